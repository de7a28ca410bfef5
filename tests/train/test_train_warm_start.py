"""train.warm_start in the fast tier: the Trainer on the tiny model, its rollouts played in the in-memory Env.

The demonstrations are what `patchgym demos` records: the fix played through the agent loop and the rollout engine
as tokens of the policy's tokenizer, graded, resolved. The warm start runs once before RL, lowers the SFT loss on
them, is checkpointed as iter-0, and a run killed before or after that checkpoint neither repeats nor skips it.
"""

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from memory_env import MemoryEnv, memory_grade, memory_task
from patchgym.agent.config import AgentConfig
from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.config import load_config
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.inference import Generation
from patchgym.rollout import ModelAgent, RolloutEngine
from patchgym.sandbox import SandboxConfig
from patchgym.tasks import write_tasks
from patchgym.train.batch import collate
from patchgym.train.checkpoint import list_checkpoints, read_state
from patchgym.train.logprobs import sequence_logprobs
from patchgym.train.loop import Trainer
from patchgym.train.metrics_schema import read_metrics
from patchgym.train.sft import DemonstrationError, read_demonstrations

torch.set_num_threads(1)

FIX = [render_call_xml(ToolCall("file_editor", {"command": "view", "path": "/testbed/calc.py"})),
       render_call_xml(ToolCall("file_editor", {"command": "str_replace", "path": "/testbed/calc.py",
                                                "old_str": "a - b", "new_str": "a + b"})),
       render_call_xml(ToolCall("finish", {}))]


SYSTEM_PROMPT = "Fix the bug with one tool call per turn."  # short sequences: the test's time goes into them


class FixEngine:
    """Samples the fix, turn by turn, as canonical tokens of `tokenizer` (the turn is read off the prompt, so
    concurrent episodes do not mix)."""

    needs_messages = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def agenerate(self, prompt_ids, params) -> Generation:
        turn = self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        ids = self.tokenizer.encode(FIX[turn], add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")


def memory_rollouts(config, agent, *, run_dir, progress):
    return RolloutEngine(agent, config.sandbox, config.rollout, run_dir=run_dir, progress=progress,
                         make_env=lambda pools: MemoryEnv(), grader=memory_grade)


class Killed(Exception):
    """Stands for kill -9 at the first RL rollouts, i.e. after the warm start and its checkpoint."""


def killed_at_rollouts(config, agent, *, run_dir, progress):
    raise Killed(run_dir)


@pytest.fixture
def demos(tiny, tmp_path):
    """A run directory of 2 resolved, token-carrying demonstrations of a memory task."""
    agent = ModelAgent(FixEngine(tiny[1]), AgentConfig(system_prompt=SYSTEM_PROMPT))
    trajectories = RolloutEngine(agent, SandboxConfig(), run_dir=tmp_path / "demos", progress=False,
                                 make_env=lambda pools: MemoryEnv(), grader=memory_grade).run(
        [memory_task(0)], samples=2)
    assert all(t.resolved and t.sampled_tokens > 0 for t in trajectories)
    return tmp_path / "demos"


def config(tmp_path, demos_path, *extra):
    tasks = tmp_path / "tasks.jsonl"
    write_tasks([memory_task(0), memory_task(1)], tasks)
    return load_config(overrides=[
        "inference.model=tiny", f"train.tasks={tasks}", "train.iterations=2", "train.tasks_per_iteration=1",
        "train.samples_per_task=2", "train.lr=0.01", "train.weight_decay=0", "train.keep_checkpoints=5",
        "train.sft_batch_size=2", f"train.warm_start={{trajectories: {demos_path}, epochs: 2, lr: 0.01}}",
        "train.loggers=[jsonl]", f"agent.system_prompt='{SYSTEM_PROMPT}'", "agent.max_steps=2",
        "agent.max_format_errors=1", "agent.sampling.max_new_tokens=8", "algorithm.advantage=rloo", *extra])


def weights(checkpoint):
    return AutoModelForCausalLM.from_pretrained(checkpoint / "model").state_dict()


def nll(model, sequences) -> float:
    """Token-mean negative log-likelihood of the sampled tokens of `sequences`."""
    batch = collate(sequences, pad_id=0)
    with torch.no_grad():
        logprobs = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], positions=batch["loss_mask"])
    return float(-(logprobs * batch["loss_mask"]).sum() / batch["loss_mask"].sum())


