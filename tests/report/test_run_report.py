"""`patchgym report` on hand-made eval, train and select runs: the PNGs are real images of the promised size, the HTML
references exist, plots without data are skipped with the reason, and tokens split at the tool call."""

import json
import re
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.cli import app
from patchgym.eval.metrics import summarize
from patchgym.report.html import TRAIN_COLUMNS
from patchgym.report.runs import run_kind, split_action, turn_tokens
from patchgym.train.metrics_schema import KEYS, UPDATE_KEYS

runner = CliRunner()
PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
CALL = "<function=execute_bash>\n<parameter=command>ls</parameter>\n</function>"


def turn(thought: str, sampled: int, format_error: bool = False) -> Turn:
    action = thought if format_error else thought + CALL
    return Turn(prompt_ids=[1] * 20, completion_ids=[7] * sampled, logprobs=[-0.5] * sampled, finish_reason="stop",
                close_ids=[2], action=action, format_error=format_error, observation="file.py\n" * 3,
                tool_call=None if format_error else {"name": "execute_bash", "arguments": {"command": "ls"}},
                exit_code=None if format_error else 0, generate_s=0.5, step_s=0.25)


def trajectory(task: str, sample: int, resolved: bool, termination: str, steps: int) -> Trajectory:
    return Trajectory(task_id=task, trajectory_id=f"{task}#{sample}", sample=sample, termination=termination,
                      turns=[turn("Let me look at the files first. ", 40) for _ in range(steps)],
                      patch=PATCH if resolved else "",
                      grade={"resolved": resolved, "duration": 2.0, "error": None if resolved else "empty_patch"},
                      seconds=3.0 * steps)


def write_lines(path: Path, records: list[Trajectory]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t.model_dump_json() + "\n" for t in records))


@pytest.fixture
def eval_run(tmp_path: Path) -> Path:
    run = tmp_path / "eval"
    records = [trajectory("alpha-1", 0, True, "submitted", 2), trajectory("alpha-1", 1, False, "max_steps", 5),
               trajectory("beta-2", 0, False, "format_errors", 3), trajectory("beta-2", 1, True, "submitted", 4)]
    write_lines(run / "trajectories.jsonl", records)
    (run / "run.json").write_text(json.dumps({"kind": "eval", "model": "tiny", "runs": 2}))
    (run / "summary.json").write_text(json.dumps(summarize(records, runs=2)))
    return run


