"""Reading a Harbor verifier's reward (fast tier; the verifier itself runs in tests/tasks/test_harbor.py)."""

import pytest

from patchgym.env.grading.families.harbor import RewardMissing, parse_reward_json, parse_reward_txt
from patchgym.env.swe_env import harbor_limits
from patchgym.tasks import Task
from patchgym.tasks.task import HarborSpec


@pytest.mark.parametrize("text, reward", [("1", 1.0), (" 0.25\n", 0.25), ("0", 0.0), ("-1.5", -1.5)])
def test_reward_txt(text, reward):
    assert parse_reward_txt(text) == reward


@pytest.mark.parametrize("text", ["", "yes", "nan", "inf", "1 2"])
def test_a_reward_txt_that_is_not_one_number(text):
    with pytest.raises(RewardMissing, match="reward.txt"):
        parse_reward_txt(text)


def test_reward_json():
    assert parse_reward_json('{"reward": 0.75, "accuracy": 0.9}') == (0.75, {"reward": 0.75, "accuracy": 0.9})
    assert parse_reward_json('{"score": 2}') == (2.0, {"score": 2.0})
    for text, problem in [('{"a": 1, "b": 0}', 'no "reward"'), ("[1]", "object"), ("{}", "object"),
                          ('{"reward": "1"}', "not a finite number"), ('{"reward": true}', "not a finite number"),
                          ("{", "not JSON")]:
        with pytest.raises(RewardMissing, match=problem):
            parse_reward_json(text)


def test_a_harbor_task_gets_its_limits_and_user():
    spec = HarborSpec(tests="x", cpus=2, memory_mb=512, network=True, env={"A": "1"}, agent_user="1001")
    task = Task(instance_id="t", repo="r", problem_statement="p", harbor=spec)  # no FAIL_TO_PASS: its verifier grades
    assert harbor_limits(task, {"B": "2"}) == {"network": True, "cpus": 2, "memory_mb": 512, "agent_user": 1001,
                                               "env": {"B": "2", "A": "1"}}
    root = task.model_copy(update={"harbor": HarborSpec(tests="x")})
    assert harbor_limits(root) == {"network": False, "agent_user": 0}
    assert harbor_limits(Task(instance_id="t", repo="r", problem_statement="p", FAIL_TO_PASS=["t"])) == {}
