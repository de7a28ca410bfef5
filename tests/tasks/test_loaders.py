"""Importing dataset rows (JSONL, Parquet) into Tasks: mappings, row errors, R2E-Gym leaks, SWE-smith reversal.

Rows that import_tasks keeps also get their execution spec (tests/tasks/test_specs.py checks those), so the rows of
each format here name a repo and version that the official spec tables and profiles know.
"""

import json
import os
import subprocess
import sys

import pytest

from patchgym.tasks.decontaminate import exclude_repos, repo_key
from patchgym.tasks.diffs import reverse_patch
from patchgym.tasks.loaders import FORMATS, convert_row, import_tasks, task_rows
from patchgym.tasks.task import Task, TaskError, write_tasks

FIX = """\
diff --git a/astropy/units/quantity.py b/astropy/units/quantity.py
index 1c2f4a1..9e0d7b2 100644
--- a/astropy/units/quantity.py
+++ b/astropy/units/quantity.py
@@ -10,3 +10,3 @@ class Quantity:
     def to_value(self, unit):
-        return self.value * unit
+        return self.value * self.unit.to(unit)
"""


TEST_PATCH = """\
diff --git a/astropy/units/tests/test_q.py b/astropy/units/tests/test_q.py
--- a/astropy/units/tests/test_q.py
+++ b/astropy/units/tests/test_q.py
@@ -1,1 +1,2 @@
 import astropy
+def test_to_value(): pass
"""
V5_SCRIPT = ("#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\npytest -rA t.py\n"
             ": '>>>>> End Test Output'\n")


def swebench_row(n: int = 1) -> dict:
    return {"instance_id": f"astropy__astropy-{n}", "repo": "astropy/astropy", "base_commit": "3cedd79e",
            "patch": FIX, "test_patch": TEST_PATCH,
            "problem_statement": "Quantity.to_value ignores the unit's scale.", "hints_text": "",
            "created_at": "2023-01-05T10:00:00Z", "version": "5.1", "environment_setup_commit": "cdf311e0",
            "FAIL_TO_PASS": json.dumps(["astropy/units/tests/test_q.py::test_to_value"]),
            "PASS_TO_PASS": json.dumps(["astropy/units/tests/test_q.py::test_add"]), "difficulty": "<15 min fix"}


def swegym_row() -> dict:
    row = swebench_row() | {"instance_id": "getmoto__moto-7365", "repo": "getmoto/moto",
                            "FAIL_TO_PASS": ["tests/test_s3.py::test_put"], "PASS_TO_PASS": []}
    del row["environment_setup_commit"], row["difficulty"]
    return row


def v5_row(n: int = 1) -> dict:
    return swebench_row(n) | {"image": f"swebench/sweb.eval.x86_64.astropy_1776_astropy-{n}:latest",
                              "eval_script": V5_SCRIPT, "log_parser": "parse_log_pytest_v2",
                              "eval_type": "pass_and_fail"}


def swegym_row_in_table() -> dict:
    """SWE-Gym's schema with a repo swebench 4.1.0's spec table has (its own repos, like moto, are not there)."""
    return swegym_row() | {"instance_id": "pydicom__pydicom-1", "repo": "pydicom/pydicom", "version": "2.1"}


def rebench_row() -> dict:
    return swebench_row() | {"instance_id": "pallets__click-2800", "repo": "pallets/click",
                             "docker_image": "swerebench/sweb.eval.x86_64.pallets_1776_click-2800",
                             "install_config": {"python": "3.11", "install": "pip install -e .",
                                                "test_cmd": "pytest -rA", "log_parser": "parse_log_pytest"}}


def smith_row() -> dict:
    bug = FIX.replace("-        return self.value * unit\n+        return self.value * self.unit.to(unit)",
                      "-        return self.value * self.unit.to(unit)\n+        return self.value * unit")
    bug = bug.replace("index 1c2f4a1..9e0d7b2", "index 9e0d7b2..1c2f4a1")
    return {"instance_id": "pallets__click.fde47b4b.func_pm_op_swap__k2",
            "repo": "swesmith/pallets__click.fde47b4b",
            "patch": bug, "FAIL_TO_PASS": ["astropy/units/tests/test_q.py::test_to_value"], "PASS_TO_PASS": ["t::a"],
            "created_at": "2025-03-01", "image_name": "swesmith.x86_64.pallets__click.fde47b4b",
            "base_commit": "77aa0b1c", "problem_statement": "to_value returns values in the wrong unit."}


