"""Harbor task folders end to end, on real images and sandboxes: import (images built from environment/),
the verifier in the agent's own sandbox after the episode, non-binary rewards, an agent that plants a reward or a
fake test.sh, and export then import of a factory task graded the same.

On docker only: building a folder's environment needs the Docker engine, and nothing here depends on the backend."""

import json
import shutil
import tomllib
import uuid
from pathlib import Path

import pytest
from harbor_commands import Commands

from patchgym.agent.scripts import NullScript, OracleScript
from patchgym.eval.run import evaluate
from patchgym.rollout import RolloutConfig, ScriptedAgent
from patchgym.sandbox import SandboxConfig
from patchgym.sandbox.images import base_recipe
from patchgym.tasks.harbor.export import export_harbor
from patchgym.tasks.harbor.folders import read_folder
from patchgym.tasks.harbor.importer import import_harbor

FIXTURES = Path(__file__).parents[1] / "fixtures" / "harbor"

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)


@pytest.fixture
def folders(backend, tmp_path):
    """The hand-written fixture folders, their FROM made the base image's current tag."""
    out = tmp_path / "harbor"
    for name in ("partial-credit", "service-config"):  # not the cookbook's recipe: its image is ubuntu's
        shutil.copytree(FIXTURES / name, out / name)
    for dockerfile in out.glob("*/environment/Dockerfile"):
        dockerfile.write_text(dockerfile.read_text().replace("FROM patchgym/base", f"FROM {base_recipe().tag}"))
    return out


def run(tasks, script, tmp_path, name, **rollout):
    summary = evaluate(tasks, ScriptedAgent(script), SandboxConfig(backend="docker"), tmp_path / name,
                       rollout=RolloutConfig(**rollout), progress=False)
    records = {r["task_id"]: r for r in map(json.loads, (tmp_path / name / "trajectories.jsonl").read_text()
                                            .splitlines())}
    return summary, records


def test_import_reads_the_folders_and_builds_their_images(folders):
    result = import_harbor(folders, SandboxConfig(backend="docker"))
    assert result.errors == [] and [t.instance_id for t in result.tasks] == ["partial-credit", "service-config"]
    partial, service = result.tasks
    assert service.problem_statement.startswith("The status service") and "canary" not in service.problem_statement
    assert service.image.startswith("patchgym/harbor-service-config:") and service.workdir == "/app"  # its WORKDIR
    assert (service.harbor.memory_mb, service.harbor.cpus, service.harbor.network) == (1024, 1.0, False)
    assert service.harbor.verifier_timeout_s == 60 and service.harbor.agent_timeout_s == 300
    assert partial.harbor.verifier_env == {"EXPECTED_FILES": "4"} and partial.workdir == "/app"
    again = import_harbor(folders, SandboxConfig(backend="docker"))
    assert [t.image for t in again.tasks] == [t.image for t in result.tasks]  # content-addressed: not rebuilt


def test_oracle_resolves_null_does_not_and_partial_credit_is_a_fraction(folders, tmp_path):
    tasks = import_harbor(folders, SandboxConfig(backend="docker")).tasks
    oracle, records = run(tasks, OracleScript(), tmp_path, "oracle")
    assert oracle["resolve_rate"] == 1.0 and oracle["infra_errors"] == 0
    assert all(r["grade"]["duration"] > 0 for r in records.values()), "a grade's duration is the verifier's time"
    assert records["partial-credit"]["grade"]["score"] == 1.0
    assert records["partial-credit"]["grade"]["rewards"] == {"reward": 1.0, "files_right": 4.0}
    null, records = run(tasks, NullScript(), tmp_path, "null")
    assert null["resolve_rate"] == 0.0 and null["grading_errors"] == 0
    assert {r["grade"]["score"] for r in records.values()} == {0.0}
    half = Commands("cd /app/out && echo alpha > a.txt && echo beta > b.txt")
    partial = [t for t in tasks if t.instance_id == "partial-credit"]
    summary, records = run(partial, half, tmp_path, "half")
    assert records["partial-credit"]["grade"]["score"] == 0.5 and summary["resolve_rate"] == 0.0
    assert summary["mean_reward"] == 0.5  # the float is the reward training sees
    summary, _ = run(partial, half, tmp_path, "half-enough", resolved_reward=0.5)
    assert summary["resolve_rate"] == 1.0


def test_named_rewards_without_a_reward_key_are_all_kept_and_the_setting_picks_the_score(folders, tmp_path):
    test_sh = folders / "partial-credit" / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace('{"reward": right / len(want), "files_right": right}',
                                                   '{"share": right / len(want), "files_right": right}'))
    tasks = [t for t in import_harbor(folders, SandboxConfig(backend="docker")).tasks
             if t.instance_id == "partial-credit"]
    summary, records = run(tasks, OracleScript(), tmp_path, "auto")
    grade = records["partial-credit"]["grade"]
    assert grade["rewards"] == {"share": 1.0, "files_right": 4.0} and grade["error"] is None
    assert grade["score"] == 2.5 and summary["mean_reward"] == 2.5  # auto: no "reward", several: their mean
    summary, records = run(tasks, OracleScript(), tmp_path, "share", harbor_score="share")
    assert records["partial-credit"]["grade"]["score"] == 1.0 and summary["resolve_rate"] == 1.0
    summary, records = run(tasks, NullScript(), tmp_path, "null", harbor_score="share")
    assert records["partial-credit"]["grade"]["score"] == 0.0 and summary["resolve_rate"] == 0.0


