"""`patchgym doctor`: is this machine ready? Each check says what it found and, when it fails, the fix."""

import importlib.metadata
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from patchgym import paths
from patchgym.config import Config
from patchgym.errors import UserError

MIN_FREE_GB = 2.0
PACKAGES = ("docker", "pydantic", "pyyaml", "typer", "rich", "torch")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _packages() -> Check:
    found, missing = [], []
    for name in PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        return Check("python packages", False, f"missing: {', '.join(missing)}", "make install")
    return Check("python packages", True, ", ".join(found))


def _docker(required: bool) -> Check:
    from patchgym.sandbox.docker import DOCKER_FIX, docker_client
    from patchgym.sandbox.errors import SandboxError

    try:
        version = docker_client().version()
    except SandboxError as exc:
        return Check("docker engine", False, str(exc).split(";")[0], DOCKER_FIX, required)
    return Check("docker engine", True, f"{version['Version']} (API {version['ApiVersion']})", required=required)


def _local(required: bool) -> list[Check]:
    from patchgym.sandbox.limits import cgroup_version

    bwrap = shutil.which("bwrap")
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip() if bwrap else ""
    overlay = "overlay" in Path("/proc/filesystems").read_text()
    cgroups = cgroup_version()
    root = os.geteuid() == 0
    return [
        Check("bubblewrap", bool(bwrap), version or "not found", "apt-get install -y bubblewrap", required),
        Check("overlayfs", overlay, "in /proc/filesystems" if overlay else "not in /proc/filesystems",
              "modprobe overlay", required),
        Check("cgroups", cgroups is not None, f"v{cgroups}, writable" if cgroups else "not writable",
              "run as root on a host with cgroups mounted read-write", required),
        Check("root", root, "uid 0" if root else f"uid {os.geteuid()}", "run as root (overlay mounts)", required),
    ]


def _disk() -> Check:
    store = paths.store_dir()
    probe = store if store.exists() else Path("/")
    free_gb = shutil.disk_usage(probe).free / 2**30
    return Check("disk space", free_gb >= MIN_FREE_GB, f"{free_gb:.1f} GiB free for {store}",
                  f"free at least {MIN_FREE_GB:g} GiB, or set PATCHGYM_HOME to a bigger disk")


def _base_image(backend: str, docker_ok: bool) -> Check:
    from patchgym.sandbox import images

    recipe = images.base_recipe()
    debootstrap = shutil.which("debootstrap") is not None
    if backend == "docker":
        built = docker_ok and images.docker_image_built(recipe)
        where = f"docker image {recipe.tag}"
    else:
        built = images.rootfs_built(recipe)
        where = f"rootfs {paths.rootfs_dir() / recipe.key}"
    fix = "patchgym image build" + ("" if debootstrap else " (after apt-get install -y debootstrap)")
    return Check(f"base image ({backend})", built, f"{where} {'built' if built else 'not built'}", fix)


def _leftovers() -> Check:
    from patchgym.sandbox.reaper import reapable

    left = reapable()
    return Check("leftover sandboxes", not left, f"{len(left)} from crashed runs" if left else "none",
                 "patchgym doctor --reap", required=False)


def _chat_template(config: Config) -> Check:
    """The configured model's chat template under the agent's history mode: what `patchgym check-template` says."""
    from patchgym.agent.template_check import check_history
    from patchgym.inference.chat_template import configure_tokenizer
    from patchgym.inference.models import load_tokenizer

    name = f"chat template ({config.inference.model}, history={config.agent.history})"
    try:
        tokenizer = load_tokenizer(config.inference.model)
    except Exception as exc:  # noqa: BLE001 - a model not available here is reported, not raised
        return Check(name, False, f"tokenizer not loadable: {exc}", "set inference.model", required=False)
    configure_tokenizer(tokenizer, config.inference.chat_template, config.inference.chat_template_kwargs)
    try:
        check_history(tokenizer, config.agent)
    except UserError as exc:
        return Check(name, False, str(exc), "patchgym check-template --model M; pick inference.chat_template")
    return Check(name, True, f"exact for tool_format={config.agent.tool_format}, {config.agent.observation_role} "
                             "observations")


def run_checks(config: Config) -> list[Check]:
    backend = config.sandbox.backend
    docker = _docker(required=backend == "docker")
    checks = [_packages(), docker, *_local(required=backend == "local"), _disk(),
              _base_image(backend, docker.ok), _leftovers(), _chat_template(config)]
    return checks
