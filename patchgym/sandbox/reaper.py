"""Removes what crashed runs left behind: containers, scratch directories and cgroups whose owner process is gone.

Runs once per process before its first sandbox starts, and on `patchgym doctor --reap`. Sandboxes of live
processes (another run going on at the same time) are never touched.
"""

import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from patchgym import paths
from patchgym.sandbox import lifecycle
from patchgym.sandbox.limits import parent_dirs, remove_cgroup_dirs

# A scratch directory this young without its owner file may be a sandbox of another process still starting.
FRESH_S = 60
_reaped: set[str] = set()
_reap_lock = threading.Lock()


@dataclass
class Reaped:
    containers: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.containers) + len(self.directories) + len(self.cgroups)


def reap_docker(result: Reaped, everything: bool = False, dry_run: bool = False) -> None:
    import docker

    try:
        client = docker.from_env(timeout=30)
        containers = client.containers.list(all=True, filters={"label": lifecycle.LABEL_SANDBOX})
    except docker.errors.DockerException:
        return  # no engine, nothing of ours can be running in it
    for c in containers:
        if everything or not lifecycle.owner_alive(c.labels.get(lifecycle.LABEL_OWNER, "")):
            try:
                if not dry_run:
                    c.remove(force=True)
                result.containers.append(c.name)
            except docker.errors.APIError:
                pass


def reap_local(result: Reaped, everything: bool = False, dry_run: bool = False) -> None:
    root = paths.sandboxes_dir()
    live_cgroups: set[str] = set()
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            owner = json.loads((d / "owner.json").read_text())
        except (OSError, ValueError):
            owner = None
        if not everything and (owner is None and time.time() - d.stat().st_mtime < FRESH_S
                               or owner and lifecycle.owner_alive(owner["labels"].get(lifecycle.LABEL_OWNER, ""))):
            live_cgroups.add(d.name)
            continue
        if not dry_run:
            if owner:
                remove_cgroup_dirs([Path(c) for c in owner.get("cgroups", [])])
            shutil.rmtree(d, ignore_errors=True)
        result.directories.append(str(d))
    for parent in parent_dirs():
        for cg in sorted(parent.iterdir()) if parent.is_dir() else []:
            # A cgroup whose directory appeared after the scan belongs to a sandbox that is starting right now.
            if cg.is_dir() and cg.name.startswith("pg-") and cg.name not in live_cgroups and not (root / cg.name).exists():
                if not dry_run:
                    remove_cgroup_dirs([cg])
                result.cgroups.append(str(cg))


def reap(backends: tuple[str, ...] = ("docker", "local"), everything: bool = False, dry_run: bool = False) -> Reaped:
    """Remove leftovers of dead owners (or, with `everything`, of every patchgym sandbox on this host)."""
    result = Reaped()
    if "docker" in backends:
        reap_docker(result, everything, dry_run)
    if "local" in backends:
        reap_local(result, everything, dry_run)
    return result


def reapable() -> list[str]:
    """What `reap()` would remove now."""
    found = reap(dry_run=True)
    return found.containers + found.directories + found.cgroups


def reap_once(backend: str) -> None:
    """Reap a backend's leftovers the first time this process uses it."""
    with _reap_lock:  # held while reaping: this process's other threads start their sandboxes after it
        if backend in _reaped or backend not in ("docker", "local"):
            return
        _reaped.add(backend)
        reap((backend,))


def leftovers(run: str) -> list[str]:
    """Everything of run `run` still on this host: containers, scratch dirs, cgroups, processes, mounts."""
    found = []
    try:
        import docker

        client = docker.from_env(timeout=30)
        found += [f"container {c.name}" for c in
                  client.containers.list(all=True, filters={"label": f"{lifecycle.LABEL_RUN}={run}"})]
    except docker.errors.DockerException:
        pass
    root = paths.sandboxes_dir()
    ours = set()
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            owner = json.loads((d / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if owner["labels"].get(lifecycle.LABEL_RUN) == run:
            ours.add(d.name)
            found.append(f"directory {d}")
    found += [f"cgroup {cg}" for parent in parent_dirs() if parent.is_dir()
              for cg in sorted(parent.iterdir()) if cg.name in ours]
    marker = f"PATCHGYM_RUN\0{run}\0".encode()
    for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            if marker in (pid / "cmdline").read_bytes():
                found.append(f"process {pid.name}")
        except OSError:
            continue
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if str(root) in line]
    return found
