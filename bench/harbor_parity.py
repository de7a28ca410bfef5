"""Harbor folders scored twice, with the oracle and the null policy: by hand, as Harbor's shared mode runs them (raw
`docker` commands only, none of patchgym's code: build, start with the image's ENTRYPOINT and `sleep infinity`,
compose services on a network under their names, each step's workdir/setup.sh/healthcheck, solve.sh through
`docker exec`, then /tests emptied and filled, test.sh, the reward file), and by patchgym (import, eval). Prints each
folder's rewards both ways and how many agree.

    python bench/harbor_parity.py                       # the folders in tests/fixtures/harbor
    python bench/harbor_parity.py path/to/folders --json

Fixture Dockerfiles start `FROM patchgym/base` (replaced by the base image's tag); `FROM ubuntu:24.04` gets a replica
(the base image without python3) where the engine lacks the real one.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sh(*argv, check=True, timeout=None, input=None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout, input=input)


def prepare(folder: Path, base: str, work: Path) -> Path:
    """A copy of the folder whose Dockerfiles start FROM the base image's tag where they said patchgym/base."""
    copy = work / folder.name
    shutil.copytree(folder, copy)
    for dockerfile in (copy / "environment").rglob("Dockerfile"):
        dockerfile.write_text(dockerfile.read_text().replace("FROM patchgym/base", f"FROM {base}"))
    return copy


def ensure_ubuntu(base: str) -> None:
    if sh("docker", "image", "inspect", "ubuntu:24.04", check=False).returncode != 0:
        sh("docker", "build", "-q", "-t", "ubuntu:24.04", "-",
           input=f"FROM {base}\nRUN rm -rf /usr/bin/python3* /usr/lib/python3* /opt/venv\n")


def by_hand(folder: Path, policy: str) -> list[float | None]:
    """Each step's reward (one for a single-step task), as Harbor's shared mode gives it."""
    toml = tomllib.loads((folder / "task.toml").read_text())
    env_table = toml.get("environment", {})
    tag = f"pg-parity-{uuid.uuid4().hex[:8]}"
    sh("docker", "build", "-q", "-t", tag, str(folder / "environment"), timeout=900)
    started, network = [], None
    compose_path = folder / "environment" / "docker-compose.yaml"
    compose = yaml.safe_load(compose_path.read_text()) if compose_path.is_file() else {"services": {}}
    main = compose["services"].get("main") or {}
    online = env_table.get("allow_internet", env_table.get("network_mode", "public") == "public") is not False
    try:
        others = {k: v for k, v in compose["services"].items() if k != "main"}
        if others:
            network = tag
            sh("docker", "network", "create", *([] if online else ["--internal"]), network)
            for name, spec in others.items():
                image = spec.get("image") or f"{tag}-{name}"
                if "build" in spec:
                    context = spec["build"] if isinstance(spec["build"], str) else spec["build"]["context"]
                    sh("docker", "build", "-q", "-t", image, str(folder / "environment" / context), timeout=900)
                check = spec.get("healthcheck", {})
                health = []
                if check:
                    test = check["test"]
                    health = ["--health-cmd", test[1] if test[0] == "CMD-SHELL" else " ".join(test[1:]),
                              "--health-interval", str(check.get("interval", "30s"))]
                env = [a for k, v in (spec.get("environment") or {}).items() for a in ("-e", f"{k}={v}")]
                started.append(sh("docker", "run", "-d", "--network", network, "--network-alias", name, *health,
                                  *env, image).stdout.strip())
            for cid in started:
                for _ in range(300):
                    state = json.loads(sh("docker", "inspect", cid).stdout)[0]["State"]
                    if state.get("Health", {}).get("Status", "healthy") == "healthy":
                        break
                    time.sleep(0.2)
        env = {**env_table.get("env", {}), **(main.get("environment") or {})}
        run_env = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        net = ["--network", network] if network else ["--network", "bridge" if online else "none"]
        main_id = sh("docker", "run", "-d", *net, *run_env, tag, "sleep", "infinity").stdout.strip()
        started.append(main_id)
        workdir = env_table.get("workdir") or json.loads(sh("docker", "inspect", tag).stdout)[0]["Config"][
            "WorkingDir"] or "/"
        steps = toml.get("steps") or [None]
        rewards = []
        for step in steps:
            home = folder / "steps" / step["name"] if step else folder
            if step and (home / "workdir").is_dir():
                sh("docker", "cp", f"{home / 'workdir'}/.", f"{main_id}:{workdir}")
                if (home / "workdir" / "setup.sh").is_file():
                    sh("docker", "exec", "-w", workdir, main_id, "bash", "setup.sh")
            if step and step.get("healthcheck"):
                sh("docker", "exec", "-w", workdir, main_id, "bash", "-c", step["healthcheck"]["command"])
            if policy == "oracle" and (home / "solution").is_dir():
                sh("docker", "exec", main_id, "rm", "-rf", "/solution")
                sh("docker", "cp", str(home / "solution"), f"{main_id}:/solution")
                solution_env = [a for k, v in toml.get("solution", {}).get("env", {}).items() for a in
                                ("-e", f"{k}={v}")]
                sh("docker", "exec", "-w", workdir, *solution_env, main_id, "bash", "/solution/solve.sh",
                   check=False, timeout=900)
            sh("docker", "exec", main_id, "bash", "-c", "rm -rf /tests /logs/verifier; mkdir -p /tests /logs/verifier")
            if (folder / "tests").is_dir():
                sh("docker", "cp", f"{folder / 'tests'}/.", f"{main_id}:/tests")
            if step:
                sh("docker", "cp", f"{home / 'tests'}/.", f"{main_id}:/tests")
            verifier_env = {**toml.get("verifier", {}).get("env", {}),
                            **((step or {}).get("verifier", {}).get("env", {}))}
            venv = [a for k, v in verifier_env.items() for a in ("-e", f"{k}={v}")]
            sh("docker", "exec", "-w", workdir, *venv, main_id, "bash", "/tests/test.sh", check=False, timeout=900)
            text = sh("docker", "exec", main_id, "cat", "/logs/verifier/reward.txt", check=False)
            if text.returncode == 0:
                reward = float(text.stdout.strip())
            else:
                named = sh("docker", "exec", main_id, "cat", "/logs/verifier/reward.json", check=False)
                data = json.loads(named.stdout) if named.returncode == 0 else None
                reward = None if data is None else data.get("reward", sum(data.values()) / len(data))
            rewards.append(reward)
            if step and step.get("min_reward") is not None and (reward or 0.0) < step["min_reward"]:
                break
        return rewards
    finally:
        for cid in started:
            sh("docker", "rm", "-f", cid, check=False)
        if network:
            sh("docker", "network", "rm", network, check=False)
        sh("docker", "rmi", "-f", tag, check=False)


