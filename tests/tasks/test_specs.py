"""Execution specs per dataset family, compared with what the official packages produce for the same row.

The classic rows' expected scripts come from swebench 4.1.0 itself, called here through the cached harness venv
(created on first use, ~45 s, then reused), and swebench 5 (the extra) rewrites them as it rewrites v5 rows.
"""

import json
import subprocess
import sys

import pytest

from patchgym.env.grading import harness_venv
from patchgym.tasks.loaders import import_tasks
from patchgym.tasks.specs import END, START, r2e_eval_script, smith_eval_script
from patchgym.tasks.task import TaskError
from tests.tasks.test_loaders import TEST_PATCH, r2e_row, smith_row, swebench_row, swegym_row, write_jsonl

make_test_spec = pytest.importorskip("swebench.harness.utils").make_test_spec

def classic_row(n: int = 1) -> dict:
    return swebench_row(n)


def test_classic_row_gets_swebench_4_script_rewritten_by_swebench_5(tmp_path):
    row = classic_row()
    source = write_jsonl(tmp_path / "verified.jsonl", [row])
    result = import_tasks("swebench-classic", source)
    assert result.errors == []
    (task,) = result.tasks
    # The official scripts: 4.1.0's TestSpec.eval_script for this row, then swebench 5's make_test_spec over it.
    python = harness_venv.ensure_venv()
    code = ("import json, sys\n"
            "import swebench.harness.test_spec.test_spec as ts\n"
            "ts.make_env_script_list = lambda *a: []  # the env script fetches from GitHub; the eval script does not\n"
            "spec = ts.make_test_spec(json.load(sys.stdin), namespace='swebench')\n"
            "from swebench.harness.log_parsers import MAP_REPO_TO_PARSER\n"
            "print(json.dumps([spec.eval_script, spec.instance_image_key, MAP_REPO_TO_PARSER[spec.repo].__name__]))\n")
    out = subprocess.run([str(python), "-I", "-c", code], input=json.dumps(row), capture_output=True, text=True,
                         check=True).stdout
    script4, image, parser = json.loads(out)
    v5 = make_test_spec({**row, "image": image, "eval_script": script4, "log_parser": parser,
                         "eval_type": "pass_and_fail"})
    assert task.eval_script == v5.eval_script
    assert task.image == image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-1:latest"
    assert (task.log_parser, task.eval_type, task.source) == (parser, "pass_and_fail", "swebench")
    assert parser == "parse_log_pytest_v2"
    assert "git apply -v - <<'EOF_114329324912'" in task.eval_script and "pytest -rA astropy/units/tests/test_q.py" \
        in task.eval_script and ">>>>> Test Exit Code" in task.eval_script


def test_rows_without_a_spec_are_refused_with_file_and_row(tmp_path):
    rows = [classic_row(1), classic_row(2) | {"version": "9.9"}, swebench_row(3) | {"repo": "nobody/nothing"},
            swebench_row(4) | {"test_patch": TEST_PATCH.replace("-1,1 +1,2", "-1,2 +1,3")}]
    result = import_tasks("swebench-classic", write_jsonl(tmp_path / "c.jsonl", rows))
    assert [t.instance_id for t in result.tasks] == ["astropy__astropy-1"]
    source = tmp_path / "c.jsonl"
    assert result.errors[0].startswith(f"{source}:2: no execution spec: version '9.9' of "
                                       "astropy/astropy is not in swebench 4.1.0's spec table")
    assert result.errors[1] == (f"{source}:3: no execution spec: repo nobody/nothing is not in "
                                "swebench 4.1.0's spec table")
    assert result.errors[2] == f"{source}:4: no execution spec: UnidiffParseError: Hunk is shorter than expected"


