"""A Harbor task's environment/ built into a local image, as Harbor builds it: with the network docker gives a build.

The tag is content-addressed (`patchgym/harbor-NAME:DIGEST` of environment/'s files and its FROM images' ids), so a
rebuild is skipped and a changed folder or base image builds anew. Each FROM image must be on this machine already,
or be pulled through `sandbox.image_mirror`. The build's RUN apt-get or pip reaches what the machine reaches; with
`offline` it has no network, and a step that downloads fails: the error names the task, the step and the line that
says why.
"""

import hashlib
import re
from pathlib import Path

from patchgym.sandbox.config import SandboxConfig
from patchgym.sandbox.pull import ensure_pulled
from patchgym.sandbox.registry import mirrored
from patchgym.tasks.harbor.folders import HarborFolder, HarborTaskError

_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE | re.MULTILINE)
_STEP = re.compile(r"^Step \d+/\d+ : .*")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def environment_digest(folder: Path) -> str:
    """sha256 over environment/'s relative paths, modes and contents."""
    digest = hashlib.sha256()
    for item in sorted(folder.rglob("*")):
        if item.is_file():
            digest.update(f"{item.relative_to(folder)}\0{item.stat().st_mode & 0o777:o}\0".encode())
            digest.update(item.read_bytes())
    return digest.hexdigest()[:16]


def base_images(dockerfile: Path) -> list[str]:
    """The images a Dockerfile's FROM lines name (not its own stages, not `scratch`)."""
    stages, bases = set(), []
    for image, stage in _FROM.findall(dockerfile.read_text()):
        if image.lower() != "scratch" and image not in stages and image not in bases:
            bases.append(image)
        if stage:
            stages.add(stage)
    return bases


def build_image(task: HarborFolder, sandbox: SandboxConfig, *, client=None, offline: bool = False) -> str:
    """The task's image tag, built from environment/ unless it is there already (`offline`: without a network)."""
    return build_context(task, task.dockerfile.parent, task.dockerfile, image_name(task.name), "environment/Dockerfile",
                         sandbox, client=client, offline=offline)


def image_name(*parts: str) -> str:
    slug = "-".join(re.sub(r"[^a-z0-9]+", "-", p.lower()).strip("-") or "task" for p in parts)
    return f"patchgym/harbor-{slug}"


def build_context(task: HarborFolder, context: Path, dockerfile: Path, name: str, what: str, sandbox: SandboxConfig,
                  *, client=None, offline: bool = False) -> str:
    """`name`:DIGEST built from `context` with `dockerfile` unless it is there already; errors name the task and
    `what` was built (environment/Dockerfile, or a compose service's)."""
    import docker

    try:
        client = client or docker.from_env(timeout=max(120, int(task.build_timeout_s)))
        client.ping()
    except docker.errors.DockerException as exc:
        raise HarborTaskError(f"task {task.name}: building {what} needs the Docker engine ({exc}); "
                              "or give task.toml an [environment].docker_image") from None
    bases = base_images(dockerfile)
    for base in bases:
        _have_base(client, base, sandbox, task, what)
    digest = environment_digest(context)
    if dockerfile.name != "Dockerfile" or bases:
        ids = [dockerfile.name, *(client.images.get(base).id for base in bases)]
        digest = hashlib.sha256(f"{digest}\0{chr(0).join(ids)}".encode()).hexdigest()[:16]
    tag = f"{name}:{digest}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    output = BuildOutput()
    try:
        for chunk in client.api.build(path=str(context), dockerfile=dockerfile.name, tag=tag, rm=True, forcerm=True,
                                      pull=False, network_mode="none" if offline else None, decode=True,
                                      timeout=int(task.build_timeout_s)):
            output.feed(_ANSI.sub("", chunk.get("stream", "")))
            step = output.step
            if "error" in chunk:
                why = (" The build ran offline (--offline): a step that downloads (apt-get, pip, curl) must take "
                       "its files from the build context or a local mirror." if offline else "")
                raise HarborTaskError(f"task {task.name}: {what} failed at {step!r}: "
                                      f"{chunk['error'].strip()}.{why} The step's output:\n" + output.summary())
    except docker.errors.APIError as exc:
        raise HarborTaskError(f"task {task.name}: {what} failed at {output.step!r}: {exc}") from None
    except Exception as exc:  # a build over build_timeout_sec ends in a read timeout
        if "timed out" in str(exc).lower():
            raise HarborTaskError(f"task {task.name}: {what} ran over build_timeout_sec "
                                  f"({task.build_timeout_s:g} s) at {output.step!r}") from None
        raise
    return tag


# Lines of a failed step that say why (a network that is not there, a missing file or package), shown before its tail.
_CAUSE = re.compile(r"(?i)error|fail|unable|could not|cannot|can't|not found|no such|denied|unreachable|resolv|"
                    r"timed out|refused")


class BuildOutput:
    """A build's output as whole lines (docker streams it in pieces that split lines): the step it is at, and that
    step's lines."""

    TAIL, CAUSES = 10, 5

    def __init__(self):
        self.partial, self.lines, self.step = "", [], "(before the first step)"

    def feed(self, text: str) -> None:
        self.partial += text
        *done, self.partial = self.partial.split("\n")
        for line in done:
            if _STEP.match(line.strip()):
                self.step, self.lines = line.strip(), []
            else:
                self.lines.append(line)

    def summary(self) -> str:
        """The step's lines that say why (the first few), then its last lines, each whole."""
        lines = [line for line in (*self.lines, self.partial) if line.strip()]
        tail = lines[-self.TAIL:]
        causes = [line for line in lines[:-self.TAIL] if _CAUSE.search(line)][:self.CAUSES]
        return "\n".join([*causes, *(["..."] if causes else []), *tail])


def _have_base(client, base: str, sandbox: SandboxConfig, task: HarborFolder, what: str) -> None:
    """`base` present in the engine under its own name: already there, or pulled from its mirror and tagged so."""
    import docker

    try:
        client.images.get(base)
        return
    except docker.errors.ImageNotFound:
        pass
    source = mirrored(base, sandbox.image_mirror)
    if source == base:
        raise HarborTaskError(f"task {task.name}: {what} starts FROM {base}, which is not on this "
                              "machine, and no sandbox.image_mirror entry maps it (no public registry is reached)")
    ensure_pulled(client, source, show_progress=False)
    client.images.get(source).tag(base)
