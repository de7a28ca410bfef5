"""environment/docker-compose.yaml of a Harbor folder, read as Harbor reads it: merged over Harbor's own base config,
where `main` is the agent's container (built from environment/Dockerfile, or the task's docker_image) and every
other service runs beside it on one network, reachable by its name.

What patchgym honours: for `main`, its `environment` (added to the task's) and `depends_on` (the services it waits
for: started, or healthy); for the other services, `build` (a context below environment/, and its `dockerfile`) or
`image`, `environment`, `command`, `entrypoint`, `healthcheck`, `depends_on` (the order they start in), and
`expose`/`ports` (every port of a service is reachable on the network; nothing is published on the host). Any other
key is refused by name: a task whose compose file asks for what patchgym does not do must not run as if it had.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from patchgym.tasks.task import TaskError

MAIN = "main"
MAIN_KEYS = {"depends_on", "environment"}
SERVICE_KEYS = {"build", "image", "environment", "command", "entrypoint", "healthcheck", "depends_on", "expose",
                "ports", "container_name", "restart"}
CONDITIONS = {"service_started": "started", "service_healthy": "healthy"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


class ComposeError(TaskError):
    """A compose file patchgym cannot run as Harbor would; the message names the file and the key."""


@dataclass
class ComposeService:
    """A service beside `main`: built from `context` (its Dockerfile `dockerfile`) or started from `image`."""

    name: str
    context: Path | None
    dockerfile: str
    image: str
    environment: dict[str, str]
    command: list[str] | None
    entrypoint: list[str] | None
    healthcheck: dict | None  # test, interval_s, timeout_s, retries, start_period_s
    wait: str = "started"  # what main waits for: started, or healthy


@dataclass
class Compose:
    main_environment: dict[str, str] = field(default_factory=dict)
    services: list[ComposeService] = field(default_factory=list)  # in the order they start


def compose_file(environment: Path) -> Path | None:
    for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml"):
        if (environment / name).is_file():
            return environment / name
    return None


def read_compose(path: Path) -> Compose:
    """Read and check a compose file (see the module's docstring for what is honoured)."""
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ComposeError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ComposeError(f"{where}: services: must be a table of services")
    for key in data:
        if key not in ("services", "version", "name"):
            raise ComposeError(f"{where}: {key}: not supported here (only services, each on the task's network)")
    main = data["services"].get(MAIN) or {}
    _known(where, MAIN, main, MAIN_KEYS, "Harbor configures main itself; patchgym honours only its environment "
                                          "and depends_on")
    compose = Compose(main_environment=_environment(where, MAIN, main.get("environment")))
    waits = _depends_on(where, MAIN, main.get("depends_on"))
    others = {name: spec or {} for name, spec in data["services"].items() if name != MAIN}
    for name in waits:
        if name not in others:
            raise ComposeError(f"{where}: services.main.depends_on: {name!r} is not a service of this file")
    for name in _start_order(where, others):
        spec = others[name]
        _known(where, name, spec, SERVICE_KEYS, "patchgym runs a service from its build or image, environment, "
                                                "command, entrypoint, healthcheck and depends_on")
        context, dockerfile, image = _build(where, name, spec, path.parent)
        service = ComposeService(name=name, context=context, dockerfile=dockerfile, image=image,
                                 environment=_environment(where, name, spec.get("environment")),
                                 command=_argv(where, name, "command", spec.get("command")),
                                 entrypoint=_argv(where, name, "entrypoint", spec.get("entrypoint")),
                                 healthcheck=_healthcheck(where, name, spec.get("healthcheck")),
                                 wait=waits.get(name, "started"))
        if service.wait == "healthy" and service.healthcheck is None:
            raise ComposeError(f"{where}: services.main.depends_on.{name}: service_healthy, but {name} has no "
                               "healthcheck")
        compose.services.append(service)
    return compose


def _known(where: str, name: str, spec, allowed: set[str], why: str) -> None:
    if not isinstance(spec, dict):
        raise ComposeError(f"{where}: services.{name}: must be a table")
    for key in spec:
        if key not in allowed:
            raise ComposeError(f"{where}: services.{name}.{key}: not supported here ({why})")


def _environment(where: str, name: str, value) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        pairs = [str(item).split("=", 1) for item in value]
        if any(len(p) != 2 for p in pairs):
            raise ComposeError(f"{where}: services.{name}.environment: each item must be NAME=VALUE")
        return dict(pairs)
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in value.items()}
    raise ComposeError(f"{where}: services.{name}.environment: must be a table or a list of NAME=VALUE")


