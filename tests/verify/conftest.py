"""Fixtures for the verifiers: hand-made graded trajectories, and an HF engine over the tiny model."""

import pytest
import torch

from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.inference.hf import HFEngine

torch.set_num_threads(1)  # two cores, shared with other jobs


def trajectory(task_id: str, sample: int, *, resolved: bool, patch: str = "", steps: int = 2,
               statement: str = "calc.add(2, 3) returns -1, but 5 was expected.") -> Trajectory:
    """A finished, graded trajectory as an eval run writes it (a scripted one: no token ids)."""
    turns = [Turn(prompt_ids=[], completion_ids=[], logprobs=[], finish_reason="stop", close_ids=[],
                  action=f"Step {i}: let me look.\n<function=execute_bash>\n<parameter=cmd>cat calc/ops.py"
                         f"</parameter>\n</function>",
                  observation=f"def add(a, b):\n    return a - b  # seen at step {i}\n" * (i + 1))
             for i in range(steps)]
    messages = [{"role": "system", "content": "You are a programming agent."},
                {"role": "user", "content": f"Consider the following GitHub issue:\n<github_issue>\n{statement}\n"
                                            "</github_issue>\n\nImplement the changes."}]
    return Trajectory(task_id=task_id, trajectory_id=f"{task_id}#{sample}", sample=sample, messages=messages,
                      turns=turns, patch=patch, termination="submitted", grade={"resolved": resolved})


@pytest.fixture
def make_trajectory():
    return trajectory


@pytest.fixture
def tiny_engine(tiny):
    model, tokenizer = tiny
    with HFEngine(model, tokenizer, max_batch=4) as engine:
        yield engine
