"""Images the sandbox tests share: one that exists only in the test registry (tests/registry.py)."""

import io
import uuid

import pytest

from patchgym.sandbox.docker import docker_client
from patchgym.sandbox.images import base_recipe, ensure_docker_image

MARK = uuid.uuid4().hex


def absent(name: str) -> None:
    """`name` removed from the Docker engine, if it was there."""
    import docker

    try:
        docker_client().images.remove(name, force=True)
    except docker.errors.ImageNotFound:
        pass


@pytest.fixture(scope="session")
def pushed(local_registry, ready_backend):
    """An image that exists only in the registry: the base plus a 2 MB random file and a mark, pushed, then removed."""
    ready_backend("docker")
    client = docker_client()
    local = f"pg-images-small:{MARK[:12]}"
    dockerfile = (f"FROM {ensure_docker_image(base_recipe())}\n"
                  f"RUN head -c 2000000 /dev/urandom > /opt/blob && echo {MARK} > /opt/pg-mark\n")
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=local, rm=True)
    name = local_registry.push(local, f"pg-images/small:{MARK[:12]}")
    absent(local)
    absent(name)
    yield name
    absent(name)
