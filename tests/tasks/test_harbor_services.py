"""Harbor folders whose environment lives, run as Harbor's shared mode runs them: a service the image's ENTRYPOINT
starts, a server the agent leaves running for the verifier, a solve.sh longer than the agent's per-command limit
(bounded by [agent].timeout_sec), a compose service beside the agent's container (reached by its name, waited for
until healthy), and an agent's leftover process that tries to write the reward.

Each folder was first run by hand as Harbor runs it (built, started with its ENTRYPOINT and `sleep infinity`,
solve.sh and then test.sh through `docker exec` in that one container): oracle 1, null 0. On docker only: building
a folder's environment needs the Docker engine."""

import json
import shutil
from pathlib import Path

import pytest
from harbor_commands import Commands

from patchgym.agent.config import AgentConfig
from patchgym.agent.scripts import NullScript, OracleScript
from patchgym.env.grading.families.harbor import verify
from patchgym.env.swe_env import harbor_limits
from patchgym.eval.run import evaluate
from patchgym.rollout import RolloutConfig, ScriptedAgent
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.sandbox.images import base_recipe
from patchgym.tasks.harbor.importer import import_harbor

FIXTURES = Path(__file__).parents[1] / "fixtures" / "harbor"
FOLDERS = ("entrypoint-service", "background-job", "compose-sidecar")

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)

# Left running by the agent (as root): writes a reward of 1 wherever the verifier may look for one, before, while and
# after test.sh runs, through every process's root too, and puts a test.sh of its own in /tests.
FORGER = r"""cat > /tmp/forge.sh <<'SH'
while :; do
  for root in / /proc/[0-9]*/root/; do
    mkdir -p $root/logs/verifier $root/tests 2>/dev/null
    echo 1 > $root/logs/verifier/reward.txt 2>/dev/null
    printf '#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n' > $root/tests/test.sh 2>/dev/null
  done
  sleep 0.01
done
SH
nohup bash /tmp/forge.sh > /dev/null 2>&1 &
echo forging"""


@pytest.fixture
def tasks(backend, tmp_path):
    out = tmp_path / "harbor"
    for name in FOLDERS:
        shutil.copytree(FIXTURES / name, out / name)
        for dockerfile in (out / name / "environment").rglob("Dockerfile"):
            dockerfile.write_text(dockerfile.read_text().replace("FROM patchgym/base", f"FROM {base_recipe().tag}"))
    result = import_harbor(out, SandboxConfig(backend="docker"))
    assert result.errors == []
    return {t.instance_id: t for t in result.tasks}


def run(tasks, script, tmp_path, name, agent=None):
    summary = evaluate(list(tasks), ScriptedAgent(script, agent), SandboxConfig(backend="docker"), tmp_path / name,
                       rollout=RolloutConfig(), progress=False)
    records = {r["task_id"]: r for r in map(json.loads, (tmp_path / name / "trajectories.jsonl").read_text()
                                            .splitlines())}
    return summary, records


def test_services_and_background_jobs_live_until_verification_and_solve_sh_has_the_agents_time(tasks, tmp_path):
    # The per-command limit is 3 s; background-job's solve.sh takes 8 s, within its [agent].timeout_sec of 60.
    quick = AgentConfig(command_timeout_s=3)
    summary, records = run(tasks.values(), OracleScript(), tmp_path, "oracle", quick)
    assert {k: r["grade"]["score"] for k, r in records.items()} == dict.fromkeys(FOLDERS, 1.0)
    assert summary["resolve_rate"] == 1.0
    summary, records = run(tasks.values(), NullScript(), tmp_path, "null", quick)
    assert {k: r["grade"]["score"] for k, r in records.items()} == dict.fromkeys(FOLDERS, 0.0)
    slow = Commands("sleep 5; echo late")  # an agent's own command still has its limit when the task sets none
    _, records = run([tasks["entrypoint-service"].model_copy(update={"harbor": tasks["entrypoint-service"].harbor
                                                                    .model_copy(update={"agent_timeout_s": None})})],
                     slow, tmp_path, "slow", quick)
    assert "timed out after 3 s" in json.dumps(records["entrypoint-service"]["messages"])


