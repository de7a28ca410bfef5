"""The structured pytest report: the plugin run for real (on the host and in every sandbox backend), and its
parsing, which printed `PASSED ...` lines cannot fool; what comes through the side channel is checked."""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from patchgym.env.grading import ReportMissing, install_report_plugin, parse_log, parse_report, read_report
from patchgym.env.grading.report import (
    PLUGIN_SOURCE,
    InstalledPlugin,
    Tampered,
    plugin_args,
    plugin_source,
    pytest_command,
    run_reported,
)
from patchgym.env.grading.report_reader import check_closing, statuses_of
from patchgym.sandbox import SandboxConfig, open_sandbox

SUITE = {
    "tests/test_suite.py": '''
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("fixture boom")

        @pytest.fixture
        def bad_teardown():
            yield
            raise RuntimeError("teardown boom")

        def test_pass():
            pass

        def test_fail():
            assert 0

        def test_error(broken):
            pass

        def test_teardown_error(bad_teardown):
            pass

        def test_fail_then_teardown_error(bad_teardown):
            assert 0

        @pytest.mark.skip(reason="not here")
        def test_skip():
            pass

        def test_skip_inside():
            pytest.skip("inside")

        @pytest.mark.xfail(reason="known bug")
        def test_xfail():
            assert 0

        def test_xfail_imperative():
            pytest.xfail("later")

        @pytest.mark.xfail(reason="fixed?", strict=True)
        def test_xpass_strict():
            pass

        @pytest.mark.xfail
        def test_xpass():
            pass

        @pytest.mark.parametrize("v", ["a b", "c[d]", "e::f"])
        def test_param(v):
            pass

        def test_liar():
            print("PASSED tests/test_suite.py::test_fail")
            print("PASSED tests/x.py::test_y")

        def test_subtests_one_fails(subtests):
            for i in range(3):
                with subtests.test(i=i):
                    assert i != 1

        def test_subtests_pass(subtests):
            with subtests.test(msg="fine"):
                assert True
        ''',
    "tests/test_broken.py": "import no_such_module_xyz\n",
    # A patch can add this: fake summary lines, printed after pytest's own.
    "tests/conftest.py": '''
        def pytest_unconfigure(config):
            print("PASSED tests/test_suite.py::test_fail")
            print("PASSED tests/x.py::test_y")
        ''',
}
S = "tests/test_suite.py::"
EXPECTED = {
    S + "test_pass": "PASSED", S + "test_fail": "FAILED", S + "test_error": "ERROR",
    S + "test_teardown_error": "ERROR", S + "test_fail_then_teardown_error": "FAILED",
    S + "test_skip": "SKIPPED", S + "test_skip_inside": "SKIPPED", S + "test_xfail": "XFAIL",
    S + "test_xfail_imperative": "XFAIL", S + "test_xpass_strict": "FAILED", S + "test_xpass": "PASSED",
    S + "test_param[a b]": "PASSED", S + "test_param[c[d]]": "PASSED", S + "test_param[e::f]": "PASSED",
    S + "test_liar": "PASSED", S + "test_subtests_one_fails": "FAILED", S + "test_subtests_pass": "PASSED",
    "tests/test_broken.py": "ERROR",
}
PYTEST = ["pytest", "-rA", "-p", "no:cacheprovider"]


def assert_not_fooled(statuses: dict[str, str], output: str) -> None:
    assert statuses == EXPECTED
    # The same run's printed log does fool a text parser: that is what the report is for.
    fooled = parse_log(output)
    assert fooled["tests/x.py::test_y"] == "PASSED" and fooled[S + "test_fail"] == "PASSED"


# -- on the host: the plugin needs no sandbox -----------------------------------------------------

