"""Reading a Harbor folder's docker-compose.yaml (fast tier: nothing is built): what main and the other services
become, and an error naming the file and the key for whatever patchgym does not run as Harbor would."""

import shutil
from pathlib import Path

import pytest

from patchgym.tasks.harbor.compose import ComposeError, duration, read_compose
from patchgym.tasks.harbor.folders import HarborTaskError, read_folder

FIXTURES = Path(__file__).parents[1] / "fixtures" / "harbor"


def write(tmp_path, text: str) -> Path:
    (tmp_path / "svc").mkdir(exist_ok=True)
    (tmp_path / "svc" / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "docker-compose.yaml").write_text(text)
    return tmp_path / "docker-compose.yaml"


def test_the_fixtures_compose_file_becomes_a_service_main_waits_for_until_healthy():
    compose = read_folder(FIXTURES / "compose-sidecar").compose
    assert compose.main_environment == {"INVENTORY_URL": "http://inventory:5000"}
    (inventory,) = compose.services
    assert (inventory.name, inventory.wait, inventory.context.name, inventory.dockerfile) == \
        ("inventory", "healthy", "inventory", "Dockerfile")
    assert inventory.healthcheck == {"test": ["CMD", "python3", "-c", "import socket; socket.create_connection(("
                                              "'localhost', 5000), timeout=2)"],
                                     "interval_s": 1.0, "timeout_s": 5.0, "retries": 30, "start_period_s": 0.0}


def test_a_file_of_main_alone_adds_its_environment_and_no_service(tmp_path):
    compose = read_compose(write(tmp_path, "services:\n  main:\n    environment:\n      - A=1\n      - B=x=y\n"))
    assert compose.main_environment == {"A": "1", "B": "x=y"} and compose.services == []


def test_services_start_after_those_they_depend_on(tmp_path):
    text = ("services:\n  web:\n    image: w\n    depends_on: [db]\n    command: serve --port 1\n"
            "  db:\n    build: ./svc\n    entrypoint: [run, db]\n")
    web_db = read_compose(write(tmp_path, text)).services
    assert [s.name for s in web_db] == ["db", "web"]
    assert web_db[1].command == ["/bin/sh", "-c", "serve --port 1"] and web_db[0].entrypoint == ["run", "db"]


BAD = [
    ("services:\n  main:\n    volumes: [./x:/x]\n", "services.main.volumes: not supported here"),
    ("services:\n  main:\n    depends_on: [nope]\n", "services.main.depends_on: 'nope' is not a service"),
    ("services:\n  a:\n    image: x\n    privileged: true\n", "services.a.privileged: not supported here"),
    ("services:\n  a:\n    build: ../../etc\n", "services.a.build.context: '../../etc' is not a folder inside"),
    ("services:\n  a: {}\n", "services.a: needs a build or an image"),
    ("services:\n  a:\n    image: x\n    depends_on: [b]\n  b:\n    image: y\n    depends_on: [a]\n", "a cycle"),
    ("services:\n  main:\n    depends_on:\n      a: {condition: service_completed_successfully}\n  a:\n    image: x\n",
     "condition: 'service_completed_successfully' is not supported"),
    ("services:\n  main:\n    depends_on:\n      a: {condition: service_healthy}\n  a:\n    image: x\n",
     "service_healthy, but a has no healthcheck"),
    ("services:\n  a:\n    image: x\n    healthcheck: {test: [CMD, x], interval: soon}\n",
     "services.a.healthcheck.interval: 'soon' is not a duration"),
    ("networks: {}\nservices: {}\n", "networks: not supported here"),
    ("services: [1]\n", "services: must be a table"),
    ("services: {a: [\n", "not valid YAML"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_what_patchgym_does_not_run_is_refused_naming_the_file_and_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ComposeError) as caught:
        read_compose(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_a_folder_with_a_bad_compose_file_is_a_task_error_naming_it(tmp_path):
    folder = tmp_path / "compose-sidecar"
    shutil.copytree(FIXTURES / "compose-sidecar", folder)
    (folder / "environment" / "docker-compose.yaml").write_text("services:\n  main:\n    ports: ['80:80']\n")
    with pytest.raises(HarborTaskError, match=r"docker-compose.yaml: services.main.ports: not supported here"):
        read_folder(folder)


@pytest.mark.parametrize("text, seconds", [("2s", 2.0), ("1m30s", 90.0), ("500ms", 0.5), (3, 3.0), ("1h", 3600.0)])
def test_compose_durations(text, seconds):
    assert duration("f", "s", "interval", text) == seconds