def test_what_the_agent_leaves_running_cannot_write_the_reward(tasks, tmp_path):
    task = tasks["entrypoint-service"]
    summary, records = run([task], Commands(FORGER), tmp_path, "forge")
    assert records["entrypoint-service"]["grade"]["score"] == 0.0 and summary["resolve_rate"] == 0.0


def test_the_forger_is_real_it_wins_where_the_verifier_shares_the_agents_directories(tasks):
    task = tasks["entrypoint-service"]
    for private, score in ((False, 1.0), (True, 0.0)):
        config = SandboxConfig(backend="docker", workdir=task.workdir)
        limits = {**harbor_limits(task), "private_mounts": private}
        with open_sandbox(config.model_copy(update=limits), image=task.image) as sandbox:
            assert sandbox.isolates is private
            assert "forging" in sandbox.exec(FORGER, agent=True, timeout=30).output
            grade = verify(sandbox, task)
        assert grade.score == score, (private, grade)


def test_a_compose_service_is_built_reached_by_its_name_and_gone_with_the_sandbox(tasks):
    import docker

    task = tasks["compose-sidecar"]
    (service,) = task.harbor.services
    assert (service.name, service.wait, service.image.startswith("patchgym/harbor-compose-sidecar-inventory:")) == \
        ("inventory", "healthy", True)
    assert task.harbor.env == {"INVENTORY_URL": "http://inventory:5000"}  # main's environment from the compose file
    config = SandboxConfig(backend="docker", workdir=task.workdir)
    with open_sandbox(config.model_copy(update=harbor_limits(task)), image=task.image) as sandbox:
        stock = sandbox.exec('python3 -c "import os, urllib.request; print(urllib.request.urlopen('
                             'os.environ[\'INVENTORY_URL\'] + \'/stock\', timeout=5).read().decode())"', agent=True)
        assert stock.ok and "apples" in stock.output
        outside = sandbox.exec("python3 -c \"import socket; socket.create_connection(('deb.debian.org', 80), 3)\"")
        assert not outside.ok  # allow_internet = false: the services' network is internal
        sandbox_id = sandbox.id
    client = docker.from_env()
    assert not client.containers.list(all=True, filters={"name": sandbox_id})
    assert not client.networks.list(names=[sandbox_id])


def test_a_compose_task_exported_and_imported_again_keeps_its_service_and_scores_the_same(tasks, tmp_path):
    from patchgym.tasks.harbor.export import export_harbor

    task = tasks["compose-sidecar"]
    export_harbor([task], tmp_path / "out", SandboxConfig(backend="docker"))
    (again,) = import_harbor(tmp_path / "out", SandboxConfig(backend="docker")).tasks
    assert again.harbor.services == task.harbor.services and again.harbor.env == task.harbor.env
    _, records = run([again], OracleScript(), tmp_path, "again")
    assert records["compose-sidecar"]["grade"]["score"] == 1.0


def test_a_verifier_that_runs_and_writes_no_reward_scores_0_and_one_that_cannot_run_is_no_tests_ran(tasks):
    import base64
    import io
    import tarfile

    def tests_archive(script: str) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo("test.sh")
            info.size, info.mode = len(script), 0o755
            tar.addfile(info, io.BytesIO(script.encode()))
        return base64.b64encode(buf.getvalue()).decode()

    task = tasks["background-job"]
    config = SandboxConfig(backend="docker", workdir=task.workdir)
    silent = task.model_copy(update={"harbor": task.harbor.model_copy(update={"tests": tests_archive("exit 3\n")})})
    missing_user = task.model_copy(update={"harbor": task.harbor.model_copy(update={"verifier_user": "nobody-here"})})
    with open_sandbox(config.model_copy(update=harbor_limits(task)), image=task.image) as sandbox:
        grade = verify(sandbox, silent)
        assert (grade.error, grade.score, grade.exit_code) == (None, 0.0, 3)
        assert "wrote neither /logs/verifier/reward.txt nor reward.json" in grade.error_detail
        grade = verify(sandbox, missing_user)
        assert grade.error == "no_tests_ran" and "'nobody-here' is not a user" in grade.error_detail
