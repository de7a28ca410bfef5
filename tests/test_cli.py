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
            "problem_statement": "it breaks", "FAIL_TO_PASS": '["t::a"]', "PASS_TO_PASS": "[]", "version": "1.0"}
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
