"""The `local` backend, no daemon: bubblewrap over a copy-on-write overlayfs view of the image's rootfs layers.

    unshare --mount (private) -> join cgroups, mount overlay(lower = image layers, upper = scratch) ->
    bwrap (new user/pid/net/ipc/uts namespaces, the overlay as /, --die-with-parent) -> the runner

bwrap maps a single uid into the user namespace it makes; we map uids and gids 0-65535 onto the same host ids
instead (written by us while bwrap waits, as its --userns-block-fd allows), so the runner, root in there, can run
the agent's commands as an ordinary user.

The overlay mount lives only in the sandbox's own mount namespace and every process in its pid namespace, so
both vanish with the sandbox, even when the host process is SIGKILLed. What stays on disk after a crash (the
scratch directory, the cgroups) names its owner and is reaped.
"""

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

from patchgym import paths
from patchgym.sandbox import images, registry
from patchgym.sandbox.base import Sandbox
from patchgym.sandbox.channel import Channel, PipeChannel
from patchgym.sandbox.errors import SandboxError
from patchgym.sandbox.limits import Cgroup, parent_dirs
from patchgym.sandbox.unpack import engine_rootfs, tar_rootfs

MAX_LOWERDIR = 3800  # mount options fit in one page (4096 bytes) with the upper and work dirs
LOCAL_FIX = ("install them with `apt-get install -y bubblewrap util-linux` and run as root, or use "
             "`sandbox.backend=docker`")
# Host uids and gids the sandbox's user namespace maps, each onto itself: root and every ordinary user of an image.
ID_MAP = "0 0 65536\n"
_MOUNT_SCRIPT = r"""
for f in $PATCHGYM_CGROUP_PROCS; do echo $$ > "$f" || exit 112; done
mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" || exit 111
shift 4
exec "$@"
"""


def resolve_rootfs(image, config=None) -> tuple[list[Path], dict[str, str]]:
    """The overlay lower layers (top first) and the environment of an image given as a recipe, a recipe's tag, a
    `docker save` tar or any other image name (unpacked once from the local Docker engine, pulled into it if need
    be)."""
    if image is None or isinstance(image, images.ImageRecipe):
        recipe = image or images.base_recipe()
        return images.ensure_rootfs(recipe), images.image_env(recipe)
    found = images.find_rootfs(image)
    if found is not None:
        return found
    if image.startswith(registry.LOCAL_NAMESPACE):
        raise SandboxError(f"no rootfs for image {image!r} under {paths.rootfs_dir()}; build it first "
                           "(`patchgym image build` builds the base image)")
    layers, env = tar_rootfs(Path(image)) if image.endswith(".tar") else _engine_rootfs(image, config)
    if len(":".join(map(str, layers))) > MAX_LOWERDIR:
        raise SandboxError(f"image {image!r} has {len(layers)} layers, more than one overlay mount can stack here "
                           f"({MAX_LOWERDIR} bytes of lowerdir); squash it (`docker export | docker import`)")
    return layers, env


def _engine_rootfs(image: str, config) -> tuple[list[Path], dict[str, str]]:
    from patchgym.sandbox.docker import docker_client
    from patchgym.sandbox.pull import ensure_pulled

    try:
        client = docker_client()
    except SandboxError as exc:
        raise SandboxError(f"the local backend takes image {image!r} from the Docker engine, and {exc}. Without an "
                           f"engine, give a `docker save` tar instead: sandbox.image=/path/image.tar, made with "
                           f"`docker save {image} -o image.tar` where Docker runs") from exc
    ensure_pulled(client, image, config.registry_auth if config else None)
    return engine_rootfs(client, image)