def test_warm_start_runs_once_lowers_the_loss_and_a_killed_run_neither_repeats_nor_skips_it(
        tiny, demos, tmp_path, caplog):
    # uncached: the warm start must really run again below (test_warm_cache.py covers the reuse)
    cfg, run = config(tmp_path, demos, "train.warm_start.cache=false"), tmp_path / "run"
    with pytest.raises(Killed):  # killed after the warm start's checkpoint
        Trainer(cfg, run, progress=False, make_rollouts=killed_at_rollouts).run()
    (warm,) = read_metrics(run)
    assert warm["iteration"] == 0 and warm["warm_start"]["trajectories"] == 2
    assert warm["warm_start"]["epochs"] == 2 and warm["warm_start"]["optimizer_steps"] == 2  # both in one step
    assert warm["warm_start"]["tokens"] == sum(s.policy_tokens for s in read_demonstrations(demos).sequences)
    losses = warm["warm_start"]["sft_loss"]
    assert losses[0] > losses[1] > 0, losses
    (first,) = list_checkpoints(run)
    assert first.name == "iter-0" and read_state(first)["warm_started"] and read_state(first)["iteration"] == 0
    tuned = weights(first)
    base = tiny[0].state_dict()
    assert any(not torch.equal(base[k], tuned[k]) for k in base)
    demo_sequences = read_demonstrations(demos).sequences
    warm_model = AutoModelForCausalLM.from_pretrained(first / "model")
    assert nll(warm_model, demo_sequences) < nll(tiny[0], demo_sequences) - 0.5

    # Killed during the warm start, after its metrics line but before its checkpoint (saved atomically, so on disk
    # that is: no iter-0): resuming runs it again, and metrics.jsonl holds its line once.
    for path in (first / "model").iterdir():
        path.unlink()
    (first / "model").rmdir()
    for path in first.iterdir():
        path.unlink()
    first.rmdir()
    with pytest.raises(Killed):
        Trainer(cfg, run, progress=False, make_rollouts=killed_at_rollouts).run(resume=True)
    assert [m["iteration"] for m in read_metrics(run)] == [0]
    assert [p.name for p in list_checkpoints(run)] == ["iter-0"]
    redone = weights(list_checkpoints(run)[0])
    assert all(torch.equal(tuned[k], redone[k]) for k in tuned)  # the same seeded warm start, from the base model

    # Killed after it: resuming goes straight to RL from the warm weights.
    with caplog.at_level(logging.WARNING, logger="patchgym.train.loop"):
        Trainer(cfg, run, progress=False, make_rollouts=memory_rollouts).run(resume=True)
    lines = read_metrics(run)
    assert [m["iteration"] for m in lines] == [0, 1, 2] and "warm_start" in lines[0]
    assert [p.name for p in list_checkpoints(run)] == ["iter-0", "iter-1", "iter-2"]
    assert read_state(list_checkpoints(run)[-1])["warm_started"]
    # The tiny model never writes a tool call: every advantage is 0 and the AdamW step (no weight decay) leaves the
    # weights as they were, so iteration 1 starts where the warm start ended (not from the base model, not warmed
    # twice).
    after_rl = weights(list_checkpoints(run)[1])
    assert all(torch.equal(tuned[k], after_rl[k]) for k in tuned)
    for line in lines[1:]:
        assert line["groups"] == 1 and line["nonzero_advantage_group_fraction"] == 0.0
        assert line["termination_fractions"]["format_errors"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if "every group has advantage 0" in r.getMessage()]
    assert len(warnings) == 1 and "Likely cause: format errors" in warnings[0], warnings


