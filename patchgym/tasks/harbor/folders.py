"""Read Harbor task folders (task.toml schema 1.4, with its deprecated spellings) into what a task needs.

A folder holds task.toml, instruction.md, environment/ (a Dockerfile and its context, unless task.toml names a
prebuilt `docker_image`; a docker-compose.yaml there adds services beside it, patchgym.tasks.harbor.compose),
tests/test.sh and its files, and optionally solution/solve.sh. A multi-step task (schema 1.1's `[[steps]]`) holds
steps/NAME/ for each step instead: instruction.md, tests/ (laid over the task's own tests/, whose test.sh is the
fallback), and optionally solution/solve.sh and workdir/ (uploaded before the agent starts). Every problem is a
HarborTaskError naming the file and the key (a step's keys as `[[steps]][N].key`, N from 1). Keys Harbor defines
that patchgym cannot honour (a separate verifier sandbox, GPUs, Windows, compose keys beyond services) are refused by
name; keys it does not know are listed as warnings and ignored, as Harbor ignores them.
"""

import base64
import gzip
import io
import re
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from patchgym.tasks.harbor.compose import Compose, ComposeError, compose_file, read_compose
from patchgym.tasks.task import HarborArtifact, HarborHealthcheck, HarborStep, TaskError

MAX_ARCHIVE_BYTES = 16 << 20  # tests/, solution/ or a step's workdir/, compressed: a row carries them
MAX_DEPTH = 6  # task folders found up to this many levels below the folder given
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_MB = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}
_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # one folder name under steps/
# What patchgym reads of each table; anything else Harbor defines is refused by name below, the rest ignored.
KNOWN = {
    "": {"schema_version", "version", "task", "metadata", "source", "verifier", "agent", "environment", "solution",
         "steps", "artifacts", "multi_step_reward_strategy"},
    "environment": {"docker_image", "build_timeout_sec", "os", "cpus", "memory_mb", "memory", "storage_mb", "storage",
                    "gpus", "gpu_types", "env", "workdir", "network_mode", "allow_internet", "allowed_hosts"},
    "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment"},
    "agent": {"timeout_sec", "user"},
    "solution": {"env"},
    "steps": {"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"},
    "steps.agent": {"timeout_sec", "user"},
    "steps.verifier": {"timeout_sec", "env", "user", "environment_mode", "environment"},
    "steps.healthcheck": {"command", "interval_sec", "timeout_sec", "retries", "start_period_sec",
                          "start_interval_sec"},
}


class HarborTaskError(TaskError):
    """A task folder that is not a runnable Harbor task; the message names the folder and the key."""


@dataclass
class HarborFolder:
    """One task folder, read and checked (nothing built yet)."""

    path: Path
    name: str
    instruction: str  # what the agent is shown first: instruction.md, or a multi-step task's first step's
    schema_version: str
    title: str  # [task].name, else the folder's name
    docker_image: str
    dockerfile: Path | None
    build_timeout_s: float
    workdir: str
    cpus: float | None
    memory_mb: int | None
    storage_mb: int | None
    network: bool
    environment_env: dict[str, str]
    verifier_timeout_s: float
    verifier_env: dict[str, str]
    verifier_user: str
    agent_timeout_s: float | None
    agent_user: str
    solution_env: dict[str, str]
    metadata: dict
    tests: str  # base64 tar.gz of tests/ (of a multi-step task: its shared tests/, maybe empty)
    solution: str  # base64 tar.gz of solution/, or ""
    steps: list[HarborStep] = field(default_factory=list)  # [] = a single-step task
    multi_step_reward: str = "mean"
    artifacts: list[HarborArtifact] = field(default_factory=list)
    task_instruction: str = ""  # a multi-step task's top-level instruction.md ("" when it has none)
    compose: Compose | None = None  # environment/docker-compose.yaml, read (patchgym.tasks.harbor.compose)
    warnings: list[str] = field(default_factory=list)


def find_task_folders(root: Path) -> list[Path]:
    """`root` itself when it holds task.toml, else every folder below it that does (hidden ones and links skipped),
    in name order."""
    root = Path(root)
    if not root.is_dir():
        raise HarborTaskError(f"{root}: no such folder")
    if (root / "task.toml").is_file():
        return [root]
    found, level = [], [root]
    for _ in range(MAX_DEPTH):
        below = []
        for folder in level:
            for child in sorted(folder.iterdir()):
                if child.name.startswith(".") or child.is_symlink() or not child.is_dir():
                    continue
                (found if (child / "task.toml").is_file() else below).append(child)
        level = below
    if not found:
        raise HarborTaskError(f"{root}: no task folder (a folder with a task.toml) in it or below it")
    return sorted(found)