OLD_NUMBERS = "class Rational:\n    def limit_denominator(self, max_denominator=10**6):\n        return self\n"
NEW_NUMBERS = ("class Rational:\n    def limit_denominator(self, max_denominator=10**6):\n"
               "        if max_denominator < 1:\n            raise ValueError('max_denominator must be at least 1')\n"
               "        return self\n")


def _line(kind: str, text: str) -> dict:
    return {"type": kind, "content": text}


def r2e_file_diffs() -> list[dict]:
    gold = {"header": {"file": {"path": "sympy/core/numbers.py"}, "misc_line": None},
            "index_line": {"old_commit_hash": "a1b2c3d", "new_commit_hash": "d4e5f6a", "mode": "100644"},
            "minus_file": {"path": "a/sympy/core/numbers.py"}, "plus_file": {"path": "b/sympy/core/numbers.py"},
            "old_file_content": OLD_NUMBERS, "new_file_content": NEW_NUMBERS, "is_binary_file": False,
            "hunks": [{"descriptor": {"old_range": {"start": 1, "length": 3}, "new_range": {"start": 1, "length": 5},
                                      "section": ""},
                       "line_group": {"all_lines": [
                           _line("context", "class Rational:"),
                           _line("context", "    def limit_denominator(self, max_denominator=10**6):"),
                           _line("added", "        if max_denominator < 1:"),
                           _line("added", "            raise ValueError('max_denominator must be at least 1')"),
                           _line("context", "        return self")]}}]}
    test = {"header": {"file": {"path": "sympy/core/tests/test_numbers.py"}, "misc_line": "new file mode 100644"},
            "minus_file": {"path": "/dev/null"}, "plus_file": {"path": "b/sympy/core/tests/test_numbers.py"},
            "hunks": [{"descriptor": {"old_range": {"start": 0, "length": 0}, "new_range": {"start": 1, "length": None},
                                      "section": ""},
                       "line_group": {"all_lines": [_line("added", "def test_limit(): pass")]}}]}
    image = {"header": {"file": {"path": "doc/logo.png"}}, "is_binary_file": True, "binary_line": "Binary files differ"}
    return [gold, test, image]


OLD_RUN = """collected 3 items
============================= short test summary info ==============================
PASSED r2e_tests/test_1.py::test_rational
FAILED r2e_tests/test_1.py::TestLimit::test_zero - AssertionError
ERROR r2e_tests/test_1.py::test_negative - TypeError
"""


def r2e_row() -> dict:
    commit = {"old_commit_hash": "a1b2c3d4", "new_commit_hash": "d4e5f6a7", "commit_message": "Validate the bound",
              "commit_date": "2019-05-01T12:00:00", "file_diffs": r2e_file_diffs()}
    gold = "".join(line["content"] + "\n" for line in r2e_file_diffs()[0]["hunks"][0]["line_group"]["all_lines"])
    return {"repo_name": "sympy", "docker_image": "namanjain12/sympy_final:d4e5f6a7", "commit_hash": "d4e5f6a7",
            "parsed_commit_content": json.dumps(commit),
            "execution_result_content": json.dumps({"old_commit_res_stdout": OLD_RUN, "new_commit_res_stdout": ""}),
            "expected_output_json": json.dumps({"test_rational": "PASSED", "TestLimit.test_zero": "PASSED",
                                                "test_negative": "PASSED", "test_known_bad": "FAILED"}),
            "modified_files": ["sympy/core/numbers.py"], "relevant_files": ["sympy/core/numbers.py"],
            "prompt": f"Write an issue for this commit.\nCommit diff:\n{FIX}\n{gold}\nTest results before and after...",
            "problem_statement": "limit_denominator accepts a zero or negative bound and returns nonsense.\n"
                                 "Expected: a clear error when the bound is below one."}


ROWS = {"swebench": v5_row, "swebench-classic": swebench_row, "swegym": swegym_row_in_table, "r2egym": r2e_row,
        "smith": smith_row, "rebench": rebench_row}
SPEC_FIELDS = {"image", "eval_script", "log_parser", "eval_type", "hidden_paths", "grading"}