def test_demonstrations_without_a_resolved_token_carrying_trajectory_are_refused_naming_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DemonstrationError, match=f"'{empty}' holds no usable demonstration"):
        Trainer(config(tmp_path, empty), tmp_path / "run", progress=False, make_rollouts=memory_rollouts).run()
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()

    sampled = Turn(prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[0.0, 0.0], finish_reason="stop", close_ids=[],
                   action="x")
    scripted = Turn(prompt_ids=[], completion_ids=[], logprobs=[], finish_reason="stop", close_ids=[],
                   action="x")
    unresolved = Trajectory(task_id="a", trajectory_id="a#0", turns=[sampled], termination="submitted",
                            grade={"resolved": False})
    tokenless = Trajectory(task_id="a", trajectory_id="a#1", turns=[scripted], termination="submitted",
                           grade={"resolved": True})
    useless = tmp_path / "useless.jsonl"
    useless.write_text(unresolved.model_dump_json() + "\n" + tokenless.model_dump_json() + "\n")
    with pytest.raises(DemonstrationError, match=f"'{useless}' holds no usable .* of its 2 trajectories 1 did not "
                                                 "resolve"):
        read_demonstrations(useless)
    with pytest.raises(DemonstrationError, match="nope.jsonl' not found"):
        read_demonstrations(tmp_path / "nope.jsonl")
    good = Trajectory.model_validate({**unresolved.model_dump(), "trajectory_id": "a#2", "grade": {"resolved": True}})
    useless.write_text(useless.read_text() + good.model_dump_json() + "\n")
    demonstrations = read_demonstrations(useless)
    assert (demonstrations.read, demonstrations.trajectories, demonstrations.tokens) == (3, 1, 2)


def test_a_trainer_with_progress_shows_a_bar_of_every_warm_start_step(tiny, demos, tmp_path, monkeypatch):
    """With progress on, the warm start's bar advances once per SFT step (2 demos, 2 per step, 2 epochs: 2 steps),
    each with its epoch and loss; without it no bar is made. The steps run on train.threads threads, and the
    process has its own count back after."""
    from patchgym.train import sft

    shown, threads = [], []
    make_bar = sft.step_bar

    def step_bar(label, total):
        bar = make_bar(label, total)
        update = bar.update

        def advance(task, **kwargs):
            shown.append((not bar.disable, kwargs["description"]))
            threads.append(torch.get_num_threads())
            update(task, **kwargs)

        bar.update = advance
        return bar

    monkeypatch.setattr(sft, "step_bar", step_bar)
    cfg = config(tmp_path, demos, "train.iterations=1", "train.threads=2", "train.warm_start.cache=false")
    Trainer(cfg, tmp_path / "run", progress=True, make_rollouts=memory_rollouts).run()
    assert [bar for bar, _ in shown] == [True, True]
    assert shown[0][1].startswith("epoch 1/2, loss ") and shown[1][1].startswith("epoch 2/2, loss ")
    assert threads == [2, 2] and torch.get_num_threads() == 1
    shown.clear()
    Trainer(cfg, tmp_path / "quiet", progress=False, make_rollouts=memory_rollouts).run()
    assert [bar for bar, _ in shown] == [False, False]


def test_a_bf16_warm_start_trains_like_fp32_each_step_computing_with_the_weights_of_the_step_before(
        tiny, demos, tmp_path):
    """train.warm_start.dtype bf16 (autocast on this CPU): every SFT step sees the weights the previous one left,
    so the loss falls epoch by epoch and the warm model fits the demonstrations about as well as the fp32 one.
    (With autocast's cast cache on over the whole warm start, each forward reused the bf16 copies of the base
    weights: the loss stayed where it began while AdamW moved the weights on.)"""
    runs = {}
    for dtype in ("fp32", "bf16"):
        cfg = config(tmp_path, demos, "train.iterations=1", "train.warm_start.cache=false",
                     "train.warm_start.epochs=4", f"train.warm_start.dtype={dtype}")
        with pytest.raises(Killed):
            Trainer(cfg, tmp_path / dtype, progress=False, make_rollouts=killed_at_rollouts).run()
        (line,) = read_metrics(tmp_path / dtype)
        losses = line["warm_start"]["sft_loss"]
        assert all(a > b for a, b in zip(losses, losses[1:])), (dtype, losses)
        runs[dtype] = (losses, AutoModelForCausalLM.from_pretrained(list_checkpoints(tmp_path / dtype)[0] / "model"))
    (fp32_losses, fp32), (bf16_losses, bf16) = runs["fp32"], runs["bf16"]
    drop = fp32_losses[0] - fp32_losses[-1]
    # each epoch's loss within a tenth of fp32's whole drop (the cast cache left bf16's last epoch 55% of it behind)
    assert all(abs(a - b) < 0.1 * drop for a, b in zip(fp32_losses, bf16_losses)), (fp32_losses, bf16_losses)
    sequences = read_demonstrations(demos).sequences
    base, after_fp32, after_bf16 = nll(tiny[0], sequences), nll(fp32, sequences), nll(bf16, sequences)
    assert after_bf16 < base - 1.0 and abs(after_bf16 - after_fp32) < 0.1 * (base - after_fp32), (
        base, after_fp32, after_bf16)
