"""Read Harbor task folders (task.toml schema 1.4, with its deprecated spellings) into what a task needs.

A folder holds task.toml, instruction.md, environment/ (a Dockerfile and its context, unless task.toml names a
prebuilt `docker_image`), tests/test.sh and its files, and optionally solution/solve.sh. Every problem is a
HarborTaskError naming the folder and the key. Keys Harbor defines that patchgym cannot honour (a compose
environment, a separate verifier sandbox, multi-step tasks, GPUs, Windows) are refused by name; keys it does not
know are listed as warnings and ignored, as Harbor ignores them.
"""

import base64
import io
import re
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from patchgym.tasks.task import TaskError

MAX_ARCHIVE_BYTES = 16 << 20  # tests/ or solution/, compressed: a row carries them
MAX_DEPTH = 6  # task folders found up to this many levels below the folder given
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_MB = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}
# What patchgym reads of each table; anything else Harbor defines is refused by name below, the rest ignored.
KNOWN = {
    "": {"schema_version", "version", "task", "metadata", "source", "verifier", "agent", "environment", "solution",
         "steps", "artifacts", "multi_step_reward_strategy", "multi_step_reward_mode"},
    "environment": {"docker_image", "build_timeout_sec", "os", "cpus", "memory_mb", "memory", "storage_mb", "storage",
                    "gpus", "gpu_types", "env", "workdir", "network_mode", "allow_internet", "allowed_hosts"},
    "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment"},
    "agent": {"timeout_sec", "user"},
    "solution": {"env"},
}


class HarborTaskError(TaskError):
    """A task folder that is not a runnable Harbor task; the message names the folder and the key."""


@dataclass
class HarborFolder:
    """One task folder, read and checked (nothing built yet)."""

    path: Path
    name: str
    instruction: str
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
    tests: str  # base64 tar.gz of tests/
    solution: str  # base64 tar.gz of solution/, or ""
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
    keys.refuse("steps", "multi-step tasks ([[steps]]) are not supported")
    version = keys.text("schema_version", old="version", default="1.0")
    if not re.fullmatch(r"1(\.\d+)*", version):
        keys.fail("schema_version", f"{version!r} is not a 1.x schema this reader knows (1.0 to 1.4)")
    env, verifier, agent, solution = (keys.table(name) for name in ("environment", "verifier", "agent", "solution"))
    env.refuse_value("os", lambda v: v != "linux", "only linux environments run here")
    env.refuse_value("gpus", lambda v: v not in (0, None), "GPU tasks do not run on this sandbox")
    verifier.refuse("environment", "a separate verifier sandbox ([verifier.environment]) is not supported; "
                                   "its verifier must run in the agent's sandbox (shared mode)")
    verifier.refuse_value("environment_mode", lambda v: v != "shared", "only the shared mode is supported")
    network = _network(env)
    docker_image = env.text("docker_image", default="")
    dockerfile = path / "environment" / "Dockerfile"
    if not docker_image:
        if any((path / "environment" / n).exists() for n in ("docker-compose.yaml", "docker-compose.yml")):
            raise HarborTaskError(f"{path}/environment: docker-compose environments are not supported; give a "
                                  "Dockerfile or [environment].docker_image")
        if not dockerfile.is_file():
            raise HarborTaskError(f"{path}/environment/Dockerfile: missing, and task.toml names no "
                                  "[environment].docker_image")
    test_sh = path / "tests" / "test.sh"
    if not test_sh.is_file():
        raise HarborTaskError(f"{path}/tests/test.sh: missing (the verifier that writes the reward)")
    if (path / "solution").exists() and not (path / "solution" / "solve.sh").is_file():
        raise HarborTaskError(f"{path}/solution/solve.sh: missing, though solution/ is there")
    workdir = env.text("workdir", default="")
    if workdir and not workdir.startswith("/"):
        env.fail("workdir", f"{workdir!r} is not an absolute path")
    task_table = keys.get("task", {})
    folder = HarborFolder(
        path=path, name=path.name, instruction=read_instruction(path), schema_version=version,
        title=str(task_table.get("name") or path.name) if isinstance(task_table, dict) else path.name,
        docker_image=docker_image, dockerfile=None if docker_image else dockerfile,
        build_timeout_s=env.number("build_timeout_sec", default=600.0), workdir=workdir,
        cpus=env.number("cpus", default=None), memory_mb=env.megabytes("memory_mb", "memory"),
        storage_mb=env.megabytes("storage_mb", "storage"), network=network,
        environment_env=env.strings("env"), verifier_timeout_s=verifier.number("timeout_sec", default=600.0),
        verifier_env=verifier.strings("env"), verifier_user=verifier.user("user"),
        agent_timeout_s=agent.number("timeout_sec", default=None), agent_user=agent.user("user"),
        solution_env=solution.strings("env"), metadata=_metadata(keys),
        tests=archive(path / "tests", f"{path}/tests"),
        solution=archive(path / "solution", f"{path}/solution") if (path / "solution").is_dir() else "")
    folder.warnings = keys.unknown()
    return folder


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
    """A folder as a base64 tar.gz (modes kept, owners dropped); over MAX_ARCHIVE_BYTES is an error."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for item in sorted(folder.rglob("*")):
            info = tar.gettarinfo(str(item), arcname=str(item.relative_to(folder)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if item.is_file() and not item.is_symlink():
                with open(item, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    if buf.tell() > MAX_ARCHIVE_BYTES:
        raise HarborTaskError(f"{where}: {buf.tell() >> 20} MiB compressed, over the {MAX_ARCHIVE_BYTES >> 20} MiB a "
                              "task row carries")
    return base64.b64encode(buf.getvalue()).decode()


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
        self.where, self.data, self.prefix = where, data, prefix

    def name(self, key: str) -> str:
        return f"[{self.prefix}].{key}" if self.prefix else key

    def fail(self, key: str, problem: str):
        raise HarborTaskError(f"{self.where}: {self.name(key)}: {problem}")

    def get(self, key: str, default):
        return self.data.get(key, default)

    def table(self, key: str) -> "Keys":
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            self.fail(key, "must be a table")
        return Keys(self.where, value, key)

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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.fail(key, f"must be a positive number, got {value!r}")
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

    def user(self, key: str) -> str:
        value = self.data.get(key, "root")
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
        return [f"{self.where}: {k}: not a key patchgym reads; ignored" for k in found]