def read_folder(path: Path) -> HarborFolder:
    """Read and check one task folder."""
    path = Path(path)
    where = f"{path}/task.toml"
    try:
        raw = tomllib.loads((path / "task.toml").read_text())
    except FileNotFoundError:
        raise HarborTaskError(f"{path}: no task.toml") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HarborTaskError(f"{where}: not valid TOML: {exc}") from None
    keys = Keys(where, raw)
    version = keys.text("schema_version", old="version", default="1.0")
    if not re.fullmatch(r"1(\.\d+)*", version):
        keys.fail("schema_version", f"{version!r} is not a 1.x schema this reader knows (1.0 to 1.4)")
    env, verifier, agent, solution = (keys.table(name) for name in ("environment", "verifier", "agent", "solution"))
    env.refuse_value("os", lambda v: v != "linux", "only linux environments run here")
    env.refuse_value("gpus", lambda v: v not in (0, None), "GPU tasks do not run on this sandbox")
    _shared_verifier(verifier)
    network = _network(env)
    docker_image = env.text("docker_image", default="")
    dockerfile = path / "environment" / "Dockerfile"
    compose_path = compose_file(path / "environment")
    try:
        compose = read_compose(compose_path) if compose_path else None
    except ComposeError as exc:
        raise HarborTaskError(str(exc)) from None
    if not docker_image:
        if not dockerfile.is_file():
            raise HarborTaskError(f"{path}/environment/Dockerfile: missing, and task.toml names no "
                                  "[environment].docker_image")
    step_keys = keys.steps()
    if not step_keys and not (path / "tests" / "test.sh").is_file():
        raise HarborTaskError(f"{path}/tests/test.sh: missing (the verifier that writes the reward)")
    if (path / "solution").exists() and not (path / "solution" / "solve.sh").is_file():
        raise HarborTaskError(f"{path}/solution/solve.sh: missing, though solution/ is there")
    workdir = env.text("workdir", default="")
    if workdir and not workdir.startswith("/"):
        env.fail("workdir", f"{workdir!r} is not an absolute path")
    task_table = keys.get("task", {})
    verifier_timeout_s, verifier_env = verifier.number("timeout_sec", default=600.0), verifier.strings("env")
    agent_timeout_s, agent_user, verifier_user = agent.number("timeout_sec", default=None), agent.user("user"), \
        verifier.user("user")
    artifacts = keys.artifacts("artifacts")
    inherited = {"agent_timeout_s": agent_timeout_s, "agent_user": agent_user, "verifier_timeout_s":
                 verifier_timeout_s, "verifier_env": verifier_env, "verifier_user": verifier_user,
                 "artifacts": artifacts}
    steps = read_steps(path, step_keys, inherited)
    folder = HarborFolder(
        path=path, name=path.name, instruction=steps[0].instruction if steps else read_instruction(path),
        schema_version=version,
        title=str(task_table.get("name") or path.name) if isinstance(task_table, dict) else path.name,
        docker_image=docker_image, dockerfile=None if docker_image else dockerfile,
        build_timeout_s=env.number("build_timeout_sec", default=600.0), workdir=workdir,
        cpus=env.number("cpus", default=None), memory_mb=env.megabytes("memory_mb", "memory"),
        storage_mb=env.megabytes("storage_mb", "storage"), network=network,
        environment_env=env.strings("env"), verifier_timeout_s=verifier_timeout_s, verifier_env=verifier_env,
        verifier_user=verifier_user, agent_timeout_s=agent_timeout_s, agent_user=agent_user,
        solution_env=solution.strings("env"), metadata=_metadata(keys),
        tests=archive_layers(_folders(path / "tests"), f"{path}/tests"),
        solution=archive(path / "solution", f"{path}/solution") if (path / "solution").is_dir() else "",
        steps=steps, multi_step_reward=_reward_strategy(keys), artifacts=artifacts,
        task_instruction=_optional_instruction(path) if steps else "", compose=compose)
    folder.warnings = keys.unknown()
    return folder


def read_steps(path: Path, step_keys: list["Keys"], inherited: dict) -> list[HarborStep]:
    """Each [[steps]] entry with its steps/NAME/ folder, in order; names must be unique folder names."""
    steps, seen = [], {}
    for step in step_keys:
        name = step.text("name", default="")
        if not _STEP_NAME.match(name) or name.endswith("."):
            step.fail("name", f"{name!r} is not a step name (a folder name under steps/: letters, digits, '.', '_', "
                              "'-', not starting with '.')")
        if name in seen:
            step.fail("name", f"{name!r} is also the name of {seen[name]}")
        seen[name] = step.prefix
        steps.append(read_step(path, name, step, inherited))
    return steps


