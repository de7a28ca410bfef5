"""Reading a Harbor verifier's reward (fast tier; the verifier itself runs in tests/tasks/test_harbor.py)."""

import pytest

from patchgym.env.grading.families.harbor import RewardMissing, parse_reward_json, parse_reward_txt, score_of
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


def test_reward_json_keeps_every_named_reward():
    assert parse_reward_json('{"reward": 0.75, "accuracy": 0.9}') == {"reward": 0.75, "accuracy": 0.9}
    assert parse_reward_json('{"score": 2}') == {"score": 2.0}
    assert parse_reward_json('{"a": 1, "b": 0}') == {"a": 1.0, "b": 0.0}  # no "reward": still a verdict
    for text, problem in [("[1]", "object"), ("{}", "object"),
                          ('{"reward": "1"}', "not a finite number"), ('{"reward": true}', "not a finite number"),
                          ("{", "not JSON")]:
        with pytest.raises(RewardMissing, match=problem):
            parse_reward_json(text)


@pytest.mark.parametrize("named, rule, score", [
    ({"reward": 0.75, "accuracy": 0.9}, "auto", 0.75), ({"score": 2.0}, "auto", 2.0),
    ({"a": 1.0, "b": 0.0}, "auto", 0.5), ({"a": 1.0, "b": 0.0}, "min", 0.0), ({"a": 1.0, "b": 0.0}, "max", 1.0),
    ({"a": 1.0, "b": 0.5}, "sum", 1.5), ({"reward": 0.0, "a": 1.0}, "mean", 0.5), ({"a": 1.0, "b": 0.25}, "b", 0.25),
])
def test_the_score_training_sees_is_the_named_reward_the_setting_picks(named, rule, score):
    assert score_of(named, rule) == score


def test_a_score_named_by_a_reward_the_verifier_did_not_write_says_which_it_wrote():
    with pytest.raises(RewardMissing, match=r"no reward named 'c' \(rollout.harbor_score\), only a, b"):
        score_of({"a": 1.0, "b": 0.0}, "c")


def test_a_harbor_task_gets_its_limits_and_user():
    spec = HarborSpec(tests="x", cpus=2, memory_mb=512, network=True, env={"A": "1"}, agent_user="1001")
    task = Task(instance_id="t", repo="r", problem_statement="p", harbor=spec)  # no FAIL_TO_PASS: its verifier grades
    lives = {"keep_background": True, "private_mounts": True}  # what the agent starts lives; the verifier is apart
    assert harbor_limits(task, {"B": "2"}) == {"network": True, "cpus": 2, "memory_mb": 512, "agent_user": 1001,
                                               "env": {"B": "2", "A": "1"}, **lives}
    root = task.model_copy(update={"harbor": HarborSpec(tests="x")})
    assert harbor_limits(root) == {"network": False, "agent_user": 0, **lives}
    assert harbor_limits(task, allow_network=False)["network"] is False  # sandbox.task_network = false
    assert harbor_limits(Task(instance_id="t", repo="r", problem_statement="p", FAIL_TO_PASS=["t"])) == {}
