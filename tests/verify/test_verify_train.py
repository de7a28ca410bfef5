"""`patchgym train-verifier` on a few hand-made graded trajectories with the tiny model: the verdict loss goes down,
only the verdict token is trained, and the saved directory loads (and scores) as a model."""

import json

import pytest
import torch
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.inference.hf import HFEngine
from patchgym.inference.models import load_model
from patchgym.verify.config import VerifierConfig
from patchgym.verify.execution_free import score_trajectories, verdict_ids
from patchgym.verify.train import verdict_examples


def _write(path, trajectories):
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    return path


def _examples(make_trajectory):
    good = [make_trajectory("t1", i, resolved=True, patch="--- a/calc/ops.py\n+++ b/calc/ops.py\n-    return a - b\n"
                                                            "+    return a + b\n") for i in range(3)]
    bad = [make_trajectory("t1", 3 + i, resolved=False, patch="") for i in range(3)]
    infra = make_trajectory("t1", 9, resolved=False)
    infra.termination = "infra_error"
    return good, bad, infra


def test_examples_train_only_the_verdict_token(tiny, make_trajectory):
    _, tokenizer = tiny
    good, bad, _ = _examples(make_trajectory)
    yes, no = verdict_ids(tokenizer, VerifierConfig())
    examples = verdict_examples(tokenizer, [good[0], bad[0]], VerifierConfig(), 2000)
    for example, label in zip(examples, (yes, no)):
        assert example.input_ids[-1] == label and example.loss_mask == [0] * (len(example) - 1) + [1]
        assert tokenizer.decode(example.input_ids[:-1]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("lora", [False, True])
def test_train_verifier_lowers_the_verdict_loss_and_saves_a_loadable_model(lora, tiny, make_trajectory, tmp_path):
    good, bad, infra = _examples(make_trajectory)
    files = [_write(tmp_path / "a.jsonl", good + [infra]), _write(tmp_path / "b.jsonl", bad)]
    out = tmp_path / "verifier"
    overrides = ["verifier.lr=0.003", "verifier.epochs=6", "verifier.batch_size=3"]
    if lora:
        overrides.append("train.lora={r: 4, lora_alpha: 16, target_modules: all-linear}")
    result = CliRunner().invoke(app, ["train-verifier", "--trajectories", str(files[0]), str(files[1]),
                                      "--model", "tiny", "--out", str(out), *overrides])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["examples"] == 6 and summary["resolved"] == 3 and summary["left_out"] == 1
    assert summary["steps"] == 12 and summary["lora"] is lora
    assert summary["loss_after"] < summary["loss_before"] - 0.1, summary
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 12

    model, tokenizer = load_model(str(out))
    assert not any("lora" in name for name, _ in model.named_parameters())
    with HFEngine(model, tokenizer) as engine:
        scores = score_trajectories(engine, {t.trajectory_id: (t, None) for t in good + bad}, VerifierConfig())
    # It learned the training labels: every resolved trajectory scores above every unresolved one.
    assert min(scores[t.trajectory_id] for t in good) > max(scores[t.trajectory_id] for t in bad)
    base, _ = load_model("tiny")
    changed = [n for n, p in model.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert changed
