"""Images without python3 (a Harbor folder FROM ubuntu or a Debian minbase) run patchgym's runner and the agent's
tools on the host's Python, bundled into an image made from them; images with python3 are left as they are."""

import pytest

from patchgym.env.tools import install_tools, run_tool
from patchgym.env.tools.calls import ToolCall
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.sandbox.images import base_recipe, ensure_docker_image
from patchgym.sandbox.python_bundle import BUNDLE_PYTHON, image_python, with_python

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)


@pytest.fixture
def no_python(backend, tmp_path):
    from patchgym.sandbox.docker import docker_client

    client = docker_client()
    base = ensure_docker_image(base_recipe(), client=client)
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN rm -rf /usr/bin/python3* /usr/lib/python3* /opt/venv\n")
    client.images.build(path=str(tmp_path), tag="patchgym-test/no-python:1", rm=True, network_mode="none")
    return client, base


def test_an_image_without_python_runs_the_runner_and_the_tools_on_the_bundle(no_python):
    client, base = no_python
    assert with_python(client, base) == (base, "python3")  # has one: unchanged
    assert image_python(client, "patchgym-test/no-python:1") is None
    image, python = with_python(client, "patchgym-test/no-python:1")
    assert python == BUNDLE_PYTHON and image != "patchgym-test/no-python:1"
    assert with_python(client, image) == (image, BUNDLE_PYTHON)  # not bundled twice
    with open_sandbox(SandboxConfig(backend="docker", python=python, workdir="/app"), image=image) as sandbox:
        assert sandbox.exec("command -v python3 || echo none").output.strip() == "none"  # not the agent's python3
        install_tools(sandbox)
        wrote = run_tool(sandbox, ToolCall("file_editor", {"command": "create", "path": "/tmp/a.txt",
                                                           "file_text": "hello\n"}), python=python)
        assert wrote.exit_code in (0, None), wrote.observation
        ran = run_tool(sandbox, ToolCall("execute_bash", {"command": "cat /tmp/a.txt"}), python=python)
        assert ran.observation.endswith("hello") and ran.exit_code == 0