def _depends_on(where: str, name: str, value) -> dict[str, str]:
    """{service: started | healthy}."""
    if value is None:
        return {}
    if isinstance(value, list):
        return {str(v): "started" for v in value}
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: services.{name}.depends_on: must be a list or a table")
    found = {}
    for other, spec in value.items():
        condition = (spec or {}).get("condition", "service_started") if isinstance(spec, dict) else spec
        if condition not in CONDITIONS:
            raise ComposeError(f"{where}: services.{name}.depends_on.{other}.condition: {condition!r} is not "
                               f"supported (only {', '.join(CONDITIONS)})")
        found[str(other)] = CONDITIONS[condition]
    return found


def _start_order(where: str, services: dict) -> list[str]:
    """Services in an order where each starts after those it depends on (a cycle is an error)."""
    order, seen, path = [], set(), []

    def visit(name: str) -> None:
        if name in seen:
            return
        if name in path:
            raise ComposeError(f"{where}: services.{name}.depends_on: a cycle ({' -> '.join([*path, name])})")
        path.append(name)
        for other in _depends_on(where, name, (services[name] or {}).get("depends_on")):
            if other not in services:
                raise ComposeError(f"{where}: services.{name}.depends_on: {other!r} is not a service of this file")
            visit(other)
        path.pop()
        seen.add(name)
        order.append(name)

    for name in services:
        visit(name)
    return order


def _build(where: str, name: str, spec: dict, environment: Path) -> tuple[Path | None, str, str]:
    build, image = spec.get("build"), spec.get("image", "")
    if build is None:
        if not image or not isinstance(image, str):
            raise ComposeError(f"{where}: services.{name}: needs a build or an image")
        return None, "", image
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict) or set(build) - {"context", "dockerfile"}:
        raise ComposeError(f"{where}: services.{name}.build: only context and dockerfile are supported")
    context = (environment / str(build.get("context", "."))).resolve()
    if environment.resolve() not in (context, *context.parents) or not context.is_dir():
        raise ComposeError(f"{where}: services.{name}.build.context: {build.get('context')!r} is not a folder "
                           "inside environment/")
    dockerfile = str(build.get("dockerfile", "Dockerfile"))
    if not (context / dockerfile).is_file():
        raise ComposeError(f"{where}: services.{name}.build: {context / dockerfile} is missing")
    return context, dockerfile, ""


def _argv(where: str, name: str, key: str, value) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return ["/bin/sh", "-c", value]
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ComposeError(f"{where}: services.{name}.{key}: must be a string or a list of strings")


def _healthcheck(where: str, name: str, value) -> dict | None:
    if value is None or (isinstance(value, dict) and value.get("disable")):
        return None
    if not isinstance(value, dict) or "test" not in value:
        raise ComposeError(f"{where}: services.{name}.healthcheck: must be a table with a test")
    test = value["test"]
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if not isinstance(test, list) or not test or test[0] not in ("CMD", "CMD-SHELL"):
        raise ComposeError(f"{where}: services.{name}.healthcheck.test: must be [CMD, ...], [CMD-SHELL, cmd] or a "
                           "string")
    return {"test": [str(t) for t in test],
            "interval_s": duration(where, name, "interval", value.get("interval", "30s")),
            "timeout_s": duration(where, name, "timeout", value.get("timeout", "30s")),
            "retries": int(value.get("retries", 3)),
            "start_period_s": duration(where, name, "start_period", value.get("start_period", "0s"))}


def duration(where: str, name: str, key: str, value) -> float:
    """A compose duration ("2s", "1m30s", "500ms", or a number of seconds) in seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeError(f"{where}: services.{name}.healthcheck.{key}: {value!r} is not a duration like 2s")
    return sum(float(n) * _UNITS[u] for n, u in parts)
