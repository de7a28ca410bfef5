"""Rollout-engine throughput and overhead with a zero-latency script, on each sandbox backend, in one run.

    python bench/rollout.py [--backend docker --backend local] [--steps 10] [--concurrency 1,4,16] [--json]

steps/s: C trajectories at once (C = 1, 4, 16), each `--steps` tool calls (`execute_bash: true`) then finish, run by
the rollout engine without grading; environment steps per second of wall time.
overhead: the same single trajectory (reset, `--overhead-steps` tool calls, diff, close) through the rollout engine
vs the same calls on SWEEnv directly, in one thread; ratio = engine time / direct time. Target <= 1.1.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from patchgym.agent.config import AgentConfig
from patchgym.env.swe_env import SWEEnv
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.rollout import RolloutConfig, RolloutEngine, ScriptedAgent
from patchgym.sandbox import SandboxConfig
from patchgym.tasks import Task

TARGET = 1.1
STEP = render_call_xml(ToolCall("execute_bash", {"command": "true"}))
FINISH = render_call_xml(ToolCall("finish", {}))


class Script:
    """`steps` tool calls, then finish: the policy answers at once."""

    def __init__(self, steps: int):
        self.steps = steps

    def act(self, task: Task, observation: str, turn: int) -> str:
        return STEP if turn < self.steps else FINISH


def bench_task() -> Task:
    """A one-file repository on the base image (its bug patch creates the file)."""
    with tempfile.TemporaryDirectory() as tmp:
        def git(*a):
            return subprocess.run(["git", *a], cwd=tmp, check=True, capture_output=True, text=True).stdout

        git("init", "-q")
        Path(tmp, "calc.py").write_text("def add(a, b):\n    return a - b\n")
        git("add", "-A")
        diff = git("diff", "--cached", "--binary")
    return Task(instance_id="bench.rollout.0", repo="bench", problem_statement="add subtracts",
                FAIL_TO_PASS=["test_calc.py::test_add"], bug_patch=diff, source="bench")


def agent(steps: int) -> ScriptedAgent:
    return ScriptedAgent(Script(steps), AgentConfig(max_steps=steps + 1))


def rollout_s(task: Task, config: SandboxConfig, steps: int, concurrency: int, run_dir: Path) -> float:
    engine = RolloutEngine(agent(steps), config, RolloutConfig(max_sandboxes=concurrency), run_dir=run_dir,
                           progress=False, grade=False)
    start = time.perf_counter()
    trajectories = engine.run([task], samples=concurrency)
    elapsed = time.perf_counter() - start
    bad = [t for t in trajectories if t.termination != "submitted" or t.steps != steps + 1]
    if bad:
        raise RuntimeError(f"a scripted trajectory went wrong: {bad[0].termination} {bad[0].error}")
    return elapsed


def direct_s(task: Task, config: SandboxConfig, steps: int) -> float:
    start = time.perf_counter()
    env = SWEEnv(config, command_timeout=90)
    try:
        observation = env.reset(task)
        policy = Script(steps)
        for turn in range(steps + 1):
            result = env.step(policy.act(task, observation, turn))
            observation = result.observation
            if result.done:
                break
        env.patch(AgentConfig().max_patch_bytes)
    finally:
        env.close()
    return time.perf_counter() - start


def bench_backend(backend: str, args, tmp: Path) -> dict:
    config = SandboxConfig(backend=backend)
    task = bench_task()
    direct_s(task, config, 2)  # warm-up: image and page caches, on both paths
    rollout_s(task, config, 2, 1, tmp / f"{backend}-warm-up")
    out: dict = {}
    for c in args.concurrency:
        elapsed = rollout_s(task, config, args.steps, c, tmp / f"{backend}-c{c}")
        out[f"steps_per_s_c{c}"] = round(c * (args.steps + 1) / elapsed, 1)
    engine, direct = [], []
    for r in range(args.repeat):
        engine.append(rollout_s(task, config, args.overhead_steps, 1, tmp / f"{backend}-overhead-{r}"))
        direct.append(direct_s(task, config, args.overhead_steps))
    out["engine_ms_per_step"] = round(statistics.median(engine) * 1000 / (args.overhead_steps + 1), 2)
    out["direct_ms_per_step"] = round(statistics.median(direct) * 1000 / (args.overhead_steps + 1), 2)
    out["overhead_ratio"] = round(statistics.median(engine) / statistics.median(direct), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", action="append", default=None, help="docker and/or local (default: both)")
    parser.add_argument("--steps", type=int, default=10, help="tool calls per trajectory in the throughput runs")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    parser.add_argument("--overhead-steps", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3, help="overhead runs per side (median)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict = {"steps": args.steps, "overhead_steps": args.overhead_steps, "target_overhead_ratio": TARGET}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backend or ["docker", "local"]:
            result[backend] = bench_backend(backend, args, Path(tmp))
    result["overhead_ratio"] = max(result[b]["overhead_ratio"] for b in args.backend or ["docker", "local"])
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
