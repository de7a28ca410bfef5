"""The `patchgym` command: doctor's verdicts and fixes, config errors, the sandbox smoke."""

import json

import pytest
from typer.testing import CliRunner

from patchgym import doctor
from patchgym.cli import app
from patchgym.errors import UserError

runner = CliRunner()


def test_doctor_passes_on_a_ready_machine(backend):
    result = runner.invoke(app, ["doctor", "--json", f"sandbox.backend={backend}"])
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert result.exit_code == 0, result.stdout
    assert checks["python packages"]["ok"] and "torch 2.13.0" in checks["python packages"]["detail"]
    assert checks[f"base image ({backend})"]["ok"]


def test_doctor_fails_with_the_fix_when_bubblewrap_is_missing(monkeypatch):
    real_which = doctor.shutil.which
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    result = runner.invoke(app, ["doctor", "sandbox.backend=local"])
    assert result.exit_code == 1
    assert "bubblewrap" in result.stdout and "MISSING" in result.stdout
    assert "apt-get install -y bubblewrap" in result.stdout
    assert "required check(s) failed: bubblewrap" in result.stdout


def test_doctor_treats_the_other_backend_as_optional(monkeypatch):
    real_which = doctor.shutil.which
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    result = runner.invoke(app, ["doctor", "--json", "sandbox.backend=docker"])
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert not checks["bubblewrap"]["ok"] and not checks["bubblewrap"]["required"]


def test_bad_override_is_a_clear_error_not_a_traceback():
    result = runner.invoke(app, ["doctor", "sandbox.memory_mb=lots"])
    assert result.exit_code == 2
    assert "sandbox.memory_mb" in result.stdout and "lots" in result.stdout
    assert "Traceback" not in result.stdout



def test_doctor_names_settings_that_clash():
    result = runner.invoke(app, ["doctor", "train.bf16=true"])
    assert result.exit_code == 2 and "train.bf16 needs a CUDA inference.device" in result.stdout

@pytest.mark.parametrize("name", ["docker", "local"])
def test_smoke_fixes_a_bug_in_a_sandbox(name, backend):
    if name != backend:
        pytest.skip("runs once per backend")
    result = runner.invoke(app, ["smoke", "--backend", name])
    assert result.exit_code == 0, result.stdout
    assert "1 failed -> 1" in result.stdout


def test_tasks_import_keeps_good_rows_and_names_bad_ones(tmp_path):
    good = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "patch": "diff", "test_patch": "",
            "problem_statement": "it breaks", "FAIL_TO_PASS": '["t::a"]', "PASS_TO_PASS": "[]", "version": "1.0",
            "image": "o/r:1", "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail",  # a SWE-bench v5 row
            "eval_script": "#!/bin/bash\n: '>>>>> Start Test Output'\npytest -rA\n: '>>>>> End Test Output'\n"}
    bad = {**good, "instance_id": "o__r-2", "FAIL_TO_PASS": 7}
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    out = tmp_path / "tasks.jsonl"
    result = runner.invoke(app, ["tasks", "import", str(src), "--format", "swebench", "--out", str(out)])
    assert result.exit_code == 0, result.stdout
    assert f"{src}:2: field FAIL_TO_PASS" in result.stdout
    assert "1 tasks ->" in result.stdout
    listed = runner.invoke(app, ["tasks", "list", str(out)])
    assert listed.exit_code == 0 and "o__r-1" in listed.stdout