@pytest.fixture
def train_run(tmp_path: Path) -> Path:
    run = tmp_path / "train"
    lines = [{"iteration": 0, "warm_start": {"source": "runs/demos", "epochs": 2, "trajectories": 6, "tokens": 900,
                                             "sft_loss": [1.25, 0.5]}}]
    for n in range(1, 5):
        write_lines(run / "rollouts" / f"iter-{n}" / "trajectories.jsonl",
                    [trajectory("alpha-1", g, g < n // 2, "submitted" if g < n // 2 else "max_steps", 2 + g)
                     for g in range(4)])
        lines.append({"iteration": n, "reward_mean": 0.1 * n, "reward_std": 0.05, "resolve_rate": 0.1 * n,
                      "resolved": n // 2, "trajectories": 4, "rollout_logprob_gap": 0.02 / n, "entropy": 1.5,
                      "terminations": {"submitted": n // 2, "max_steps": 4 - n // 2}, "time_rollout_s": 30.0 + n,
                      "nonzero_advantage_group_fraction": 1.0 if 0 < n // 2 < 4 else 0.0,
                      "termination_fractions": {"submitted": n // 2 / 4, "max_steps": 1 - n // 2 / 4, "timeout": 0.0},
                      "time_grading_s": 8.0, "time_training_s": 12.0, "time_weight_sync_s": 1.5})
    lines[3].pop("rollout_logprob_gap")  # a line without a key the report uses
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"iteration": 5, "rew')
    return run


@pytest.fixture
def select_run(tmp_path: Path) -> Path:
    run = tmp_path / "select"
    run.mkdir()
    values = {1: (0.2, 0.2), 2: (0.3, 0.35), 4: (0.36, 0.45), 8: (0.4, 0.55), 16: (0.42, 0.6)}
    summary = {key: value for k, (best, oracle) in values.items()
               for key, value in ((f"best@{k}", best), (f"pass@{k}", oracle))}
    (run / "summary.json").write_text(json.dumps({**summary, "verifier": "hybrid", "tasks": 10}))
    return run


def report(run: Path) -> str:
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    return (run / "report.html").read_text()


def check_pngs(run: Path, page: str, expected: set[str]) -> None:
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert {Path(s).name for s in sources} == expected
    for source in sources:
        path = run / source  # relative to the HTML file
        assert path.is_file() and path.stat().st_size > 5000, source
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (900, 500), (source, image.size)
            colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
            assert len(colours) > 20, f"{source} is (almost) one colour"
            assert max(count for count, _ in colours) < 0.97 * 900 * 500, f"{source} is nearly blank"
    assert "http://" not in page and "https://" not in page  # no network assets


def test_eval_report_has_pass_at_k_steps_tokens_terminations_and_time(eval_run):
    page = report(eval_run)
    check_pngs(eval_run, page, {"pass_at_k.png", "steps.png", "tokens.png", "terminations.png", "time.png"})
    assert "Skipped: only train runs have iterations (eval runs do not)" in page
    assert "Skipped: only train runs compare rollout and trainer logprobs" in page
    assert not (eval_run / "report" / "reward.png").exists()
    assert "<td>pass@1</td><td>50.0%</td>" in page and "<td>by_termination/submitted/count</td><td>2</td>" in page


def test_train_report_has_curves_per_iteration_and_skips_pass_at_k(train_run):
    page = report(train_run)
    check_pngs(train_run, page, {"reward.png", "gain.png", "signal.png", "steps.png", "tokens.png",
                                 "terminations.png", "time.png", "logprob_gap.png"})
    assert ("<td>gain on the tasks of every iteration</td><td>iteration 1 -&gt; 4: +50.0 pts on 1 task; one task has "
            "no spread to judge noise by</td>") in page
    assert "Skipped: train runs have no Pass@k" in page
    assert "<th>iteration</th>" in page and "<th>nonzero_advantage_group_fraction</th>" in page
    assert "<tr><td>1</td>" in page and "<tr><td>0</td>" not in page  # one row per RL iteration, none for warm start
    assert "<td>iterations in metrics.jsonl</td><td>4</td>" in page and "<td>100.0%</td>" in page
    assert ("<td>warm start</td><td>2 epochs of SFT on 6 demonstrations (900 tokens) from runs/demos; loss per "
            "epoch 1.25 -&gt; 0.5</td>") in page
    assert "<td>trajectories read</td><td>16</td>" in page


def test_the_train_table_shows_keys_of_the_metrics_schema():
    assert set(TRAIN_COLUMNS) <= set(KEYS) | set(UPDATE_KEYS), set(TRAIN_COLUMNS) - set(KEYS) - set(UPDATE_KEYS)


def test_select_report_plots_best_at_k_against_pass_at_k(select_run):
    page = report(select_run)
    check_pngs(select_run, page, {"pass_at_k.png"})
    assert "<tr><td>16</td><td>42.0%</td><td>60.0%</td></tr>" in page
    assert "Skipped: select runs hold no trajectories" in page


def test_a_plot_without_data_is_skipped_and_its_stale_png_removed(eval_run):
    report(eval_run)
    records = [json.loads(line) for line in (eval_run / "trajectories.jsonl").read_text().splitlines()]
    for record in records:  # a script samples no tokens
        for t in record["turns"]:
            t["completion_ids"], t["logprobs"] = [], []
    (eval_run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = report(eval_run)
    assert "Skipped: no sampled tokens" in page and not (eval_run / "report" / "tokens.png").exists()


def test_run_kind_comes_from_the_files(eval_run, train_run, select_run, tmp_path):
    assert (run_kind(eval_run), run_kind(train_run), run_kind(select_run)) == ("eval", "train", "select")
    result = runner.invoke(app, ["report", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "not a train, eval, select or learning run" in result.output


def test_thinking_is_the_text_before_the_tool_call():
    thought = "I should list the files. "  # 25 characters, then 69 of the call
    assert split_action(thought + CALL) == (thought, CALL)
    assert split_action("no call at all") == ("no call at all", "")
    assert split_action('ok {"name": "finish", "arguments": {}}') == ("ok ", '{"name": "finish", "arguments": {}}')
    assert len(CALL) == 69 and turn_tokens(turn(thought, 94)) == (25, 69)
    assert turn_tokens(turn(thought, 10)) == (3, 7)  # 10 * 25 / 94 = 2.66
    assert turn_tokens(turn("garbage", 10, format_error=True)) == (10, 0)
