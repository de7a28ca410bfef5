"""A Qwen3-architecture model (random weights, Qwen3's real template with thinking) trains two GRPO++ iterations in
both history modes, with thinking on and off, the second after a resume, with 0 token mismatches in what it trained
on.

One setting runs on the tiny task in Docker (the trainer's own rollouts, real sandboxes and grading). The other two
play in the in-memory env (tests/memory_env.py): the random model never writes a tool call, so every step is a format
error that both envs answer with the same parser's message, no patch is made and nothing is graded; what those settings
prove (the history mode's re-rendering, thinking off's empty think blocks, the check) lies in the tokens, not the
sandbox."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory_env import MemoryEnv, memory_grade, memory_task
from patchgym.agent.check_tokens import check_run
from patchgym.cli import app
from patchgym.config import load_config
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.models import qwen3_tokenizer
from patchgym.rollout import RolloutEngine
from patchgym.tasks import write_tasks
from patchgym.train.loop import Trainer
from patchgym.train.metrics_schema import read_metrics

GRPO_PP = Path(__file__).resolve().parents[2] / "configs" / "grpo++.yaml"


def memory_rollouts(config, agent, *, run_dir, progress):
    return RolloutEngine(agent, config.sandbox, config.rollout, run_dir=run_dir, progress=progress,
                         make_env=lambda pools: MemoryEnv(), grader=memory_grade)


def two_iterations_and_a_resume(task, template_path, tmp_path, history, thinking, **trainer):
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([task], tasks_file)
    template = str(template_path("qwen3"))
    overrides = [
        "inference.model=tiny-qwen3", f"inference.chat_template={template}",
        f"inference.chat_template_kwargs={{enable_thinking: {str(thinking).lower()}}}", f"agent.history={history}",
        f"train.tasks={tasks_file}", "train.iterations=2", "train.tasks_per_iteration=1", "train.samples_per_task=2",
        "train.mini_batches=1", "train.keep_checkpoints=1", "agent.max_steps=3", "agent.max_format_errors=10",
        "agent.max_context_tokens=2048", "algorithm.norm_constant=2048", "agent.sampling.max_new_tokens=8",
        "rollout.max_sandboxes=2",
        # The random model never resolves: every advantage is 0. Kept in the loss (no compact filter) with an
        # entropy term, every row still runs forward and backward through the policy update.
        "algorithm.compact_filter=false", "algorithm.entropy_coef=0.001"]
    run = tmp_path / "run"
    Trainer(load_config([GRPO_PP], [*overrides, "train.iterations=1"]), run, progress=False, **trainer).run()
    Trainer(load_config([GRPO_PP], overrides), run, progress=False, **trainer).run(resume=True)
    lines = read_metrics(run)
    assert [line["iteration"] for line in lines] == [1, 2]
    assert all(line["trajectories"] == 2 and line["terminations"] == {"max_steps": 2} for line in lines)
    for line in lines:
        assert line["policy_tokens"] == 2 * line["sampled_tokens_per_trajectory"] and line["train_input_tokens"] > 0
        assert line["trained_trajectories"] == 2 and line["loss"] is not None
    extra = [line["stepwise_extra_tokens"] for line in lines]
    assert all(e > 0 for e in extra) if history == "template" else extra == [0, 0]
    result = check_run(run, configure_tokenizer(qwen3_tokenizer(), template, {"enable_thinking": thinking}))
    summary = result.summary()
    assert summary["trajectories"] == 4 and summary["failed"] == 0, [c.errors for c in result.trajectories]
    # The command re-renders each trajectory with the template it recorded, not the tokenizer's own (which lacks
    # enable_thinking=false's empty think block in every generation prompt).
    command = CliRunner().invoke(app, ["check-tokens", str(run), "--model", "tiny-qwen3", "--json"])
    assert command.exit_code == 0 and json.loads(command.output.splitlines()[-1])["failed"] == 0, command.output


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_two_grpo_pp_iterations_and_a_resume_with_exact_tokens_in_docker(backend, tiny, tiny_task,
                                                                         qwen3_template_path, tmp_path):
    two_iterations_and_a_resume(tiny_task, qwen3_template_path, tmp_path, history="keep", thinking=True)


@pytest.mark.parametrize("history, thinking", [("template", True), ("keep", False)])
def test_two_grpo_pp_iterations_and_a_resume_with_exact_tokens(tiny, qwen3_template_path, tmp_path, history,
                                                               thinking):
    two_iterations_and_a_resume(memory_task(), qwen3_template_path, tmp_path, history, thinking,
                                make_rollouts=memory_rollouts)