def read_step(path: Path, name: str, step: "Keys", inherited: dict) -> HarborStep:
    """One step: its table in task.toml and its folder steps/NAME/, over the task-level values it inherits."""
    folder, where = path / "steps" / name, f"{path}/steps/{name}"
    if not folder.is_dir():
        raise HarborTaskError(f"{where}: missing (the folder of {step.prefix}, named {name!r})")
    layers = _folders(path / "tests", folder / "tests")
    if not any((layer / "test.sh").is_file() for layer in layers):
        raise HarborTaskError(f"{where}/tests/test.sh: missing, and the task's tests/ has no test.sh either (the "
                              "verifier that writes the step's reward)")
    if (folder / "solution").exists() and not (folder / "solution" / "solve.sh").is_file():
        raise HarborTaskError(f"{where}/solution/solve.sh: missing, though solution/ is there")
    agent, verifier = step.table("agent"), step.table("verifier")
    _shared_verifier(verifier)
    values = dict(
        name=name, instruction=read_instruction(folder), tests=archive_layers(layers, f"{where}/tests"),
        solution=archive(folder / "solution", f"{where}/solution") if (folder / "solution").is_dir() else "",
        workdir=archive(folder / "workdir", f"{where}/workdir") if (folder / "workdir").is_dir() else "",
        agent_timeout_s=agent.number("timeout_sec", default=inherited["agent_timeout_s"]),
        agent_user=agent.user("user", default=inherited["agent_user"]),
        verifier_timeout_s=verifier.number("timeout_sec", default=inherited["verifier_timeout_s"]),
        verifier_env={**inherited["verifier_env"], **verifier.strings("env")},
        verifier_user=verifier.user("user", default=inherited["verifier_user"]),
        healthcheck=_healthcheck(step), min_reward=_min_reward(step),
        artifacts=inherited["artifacts"] + step.artifacts("artifacts"))
    try:
        return HarborStep(**values)
    except ValidationError as exc:
        raise HarborTaskError(f"{step.where}: {step.prefix}: {exc}") from None


def _shared_verifier(verifier: "Keys") -> None:
    verifier.refuse("environment", "a separate verifier sandbox ([verifier.environment]) is not supported; "
                                   "its verifier must run in the agent's sandbox (shared mode)")
    verifier.refuse_value("environment_mode", lambda v: v != "shared", "only the shared mode is supported")


def _healthcheck(step: "Keys") -> HarborHealthcheck | None:
    """[steps.healthcheck], with Harbor's defaults for what it leaves out (Docker HEALTHCHECK's options)."""
    if "healthcheck" not in step.data:
        return None
    check = step.table("healthcheck")
    command = check.text("command", default="")
    if not command.strip():
        check.fail("command", "missing or empty (the shell command whose exit 0 means healthy)")
    retries = check.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        check.fail("retries", f"must be a whole number of at least 1, got {retries!r}")
    return HarborHealthcheck(
        command=command, interval_s=check.seconds("interval_sec", default=5.0),
        timeout_s=check.number("timeout_sec", default=30.0), retries=retries,
        start_period_s=check.seconds("start_period_sec", default=0.0),
        start_interval_s=check.seconds("start_interval_sec", default=5.0))


