"""`patchgym select` end to end, fast: the tiny model as the verifier, the tiny task in containers, and two
hand-made eval runs whose trajectory ids repeat (`task#0` in each)."""

import json

import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.report import write_report
from patchgym.tasks import write_tasks


def _run(path, trajectories):
    path.mkdir()
    (path / "trajectories.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    return path


@pytest.mark.parametrize("verifier", ["hybrid", "ef"])
def test_select_writes_summary_scores_choices_and_preds(verifier, backend, tiny_task, make_trajectory, tmp_path):
    if backend != "docker":
        pytest.skip("one backend is enough for the command")
    task_id = tiny_task.instance_id
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    infra = make_trajectory(task_id, 2, resolved=False)
    infra.termination = "infra_error"
    run_a = _run(tmp_path / "runA", [make_trajectory(task_id, 0, resolved=True, patch=tiny_task.patch),
                                     make_trajectory(task_id, 1, resolved=False, patch=""), infra])
    run_b = _run(tmp_path / "runB", [make_trajectory(task_id, 0, resolved=False, patch="")])
    out = tmp_path / "sel"
    result = CliRunner().invoke(app, [
        "select", "--runs", str(run_a), str(run_b), "--tasks", str(tmp_path / "tasks.jsonl"), "--verifier", verifier,
        "--k", "1,2,3,4", "--model", "tiny", "--out", str(out), "--json", f"sandbox.backend={backend}",
        "verifier.repro_tests=2", "verifier.repro_sampling.max_new_tokens=32"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 1 and summary["candidates"] == 3 and summary["skipped"]["infra_error"] == 1
    # 1 of 3 candidates resolves: pass@1 = 1/3, pass@2 = 1 - C(2,2)/C(3,2) = 2/3, pass@3 = 1; k = 4 is null.
    assert summary["pass@1"] == pytest.approx(1 / 3) and summary["pass@2"] == pytest.approx(2 / 3)
    assert summary["pass@3"] == 1.0 and summary["best@1"] == pytest.approx(1 / 3)
    assert summary["best@4"] is None and summary["pass@4"] is None and "4" in summary["null_k"]
    assert 0 <= summary["best@2"] <= summary["pass@2"] and summary["best@3"] in (0.0, 1.0)

    scores = {r["id"]: r for r in map(json.loads, (out / "scores.jsonl").read_text().splitlines())}
    assert set(scores) == {f"runA/{task_id}#0", f"runA/{task_id}#1", f"runB/{task_id}#0"}
    assert scores[f"runA/{task_id}#0"]["resolved"] and not scores[f"runB/{task_id}#0"]["resolved"]
    assert all(0 < r["p_yes"] < 1 for r in scores.values())
    if verifier == "hybrid":
        # The gold and the empty patches both keep tests/test_sub.py passing.
        assert {r["regression_passed"] for r in scores.values()} == {1}
        checks = [json.loads(line) for line in (out / "checks.jsonl").read_text().splitlines()]
        assert checks[0]["regression_files"] == ["tests/test_sub.py"]
    else:
        assert all(r["regression_passed"] is None for r in scores.values())
    (choice,) = [json.loads(line) for line in (out / "choices.jsonl").read_text().splitlines()]
    assert choice["task_id"] == task_id and choice["candidates"] == 3
    assert summary["best@3"] == float(choice["resolved"])  # one 3-subset: the full set
    (pred,) = [json.loads(line) for line in (out / "preds.jsonl").read_text().splitlines()]
    assert set(pred) == {"instance_id", "model_name_or_path", "model_patch"}
    assert pred["model_patch"] == (tiny_task.patch if choice["resolved"] else "")
    assert write_report(out).is_file()


def test_select_finds_the_tasks_file_in_the_runs_run_json(backend, tiny_task, tmp_path):
    """`eval` records its tasks file in run.json, so `select` needs no --tasks; a run without one is refused."""
    if backend != "docker":
        pytest.skip("one backend is enough for the command")
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    run = tmp_path / "oracle"
    evaluated = CliRunner().invoke(app, ["eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--policy", "oracle",
                                         "--out", str(run), "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads((run / "run.json").read_text())["tasks_file"] == str((tmp_path / "tasks.jsonl").resolve())
    result = CliRunner().invoke(app, ["select", "--runs", str(run), "--verifier", "ef", "--k", "1",
                                      "--model", "tiny", "--out", str(tmp_path / "sel"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["best@1"] == 1.0
    (run / "run.json").write_text("{}")
    refused = CliRunner().invoke(app, ["select", "--runs", str(run), "--verifier", "ef", "--model", "tiny",
                                       "--out", str(tmp_path / "sel2")])
    assert refused.exit_code == 2 and "does not name its tasks file; pass --tasks" in refused.output