def by_patchgym(folders: Path, policy: str, out: Path) -> dict[str, list[float | None]]:
    """Each task's step rewards (one for a single-step task) from patchgym's eval."""
    from patchgym.agent.scripts import NullScript, OracleScript
    from patchgym.eval.run import evaluate
    from patchgym.rollout import RolloutConfig, ScriptedAgent
    from patchgym.sandbox import SandboxConfig
    from patchgym.tasks.harbor.importer import import_harbor

    result = import_harbor(folders, SandboxConfig(backend="docker"))
    if result.errors:
        raise SystemExit("\n".join(result.errors))
    script = OracleScript() if policy == "oracle" else NullScript()
    evaluate(result.tasks, ScriptedAgent(script), SandboxConfig(backend="docker"), out / policy,
             rollout=RolloutConfig(), progress=False)
    found = {}
    for line in (out / policy / "trajectories.jsonl").read_text().splitlines():
        record = json.loads(line)
        grade = record["grade"]
        found[record["task_id"]] = [s["score"] for s in grade["steps"]] if grade["steps"] else [grade["score"]]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="?", default=str(ROOT / "tests" / "fixtures" / "harbor"))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    from patchgym.sandbox.images import base_recipe, ensure_docker_image

    base = ensure_docker_image(base_recipe())
    ensure_ubuntu(base)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "folders"
        work.mkdir()
        folders = [prepare(p, base, work) for p in sorted(Path(args.folders).iterdir()) if (p / "task.toml").is_file()]
        rows, began = [], time.monotonic()
        for policy in ("oracle", "null"):
            ours = by_patchgym(work, policy, Path(tmp) / "runs")
            for folder in folders:
                hand = by_hand(folder, policy)
                rows.append({"task": folder.name, "policy": policy, "harbor_by_hand": hand,
                             "patchgym": ours.get(folder.name), "agree": hand == ours.get(folder.name)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'task':24} {'policy':7} {'by hand (Harbor shared mode)':30} {'patchgym':24} agree")
        for row in rows:
            print(f"{row['task']:24} {row['policy']:7} {str(row['harbor_by_hand']):30} {str(row['patchgym']):24} "
                  f"{'yes' if row['agree'] else 'NO'}")
    agree = sum(row["agree"] for row in rows)
    print(f"{agree}/{len(rows)} agree ({time.monotonic() - began:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