def write_jsonl(path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def write_parquet(path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = list(dict.fromkeys(k for r in rows for k in r))
    pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in keys}), path)
    return str(path)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_each_format_imports_from_jsonl_and_parquet(tmp_path, fmt, suffix):
    writer = write_jsonl if suffix == "jsonl" else write_parquet
    result = import_tasks(fmt, writer(tmp_path / f"rows.{suffix}", [ROWS[fmt]()]))
    assert result.errors == []
    [task] = result.tasks
    converted = convert_row(fmt, ROWS[fmt]())
    assert task.model_dump(exclude=SPEC_FIELDS) == converted.model_dump(exclude=SPEC_FIELDS) and task.FAIL_TO_PASS
    assert task.source == fmt.removesuffix("-classic") and task.eval_script and task.log_parser


def test_swebench_rows_as_is_with_the_harness_image():
    task = convert_row("swebench-classic", swebench_row())
    assert task.FAIL_TO_PASS == ["astropy/units/tests/test_q.py::test_to_value"]
    assert (task.patch, task.version, task.difficulty, task.base_commit) == (FIX, "5.1", "<15 min fix", "3cedd79e")
    assert task.image == ""  # the spec names it (swebench 4.1.0's instance_image_key)
    assert convert_row("swebench", swebench_row() | {"image": "mine:1"}).image == "mine:1"
    assert convert_row("swegym", swegym_row()).image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest"


def test_rebench_keeps_install_config():
    assert convert_row("rebench", rebench_row()).install_config["test_cmd"] == "pytest -rA"
    as_text = rebench_row() | {"install_config": json.dumps({"python": "3.9"})}
    assert convert_row("rebench", as_text).install_config == {"python": "3.9"}


def test_malformed_rows_are_errors_and_valid_rows_are_kept(tmp_path):
    missing = {k: v for k, v in swebench_row(2).items() if k != "problem_statement"}
    rows = [swebench_row(1), missing, swebench_row(3) | {"FAIL_TO_PASS": 7}, "{broken json",
            swebench_row(5) | {"FAIL_TO_PASS": "[]"}, swebench_row(6), swebench_row(6), "[1, 2]"]
    source = write_jsonl(tmp_path / "swe.jsonl", rows)
    result = import_tasks("swebench-classic", source)
    assert [t.instance_id for t in result.tasks] == ["astropy__astropy-1", "astropy__astropy-6"]
    assert result.errors == [
        f"{source}:2: field problem_statement: missing",
        f"{source}:3: field FAIL_TO_PASS: expected a list of test ids, got int",
        f"{source}:4: field (row): not valid JSON: Expecting property name enclosed in double quotes at column 2",
        f"{source}:5: field FAIL_TO_PASS: List should have at least 1 item after validation, not 0",
        f"{source}:7: field instance_id: 'astropy__astropy-6' already on row 6",
        f"{source}:8: field (row): not a JSON object"]


def test_parquet_row_errors_name_the_row(tmp_path):
    rows = [swegym_row_in_table(), swegym_row_in_table() | {"instance_id": "x__y-2", "repo": None}]
    source = write_parquet(tmp_path / "gym.parquet", rows)
    result = import_tasks("swegym", source)
    assert len(result.tasks) == 1
    assert result.errors == [f"{source}:2: field repo: empty"]