class LocalSandbox(Sandbox):
    backend = "local"

    def _start(self) -> Channel:
        self._proc = None
        self._cgroup = None
        for tool in ("bwrap", "unshare", "mount"):
            if shutil.which(tool) is None:
                raise SandboxError(f"the local backend needs `{tool}`; {LOCAL_FIX}")
        layers, env = resolve_rootfs(self.image, self.config)
        cfg = self.config
        self._dir = paths.sandboxes_dir() / self.id
        upper, work, merged = (self._dir / n for n in ("upper", "work", "merged"))
        for d in (upper, work, merged):
            d.mkdir(parents=True)
        # The owner goes on disk before the cgroup exists, so a concurrent reaper never takes it for a leftover.
        cgroups = [str(parent / self.id) for parent in parent_dirs()]
        (self._dir / "owner.json").write_text(json.dumps({"labels": self.labels, "cgroups": cgroups}))
        try:
            self._cgroup = Cgroup(self.id, memory_mb=cfg.memory_mb, pids=cfg.pids, cpus=cfg.cpus)
        except PermissionError as exc:
            raise SandboxError(f"{self.id}: cannot set its limits: {exc}") from exc
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        bwrap = ["bwrap", "--bind", str(merged), "/", "--proc", "/proc", "--dev", "/dev",
                 "--unshare-all", *(["--share-net"] if cfg.network else []), "--hostname", "sandbox",
                 "--unshare-user", "--userns-block-fd", str(block_r), "--info-fd", str(info_w),
                 "--uid", "0", "--gid", "0", "--die-with-parent", "--new-session", "--clearenv"]
        # PATCHGYM_RUN also stands in bwrap's command line, so a leak check can find the processes of a run.
        for key, value in {"HOME": "/root", "LANG": "C.UTF-8", **env, **cfg.env, "PATCHGYM_RUN": self.run_id}.items():
            bwrap += ["--setenv", key, value]
        argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _MOUNT_SCRIPT, "sh",
                ":".join(map(str, layers)), str(upper), str(work), str(merged),
                *bwrap, "--", *self.runner_command()]
        self._log = open(self._dir / "stderr.log", "wb")
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                               "PATCHGYM_CGROUP_PROCS": " ".join(self._cgroup.procs_files)},
                                          pass_fds=(info_w, block_r),
                                          start_new_session=True)  # Ctrl-C reaches us, not the sandbox: we clean up
            os.close(info_w)
            os.close(block_r)
            info_w = block_r = None
            self._map_ids(info_r, block_w)
        finally:
            for fd in (info_r, info_w, block_r, block_w):
                if fd is not None:
                    os.close(fd)
        return PipeChannel(self.id, self._proc.stdin, self._proc.stdout)

    def _map_ids(self, info_fd: int, block_fd: int) -> None:
        """Once bwrap has made the user namespace (it says so on `info_fd`), write its uid and gid maps, then let
        it go on (a byte on `block_fd`)."""
        deadline = time.monotonic() + self.config.start_timeout_s
        data = b""
        while True:
            try:
                info = json.loads(data)
                break
            except ValueError:
                pass
            left = deadline - time.monotonic()
            chunk = os.read(info_fd, 4096) if left > 0 and select.select([info_fd], [], [], left)[0] else None
            if not chunk:
                why = "no answer" if chunk is None else self._diagnose()
                raise SandboxError(f"{self.id}: bwrap did not make its user namespace ({why})")
            data += chunk
        pid = info["child-pid"]
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{pid}/{name}").write_text(ID_MAP)
        os.write(block_fd, b"1")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
        if self._cgroup is not None:
            self._cgroup.destroy()
        if self._proc is not None:
            self._proc.wait()
            self._log.close()
        if getattr(self, "_dir", None) is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _oom_kills(self) -> int | None:
        return self._cgroup.oom_kills() if self._cgroup else None

    def _diagnose(self) -> str:
        try:
            self._proc.wait(timeout=1)
        except (AttributeError, subprocess.TimeoutExpired):
            return ""
        try:
            log = (self._dir / "stderr.log").read_text(errors="replace").strip()[-500:]
        except OSError:
            log = ""
        return f"its process exited with {self._proc.returncode}" + (f": {log}" if log else "")

    def _died_inside(self) -> bool:
        # bwrap passes on the exit status of the runner when something inside ended it; a signal from the host
        # kills bwrap itself. A runner that only stopped answering leaves bwrap running: inside too.
        try:
            return self._proc.wait(timeout=2) >= 0
        except subprocess.TimeoutExpired:
            return True