def test_tasks_import_unknown_format_is_a_clear_error(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("{}\n")
    result = runner.invoke(app, ["tasks", "import", str(src), "-f", "swebnech", "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2 and "swebench" in result.stdout


class NotYourFault(UserError):
    pass


def raising(exc: Exception):
    def fail(*args, **kwargs):
        raise exc
    return fail


def test_a_user_error_from_any_command_is_its_message_and_exit_2(monkeypatch, tmp_path):
    import patchgym.report
    import patchgym.tasks

    message = "run [abc] is not ready: fix it"  # brackets print as is, not as a style tag
    monkeypatch.setattr(patchgym.report, "write_report", raising(NotYourFault(message)))
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and message in result.stdout and "Traceback" not in result.stdout
    monkeypatch.setattr(patchgym.tasks, "read_tasks", raising(NotYourFault(message)))
    nested = runner.invoke(app, ["tasks", "list", str(tmp_path / "t.jsonl")])  # a command of a sub-group
    assert nested.exit_code == 2 and message in nested.stdout


def test_any_other_error_is_not_swallowed(monkeypatch, tmp_path):
    import patchgym.report

    monkeypatch.setattr(patchgym.report, "write_report", raising(KeyError("a bug")))
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)


def test_k_must_be_positive_integers(tmp_path):
    for k in ("0", "1,x", ","):
        result = runner.invoke(app, ["select", "--runs", str(tmp_path), "--k", k, "--out", str(tmp_path / "s")])
        assert result.exit_code == 2 and f"--k: k must be positive integers, got {k!r}" in result.stdout


def test_tasks_build_names_an_unknown_package(tmp_path):
    result = runner.invoke(app, ["tasks", "build", "--packages", "no-such-package", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "no recipe for no-such-package; known: " in result.stdout


BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x01"  # the start of a PNG: not UTF-8 text
BAD_FILES = {"binary.yaml": BINARY, "bad.yaml": b"a: [1\n", "list.yaml": b"- 1\n- 2\n", "binary.jsonl": BINARY,
             "bad.jsonl": b"not json\n", "list.jsonl": b"[1, 2]\n", "broken.parquet": b"PAR1 cut short",
             "run/run.json": b"{\"tasks_file\": ",
             # a row without the tests that must change: the empty patch would resolve it
             "no_f2p.jsonl": b'{"instance_id": "a-1", "repo": "a", "problem_statement": "p", '
                             b'"PASS_TO_PASS": ["t::x"]}\n'}
NO_F2P = "{d}/no_f2p.jsonl:1: field FAIL_TO_PASS: List should have at least 1 item"


# Each case: the command on a bad file (FILE under the test's directory) and what the message must say.
@pytest.mark.parametrize("args, message", [
    (["doctor", "-c", "{d}/binary.yaml"], "config file '{d}/binary.yaml' is not UTF-8 text (byte 0 is 0x89)"),
    (["doctor", "-c", "{d}/bad.yaml"], "config file '{d}/bad.yaml', line 2, column 1: invalid YAML"),
    (["doctor", "-c", "{d}/list.yaml"], "config file '{d}/list.yaml': the top level must be a mapping"),
    (["doctor", "-c", "{d}/nope.yaml"], "config file '{d}/nope.yaml' not found"),
    (["doctor", "-c", "{d}/run"], "config file '{d}/run' is a directory, not a file"),
    (["tasks", "import", "{d}/binary.jsonl", "-f", "swebench", "-o", "{d}/o.jsonl"],
     "{d}/binary.jsonl: no row is a valid swebench task"),
    (["tasks", "import", "{d}/bad.jsonl", "-f", "swebench", "-o", "{d}/o.jsonl"],
     "{d}/bad.jsonl:1: field (row): not valid JSON"),
    (["tasks", "import", "{d}/list.jsonl", "-f", "swebench", "-o", "{d}/o.jsonl"],
     "{d}/list.jsonl:1: field (row): not a JSON object"),
    (["tasks", "import", "{d}/broken.parquet", "-f", "swebench", "-o", "{d}/o.jsonl"],
     "cannot read {d}/broken.parquet as Parquet"),
    (["tasks", "import", "{d}/nope.jsonl", "-f", "swebench", "-o", "{d}/o.jsonl"], "cannot read {d}/nope.jsonl"),
    (["tasks", "import", "{d}/run", "-f", "swebench", "-o", "{d}/o.jsonl"], "cannot read {d}/run: a directory"),
    (["tasks", "list", "{d}/binary.jsonl"], "tasks file '{d}/binary.jsonl' is not UTF-8 text"),
    (["tasks", "list", "{d}/no_f2p.jsonl"], NO_F2P),
    (["grade", "--tasks", "{d}/no_f2p.jsonl", "--instance", "a-1", "--patch", "/dev/null"], NO_F2P),
    (["eval", "--tasks", "{d}/no_f2p.jsonl", "--policy", "null", "--out", "{d}/e"], NO_F2P),
    (["tasks", "validate", "--tasks", "{d}/no_f2p.jsonl", "--out", "{d}/v"], NO_F2P),
    (["tasks", "export", "{d}/no_f2p.jsonl", "--format", "harbor", "--out", "{d}/h"], NO_F2P),
    (["sft", "--trajectories", "{d}/binary.jsonl", "--out", "{d}/sft"],
     "{d}/binary.jsonl:1: not a trajectory record: (record): Invalid JSON"),
    (["sft", "--trajectories", "{d}/list.jsonl", "--out", "{d}/sft"],
     "{d}/list.jsonl:1: not a trajectory record: (record): Input should be an object"),
    (["sft", "--trajectories", "{d}/nope.jsonl", "--out", "{d}/sft"], "trajectory file '{d}/nope.jsonl' not found"),
    (["select", "--runs", "{d}/run", "--out", "{d}/sel"], "run record '{d}/run/run.json' is not valid JSON"),
])
def test_a_bad_input_file_is_a_message_naming_it_and_exit_2(tmp_path, args, message):
    for name, data in BAD_FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    result = runner.invoke(app, [arg.format(d=tmp_path) for arg in args])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.exception
    assert message.format(d=tmp_path) in result.stdout.replace("\n", "")
    assert "Traceback" not in result.stdout


def test_messages_print_square_brackets_as_they_are(tmp_path):
    """Errors quote task.toml's tables and test ids with brackets: none may be taken for a style tag, whether the
    command ends on the error or lists it among a folder's bad tasks."""
    folder = tmp_path / "tasks" / "one"
    (folder / "tests").mkdir(parents=True)
    (folder / "task.toml").write_text('schema_version = "1.0"\n')
    (folder / "instruction.md").write_text("do it\n")
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    for source in (folder, folder.parent):
        result = runner.invoke(app, ["tasks", "import", str(source), "-f", "harbor", "-o", str(tmp_path / "o.jsonl")])
        assert result.exit_code == 2 and "names no [environment].docker_image" in result.output, result.output
    (folder / "task.toml").write_text('schema_version = "1.1"\n[environment]\ndocker_image = "x"\n[[steps]]\n'
                                      'name = "one"\n')
    for source in (folder, folder.parent):
        result = runner.invoke(app, ["tasks", "import", str(source), "-f", "harbor", "-o", str(tmp_path / "o.jsonl")])
        assert result.exit_code == 2 and "(the folder of [[steps]][1], named 'one')" in result.output, result.output
