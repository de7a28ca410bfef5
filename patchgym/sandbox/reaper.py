"""Removes what crashed runs left behind: containers, pods, scratch dirs and cgroups whose owner process is gone.

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
    pods: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return self.containers + self.directories + self.cgroups + self.pods

    @property
    def total(self) -> int:
        return len(self.names)


def _kubelet_made(container) -> bool:
    """Containers a kubelet made for a pod (they carry the pod's labels): the pod is what gets reaped and listed."""
    return "io.kubernetes.docker.type" in container.labels


def reap_docker(result: Reaped, everything: bool = False, dry_run: bool = False) -> None:
    import docker

    try:
        client = docker.from_env(timeout=30)
        containers = client.containers.list(all=True, filters={"label": lifecycle.LABEL_SANDBOX})
    except docker.errors.DockerException:
        return  # no engine, nothing of ours can be running in it
    for c in containers:
        if _kubelet_made(c):
            continue
        if everything or not lifecycle.owner_alive(c.labels.get(lifecycle.LABEL_OWNER, "")):
            try:
                if not dry_run:
                    c.remove(force=True)
                result.containers.append(c.name)
            except docker.errors.APIError:
                pass
    try:  # the networks of sandboxes with services, once their containers are gone
        networks = client.networks.list(filters={"label": lifecycle.LABEL_SANDBOX})
    except docker.errors.DockerException:
        return
    for n in networks:
        if everything or not lifecycle.owner_alive(n.attrs.get("Labels", {}).get(lifecycle.LABEL_OWNER, "")):
            try:
                if not dry_run:
                    n.remove()
                result.containers.append(f"network {n.name}")
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
            if (cg.is_dir() and cg.name.startswith("pg-") and cg.name not in live_cgroups
                    and not (root / cg.name).exists()):
                if not dry_run:
                    remove_cgroup_dirs([cg])
                result.cgroups.append(str(cg))


def _kube_config():
    """The default `sandbox.kubernetes` settings when a cluster is configured (KUBECONFIG, ...), else None."""
    from patchgym.sandbox.kubernetes_config import KubernetesConfig, configured

    kcfg = KubernetesConfig()
    return kcfg if configured(kcfg) else None


def reap_kubernetes(result: Reaped, everything: bool = False, dry_run: bool = False) -> None:
    kcfg = _kube_config()
    if kcfg is None:
        return
    from patchgym.sandbox.kubernetes import reap_pods

    try:
        result.pods += reap_pods(kcfg, everything, dry_run)
    except Exception:  # no API server answers (the client raises many types): nothing of ours can run there
        return


def reap(backends: tuple[str, ...] = ("docker", "local", "kubernetes"), everything: bool = False,
         dry_run: bool = False) -> Reaped:
    """Remove leftovers of dead owners (or, with `everything`, of every patchgym sandbox on this host)."""
    result = Reaped()
    if "docker" in backends:
        reap_docker(result, everything, dry_run)
    if "local" in backends:
        reap_local(result, everything, dry_run)
    if "kubernetes" in backends:
        reap_kubernetes(result, everything, dry_run)
    return result


def reapable() -> list[str]:
    """What `reap()` would remove now."""
    return reap(dry_run=True).names


def reap_once(backend: str) -> None:
    """Reap a backend's leftovers the first time this process uses it (kubernetes: per namespace, by the sandbox)."""
    with _reap_lock:  # held while reaping: this process's other threads start their sandboxes after it
        if backend in _reaped or backend not in ("docker", "local"):
            return
        _reaped.add(backend)
        reap((backend,))


def leftovers(run: str) -> list[str]:
    """Everything of run `run` still on this host: containers, pods, scratch dirs, cgroups, processes, mounts."""
    found = []
    try:
        import docker

        client = docker.from_env(timeout=30)
        found += [f"container {c.name}" for c in
                  client.containers.list(all=True, filters={"label": f"{lifecycle.LABEL_RUN}={run}"})
                  if not _kubelet_made(c)]
    except docker.errors.DockerException:
        pass
    if (kcfg := _kube_config()) is not None:
        from patchgym.sandbox.kubernetes import run_pods

        try:
            found += [f"pod {p}" for p in run_pods(kcfg, run)]
        except Exception:  # no API server answers: no pod of ours runs there
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
