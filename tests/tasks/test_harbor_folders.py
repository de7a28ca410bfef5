"""Reading Harbor task folders (fast tier: no image is built): what a folder becomes, the deprecated spellings, and
an error that names the folder and the key for every schema problem."""

import shutil
from pathlib import Path

import pytest

from patchgym.tasks.harbor.export import to_toml
from patchgym.tasks.harbor.folders import HarborTaskError, find_task_folders, read_folder, unpack

FIXTURES = Path(__file__).parents[1] / "fixtures" / "harbor"


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "service-config"
    shutil.copytree(FIXTURES / "service-config", out)
    return out


def test_a_folder_read_with_its_deprecated_spellings(folder, tmp_path):
    task = read_folder(folder)
    assert (task.name, task.title, task.schema_version) == ("service-config", "patchgym-fixtures/service-config", "1.4")
    assert task.memory_mb == 1024 and task.network is False and task.cpus == 1.0  # memory = "1G", allow_internet
    assert task.instruction.startswith("The status service")  # the canary line and the blank after it dropped
    assert task.verifier_timeout_s == 60 and task.agent_timeout_s == 300 and task.agent_user == "root"
    assert task.dockerfile == folder / "environment" / "Dockerfile" and task.warnings == []
    unpack(task.tests, tmp_path / "tests")
    assert (tmp_path / "tests" / "test.sh").read_text() == (folder / "tests" / "test.sh").read_text()
    assert (tmp_path / "tests" / "run.sh.orig").is_file()


def test_task_folders_are_found_below_a_dataset_folder(tmp_path):
    shutil.copytree(FIXTURES, tmp_path / "set" / "nested")
    (tmp_path / "set" / ".hidden").mkdir()
    shutil.copytree(FIXTURES / "partial-credit", tmp_path / "set" / ".hidden" / "skipped")
    found = find_task_folders(tmp_path / "set")
    assert [p.name for p in found] == sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    assert find_task_folders(found[0]) == [found[0]]
    with pytest.raises(HarborTaskError, match="no task folder"):
        find_task_folders(tmp_path / "set" / ".hidden" / "skipped" / "tests")


BAD_TOMLS = [
    ('[environment]\ncpus = "two"\n', "[environment].cpus: must be a positive number"),
    ("[environment]\nmemory_mb = 512\nmemory = \"1G\"\n", "[environment].memory_mb: 512 contradicts"),
    ('[environment]\nstorage = "lots"\n', "[environment].storage: 'lots' is not a size"),
    ('[environment]\nnetwork_mode = "allowlist"\n', "[environment].network_mode: 'allowlist'"),
    ('[environment]\nnetwork_mode = "public"\nallow_internet = false\n', "[environment].network_mode: 'public' contra"),
    ('[environment]\nallow_internet = "yes"\n', "[environment].allow_internet: must be true or false"),
    ("[environment]\ngpus = 1\n", "[environment].gpus: 1: GPU tasks"),
    ('[environment]\nos = "windows"\n', "[environment].os: 'windows'"),
    ('[environment]\nworkdir = "app"\n', "[environment].workdir: 'app' is not an absolute path"),
    ("[verifier]\ntimeout_sec = 0\n", "[verifier].timeout_sec: must be a positive number"),
    ('[verifier]\nenvironment_mode = "separate"\n', "[verifier].environment_mode: 'separate'"),
    ("[verifier.environment]\ncpus = 1\n", "[verifier].environment: a separate verifier sandbox"),
    ("[verifier]\nenv = 3\n", "[verifier].env: must be a table"),
    ("[agent]\nuser = true\n", "[agent].user: must be a user name or uid"),
    ('schema_version = "2.0"\n', "schema_version: '2.0' is not a 1.x schema"),
    ("version = 1\n", "version: must be a string"),
    ('[[steps]]\nname = "../one"\n', "[[steps]][1].name: '../one' is not a step name"),
    ("environment = 3\n", "environment: must be a table"),
    ("[environment\n", "not valid TOML"),
]


@pytest.mark.parametrize("text, message", BAD_TOMLS)
def test_every_schema_error_names_the_folder_and_the_key(folder, text, message):
    (folder / "task.toml").write_text(text)
    with pytest.raises(HarborTaskError) as caught:
        read_folder(folder)
    assert str(caught.value).startswith(f"{folder}/task.toml: ") and message in str(caught.value)


@pytest.mark.parametrize("remove, message", [
    ("instruction.md", "instruction.md: missing"),
    ("tests/test.sh", "tests/test.sh: missing"),
    ("solution/solve.sh", "solution/solve.sh: missing"),
    ("environment/Dockerfile", "environment/Dockerfile: missing, and task.toml names no"),
    ("task.toml", "no task.toml"),
])
def test_a_missing_file_names_the_folder_and_the_file(folder, remove, message):
    (folder / remove).unlink()
    with pytest.raises(HarborTaskError, match=message) as caught:
        read_folder(folder)
    assert str(folder) in str(caught.value)


def test_compose_keys_of_main_and_unknown_keys(folder):
    (folder / "environment" / "docker-compose.yaml").write_text("services: {main: {build: .}}\n")
    with pytest.raises(HarborTaskError, match=r"services.main.build: not supported here \(Harbor configures main"):
        read_folder(folder)
    (folder / "environment" / "docker-compose.yaml").unlink()
    (folder / "environment" / "Dockerfile").unlink()
    (folder / "task.toml").write_text('colour = "blue"\n[environment]\ndocker_image = "x:1"\nshade = 2\n')
    task = read_folder(folder)  # a prebuilt image needs no Dockerfile
    assert task.docker_image == "x:1" and task.dockerfile is None
    assert [w.split(": ", 1)[1] for w in task.warnings] == ["colour: not a key patchgym reads; ignored",
                                                             "[environment].shade: not a key patchgym reads; ignored"]


def test_an_exported_task_toml_reads_back(folder):
    (folder / "task.toml").write_text(to_toml({
        "schema_version": "1.4", "task": {"name": "x/y"}, "metadata": {"tag list": ["a", "b"], "n": 2},
        "verifier": {"timeout_sec": 30.0, "env": {"A": "1 \"quoted\""}},
        "environment": {"memory_mb": 2048, "network_mode": "public", "workdir": "/w"}}))
    task = read_folder(folder)
    assert (task.verifier_env, task.memory_mb, task.network, task.workdir) == ({"A": '1 "quoted"'}, 2048, True, "/w")
    assert task.metadata == {"tag list": ["a", "b"], "n": 2} and task.title == "x/y"


def test_the_kubernetes_backend_needs_a_prebuilt_image(tmp_path):
    from patchgym.sandbox import SandboxConfig
    from patchgym.tasks.harbor.importer import import_harbor

    shutil.copytree(FIXTURES / "service-config", tmp_path / "service-config")
    result = import_harbor(tmp_path / "service-config", SandboxConfig(backend="kubernetes"))
    assert result.tasks == [] and result.errors[0].startswith(
        f"{tmp_path}/service-config/task.toml: [environment].docker_image: the kubernetes backend runs prebuilt images")


@pytest.mark.parametrize(("environment", "network"), [
    ("", True), ("allow_internet = true\n", True), ("allow_internet = false\n", False),
    ('network_mode = "public"\n', True), ('network_mode = "no-network"\n', False)])
def test_the_network_is_what_task_toml_asks_and_on_where_it_says_nothing_as_in_harbor(folder, environment, network):
    toml = (folder / "task.toml").read_text().replace("allow_internet = false\n", environment)
    (folder / "task.toml").write_text(toml)
    assert read_folder(folder).network is network
