"""`patchgym tasks import DIR --format harbor`: each task folder under DIR becomes a task.

The image is the folder's prebuilt `docker_image` (pulled at first use, as other images are) or its environment/
built here (patchgym.tasks.harbor.build); the instruction is the problem statement (a multi-step task's: its first
step's); tests/ and solution/ travel in the row (Task.harbor), with the limits and timeouts of task.toml, and so do
a multi-step task's steps (Task.harbor.steps: each one's instruction, tests, solution, workdir and limits). A
folder that cannot be used is an error line that names it; the others are kept.
"""

from pathlib import Path

from pydantic import ValidationError

from patchgym.sandbox.config import SandboxConfig, ServiceConfig, ServiceHealthcheck
from patchgym.tasks.harbor.build import build_context, build_image, image_name
from patchgym.tasks.harbor.folders import HarborFolder, HarborTaskError, find_task_folders, read_folder
from patchgym.tasks.loaders import ImportResult
from patchgym.tasks.task import HarborSpec, Task


def import_harbor(source: str | Path, sandbox: SandboxConfig, *, client=None, offline: bool = False) -> ImportResult:
    """Every task folder in or under `source`, as tasks; bad folders become error lines. `offline`: build their
    environments without a network."""
    result, seen = ImportResult([], []), {}
    for path in find_task_folders(Path(source)):
        try:
            folder = read_folder(path)
            if folder.name in seen:
                raise HarborTaskError(f"{path}: task id {folder.name!r} (the folder's name) is also "
                                      f"{seen[folder.name]}")
            task = to_task(folder, sandbox, client=client, offline=offline)
        except HarborTaskError as exc:
            result.errors.append(str(exc))
            continue
        seen[folder.name] = path
        result.tasks.append(task)
        result.warnings += folder.warnings
    return result


def to_task(folder: HarborFolder, sandbox: SandboxConfig, *, client=None, offline: bool = False) -> Task:
    if folder.docker_image:
        image = folder.docker_image
    elif sandbox.backend == "kubernetes":
        raise HarborTaskError(f"{folder.path}/task.toml: [environment].docker_image: the kubernetes backend runs "
                              "prebuilt images only; build environment/ with the docker backend, push it to the "
                              "cluster's registry and name it here")
    else:
        image = build_image(folder, sandbox, client=client, offline=offline)
    image, python = runner_python(image, client)
    services = compose_services(folder, sandbox, client=client, offline=offline)
    try:
        spec = HarborSpec(folder=str(folder.path), schema_version=folder.schema_version, tests=folder.tests,
                          solution=folder.solution, verifier_timeout_s=folder.verifier_timeout_s,
                          verifier_env=folder.verifier_env, verifier_user=folder.verifier_user,
                          agent_timeout_s=folder.agent_timeout_s, agent_user=folder.agent_user,
                          solution_env=folder.solution_env, cpus=folder.cpus, memory_mb=folder.memory_mb,
                          storage_mb=folder.storage_mb, network=folder.network,
                          env={**folder.environment_env, **(folder.compose.main_environment if folder.compose else {})},
                          runner_python=python, services=services,
                          metadata=folder.metadata, steps=folder.steps, multi_step_reward=folder.multi_step_reward,
                          artifacts=folder.artifacts, instruction=folder.task_instruction)
        return Task(instance_id=folder.name, repo=folder.title, problem_statement=folder.instruction, image=image,
                    workdir=folder.workdir or image_workdir(image, client) or "/", source="harbor", harbor=spec,
                    difficulty=str(folder.metadata.get("difficulty", "")))
    except ValidationError as exc:
        raise HarborTaskError(f"{folder.path}: {exc}") from None


def compose_services(folder: HarborFolder, sandbox: SandboxConfig, *, client=None,
                     offline: bool = False) -> list[ServiceConfig]:
    """The services of the folder's compose file, each service's image built from its context (or named)."""
    if folder.compose is None or not folder.compose.services:
        return []
    if sandbox.backend != "docker":
        raise HarborTaskError(f"{folder.path}/environment: its compose services "
                              f"({', '.join(s.name for s in folder.compose.services)}) run on the docker backend only")
    found = []
    for service in folder.compose.services:
        image = service.image
        if service.context is not None:
            image = build_context(folder, service.context, service.context / service.dockerfile,
                                  image_name(folder.name, service.name),
                                  f"the Dockerfile of compose service {service.name}", sandbox, client=client,
                                  offline=offline)
        check = service.healthcheck
        found.append(ServiceConfig(name=service.name, image=image, env=service.environment, command=service.command,
                                   entrypoint=service.entrypoint, wait=service.wait,
                                   healthcheck=ServiceHealthcheck(**check) if check else None))
    return found


def runner_python(image: str, client=None) -> tuple[str, str]:
    """(the image tasks start from, the python patchgym's runner uses in it): where the engine has the image and it
    has no python3, an image made from it with patchgym's Python bundle (patchgym.sandbox.python_bundle). An image
    the engine does not have yet (a docker_image pulled at first use) is taken as it is."""
    import docker

    from patchgym.sandbox.python_bundle import with_python

    try:
        client = client or docker.from_env()
        client.images.get(image)
    except Exception:  # noqa: BLE001 - no engine, or not pulled yet
        return image, "python3"
    return with_python(client, image)


def image_workdir(image: str, client=None) -> str:
    """The image's WORKDIR, where the engine has it ('' when it cannot tell: the image is pulled at first use)."""
    try:
        import docker

        client = client or docker.from_env()
        return client.images.get(image).attrs.get("Config", {}).get("WorkingDir") or ""
    except Exception:  # noqa: BLE001 - no engine, or not pulled yet: the folder's workdir or / then
        return ""
