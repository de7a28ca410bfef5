"""The classic harnesses' own code, run in a venv of their own: swebench 4.1.0 and swesmith, created once and cached.

swebench 5 (patchgym's extra) dropped the per-repo/version spec table that classic SWE-bench rows need, and swesmith
imports modules that only 4.x has, so neither fits in patchgym's environment. The venv lives at
`<patchgym store>/harness-venv/swebench-4.1.0` ($PATCHGYM_HOME, else /var/lib/patchgym as root, else
~/.cache/patchgym); it is made with `python -m venv` and `pip install swebench==4.1.0` plus `swesmith==0.0.9
--no-deps` (its imports need nothing beyond swebench's own dependencies). Measured here: 42 s on an idle machine,
1 min 54 s on a busy one, 488 MB.
The worker (harness_worker.py) reads requests (a kind and rows) as JSON lines on stdin and answers each with one JSON
line (specs, or SWE-smith verdicts). One worker serves a patchgym process for its lifetime: starting one costs 2-5 s
(importing swebench and swesmith), a request then milliseconds, which matters where every grade of a SWE-smith row
asks it for a verdict.
"""

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from patchgym.errors import UserError
from patchgym.files import file_lock
from patchgym.paths import store_dir

PACKAGES = ("swebench==4.1.0",)
NO_DEPS_PACKAGES = ("swesmith==0.0.9",)
WORKER = Path(__file__).with_name("harness_worker.py")


class HarnessVenvError(UserError):
    """The classic harness venv could not be created or its worker failed."""


def venv_dir() -> Path:
    return store_dir() / "harness-venv" / "swebench-4.1.0"


def ensure_venv() -> Path:
    """The venv's python, creating the venv on first use (a marker file says it is complete)."""
    root = venv_dir()
    python, done = root / "bin" / "python", root / ".complete"
    if done.is_file():
        return python
    root.parent.mkdir(parents=True, exist_ok=True)
    with file_lock("harness-venv"):  # two imports at once: the second waits for the first's venv
        if not done.is_file():
            _create(root, python)
            done.write_text(" ".join(PACKAGES + NO_DEPS_PACKAGES) + "\n")
    return python


def _create(root: Path, python: Path) -> None:
    print(f"creating {root} (swebench 4.1.0 + swesmith, once; 1-2 minutes)", file=sys.stderr)
    steps = [[sys.executable, "-m", "venv", "--clear", str(root)],
             [str(python), "-m", "pip", "install", "-q", *PACKAGES],
             [str(python), "-m", "pip", "install", "-q", "--no-deps", *NO_DEPS_PACKAGES]]
    for step in steps:
        run = subprocess.run(step, capture_output=True, text=True)
        if run.returncode:
            raise HarnessVenvError(f"creating the classic harness venv {root} failed at `{' '.join(step)}` "
                                   f"(exit {run.returncode}): {run.stderr.strip()[-2000:]}")


def derive(kind: str, rows: list[dict]) -> list[dict]:
    """One answer per row: {"spec": {...}} or {"error": "why"} (see harness_worker.py)."""
    return _ask(kind, rows)


def smith_grade(rows: list[dict]) -> list[dict]:
    """SWE-smith's own verdict per row (instance_id, repo, FAIL_TO_PASS, PASS_TO_PASS, log): {"report": {"statuses",
    "found", "resolved"}} or {"error": "why"}."""
    return _ask("smith_grade", rows)


class _Worker:
    """The worker process, its stderr in a temporary file (so that it never blocks on a full pipe), and the pid of the
    process that started it (a forked child starts its own rather than share the pipes)."""

    def __init__(self, python: Path):
        self.stderr = tempfile.TemporaryFile()
        # -I: the user's PYTHONPATH (patchgym, swebench 5) must not shadow the venv's packages.
        self.process = subprocess.Popen([str(python), "-I", str(WORKER)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, text=True, bufsize=1,
                                        env={**os.environ, "PYTHONWARNINGS": "ignore"})
        self.owner = os.getpid()

    def ask(self, line: str) -> str:
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
            return self.process.stdout.readline()
        except (BrokenPipeError, OSError):
            return ""

    def failure(self) -> str:
        self.stop()
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace").strip()[-2000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


_worker: _Worker | None = None
_lock = threading.Lock()


def _ask(kind: str, rows: list[dict]) -> list[dict]:
    global _worker
    if not rows:
        return []
    python = ensure_venv()
    with _lock:  # one request at a time on the pipe (rollout threads grade concurrently)
        if _worker is None or _worker.owner != os.getpid() or _worker.process.poll() is not None:
            _worker = _Worker(python)
        answer = _worker.ask(json.dumps({"kind": kind, "rows": rows}))
        if not answer:
            code, detail, _worker = _worker.process.poll(), _worker.failure(), None
            raise HarnessVenvError(f"the classic harness worker ({python}) failed (exit {code}): {detail}")
    answers = json.loads(answer)
    if len(answers) != len(rows):
        raise HarnessVenvError(f"the classic harness worker answered {len(answers)} rows for {len(rows)}")
    return answers


@atexit.register
def _stop_worker() -> None:
    if _worker is not None and _worker.owner == os.getpid():
        _worker.stop()
