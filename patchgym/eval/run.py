"""Run episodes (policy <-> SWEEnv), grade each final patch, and summarise; results are written as they complete."""

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.progress import Progress

from patchgym.agent.reference import Policy
from patchgym.env.grading.grader import grade_patch
from patchgym.env.swe_env import SWEEnv
from patchgym.sandbox import SandboxConfig, SandboxError
from patchgym.tasks import Task


@dataclass
class EpisodeResult:
    instance_id: str
    resolved: bool
    termination: str  # submitted | max_steps | infra_error
    steps: int
    format_errors: int
    patch: str
    grade: dict
    error: str | None
    seconds: float


def run_episode(task: Task, policy: Policy, config: SandboxConfig, *, max_steps: int, test_timeout: float) -> EpisodeResult:
    start = time.monotonic()
    env = SWEEnv(config)
    try:
        observation = env.reset(task)
        termination = "max_steps"
        for turn in range(max_steps):
            step = env.step(policy.act(task, observation, turn))
            observation = step.observation
            if step.done:
                termination = "submitted"
                break
        patch = env.patch()
        steps, format_errors = env.steps, env.format_errors
    except SandboxError as exc:
        return EpisodeResult(task.instance_id, False, "infra_error", env.steps, env.format_errors, "", {},
                             f"infra: {exc}", time.monotonic() - start)
    finally:
        env.close()
    grade = grade_patch(task, patch, config, timeout=test_timeout)
    return EpisodeResult(task.instance_id, grade.resolved, termination, steps, format_errors, patch,
                         grade.to_dict(), grade.error, time.monotonic() - start)


def evaluate(tasks: list[Task], policy: Policy, config: SandboxConfig, out: Path | None = None, *,
             workers: int = 2, max_steps: int = 100, test_timeout: float = 1800.0, progress: bool = True) -> dict:
    """Every task once; each result is appended to `out/results.jsonl` as it completes. Returns the summary."""
    results: list[EpisodeResult] = []
    lock = threading.Lock()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    with Progress(disable=not progress) as bar, ThreadPoolExecutor(max_workers=workers) as pool:
        job = bar.add_task("episodes", total=len(tasks))
        futures = [pool.submit(run_episode, t, policy, config, max_steps=max_steps, test_timeout=test_timeout)
                   for t in tasks]
        for future in as_completed(futures):
            result = future.result()
            with lock:
                results.append(result)
                if out is not None:
                    with open(out / "results.jsonl", "a") as f:
                        f.write(json.dumps(asdict(result)) + "\n")
                        f.flush()
                        os.fsync(f.fileno())
            bar.advance(job)
    judged = [r for r in results if r.termination != "infra_error"]
    summary = {
        "tasks": len(tasks),
        "resolved": sum(r.resolved for r in results),
        "resolve_rate": sum(r.resolved for r in judged) / len(judged) if judged else 0.0,
        "infra_errors": len(results) - len(judged),
        "grading_errors": sum(1 for r in judged if r.error),
        "by_termination": {t: sum(r.termination == t for r in results) for t in sorted({r.termination for r in results})},
    }
    if out is not None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