def test_swegym_repos_outside_swebench_4_table_are_refused(tmp_path):
    """SWE-Gym's own table lives in its SWE-Bench fork (not on PyPI); 4.1.0's table lacks getmoto/moto."""
    gym_in_table = swegym_row() | {"instance_id": "pydicom__pydicom-1", "repo": "pydicom/pydicom", "version": "2.1",
                                   "test_patch": TEST_PATCH.replace("astropy/units/tests/test_q.py", "tests/t.py")}
    result = import_tasks("swegym", write_jsonl(tmp_path / "g.jsonl", [swegym_row(), gym_in_table]))
    assert result.errors == [f"{tmp_path / 'g.jsonl'}:1: no execution spec: repo getmoto/moto is not "
                             "in swebench 4.1.0's spec table"]
    (task,) = result.tasks
    assert task.image == "xingyaoww/sweb.eval.x86_64.pydicom_s_pydicom-1:latest"
    assert task.log_parser == "parse_log_pytest_options" and "pytest -rA tests/t.py" in task.eval_script


def test_v5_row_taken_as_swebench_5_takes_it(tmp_path):
    script = ("#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\npytest -rA t.py\n"
              ": '>>>>> End Test Output'\ngit checkout abc t.py\n")
    row = swebench_row() | {"image": "swebench/sweb.eval.x86_64.astropy_1776_astropy-1:v5", "eval_script": script,
                            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    result = import_tasks("swebench", write_jsonl(tmp_path / "v5.jsonl", [row, swebench_row(2)]))
    (task,) = result.tasks
    assert task.eval_script == make_test_spec(row).eval_script and task.image == row["image"]
    assert result.errors == [f"{tmp_path / 'v5.jsonl'}:2: field eval_script: missing; a row without eval_script, "
                             "image, eval_type is a classic SWE-bench row: import it with --format "
                             "swebench-classic"]


def test_rebench_spec_comes_from_install_config(tmp_path):
    config = {"python": "3.11", "install": "pip install -e .", "test_cmd": "pytest -rA --tb=short",
              "log_parser": "parse_log_pytest"}
    row = classic_row() | {"instance_id": "pallets__click-2800", "repo": "pallets/click", "version": "8.1",
                           "install_config": config,
                           "docker_image": "swerebench/sweb.eval.x86_64.pallets_1776_click-2800"}
    rows = [row, row | {"instance_id": "a__b-1", "install_config": None}, row | {"instance_id": "a__b-2",
                                                                                   "docker_image": None}]
    result = import_tasks("rebench", write_jsonl(tmp_path / "r.jsonl", rows))
    (task,) = result.tasks
    assert task.image == row["docker_image"] and task.log_parser == "parse_log_pytest"
    assert "pytest -rA --tb=short astropy/units/tests/test_q.py" in task.eval_script
    assert "pip install -e ." in task.eval_script
    assert [e.split(": ", 2)[1] for e in result.errors] == ["field install_config", "field docker_image"]


def test_smith_spec_from_the_profile(tmp_path):
    row = smith_row() | {"repo": "swesmith/pallets__click.fde47b4b", "instance_id": "pallets__click.fde47b4b.x__1",
                         "FAIL_TO_PASS": ["tests/test_a.py::test_x"], "PASS_TO_PASS": ["tests/test_b.py::test_y"]}
    unknown = row | {"repo": "swesmith/nobody__nothing.12345678", "instance_id": "nobody__nothing.12345678.x"}
    result = import_tasks("smith", write_jsonl(tmp_path / "s.jsonl", [row, unknown]))
    (task,) = result.tasks
    assert task.log_parser == "swesmith" and task.image == "swebench/swesmith.x86_64.pallets_1776_click.fde47b4b"
    assert task.eval_script == smith_eval_script(row["instance_id"], "source /opt/miniconda3/bin/activate; "
                                                 "conda activate testbed; pytest --disable-warnings --color=no "
                                                 "--tb=no --verbose", ["tests/test_a.py", "tests/test_b.py"])
    assert len(result.errors) == 1 and ":2: no execution spec: swesmith knows no repo profile" in result.errors[0]


def test_r2egym_spec_hides_the_tests(tmp_path):
    result = import_tasks("r2egym", write_jsonl(tmp_path / "r2e.jsonl", [r2e_row()]))
    (task,) = result.tasks
    assert task.hidden_paths == ["/r2e_tests", "/testbed/run_tests.sh"] and task.log_parser == "r2egym"
    assert task.eval_script == r2e_eval_script()


def test_smith_profiles_of_other_languages_import_with_their_own_parser(tmp_path):
    """A JavaScript profile's row takes its test command and image from swesmith and names the profile's own parser
    (run in the harness venv when a log is graded); Go's profile lists test files from a clone of its GitHub mirror,
    so offline its row is refused with the profile named."""
    js = smith_row() | {"repo": "swesmith/mholt__PapaParse.b10b87ef", "instance_id": "mholt__PapaParse.b10b87ef.x__1",
                        "image_name": "swebench/swesmith.x86_64.mholt_1776_papaparse.b10b87ef"}
    go = smith_row() | {"repo": "swesmith/spf13__pflag.1c62fb28", "instance_id": "spf13__pflag.1c62fb28.x__1"}
    result = import_tasks("smith", write_jsonl(tmp_path / "s.jsonl", [js, go]))
    (task,) = result.tasks
    assert task.log_parser == "swesmith-profile" and task.image == js["image_name"]
    assert task.eval_script == smith_eval_script(js["instance_id"], "npm test", [])
    assert len(result.errors) == 1 and "profile PFlag cannot list its test files offline" in (
        result.errors[0]), result.errors


def test_smith_script_restores_the_removed_tests_and_records_the_exit_code(tmp_path):
    """Real bash and git on a branch laid out as SWE-smith's: bug commit, then a commit removing the F2P tests."""
    repo = tmp_path / "testbed"
    repo.mkdir()
    def git(*a):
        return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    (repo / "t.py").write_text("test\n")
    git("add", ".")
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "bug")
    git("checkout", "-qb", "inst")
    git("rm", "-q", "t.py")
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "Remove F2P Tests")
    script = smith_eval_script("inst", "cat t.py; false", ["t.py"]).replace("cd /testbed", f"cd {repo}")
    log = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    sliced = log.split(START)[1].split(END)[0]
    assert "test" in sliced and ">>>>> Test Exit Code: 1" in log.split(END)[1]