def test_r2egym_prompt_never_reaches_the_task():
    row = r2e_row()
    task = convert_row("r2egym", row)
    added = [line[1:].strip() for line in task.patch.splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    assert len(added) == 2 and all(a in row["prompt"] for a in added)  # the prompt does hold the gold patch
    for field, value in task.model_dump().items():
        if field not in ("patch", "test_patch"):
            assert not any(a in str(value) for a in added), f"gold patch leaked into {field}"
    assert row["prompt"] not in task.model_dump_json()


def test_r2egym_statement_quoting_a_diff_is_rejected():
    with pytest.raises(TaskError, match="field problem_statement: quotes a diff"):
        convert_row("r2egym", r2e_row() | {"problem_statement": r2e_row()["prompt"]})


def test_r2egym_mapping_and_test_split(tmp_path):
    task = convert_row("r2egym", r2e_row())
    assert (task.instance_id, task.repo, task.image) == ("sympy__d4e5f6a7", "sympy", "namanjain12/sympy_final:d4e5f6a7")
    assert task.base_commit == "a1b2c3d4" and task.created_at == "2019-05-01T12:00:00"
    assert task.FAIL_TO_PASS == ["TestLimit.test_zero", "test_negative"]  # not passing in the old run
    assert task.PASS_TO_PASS == ["test_rational"]  # test_known_bad fails even after the fix: in neither list
    assert "sympy/core/tests/test_numbers.py" in task.test_patch and "test_numbers" not in task.patch
    assert "logo.png" not in task.patch + task.test_patch
    no_log = convert_row("r2egym", {k: v for k, v in r2e_row().items() if k != "execution_result_content"})
    assert no_log.FAIL_TO_PASS == ["test_rational", "TestLimit.test_zero", "test_negative"]
    assert no_log.PASS_TO_PASS == []
    repo = git_repo(tmp_path, {"sympy/core/numbers.py": OLD_NUMBERS})
    git(repo, "apply", input=task.patch)  # the rebuilt gold patch applies and gives the fixed file
    assert (repo / "sympy/core/numbers.py").read_text() == NEW_NUMBERS


def test_r2egym_malformed_commit_is_a_field_error():
    with pytest.raises(TaskError, match="field parsed_commit_content: malformed file_diffs"):
        convert_row("r2egym", r2e_row() | {"parsed_commit_content": json.dumps({"file_diffs": [{"hunks": []}]})})
    with pytest.raises(TaskError, match="field expected_output_json: no test goes from failing to passing"):
        convert_row("r2egym", r2e_row() | {"expected_output_json": json.dumps({"test_rational": "PASSED"})})


def test_smith_fix_is_the_reverse_of_the_bug():
    task = convert_row("smith", smith_row())
    # The bug is already on the image's instance branch, which the sandbox checks out first.
    assert task.bug_patch == "" and task.start_ref == task.instance_id and task.patch == FIX
    assert task.image == "swesmith.x86_64.pallets__click.fde47b4b" and task.test_patch == ""


def git(repo, *args, input=None) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "core.autocrlf=false", *args]
    return subprocess.run(cmd, cwd=repo, input=input, text=True, capture_output=True, check=True).stdout


def git_repo(tmp_path, files: dict[str, str]):
    repo = tmp_path / "repo"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "original")
    return repo


def snapshot(repo) -> dict[str, tuple[str, bool]]:
    return {str(p.relative_to(repo)): (p.read_text(), os.access(p, os.X_OK))
            for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts}


def test_reversed_bug_restores_the_original_in_a_git_repo(tmp_path):
    lines = "".join(f"value_{i} = {i}\n" for i in range(30))
    repo = git_repo(tmp_path, {"src/calc.py": lines, "src/gone.py": "def gone():\n    return 1\n",
                               "notes.txt": "first\nlast line without newline", "run.sh": "echo hi\n",
                               "src/old_name.py": "A = 1\nB = 2\nC = 3\nD = 4\nE = 5\n",
                               "queries.sql": "select 1;\n-- all rows\nselect 2;\n"})
    original = snapshot(repo)
    (repo / "src/calc.py").write_text(lines.replace("value_3 = 3\n", "value_3 = 4\nvalue_3b = 0\n")
                                      .replace("value_25 = 25\n", ""))
    (repo / "src/gone.py").unlink()
    (repo / "src/extra.py").write_text("def extra():\n    pass\n")
    (repo / "notes.txt").write_text("first\nlast line changed")
    (repo / "run.sh").chmod(0o755)
    (repo / "src/old_name.py").rename(repo / "src/new_name.py")
    (repo / "src/new_name.py").write_text("A = 1\nB = 2\nC = 3\nD = 4\nE = 6\n")
    (repo / "queries.sql").write_text("select 1;\n++ added\nselect 2;\n")  # body lines that look like headers
    git(repo, "add", "-A")
    bug, bugged = git(repo, "diff", "--cached", "-M", "HEAD"), snapshot(repo)
    assert "rename from" in bug and "new file mode" in bug and "deleted file mode" in bug and "\\ No newline" in bug
    git(repo, "reset", "-q", "--hard", "HEAD")
    assert snapshot(repo) == original
    git(repo, "apply", input=bug)
    assert snapshot(repo) == bugged
    git(repo, "apply", input=reverse_patch(bug))
    assert snapshot(repo) == original and git(repo, "status", "--porcelain") == ""
    assert reverse_patch(reverse_patch(bug)) == bug


def test_reverse_refuses_binary_and_truncated_diffs():
    with pytest.raises(ValueError, match="binary"):
        reverse_patch("diff --git a/x.png b/x.png\nGIT binary patch\nliteral 3\n")
    with pytest.raises(ValueError, match="ends before"):
        reverse_patch("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n")
    bad = smith_row() | {"patch": "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n"}
    with pytest.raises(TaskError, match="field patch: cannot reverse the bug patch"):
        convert_row("smith", bad)


