"""`patchgym eval` with real models: SmolLM2 on the CI task set (every file written, the token check passes), and
Ctrl-C in the middle of a tiny-model run (whole lines, no sandbox left, the rerun resumes).

On docker only: that Ctrl-C leaves no sandbox on each backend is tests/sandbox/test_lifecycle.py's (8 concurrent
sandboxes, SIGINT and SIGKILL); what is proven here is the eval's own: whole lines, and a rerun that resumes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.sandbox.reaper import leftovers
from patchgym.tasks import write_tasks


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_smollm2_on_the_ci_tasks_writes_every_file_and_its_tokens_check(backend, ci_tasks, tmp_path):
    tasks = ci_tasks[:1]  # one task, two runs: what pass@k and the files need, in the suite's time
    write_tasks(tasks, tmp_path / "tasks.jsonl")
    run = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--model", "smollm2", "--runs", "2", "--out", str(run),
        "--engine", "hf",  # auto would start a vLLM server (~30 s); the SIGINT test below runs eval on vLLM
        "--json", f"sandbox.backend={backend}", "agent.max_steps=2", "agent.sampling.max_new_tokens=32"])
    assert result.exit_code == 0, result.stdout
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary == json.loads((run / "summary.json").read_text())
    assert summary["tasks"] == 1 and summary["trajectories"] == 2 and summary["infra_errors"] == 0
    for key in ("pass@1", "pass@1_sem", "pass@2", "mean_steps", "mean_sampled_tokens", "by_termination"):
        assert summary[key] is not None, key
    assert 1 <= summary["mean_steps"] <= 2 and 0 < summary["mean_sampled_tokens"] <= 2 * 32
    for name in ("preds.jsonl", "preds-run0.jsonl", "preds-run1.jsonl"):
        preds = [json.loads(line) for line in (run / name).read_text().splitlines()]
        assert sorted(p["instance_id"] for p in preds) == sorted(t.instance_id for t in tasks)
        assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in preds)
    assert (run / "preds.jsonl").read_text() == (run / "preds-run0.jsonl").read_text()
    records = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["engine"]["class"] == "HFEngine" and r["grade"] is not None for r in records)
    check = CliRunner().invoke(app, ["check-tokens", str(run), "--json"])
    assert check.exit_code == 0, check.stdout
    report = json.loads(check.stdout)
    assert report["ok"] and report["sampled_segments"] == sum(len(r["turns"]) for r in records)
    print(f"SmolLM2 on the CI tasks: {report['non_canonical_segments']} of {report['sampled_segments']} sampled "
          "segments non-canonical")


def _eval_command(tasks, run, backend):
    return [sys.executable, "-c", "from patchgym.cli import app; app()", "eval", "--tasks", str(tasks),
            "--model", "tiny", "--runs", "6", "--out", str(run), f"sandbox.backend={backend}",
            "agent.max_steps=3", "agent.sampling.max_new_tokens=64", "rollout.max_sandboxes=2"]


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_ctrl_c_leaves_whole_lines_and_no_sandbox_and_the_rerun_resumes(backend, tiny_task, tmp_path):
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    run_id = f"ctrl-c-{os.getpid()}-{backend}"
    env = {**os.environ, "PATCHGYM_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    path = tmp_path / "run" / "trajectories.jsonl"
    child = subprocess.Popen(_eval_command(tmp_path / "tasks.jsonl", tmp_path / "run", backend), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (path.exists() and path.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        assert child.poll() is None, child.stderr.read()
        time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    child.wait(timeout=60)
    text = path.read_text()
    done = text.splitlines()
    assert text.endswith("\n") and 1 <= len(done) < 6, len(done)
    assert all(json.loads(line)["termination"] for line in done)
    deadline = time.monotonic() + 30  # a pooled sandbox is closed by a background thread on the way out
    while (left := leftovers(run_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []

    subprocess.run(_eval_command(tmp_path / "tasks.jsonl", tmp_path / "run", backend), env=env, check=True,
                   capture_output=True, timeout=600)
    lines = path.read_text().splitlines()
    assert lines[: len(done)] == done and len(lines) == 6  # what was done stays, and nothing is counted twice
    assert sorted(json.loads(line)["sample"] for line in lines) == list(range(6))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["trajectories"] == 6
    assert leftovers(run_id) == []


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_eval_through_the_openai_engine_against_patchgym_serve_keeps_exact_tokens(tiny, tiny_task, tmp_path, api):
    """A real server (patchgym serve's code over the hf engine) and the openai engine through the official client."""
    from patchgym.inference.hf import HFEngine
    from patchgym.inference.server import serve

    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    with HFEngine(*tiny) as engine, serve(engine, port=0, model_name="tiny") as server:
        result = CliRunner().invoke(app, [
            "eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--engine", "openai", "--model", "tiny", "--runs", "2",
            "--out", str(tmp_path / "run"), "--json", f"inference.base_url={server.base_url}",
            f"inference.api={api}", "agent.max_steps=2", "agent.sampling.max_new_tokens=32"])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout.strip().splitlines()[-1])["infra_errors"] == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["engine"]["class"] == "OpenAIEngine" for r in records)
    assert all(turn["exact"] and turn["completion_ids"] for r in records for turn in r["turns"])
    check = CliRunner().invoke(app, ["check-tokens", str(tmp_path / "run"), "--json"])
    assert check.exit_code == 0 and (json.loads(check.stdout)["sampled_segments"]
                                     == sum(len(r["turns"]) for r in records))


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_sigint_mid_generation_stops_the_eval_within_seconds_on_each_engine(backend, engine, tiny_task, tmp_path):
    """SmolLM2 asked for 1,024-token turns (minutes of decoding on the hf engine's one thread): Ctrl-C while the first
    turns decode cancels them instead of waiting for them, closes every sandbox, and (vllm) stops the server."""
    import psutil

    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    run_id = f"sigint-{os.getpid()}-{engine}"
    env = {**os.environ, "PATCHGYM_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", "from patchgym.cli import app; app()", "eval", "--tasks",
               str(tmp_path / "tasks.jsonl"), "--engine", engine, "--model", "smollm2", "--runs", "2",
               "--out", str(tmp_path / "run"), f"sandbox.backend={backend}", "agent.max_steps=2",
               "agent.sampling.max_new_tokens=1024", "agent.sampling.temperature=1.0"]
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.monotonic() + 300
    while len(leftovers(run_id)) < 2 and time.monotonic() < deadline:  # both episodes' sandboxes are up
        assert child.poll() is None, child.stderr.read()
        time.sleep(0.2)
    time.sleep(3)  # the problem statement is read and the first turns are decoding
    assert child.poll() is None and not (tmp_path / "run" / "trajectories.jsonl").exists()
    family = [child.pid] + [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
    began = time.monotonic()
    child.send_signal(signal.SIGINT)
    child.wait(timeout=60)
    stopped_s = time.monotonic() - began
    assert stopped_s < 15, f"{engine}: the eval took {stopped_s:.1f} s to stop"
    assert leftovers(run_id) == []
    assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
