"""The classic harnesses' own code, run in a venv of their own: swebench 4.1.0 and swesmith, created once and cached.

swebench 5 (patchgym's extra) dropped the per-repo/version spec table that classic SWE-bench rows need, and swesmith
imports modules that only 4.x has, so neither fits in patchgym's environment. The venv lives at
`<patchgym store>/harness-venv/swebench-4.1.0` ($PATCHGYM_HOME, else /var/lib/patchgym as root, else
~/.cache/patchgym); it is made with `python -m venv` and `pip install swebench==4.1.0` plus `swesmith==0.0.9
--no-deps` (its imports need nothing beyond swebench's own dependencies). Measured here: 42 s on an idle machine,
1 min 54 s on a busy one, 488 MB; each worker call then costs 3-6 s (importing swebench and swesmith).
The worker (harness_worker.py) reads rows as JSON on stdin and writes specs, or SWE-smith verdicts, as JSON on stdout.
"""

import json
import os
import subprocess
import sys
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


def _ask(kind: str, rows: list[dict]) -> list[dict]:
    if not rows:
        return []
    python = ensure_venv()
    # -I: the user's PYTHONPATH (patchgym, swebench 5) must not shadow the venv's packages.
    run = subprocess.run([str(python), "-I", str(WORKER)], input=json.dumps({"kind": kind, "rows": rows}),
                         capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if run.returncode:
        raise HarnessVenvError(f"the classic harness worker ({python}) failed (exit {run.returncode}): "
                               f"{run.stderr.strip()[-2000:]}")
    answers = json.loads(run.stdout)
    if len(answers) != len(rows):
        raise HarnessVenvError(f"the classic harness worker answered {len(answers)} rows for {len(rows)}")
    return answers