def test_repo_spellings_normalise():
    spellings = ["Django/Django", "https://github.com/django/django.git", "git@github.com:django/django.git",
                 "github.com/django/django/", "swesmith/django__django.1a2b3c4d"]
    assert {repo_key(s) for s in spellings} == {"django/django"}


def test_exclude_repos_drops_eval_repos(tmp_path):
    def task(iid, repo):
        return Task(instance_id=iid, repo=repo, problem_statement="p", FAIL_TO_PASS=["t"])

    train = [task("1", "https://github.com/SymPy/sympy"), task("2", "sympy"), task("3", "psf/requests"),
             task("4", "swesmith/django__django.1a2b3c4d"), task("5", "other/sympy-tools")]
    kept, dropped = exclude_repos(train, [task("e1", "sympy/sympy"), task("e2", "django/django.git")])
    assert [t.instance_id for t in kept] == ["3", "5"] and [t.instance_id for t in dropped] == ["1", "2", "4"]
    eval_file = tmp_path / "eval.jsonl"
    write_tasks([convert_row("swebench", swebench_row())], eval_file)
    source = write_jsonl(tmp_path / "gym.jsonl", [swegym_row_in_table(), swebench_row(9)])
    result = import_tasks("swegym", source, exclude_repos_of=str(eval_file))
    assert [t.repo for t in result.tasks] == ["pydicom/pydicom"]
    assert [t.repo for t in result.dropped] == ["astropy/astropy"]


def test_unknown_format_lists_the_formats(tmp_path):
    for call in (lambda: import_tasks("swe-bench", write_jsonl(tmp_path / "a.jsonl", [])),
                 lambda: convert_row("swe-bench", {})):
        with pytest.raises(TaskError, match="unknown dataset format 'swe-bench': choose one of swebench, "
                                             "swebench-classic, swegym, r2egym, smith, rebench"):
            call()


def row_numbers(errors: list[str], source: str) -> set[int]:
    return {int(line.removeprefix(f"{source}:").split(":")[0]) for line in errors}


def test_rows_are_numbered_from_one_and_bad_sources_named(tmp_path):
    source = write_jsonl(tmp_path / "r.jsonl", [{"a": 1}, "", {"a": 2}])
    assert row_numbers(import_tasks("swebench", source).errors, source) == {1, 3}  # the blank line is skipped
    source = write_jsonl(tmp_path / "r2.jsonl", [{"a": 1}, "nope"])
    assert f"{source}:2: field (row): not valid JSON: Expecting value at column 1" in import_tasks("swebench",
                                                                                                    source).errors
    with pytest.raises(TaskError, match="no such file"):
        import_tasks("swebench", str(tmp_path / "missing.jsonl"))
    with pytest.raises(TaskError, match="expected a .jsonl or .parquet file"):
        import_tasks("swebench", write_jsonl(tmp_path / "r.csv", []))
    with pytest.raises(TaskError, match="cannot read .* as Parquet"):
        import_tasks("swebench", write_jsonl(tmp_path / "fake.parquet", [{"a": 1}]))


def test_hf_source_without_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as when the package is not installed
    with pytest.raises(TaskError, match=r"hf:SWE-Gym/SWE-Gym:train needs the `datasets` package"):
        import_tasks("swegym", "hf:SWE-Gym/SWE-Gym:train")


def test_task_rows_for_the_cli_table():
    tasks = [convert_row("swebench", v5_row()), convert_row("swegym", swegym_row())]
    built = {"swebench/sweb.eval.x86_64.astropy_1776_astropy-1:latest"}
    assert task_rows(tasks, built.__contains__) == [
        ("astropy__astropy-1", "astropy/astropy", 1, 1, "yes"), ("getmoto__moto-7365", "getmoto/moto", 1, 0, "no")]


def test_a_parquet_file_damaged_past_its_first_rows_is_a_task_error(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"instance_id": [f"id-{i}" for i in range(200)]}), path, row_group_size=100,
                   compression="none")
    page = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[page: page + 40] = b"\xab" * 40  # the second row group's page header: read only after 100 rows
    path.write_bytes(data)
    with pytest.raises(TaskError, match=f"cannot read {path} as Parquet"):
        import_tasks("swebench", str(path))


def test_a_jsonl_row_that_is_not_utf8_is_a_bad_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe{}\n')
    errors = import_tasks("swebench", str(path)).errors
    assert f"{path}:2: field (row): not UTF-8 text (byte 0): is the file binary?" in errors
