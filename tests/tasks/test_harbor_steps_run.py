"""A multi-step Harbor task played as Harbor plays it: the cookbook's multi-step recipe, as published, imported and
run with the oracle (each step's solve.sh: 1, 1, 1), the null policy (stops after step 1, min_reward 1.0), an agent
that fails step 2 (its min_reward 0.5 stops the task: the mean of 1 and 0), and after an export round trip.

The recipe starts FROM ubuntu:24.04, which no registry here serves: the test builds a replica under that name (the
patchgym base image, Debian 12 minbase, without python3 as ubuntu:24.04 is; the recipe's apt-get then installs from
Debian's mirror), unless the engine has the real image. With no python3 in it, the task runs on patchgym's Python
bundle. Each step and the early stop were first checked by hand as Harbor runs them
(steps in one container, each step's tests over the shared tests/ in /tests). On docker only."""

import json
from pathlib import Path

import pytest
from harbor_commands import Commands

from patchgym.agent.scripts import NullScript, OracleScript, has_solution
from patchgym.eval.run import evaluate
from patchgym.rollout import RolloutConfig, ScriptedAgent
from patchgym.sandbox import SandboxConfig
from patchgym.sandbox.images import base_recipe
from patchgym.tasks.harbor.export import export_harbor
from patchgym.tasks.harbor.importer import import_harbor

RECIPE = Path(__file__).parents[1] / "fixtures" / "harbor" / "cookbook-multi-step"

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)


REPLICA = """FROM {base}
RUN rm -rf /usr/bin/python3* /usr/lib/python3* /opt/venv
"""


@pytest.fixture
def recipe(backend, tmp_path):
    import docker

    from patchgym.sandbox.docker import docker_client
    from patchgym.sandbox.images import ensure_docker_image

    client = docker_client()
    try:
        client.images.get("ubuntu:24.04")
    except docker.errors.ImageNotFound:  # the replica: Debian minbase, and like ubuntu:24.04 without python3
        (tmp_path / "replica").mkdir()
        (tmp_path / "replica" / "Dockerfile").write_text(REPLICA.format(base=ensure_docker_image(base_recipe(),
                                                                                                 client=client)))
        client.images.build(path=str(tmp_path / "replica"), tag="ubuntu:24.04", rm=True, network_mode="none")
    result = import_harbor(RECIPE, SandboxConfig(backend="docker"))
    assert result.errors == [] and len(result.tasks) == 1
    return result.tasks[0]


def run(task, script, tmp_path, name):
    summary = evaluate([task], ScriptedAgent(script), SandboxConfig(backend="docker"), tmp_path / name,
                       rollout=RolloutConfig(), progress=False)
    record = json.loads((tmp_path / name / "trajectories.jsonl").read_text().splitlines()[0])
    return summary, record["grade"]


def step_scores(grade):
    return [(s["name"], s["score"]) for s in grade["steps"]]


def test_the_cookbook_recipe_scores_1_1_1_with_the_oracle_and_stops_after_step_1_with_null(recipe, tmp_path):
    assert has_solution(recipe) and [s.name for s in recipe.harbor.steps] == ["scaffold", "implement", "document"]
    assert recipe.harbor.runner_python == "/.patchgym/python/bin/python3"  # the image has no python3
    summary, grade = run(recipe, OracleScript(), tmp_path, "oracle")
    assert step_scores(grade) == [("scaffold", 1.0), ("implement", 1.0), ("document", 1.0)], grade
    assert grade["score"] == 1.0 and summary["resolve_rate"] == 1.0
    artifacts = {s["name"]: s["artifacts"] for s in grade["steps"]}
    assert set(artifacts["scaffold"]) == {"greet.sh"} and set(artifacts["document"]) == {"greet.sh", "README.md"}
    summary, grade = run(recipe, NullScript(), tmp_path, "null")
    assert step_scores(grade) == [("scaffold", 0.0)] and grade["score"] == 0.0 and summary["resolve_rate"] == 0.0


def test_a_step_below_its_min_reward_ends_the_task_with_the_mean_of_the_steps_played(recipe, tmp_path):
    scaffold = "printf '#!/bin/bash\\necho hello\\n' > /app/greet.sh && chmod +x /app/greet.sh"
    hard_coded = "printf '#!/bin/bash\\necho \"Hello, Harbor!\"\\n' > /app/greet.sh"  # fails the World check
    summary, grade = run(recipe, Commands(scaffold, None, "cat /app/config.txt", hard_coded, None), tmp_path, "half")
    assert step_scores(grade) == [("scaffold", 1.0), ("implement", 0.0)], grade
    assert grade["score"] == 0.5 and summary["mean_reward"] == 0.5


def test_exported_and_imported_again_it_scores_the_same(recipe, tmp_path):
    export_harbor([recipe], tmp_path / "out", SandboxConfig(backend="docker"))
    again = import_harbor(tmp_path / "out", SandboxConfig(backend="docker"))
    assert again.errors == [] and again.tasks[0].harbor.model_copy(update={"folder": ""}) == \
        recipe.harbor.model_copy(update={"folder": ""})
    _, grade = run(again.tasks[0], OracleScript(), tmp_path, "again")
    assert [score for _, score in step_scores(grade)] == [1.0, 1.0, 1.0]


def test_a_step_whose_time_runs_out_is_verified_and_a_failed_healthcheck_ends_the_task(recipe, tmp_path):
    steps = recipe.harbor.steps
    quick = [steps[0].model_copy(update={"agent_timeout_s": 3.0, "min_reward": None}), *steps[1:]]
    task = recipe.model_copy(update={"harbor": recipe.harbor.model_copy(update={"steps": quick})})
    summary, grade = run(task, Commands("sleep 30", "echo never"), tmp_path, "slow")
    # The sleep is cut at the step's 3 s; the next action finds the time gone: scaffold is verified (0), and with no
    # min_reward the task goes on to implement, whose healthcheck (test -x /app/greet.sh) fails three times.
    assert [(s["name"], s["score"], s["error"]) for s in grade["steps"]] == \
        [("scaffold", 0.0, None), ("implement", None, "no_tests_ran")], grade["steps"]
    assert "healthcheck" in grade["steps"][1]["error_detail"] and grade["score"] == 0.0
    assert summary["resolve_rate"] == 0.0
