"""A real image registry for tests: Debian's `docker-registry` on 127.0.0.1, basic auth from an htpasswd file
(bcrypt), plain HTTP (the engine treats 127.0.0.0/8 as insecure), storage in a tmp dir; and a push helper.

    def test_x(local_registry):           # a LocalRegistry: .host ("127.0.0.1:PORT"), .username, .password
        name = local_registry.push("patchgym/base:KEY", "pg-test/base:1")   # "127.0.0.1:PORT/pg-test/base:1"
"""

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BINARY = "docker-registry"
FIX = "apt-get install -y docker-registry apache2-utils (scripts/setup-host.sh installs them)"


@dataclass(frozen=True)
class LocalRegistry:
    host: str  # "127.0.0.1:PORT"
    username: str
    password: str

    @property
    def login(self) -> dict[str, str]:
        return {"username": self.username, "password": self.password}

    def push(self, local_tag: str, repository: str) -> str:
        """Tag `local_tag` as HOST/repository and push it with the login; returns the registry name. The registry
        tag stays in the engine: remove it (`client.images.remove(name)`) to make a test pull it."""
        from patchgym.sandbox.docker import docker_client

        client = docker_client()
        name = f"{self.host}/{repository}"
        repo, _, tag = name.rpartition(":")
        client.images.get(local_tag).tag(repo, tag)
        for event in client.api.push(repo, tag, stream=True, decode=True, auth_config=self.login):
            if "error" in event:
                raise RuntimeError(f"push of {name} failed: {event['error']}")
        return name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _htpasswd(username: str, password: str) -> str:
    return subprocess.run(["htpasswd", "-Bbn", username, password], check=True, capture_output=True,
                          text=True).stdout.strip() + "\n"


def start_registry(root: Path, username: str = "patchgym",
                   password: str = "s3cret-registry") -> tuple[subprocess.Popen, LocalRegistry]:
    """Start a registry serving from `root`; returns its process (the caller stops it) and how to reach it."""
    import requests

    missing = [tool for tool in (BINARY, "htpasswd") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: {FIX}")
    port = _free_port()
    (root / "htpasswd").write_text(_htpasswd(username, password))
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: patchgym-test\n    path: {root / 'htpasswd'}\n")
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen([BINARY, "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 401:
                return proc, LocalRegistry(f"127.0.0.1:{port}", username, password)
        except requests.ConnectionError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"docker-registry did not answer on port {port}: {(root / 'registry.log').read_text()[-2000:]}")


@pytest.fixture(scope="session")
def local_registry(tmp_path_factory):
    """A registry for the whole session, stopped at the end."""
    proc, registry = start_registry(tmp_path_factory.mktemp("registry"))
    yield registry
    _untag(registry.host)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _untag(host: str) -> None:
    """Remove the engine's tags of `host`'s images (pushed or pulled by the tests): the registry dies with the
    session, its port with it, and tags of dead ports only pile up. The layers stay, shared with the local tags."""
    from patchgym.sandbox.docker import docker_client

    try:
        client = docker_client()
        for image in client.images.list():
            for tag in image.tags:
                if tag.startswith(host + "/"):
                    client.images.remove(tag, noprune=True)
    except Exception as exc:  # the engine went away: nothing to tidy
        print(f"left {host}'s image tags: {exc}")
