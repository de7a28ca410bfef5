"""`patchgym report DIR` on a learning benchmark's directory (bench/learning.py's DIR/learning.json): both runs'
per-iteration resolve rates and their paired gains are drawn; a result without iterations says so instead."""

import json

from PIL import Image

from patchgym.report import run_kind, write_report


def point(n: int, rate: float, se: float) -> dict:
    return {"iteration": n, "rate": rate, "se": se, "tasks": 5, "attempts": 20, "resolved": round(20 * rate),
            "reward_mean": rate}


def test_a_learning_directory_plots_its_curves_and_gains(tmp_path):
    result = {"runs": {
        "rl": {"curve": [point(1, 0.3, 0.1), point(2, 0.45, 0.1)],
               "gain": {"tasks": 5, "mean": 0.2, "se": 0.05, "threshold": 0.1, "significant": True}},
        "flipped": {"curve": [point(1, 0.3, 0.1), point(2, 0.2, 0.08)],
                    "gain": {"tasks": 5, "mean": -0.1, "se": 0.06, "threshold": 0.12, "significant": False}}},
        "ok": True}
    (tmp_path / "learning.json").write_text(json.dumps(result))
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "metrics.jsonl").write_text("")  # the stages' runs inside do not make DIR a train run
    assert run_kind(tmp_path) == "learning"
    html = write_report(tmp_path).read_text()
    for name in ("learning_iterations.png", "learning_gain.png"):
        assert Image.open(tmp_path / "report" / name).size == (900, 500)
        assert f'src="report/{name}"' in html
    (tmp_path / "learning.json").write_text(json.dumps({"band": {"kept": 0}, "ok": False}))
    html = write_report(tmp_path).read_text()
    assert "Skipped: learning.json has no training iterations yet" in html
    assert "Skipped: learning.json has no final evaluation yet" in html
    assert not (tmp_path / "report" / "learning_iterations.png").exists()