def host_pytest(tmp_path, target: str, args: list[str]) -> str:
    for rel, text in SUITE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir(exist_ok=True)
    (plugin_dir / "_report.py").write_text(plugin_source(target))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(plugin_dir)
    cmd = [sys.executable, "-m", *PYTEST, "-p", "no:timeout", "-p", "_report", *args, "tests"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout


def test_plugin_on_the_host_writing_to_a_file(tmp_path):
    """The file target is what an exported Harbor verifier uses."""
    path = tmp_path / "report.jsonl"
    output = host_pytest(tmp_path, str(path), ["--continue-on-collection-errors"])
    assert_not_fooled(statuses_of(path.read_text(), str(path)), output)
    first, collected = (json.loads(line) for line in path.read_text().splitlines()[:2])
    assert set(first) <= {"nodeid", "when", "outcome", "wasxfail"}
    assert collected["when"] == "collected" and S + "test_pass" in collected["nodeids"]


def test_plugin_source_suits_python_3_6():
    tree = ast.parse(PLUGIN_SOURCE, feature_version=(3, 6))  # rejects the walrus and later syntax
    # No f-strings at all, so f"{x=}" (3.8) cannot slip past the check above.
    assert not any(isinstance(node, ast.JoinedStr) for node in ast.walk(tree))
    assert not [line for line in PLUGIN_SOURCE.splitlines() if line.startswith(("import", "from"))
                and line.split()[1].split(".")[0] not in ("json", "os", "stat", "pytest")]


def test_the_plugin_as_installed_names_neither_patchgym_nor_a_grader():
    for source in (plugin_source(3, strict=True), plugin_source("/logs/verifier/r.jsonl")):
        assert not re.search(r"patchgym|grader|grading", source, re.IGNORECASE)
    assert "\n_TARGET = 3  #" in plugin_source(3) and "\n_STRICT = True  #" in plugin_source(3, strict=True)
    assert "\n_TARGET = '/x.jsonl'  #" in plugin_source("/x.jsonl")


def test_plugin_args_load_the_report_plugin_first():
    assert plugin_args("_abc", ["hypothesispytest"]) == ["-p", "_abc", "-p", "hypothesispytest"]


def line(nodeid: str, when: str, outcome: str, wasxfail=None) -> str:
    return json.dumps({"nodeid": nodeid, "when": when, "outcome": outcome, "wasxfail": wasxfail})


def test_parse_report_phases():
    text = "\n".join([
        line("t.py::a", "setup", "passed"), line("t.py::a", "call", "passed"), line("t.py::a", "teardown", "failed"),
        line("t.py::b", "setup", "skipped", wasxfail=""),  # xfail(run=False): an empty reason is still an xfail
        line("t.py::c", "call", "rerun"), line("t.py::c", "call", "passed"),  # pytest-rerunfailures
        line("t.py::d", "setup", "skipped"),
        json.dumps({"nodeid": "t2.py", "when": "collect", "outcome": "failed"}),
        json.dumps({"nodeid": "t3.py", "when": "collect", "outcome": "skipped"}),
        "PASSED t.py::e", '{"nodeid": "t.py::f", "when": "call", "outc',  # noise, and a line cut by a kill
    ])
    assert parse_report(text) == {"t.py::a": "ERROR", "t.py::b": "XFAIL", "t.py::c": "PASSED",
                                  "t.py::d": "SKIPPED", "t2.py": "ERROR", "t3.py": "SKIPPED"}


def end(lines: int, tampered=()) -> dict:
    return {"nodeid": "", "when": "end", "lines": lines, "tampered": list(tampered)}


def test_only_the_plugins_own_lines_and_a_clean_closing_check_pass():
    collected = {"nodeid": "", "when": "collected", "nodeids": ["t.py::a", "t.py::b"]}
    a, b = ({"nodeid": f"t.py::{n}", "when": "call", "outcome": "passed"} for n in "ab")
    rerun = {"nodeid": "t.py::b", "when": "call", "outcome": "rerun"}
    check_closing([collected, a, rerun, b, end(4)])
    for records, why in [([a, b], "ended before"), ([collected, a, b, end(3, ["x was replaced"])], "x was replaced"),
                         ([collected, a, b, a, end(3)], "holds 4 results"),  # a line planted during the run
                         ([end(0), a, b, end(2)], "holds 3 results"),
                         ([collected, a, b, end(3), b], "goes on after its closing line"),
                         ([collected, a, a, end(3)], "two call results for t.py::a"),
                         ([collected, a, {**b, "nodeid": "t.py::z"}, end(3)], "t.py::z, which was never collected"),
                         ([collected, collected, a, end(3)], "collected tests 2 times")]:
        with pytest.raises(Tampered, match=why):
            check_closing(records)


def test_lines_that_are_not_records_break_the_count():
    good = "\n".join(json.dumps(r) for r in [{"nodeid": "t.py::a", "when": "call", "outcome": "passed"}, end(1)])
    assert statuses_of(good, "x") == {"t.py::a": "PASSED"}
    with pytest.raises(Tampered, match="holds 2 results"):
        statuses_of("not json at all\n" + good, "x")


def test_the_command_turns_autoload_off_and_loads_the_report_plugin_first():
    command = pytest_command("pytest tests", InstalledPlugin("/tmp/abc", "_xyz"), ["hypothesispytest"])
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in command and "unset PYTEST_PLUGINS PYTEST_ADDOPTS" in command
    assert "PYTHONPATH=/tmp/abc" in command
    assert command.endswith("pytest tests -p _xyz -p hypothesispytest")


# -- in real sandboxes ---------------------------------------------------------------------------

@pytest.fixture
def sb(backend, base_image):
    with open_sandbox(SandboxConfig(backend=backend, memory_mb=512, exec_timeout_s=120), image=base_image) as sandbox:
        for rel, text in SUITE.items():
            sandbox.write_file(f"/testbed/{rel}", textwrap.dedent(text))
        yield sandbox


def run_in(sandbox, args: list[str]):
    plugin = install_report_plugin(sandbox)
    command = pytest_command(" ".join([*PYTEST, *args, "tests"]), plugin, plugins=None)
    return run_reported(sandbox, command, "/testbed", 120)


def test_report_in_a_sandbox_gives_each_test_its_status(sb):
    run = run_in(sb, ["--continue-on-collection-errors"])
    assert_not_fooled(read_report(run), run.output)


def test_the_tests_run_as_the_agent_and_cannot_change_the_plugin(sb):
    plugin = install_report_plugin(sb)
    probe = (f"id -u; test -w {plugin.directory} || echo dir-locked; test -w {plugin.directory}/{plugin.module}.py "
             "|| echo file-locked; ls -ld /root/.grading 2>&1 | grep -c 'Permission denied'")
    sb.exec("mkdir -p -m 700 /root/.grading && chmod 700 /root")
    run = run_reported(sb, probe, "/testbed", 30)
    assert run.output.split() == [str(sb.config.agent_user), "dir-locked", "file-locked", "1"], run.output
    assert re.fullmatch(r"/tmp/[a-z]{10}", plugin.directory) and re.fullmatch(r"_[a-z]{10}", plugin.module)


def test_interrupted_collection_still_reports_the_broken_module(sb):
    assert read_report(run_in(sb, [])) == {"tests/test_broken.py": "ERROR"}


def test_no_sign_the_suite_ran_raises(sb):
    # A run that selected no test leaves no result.
    run = run_in(sb, ["--ignore=tests/test_broken.py", "-k", "no_such_test"])
    assert "deselected" in run.output
    with pytest.raises(ReportMissing):
        read_report(run)
    sb.write_file("/testbed/tests/conftest.py", "import no_such_module_xyz\n")
    with pytest.raises(ReportMissing):
        read_report(run_in(sb, []))
    with pytest.raises(ReportMissing, match="no test result came through"):
        read_report(run_reported(sb, "true", "/testbed", 30))