def _min_reward(step: "Keys") -> float | dict[str, float] | None:
    """A number (gates the reward named "reward"), or a table of reward names to numbers (gates each)."""
    value = step.get("min_reward", None)
    if value is None:
        return None
    if _is_number(value):
        return float(value)
    if isinstance(value, dict) and value and all(_is_number(v) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    step.fail("min_reward", f"must be a number or a table of reward names to numbers, got {value!r}")


def _reward_strategy(keys: "Keys") -> str:
    strategy = keys.text("multi_step_reward_strategy", default="mean")
    if strategy not in ("mean", "final"):
        keys.fail("multi_step_reward_strategy", f"{strategy!r}: Harbor's strategies are \"mean\" and \"final\"")
    return strategy


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _folders(*paths: Path) -> list[Path]:
    return [p for p in paths if p.is_dir()]


def _optional_instruction(path: Path) -> str:
    """A multi-step task's top-level instruction.md, which it may leave out ("" then, or when it is empty)."""
    if not (path / "instruction.md").is_file():
        return ""
    try:
        return read_instruction(path)
    except HarborTaskError:
        return ""


def read_instruction(path: Path) -> str:
    """instruction.md, without leading canary lines (and the blank lines after them)."""
    try:
        text = (path / "instruction.md").read_text()
    except FileNotFoundError:
        raise HarborTaskError(f"{path}/instruction.md: missing (what the agent is asked to do)") from None
    lines, dropped = text.splitlines(keepends=True), False
    while lines and (_CANARY.match(lines[0].strip()) or (dropped and not lines[0].strip())):
        lines, dropped = lines[1:], True
    body = "".join(lines)
    if not body.strip():
        raise HarborTaskError(f"{path}/instruction.md: empty")
    return body


def archive(folder: Path, where: str) -> str:
    """A folder as a base64 tar.gz; over MAX_ARCHIVE_BYTES is an error."""
    return archive_layers([folder], where)


def archive_layers(folders: list[Path], where: str) -> str:
    """Folders laid one over the next (a later one's file replaces an earlier one's) as one base64 tar.gz. The same
    files give the same bytes: owners and times are dropped and modes kept only as executable or not, so a row does
    not depend on the machine that read the folder. Over MAX_ARCHIVE_BYTES is an error."""
    entries = {}
    for folder in folders:
        for item in sorted(folder.rglob("*")):
            rel = item.relative_to(folder).as_posix()
            if rel in entries and entries[rel].is_dir() and not item.is_dir():  # a file replaces a folder below
                entries = {k: v for k, v in entries.items() if not k.startswith(rel + "/")}
            entries[rel] = item
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as packed, tarfile.open(fileobj=packed, mode="w") as tar:
        for rel in sorted(entries):
            _add(tar, entries[rel], rel)
    if buf.tell() > MAX_ARCHIVE_BYTES:
        raise HarborTaskError(f"{where}: {buf.tell() >> 20} MiB compressed, over the {MAX_ARCHIVE_BYTES >> 20} MiB a "
                              "task row carries")
    return base64.b64encode(buf.getvalue()).decode()


def _add(tar: tarfile.TarFile, item: Path, name: str) -> None:
    info = tar.gettarinfo(str(item), arcname=name)
    info.uid = info.gid = info.mtime = 0
    info.uname = info.gname = ""
    if info.isdir():
        info.mode = 0o755
    elif not info.issym():
        info.mode = 0o755 if info.mode & 0o111 else 0o644
    if info.isreg():
        with open(item, "rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def unpack(data: str, dest: Path) -> None:
    """Write an `archive` back out into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data)), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")


def _network(env: "Keys") -> bool:
    """The agent's network as task.toml asks: network_mode = "public" or "no-network", or the deprecated
    allow_internet; on when it says nothing, as in Harbor (sandbox.task_network = false keeps every sandbox off)."""
    mode = env.text("network_mode", default="")
    if mode and mode not in ("public", "no-network"):
        env.fail("network_mode", f"{mode!r}: only \"public\" and \"no-network\" are supported")
    allow = env.get("allow_internet", None)
    if allow is not None and not isinstance(allow, bool):
        env.fail("allow_internet", f"must be true or false, got {allow!r}")
    if mode and allow is not None and (mode == "public") != allow:
        env.fail("network_mode", f"{mode!r} contradicts the deprecated allow_internet = {str(allow).lower()}")
    return mode == "public" if mode else allow is not False


def _metadata(keys: "Keys") -> dict:
    meta = keys.get("metadata", {})
    if not isinstance(meta, dict):
        keys.fail("metadata", "must be a table")
    source = keys.get("source", None)
    return {**meta, **({"source": source} if source else {})}


class Keys:
    """One table of task.toml, read key by key with errors that name the file and the key."""

    def __init__(self, where: str, data: dict, prefix: str = ""):
        self.where, self.data, self.prefix = where, data, prefix  # prefix: "[verifier]", "[[steps]][2].agent", ...

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, problem: str):
        raise HarborTaskError(f"{self.where}: {self.name(key)}: {problem}")

    def get(self, key: str, default):
        return self.data.get(key, default)

    def table(self, key: str) -> "Keys":
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            self.fail(key, "must be a table")
        return Keys(self.where, value, self.name(key) if self.prefix else f"[{key}]")

    def steps(self) -> list["Keys"]:
        """The [[steps]] tables, in order ([] when there are none)."""
        if "steps" not in self.data:
            return []
        value = self.data["steps"]
        if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
            self.fail("steps", "must be one or more [[steps]] tables")
        return [Keys(self.where, step, f"[[steps]][{n}]") for n, step in enumerate(value, 1)]

    def artifacts(self, key: str) -> list[HarborArtifact]:
        """Paths to collect: each a path, or a table {source, destination, exclude}."""
        value = self.data.get(key, [])
        if not isinstance(value, list):
            self.fail(key, "must be a list of paths or {source = ...} tables")
        return [self._artifact(f"{key}[{n}]", item) for n, item in enumerate(value, 1)]

    def _artifact(self, key: str, item) -> HarborArtifact:
        if isinstance(item, str) and item.strip():
            return HarborArtifact(source=item)
        if not isinstance(item, dict):
            self.fail(key, f"must be a path or a {{source = ...}} table, got {item!r}")
        spec = Keys(self.where, item, self.name(key))
        for extra in set(item) - {"source", "destination", "exclude"}:
            spec.fail(extra, "not a key of an artifact (source, destination, exclude)")
        source, destination = spec.text("source", default=""), item.get("destination")
        exclude = item.get("exclude", [])
        if not source.strip():
            spec.fail("source", "missing or empty (the path to collect)")
        if destination is not None and not (isinstance(destination, str) and destination.strip()):
            spec.fail("destination", f"must be a name, got {destination!r}")
        if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
            spec.fail("exclude", f"must be a list of patterns, got {exclude!r}")
        return HarborArtifact(source=source, destination=destination, exclude=exclude)

    def refuse(self, key: str, why: str) -> None:
        if key in self.data:
            self.fail(key, why)

    def refuse_value(self, key: str, bad, why: str) -> None:
        if key in self.data and bad(self.data[key]):
            self.fail(key, f"{self.data[key]!r}: {why}")

    def text(self, key: str, *, old: str | None = None, default: str) -> str:
        value = self.data.get(key, self.data.get(old, default) if old else default)
        if not isinstance(value, str):
            self.fail(key if key in self.data else old, f"must be a string, got {value!r}")
        return value

    def number(self, key: str, *, default):
        value = self.data.get(key, default)
        if value is None:
            return None
        if not _is_number(value) or value <= 0:
            self.fail(key, f"must be a positive number, got {value!r}")
        return float(value)

    def seconds(self, key: str, *, default: float) -> float:
        """A time that may be 0."""
        value = self.data.get(key, default)
        if not _is_number(value) or value < 0:
            self.fail(key, f"must be a number of seconds (0 or more), got {value!r}")
        return float(value)

    def megabytes(self, key: str, old: str) -> int | None:
        """An amount in MB from `key`, or from the deprecated `old` ("4G", "512M"); both, differing, is an error."""
        new = self.data.get(key)
        if new is not None and (isinstance(new, bool) or not isinstance(new, int) or new <= 0):
            self.fail(key, f"must be a positive whole number of MB, got {new!r}")
        legacy = self.data.get(old)
        if legacy is not None:
            match = _SIZE.match(str(legacy))
            if not match:
                self.fail(old, f"{legacy!r} is not a size like \"4G\" or \"512M\"")
            amount = round(float(match.group(1)) * _MB[match.group(2).upper()])
            if new is not None and new != amount:
                self.fail(key, f"{new} contradicts the deprecated {old} = {legacy!r} ({amount} MB)")
            return max(amount, 1)
        return new

    def strings(self, key: str) -> dict[str, str]:
        value = self.data.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
            self.fail(key, "must be a table of names to strings")
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}

    def user(self, key: str, default: str = "root") -> str:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, int) and value < 0) \
                or not str(value).strip():
            self.fail(key, f"must be a user name or uid, got {value!r}")
        return str(value)

    def unknown(self) -> list[str]:
        """Keys of this file that patchgym does not read (ignored, as Harbor ignores them)."""
        found = [k for k in self.data if k not in KNOWN[""]]
        for table in ("environment", "verifier", "agent", "solution"):
            if isinstance(self.data.get(table), dict):
                found += [f"[{table}].{k}" for k in self.data[table] if k not in KNOWN[table]]
        for step in self.steps():
            found += [step.name(k) for k in step.data if k not in KNOWN["steps"]]
            for table in ("agent", "verifier", "healthcheck"):
                if isinstance(step.data.get(table), dict):
                    found += [f"{step.name(table)}.{k}" for k in step.data[table] if k not in KNOWN[f"steps.{table}"]]
        return [f"{self.where}: {k}: not a key patchgym reads; ignored" for k in found]
