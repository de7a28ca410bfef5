"""`patchgym report DIR` on a learning benchmark's directory (bench/learning.py's DIR/learning.json): the stages'
resolve rates and the two runs' reward curves are drawn; a result without iterations says so instead."""

import json

from PIL import Image

from patchgym.report import run_kind, write_report


def rate(p: float, se: float) -> dict:
    return {"rate": p, "se": se, "tasks": 12, "attempts": 48, "resolved": round(48 * p)}


def test_a_learning_directory_plots_its_stages_and_curves(tmp_path):
    result = {"train": {"base": rate(0, 0), "warm": rate(0.1, 0.05), "rl": rate(0.3, 0.08), "flipped": rate(0.05, 0.03)},
              "heldout": {"base": rate(0, 0), "warm": rate(0.05, 0.03)},
              "curves": {"rl": [{"iteration": 1, "reward_mean": 0.1}, {"iteration": 2, "reward_mean": 0.25}],
                         "flipped": [{"iteration": 1, "reward_mean": 0.1}]}, "ok": True}
    (tmp_path / "learning.json").write_text(json.dumps(result))
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "metrics.jsonl").write_text("")  # the stages' runs inside do not make DIR a train run
    assert run_kind(tmp_path) == "learning"
    html = write_report(tmp_path).read_text()
    for name in ("learning_rates.png", "learning_reward.png"):
        assert Image.open(tmp_path / "report" / name).size == (900, 500)
        assert f'src="report/{name}"' in html
    result["curves"] = {"rl": [], "flipped": []}
    (tmp_path / "learning.json").write_text(json.dumps(result))
    html = write_report(tmp_path).read_text()
    assert "Skipped: learning.json has no training iterations yet" in html
    assert not (tmp_path / "report" / "learning_reward.png").exists()
