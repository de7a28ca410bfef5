"""The `docker` backend: one container per sandbox, whose main process is the runner, attached over one socket.

No `docker exec` per command: the runner is started with the container (`python3 -c RUNNER`) and we keep its
stdin/stdout. With `StdinOnce` and `AutoRemove`, a host process that dies (even by SIGKILL) closes the socket,
the runner sees end of file and exits, and the engine removes the container: nothing leaks.
"""

import functools
import time
from pathlib import Path

from patchgym.sandbox import images, registry
from patchgym.sandbox.base import Sandbox
from patchgym.sandbox.channel import Channel, DockerAttachChannel
from patchgym.sandbox.errors import SandboxError
from patchgym.sandbox.limits import oom_kill_count
from patchgym.sandbox.pull import ensure_pulled

DOCKER_FIX = ("start the Docker engine (`dockerd &`, or `systemctl start docker`), install it with "
              "`apt-get install -y docker.io`, or use `sandbox.backend=local`")


@functools.lru_cache(maxsize=1)
def docker_client():
    """The process's Docker client; a `SandboxError` with the fix when no engine answers."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        docker_client.cache_clear()
        raise SandboxError(f"no Docker engine answers ({exc}); {DOCKER_FIX}") from exc
    return client


def resolve_image(image, client, config=None) -> str:
    """An image tag to run: recipes are built on demand, a name the engine lacks is pulled from its registry."""
    import docker

    if image is None or isinstance(image, images.ImageRecipe):
        return images.ensure_docker_image(image or images.base_recipe(), client=client)
    if image.endswith(".tar"):
        return _load_save_tar(client, Path(image))
    if image.startswith(registry.LOCAL_NAMESPACE):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"Docker image {image!r} not found; build it first "
                               "(`patchgym image build` builds the base image)") from None
        return image
    return ensure_pulled(client, image, config.registry_auth if config else None)


def _load_save_tar(client, path: Path) -> str:
    """The image of a `docker save` tar, loaded into the engine unless an image with its id is there already."""
    import docker

    from patchgym.sandbox.unpack import save_tar_id

    image_id = save_tar_id(path)
    try:
        client.images.get(image_id)
    except docker.errors.ImageNotFound:
        with path.open("rb") as f:
            try:
                client.images.load(f)
            except docker.errors.APIError as exc:
                raise SandboxError(f"{path}: the Docker engine could not load it: {exc}") from exc
    return image_id


class DockerSandbox(Sandbox):
    backend = "docker"
    runs_services = True

    def _start(self) -> Channel:
        import docker

        self._container_id = None
        self._started_at = int(time.time())
        client = docker_client()
        tag = resolve_image(self.image, client, self.config)
        cfg = self.config
        api = client.api
        self._services: list[str] = []
        self._network = None
        network_mode = self._start_services(client, tag) if cfg.services else "bridge" if cfg.network else "none"
        try:
            host_config = api.create_host_config(
                network_mode=network_mode,
                mem_limit=cfg.memory_mb * 2**20, memswap_limit=cfg.memory_mb * 2**20,
                pids_limit=cfg.pids, nano_cpus=int(cfg.cpus * 1e9),
                init=True, auto_remove=True, security_opt=["no-new-privileges"],
                # private_mounts: the runner keeps this to itself (every command it starts gives it up).
                cap_add=["SYS_ADMIN"] if cfg.private_mounts else None,
            )
            container = api.create_container(
                # Root whatever the image's USER: the runner drops to the agent's uid for the agent's commands.
                tag, command=self.runner_command(), name=self.id, user="0:0",
                stdin_open=True, detach=False, tty=False, labels=self.labels, environment=cfg.env,
                host_config=host_config, networking_config=api.create_networking_config(
                    {network_mode: api.create_endpoint_config(aliases=["main"])}) if cfg.services else None,
            )
            self._container_id = container["Id"]
            sock = api.attach_socket(self._container_id, params={"stdin": 1, "stdout": 1, "stream": 1})
            api.start(self._container_id)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"{self.id}: could not start a container from {tag!r}: {exc}") from exc
        return DockerAttachChannel(self.id, getattr(sock, "_sock", sock))

    def _start_services(self, client, main_image: str) -> str:
        """The config's services, each on the sandbox's own network under its name, started (healthy, where they
        are to be waited for) before the sandbox itself; the network's name. The network reaches the outside only
        where the sandbox has a network."""
        import docker

        cfg, api = self.config, client.api
        try:
            network = client.networks.create(self.id, driver="bridge", internal=not cfg.network, labels=self.labels)
            self._network = network.id
            for service in cfg.services:
                image = resolve_image(service.image, client, cfg)
                check = service.healthcheck
                container = api.create_container(
                    image, command=service.command, entrypoint=service.entrypoint, name=f"{self.id}-{service.name}",
                    environment=service.env, labels=self.labels, healthcheck=None if check is None else {
                        "test": check.test, "interval": int(check.interval_s * 1e9),
                        "timeout": int(check.timeout_s * 1e9), "retries": check.retries,
                        "start_period": int(check.start_period_s * 1e9)},
                    host_config=api.create_host_config(
                        network_mode=self.id, mem_limit=cfg.memory_mb * 2**20, pids_limit=cfg.pids, init=True,
                        nano_cpus=int(cfg.cpus * 1e9), security_opt=["no-new-privileges"]),
                    networking_config=api.create_networking_config(
                        {self.id: api.create_endpoint_config(aliases=[service.name])}))
                self._services.append(container["Id"])
                api.start(container["Id"])
            for service, cid in zip(cfg.services, self._services):
                if service.wait == "healthy":
                    self._wait_healthy(api, service.name, cid)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"{self.id}: could not start its services: {exc}") from exc
        return self.id

    def _wait_healthy(self, api, name: str, cid: str) -> None:
        check = next(s.healthcheck for s in self.config.services if s.name == name)
        if check is None:
            raise SandboxError(f"{self.id}: service {name} is to be waited for until healthy, but has no healthcheck")
        budget = check.start_period_s + (check.interval_s + check.timeout_s) * (check.retries + 1) + 30
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            state = api.inspect_container(cid)["State"]
            health = state.get("Health", {}).get("Status")
            if health == "healthy":
                return
            if health == "unhealthy" or state["Status"] in ("exited", "dead"):
                log = api.logs(cid, tail=20).decode(errors="replace")
                raise SandboxError(f"{self.id}: service {name} is {health or state['Status']}: {log[-1500:]}")
            time.sleep(0.2)
        raise SandboxError(f"{self.id}: service {name} was not healthy within {budget:g} s")

    def _stop(self) -> None:
        import docker

        api = docker_client().api
        try:
            if getattr(self, "_container_id", None) is not None:
                try:
                    api.remove_container(self._container_id, force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:  # 409: the engine is already removing it (AutoRemove)
                        raise SandboxError(f"{self.id}: could not remove its container: {exc}") from exc
        finally:
            self._stop_services(api)

    def _stop_services(self, api) -> None:
        import docker

        for cid in getattr(self, "_services", []):
            try:
                api.remove_container(cid, force=True)
            except docker.errors.APIError:
                pass  # gone already, or being removed: the reaper takes what is left
        if getattr(self, "_network", None) is not None:
            for _ in range(50):  # the main container's AutoRemove may still hold the network for a moment
                try:
                    api.remove_network(self._network)
                    break
                except docker.errors.NotFound:
                    break
                except docker.errors.APIError:
                    time.sleep(0.1)

    def _cgroup_dirs(self) -> list[Path]:
        cid = self._container_id
        return [Path(f"/sys/fs/cgroup/memory/docker/{cid}"), Path(f"/sys/fs/cgroup/docker/{cid}"),
                Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope")]

    def _oom_kills(self) -> int | None:
        return oom_kill_count(self._cgroup_dirs())

    def _diagnose(self) -> str:
        import docker

        try:
            state = docker_client().api.inspect_container(self._container_id)["State"]
        except (docker.errors.DockerException, SandboxError):
            return "its container is gone"
        return f"container status {state['Status']}, exit code {state['ExitCode']}, OOM-killed {state['OOMKilled']}"

    def _died_inside(self) -> bool:
        # Every kill through the engine (`docker kill`, `docker stop`, `docker rm -f`) is logged as a "kill" event; a
        # process inside that ends the runner, or the memory limit, is not.
        import docker

        try:
            events = docker_client().api.events(since=self._started_at, until=int(time.time()) + 1, decode=True,
                                                filters={"container": self._container_id, "event": "kill"})
            return not any(True for _ in events)
        except (docker.errors.DockerException, SandboxError, OSError):
            return False  # no engine to ask: the engine's failure, not the agent's
