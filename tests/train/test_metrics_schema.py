"""patchgym.train.metrics_schema loads without torch, and so does the report that reads a train run's metrics.jsonl
through it: with torch made unimportable, the trainer's own metrics module fails to load and these do not."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NO_TORCH = "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ModuleNotFoundError


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_metrics_schema_and_the_report_load_without_torch(tmp_path):
    blocked = python("import patchgym.train.metrics")
    assert blocked.returncode != 0 and "import of torch halted" in blocked.stderr, blocked.stderr
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1, "resolve_rate": 0.5}\n{"iteration": 2, "resol')
    loaded = python("from pathlib import Path\n"
                    "from patchgym.report.html import load_run\n"
                    "from patchgym.train.metrics_schema import KEYS, UPDATE_KEYS\n"
                    "assert 'resolve_rate' in KEYS and 'loss' in UPDATE_KEYS\n"
                    f"print(load_run(Path({str(tmp_path)!r})).metrics)")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[{'iteration': 1, 'resolve_rate': 0.5}]"  # the line cut by a crash left out
