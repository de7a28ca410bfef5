"""Shared fixtures: which sandbox backends this machine can run, and a check that the suite leaves nothing behind."""

import os
import shutil

import pytest

# Two cores: torch's own threads would fight the sandboxes and each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from patchgym.sandbox import lifecycle  # noqa: E402

TEST_RUN_ID = f"pytest-{os.getpid()}"
lifecycle.set_run_id(TEST_RUN_ID)


def docker_unavailable() -> str | None:
    from patchgym.sandbox.docker import docker_client
    from patchgym.sandbox.errors import SandboxError

    try:
        docker_client()
    except SandboxError as exc:
        return str(exc)
    return None


def local_unavailable() -> str | None:
    from patchgym.sandbox.limits import cgroup_version

    if os.geteuid() != 0:
        return "the local backend needs root (overlay mounts, cgroups)"
    missing = [t for t in ("bwrap", "unshare", "debootstrap") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install -y bubblewrap debootstrap)"
    if cgroup_version() is None:
        return "cgroups are not writable"
    return None


@pytest.fixture(scope="session")
def base_image():
    """The base image recipe, built once (cached across runs under the patchgym store)."""
    from patchgym.sandbox import images

    return images.base_recipe()


@pytest.fixture(scope="session", params=["docker", "local"])
def backend(request, base_image) -> str:
    """Each sandbox backend in turn; skipped (with the reason) where this machine cannot run it."""
    from patchgym.sandbox import images

    reason = docker_unavailable() if request.param == "docker" else local_unavailable()
    if reason:
        pytest.skip(f"{request.param} backend unavailable: {reason}")
    if request.param == "docker":
        images.ensure_docker_image(base_image)
    else:
        images.ensure_rootfs(base_image)
    return request.param


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    """After the whole suite: no container, scratch directory or cgroup of this test run remains."""
    yield
    lifecycle.close_all()
    from patchgym.sandbox.reaper import leftovers

    left = leftovers(TEST_RUN_ID)
    assert not left, f"the test suite left sandboxes behind: {left}"
