"""Grading overhead: a whole grade (warm pool) against the bare test command in the same image, in one run.

    python bench/grading.py --tasks TASKS.jsonl [--backend local|docker] [--limit N] [--repeat K] [--json]
    python bench/grading.py --imported [--repeat K] [--test-seconds S] [--json]
    python bench/grading.py --pull [--gb 1.0] [--layers 4] [--repeat 2] [--json]      (runs bench/pull.py)

--imported (grading_cost): an imported row (SWE-bench's shape, its own image) graded by patchgym (docker backend,
fresh sandbox) against its eval script run by hand in the same image: `docker run`, apply the patch,
`docker exec bash eval.sh`, `docker rm`. Target: patchgym / by hand <= 1.2.

bare = the task's test command alone in a ready sandbox of its image (bug applied, nothing else): pytest's, or for a
JavaScript task its test files required by one node process under tape, as by hand;
grade = grade_patch of the gold fix: fresh sandbox from a warm pool, bug, snapshot, patch, restore the grader's
files, canaries, run as the agent's user with the structured report through the side channel, parse, judge.
Target: grade / bare <= 1.3.

The pull half is bench/pull.py: a 1 GB image from a local registry through patchgym against `docker pull`.
"""

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from patchgym.env.grading import tape
from patchgym.env.grading.families import family_of
from patchgym.env.grading.families.tape_report import TapeReport
from patchgym.env.grading.grader import grade_patch
from patchgym.env.workspace import apply_patch
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import read_tasks

TARGET = 1.3
IMPORTED_TARGET = 1.2


def bare_command(task) -> str:
    if not isinstance(family_of(task), TapeReport):
        return task.test_cmd
    driver = ("var path = require('path'); require(require('module').createRequire(path.join(process.cwd(), "
              "'index.js')).resolve('tape')); process.argv.slice(1).forEach(function (f) { require(path.resolve(f)); "
              "});")
    return f"node -e {shlex.quote(driver)} {' '.join(tape.test_targets(task.test_cmd))}"


def bare_ms(task, config: SandboxConfig, repeat: int) -> float:
    with open_sandbox(config, image=task.image or None) as sb:
        apply_patch(sb, task.bug_patch, task.workdir, "bug")
        samples = []
        for _ in range(repeat + 1):
            start = time.perf_counter()
            sb.exec(bare_command(task), cwd=task.workdir, timeout=1800)
            samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples[1:])  # the first run warms caches