def test_smith_script_on_a_branch_without_a_removal_commit_grades_the_tip(tmp_path):
    """A branch holding only the bug commit (SWE-smith makes no removal commit where the profile lists no F2P test
    files, as its JavaScript profiles do): `<branch>~1` is the clean snapshot, so restoring from it would undo the bug
    and resolve any patch. The script grades the tip, resetting only the test files the patch edited."""
    repo = tmp_path / "testbed"
    repo.mkdir()

    def git(*a):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b", *a], check=True,
                              capture_output=True)

    git("init", "-q", "-b", "main")
    (repo / "code.js").write_text("clean\n")
    (repo / "t.js").write_text("the test\n")
    git("add", ".")
    git("commit", "-qm", "Initial commit")
    git("checkout", "-qb", "inst")
    (repo / "code.js").write_text("buggy\n")
    git("commit", "-qam", "Bug Patch")
    (repo / "t.js").write_text("a test the patch rewrote\n")  # the candidate's edit to a test file
    script = smith_eval_script("inst", "cat code.js t.js", ["t.js"]).replace("cd /testbed", f"cd {repo}")
    log = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    sliced = log.split(START)[1].split(END)[0]
    assert "buggy" in sliced and "clean" not in sliced and "the test" in sliced and "rewrote" not in sliced


def test_the_parsers_the_loaders_name_besides_swebenchs_are_registered():
    from patchgym.env.grading import PARSERS
    assert {"r2egym", "swesmith"} <= set(PARSERS)


def test_a_missing_swebench_extra_stops_the_import_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "swebench", None)  # as when patchgym[swebench] is not installed
    monkeypatch.setitem(sys.modules, "swebench.harness.utils", None)
    with pytest.raises(TaskError, match=r"pip install 'patchgym\[swebench\]'"):
        import_tasks("swebench-classic", write_jsonl(tmp_path / "c.jsonl", [classic_row()]))