def test_the_oracle_on_a_folder_without_a_solution_is_reported_as_having_nothing_to_play(folders, tmp_path):
    from patchgym.eval.build import load_eval_config, run_eval
    from patchgym.tasks import write_tasks

    shutil.rmtree(folders / "partial-credit" / "solution")
    tasks = import_harbor(folders, SandboxConfig(backend="docker")).tasks
    write_tasks(tasks, tmp_path / "tasks.jsonl")
    run = run_eval(load_eval_config([], ["sandbox.backend=docker"]), tmp_path / "tasks.jsonl", script="oracle",
                   out=tmp_path / "eval", progress=False)
    assert run.summary["resolved"] == 1  # service-config's solution still plays
    (warning,) = run.warnings
    assert "nothing to play on 1 task(s)" in warning and warning.endswith(": partial-credit")


def test_a_planted_reward_or_a_fake_test_sh_scores_what_the_real_verifier_says(folders, tmp_path):
    tasks = [t for t in import_harbor(folders, SandboxConfig(backend="docker")).tasks
             if t.instance_id == "service-config"]
    plant = Commands("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
                     "echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
                     "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
                     "chmod +x /tests/test.sh && cp /tests/test.sh /tests/run.sh.orig")
    summary, records = run(tasks, plant, tmp_path, "plant")
    assert summary["resolve_rate"] == 0.0 and records["service-config"]["grade"]["score"] == 0.0
    fixed = Commands("sed -i 's/^port=.*/port=8080/' /etc/svc.conf")
    summary, _ = run(tasks, fixed, tmp_path, "fixed")
    assert summary["resolve_rate"] == 1.0  # the same verifier does resolve a real fix
    changed = Commands("sed -i 's/^port=.*/port=8080/' /etc/svc.conf && echo 'port=8080' > /app/run.sh")
    summary, _ = run(tasks, changed, tmp_path, "changed")
    assert summary["resolve_rate"] == 0.0  # run.sh must stay as it was


def test_a_factory_task_exported_then_imported_grades_the_same(tiny_task, backend, tmp_path):
    config = SandboxConfig(backend="docker")
    (folder,) = export_harbor([tiny_task], tmp_path / "exported", config)
    toml = tomllib.loads((folder / "task.toml").read_text())
    assert toml["schema_version"] == "1.4" and toml["environment"]["network_mode"] == "no-network"
    assert (folder / "tests" / "hidden" / "tests" / "test_add.py").is_file()  # the hidden test, only in tests/
    assert read_folder(folder).workdir == tiny_task.workdir
    result = import_harbor(tmp_path / "exported", config)
    assert result.errors == []
    (task,) = result.tasks
    assert task.problem_statement.strip() == tiny_task.problem_statement.strip()
    oracle, records = run([task], OracleScript(), tmp_path, "oracle")
    assert oracle["resolve_rate"] == 1.0, records
    null, _ = run([task], NullScript(), tmp_path, "null")
    assert null["resolve_rate"] == 0.0 and null["grading_errors"] == 0
    # The grader's guarantees hold in the exported verifier: the hidden test is not in the agent's view, and a
    # conftest.py or an edited test that makes everything pass is put back before the tests run.
    cheat = Commands("ls tests /tmp",
                     "printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport():\\n"
                     "    outcome = yield\\n    outcome.get_result().outcome = \"passed\"\\n' > conftest.py && "
                     "printf 'def test_add():\\n    pass\\n' > tests/test_add.py")
    summary, records = run([task], cheat, tmp_path, "cheat")
    listing = records[task.instance_id]["messages"][3]["content"]
    assert "test_sub.py" in listing and "test_add.py" not in listing and "start.patch" not in listing
    assert summary["resolve_rate"] == 0.0 and records[task.instance_id]["grade"]["score"] == 0.0


def test_an_exported_factory_task_from_the_task_factory_round_trips(ci_tasks, tmp_path):
    config = SandboxConfig(backend="docker")
    task = ci_tasks[0]
    export_harbor([task], tmp_path / "exported", config)
    (imported,) = import_harbor(tmp_path / "exported", config).tasks
    oracle, records = run([imported], OracleScript(), tmp_path, "oracle")
    assert oracle["resolve_rate"] == 1.0, records
    null, _ = run([imported], NullScript(), tmp_path, "null")
    assert null["resolve_rate"] == 0.0 and null["grading_errors"] == 0


def test_a_build_gets_the_network_unless_offline_and_a_failure_names_the_task_and_the_step(folders):
    dockerfile = folders / "service-config" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(
        "RUN chmod 755 /app/run.sh",
        "RUN python3 -c \"import urllib.request; urllib.request.urlopen('http://deb.debian.org', timeout=5)\""
        f" {uuid.uuid4()}"))  # a step no earlier build cached
    (folders / "partial-credit" / "environment" / "Dockerfile").write_text("FROM nosuch.example/image:1\n")
    result = import_harbor(folders, SandboxConfig(backend="docker"), offline=True)
    assert result.tasks == [] and len(result.errors) == 2
    missing, network = result.errors
    assert missing.startswith("task partial-credit: environment/Dockerfile starts FROM nosuch.example/image:1, which "
                              "is not on this machine")
    assert network.startswith("task service-config: environment/Dockerfile failed at 'Step 4/5 : RUN python3 -c")
    assert "ran offline (--offline)" in network
    assert "urlopen error" in network  # the line that says why, whole
    online = import_harbor(folders, SandboxConfig(backend="docker"))  # the network docker gives a build, as Harbor's
    assert [t.instance_id for t in online.tasks] == ["service-config"] and len(online.errors) == 1