def grade_ms(task, config: SandboxConfig, pools: PoolSet, repeat: int) -> float:
    samples = []
    for _ in range(repeat + 1):
        while len(pools.pool(task.image or None)._idle) < pools.size:
            time.sleep(0.01)  # measure warm-pool hits, as in a steady training loop
        start = time.perf_counter()
        grade = grade_patch(task, task.patch, config, timeout=1800, pools=pools)
        samples.append((time.perf_counter() - start) * 1000)
        if not grade.resolved:
            raise RuntimeError(f"{task.instance_id}: the gold patch did not resolve: {grade}")
    return statistics.median(samples[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--backend", default="local")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = SandboxConfig(backend=args.backend)
    rows = []
    with PoolSet(config, size=2, max_concurrency=4) as pools:
        for task in read_tasks(args.tasks)[: args.limit]:
            bare = bare_ms(task, config, args.repeat)
            graded = grade_ms(task, config, pools, args.repeat)
            rows.append({"instance_id": task.instance_id, "bare_ms": bare, "grade_ms": graded, "ratio": graded / bare})
    summary = {"backend": args.backend, "tasks": len(rows),
               "median_ratio": statistics.median(r["ratio"] for r in rows),
               "median_bare_ms": statistics.median(r["bare_ms"] for r in rows),
               "median_grade_ms": statistics.median(r["grade_ms"] for r in rows)}
    summary["target_met"] = summary["median_ratio"] <= TARGET
    if args.json:
        print(json.dumps({**summary, "per_task": rows}))
    else:
        table = Table(title=f"grading overhead ({args.backend}, warm pool)")
        for column in ("task", "bare ms", "grade ms", "ratio"):
            table.add_column(column)
        for r in rows:
            table.add_row(r["instance_id"], f"{r['bare_ms']:.0f}", f"{r['grade_ms']:.0f}", f"{r['ratio']:.2f}")
        Console().print(table)
        Console().print(f"median ratio {summary['median_ratio']:.2f} (target <= {TARGET}): "
                        + ("met" if summary["target_met"] else "MISSED"))
    return 0 if summary["target_met"] else 1


def _imported_row(tests_dir: Path, test_seconds: float):
    """The replica row of tests/env/test_grader_imported.py baked into an image of its own (pg-grading-bench)."""
    import subprocess
    import tempfile

    from patchgym.sandbox import images
    from patchgym.tasks import Task

    sys.path.insert(0, str(tests_dir))
    from env import test_grader_imported as replica  # noqa: E402 - the row the tests grade

    repo = {**replica.REPO,
            "tests/test_slow.py": f"import time\n\n\ndef test_slow():\n    time.sleep({test_seconds})\n"}
    tag = "pg-grading-bench:imported"
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in repo.items():
            (Path(tmp) / "testbed" / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / "testbed" / path).write_text(text)
        (Path(tmp) / "Dockerfile").write_text(f"FROM {images.ensure_docker_image(images.base_recipe())}\n"
                                              "COPY testbed /testbed\n"
                                              "RUN cd /testbed && git init -q && git add -A && "
                                              "git -c user.name=b -c user.email=b@b commit -qm base\n")
        subprocess.run(["docker", "build", "-q", "-t", tag, tmp], check=True, capture_output=True)
    diff = _git_diff
    test_patch = diff({}, {"tests/test_helper.py": replica.TEST_FILE})
    script = replica.EVAL_SCRIPT.format(test_patch=test_patch.rstrip("\n")).replace(
        "tests/test_other.py", "tests/test_other.py tests/test_slow.py")
    helper = "pkg/tests/helper.py"
    return Task(instance_id="bench__pkg-1", repo="bench/pkg", problem_statement="add subtracts", image=tag,
                FAIL_TO_PASS=[replica.F2P], PASS_TO_PASS=[replica.P2P, "tests/test_slow.py::test_slow"],
                patch=diff({helper: replica.REPO[helper]}, {helper: replica.HELPER}), test_patch=test_patch,
                eval_script=script, log_parser="pytest", source="swebench", validated=True)


def _git_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style diff from `before` to `after` ({path: text}), made by git itself."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        def run(*a):
            return subprocess.run(["git", *a], cwd=tmp, check=True, capture_output=True, text=True).stdout

        run("init", "-q")
        for files in (before, after):
            if files is after:
                run("rm", "-rqf", "--ignore-unmatch", ".")
            for path, text in files.items():
                (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / path).write_text(text)
            run("add", "-A")
            if files is before:
                run("-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "before", "--allow-empty")
        return run("diff", "--cached", "HEAD")


def _by_hand_s(task) -> float:
    """The row's eval script run by hand: start a container of its image, apply the patch, run eval.sh, remove it."""
    import subprocess

    start = time.perf_counter()
    cid = subprocess.run(["docker", "run", "-d", "--rm", task.image, "sleep", "infinity"], check=True,
                         capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run(["docker", "exec", "-i", "-w", task.workdir, cid, "git", "apply", "-"], input=task.patch,
                       text=True, check=True, capture_output=True)
        subprocess.run(["docker", "exec", "-i", cid, "bash", "-c", "cat > /eval.sh"], input=task.eval_script,
                       text=True, check=True, capture_output=True)
        out = subprocess.run(["docker", "exec", "-w", task.workdir, cid, "bash", "/eval.sh"], capture_output=True,
                             text=True).stdout
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    if "Test Exit Code: 0" not in out:
        raise RuntimeError(f"{task.instance_id}: the gold patch failed when run by hand:\n{out[-2000:]}")
    return time.perf_counter() - start


def grading_cost() -> int:
    """Grading an imported row through patchgym against running its eval script by hand in the same image."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imported", action="store_true", required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--test-seconds", type=float, default=5.0, help="how long the row's own tests take")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    task = _imported_row(Path(__file__).resolve().parents[1] / "tests", args.test_seconds)
    config = SandboxConfig(backend="docker")
    hand, graded = [], []
    try:
        for _ in range(args.repeat + 1):  # interleaved, so drift in the machine's load hits both alike
            hand.append(_by_hand_s(task))
            start = time.perf_counter()
            grade = grade_patch(task, task.patch, config, timeout=600)
            graded.append(time.perf_counter() - start)
            if not grade.resolved:
                raise RuntimeError(f"{task.instance_id}: the gold patch did not resolve through patchgym: {grade}")
    finally:
        import subprocess

        subprocess.run(["docker", "rmi", "-f", task.image], capture_output=True)
    summary = {"by_hand_s": statistics.median(hand[1:]), "patchgym_s": statistics.median(graded[1:]),
               "test_seconds": args.test_seconds, "repeat": args.repeat}  # the first round warms caches
    summary["ratio"] = summary["patchgym_s"] / summary["by_hand_s"]
    summary["target_met"] = summary["ratio"] <= IMPORTED_TARGET
    if args.json:
        print(json.dumps(summary))
    else:
        Console().print(f"imported row, tests {args.test_seconds:g} s: by hand {summary['by_hand_s']:.2f} s, "
                        f"patchgym {summary['patchgym_s']:.2f} s, ratio {summary['ratio']:.2f} "
                        f"(target <= {IMPORTED_TARGET}): " + ("met" if summary["target_met"] else "MISSED"))
    return 0 if summary["target_met"] else 1


def pull_time() -> int:
    """The pull half: a 1 GB image from a local registry through patchgym against `docker pull` (bench/pull.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pull

    return pull.main([a for a in sys.argv[1:] if a != "--pull"])


if __name__ == "__main__":
    sys.exit(grading_cost() if "--imported" in sys.argv else pull_time() if "--pull" in sys.argv else main())
