"""The `sandbox:` section of a patchgym config: which backend, which image, and the limits every sandbox gets."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from patchgym.sandbox.kubernetes_config import KubernetesConfig

# Short names of the built-in backends; any other backend is given as an import path "package.module:Class".
BACKENDS = {
    "docker": "patchgym.sandbox.docker:DockerSandbox",
    "local": "patchgym.sandbox.local:LocalSandbox",
    "kubernetes": "patchgym.sandbox.kubernetes:KubernetesSandbox",
}


class RegistryLogin(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: str
    password: SecretStr = Field(description="kept out of printed and saved configs")


class ServiceHealthcheck(BaseModel):
    """A service's health test, polled as Docker's HEALTHCHECK polls it."""

    model_config = ConfigDict(extra="forbid")

    test: list[str] = Field(min_length=1, description="exec form ['CMD', ...] or ['CMD-SHELL', 'command']")
    interval_s: float = Field(30.0, gt=0)
    timeout_s: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=1)
    start_period_s: float = Field(0.0, ge=0)


class ServiceConfig(BaseModel):
    """A container that runs beside the sandbox (a Harbor compose task's other services): on one network with it,
    reachable by its name; started (and, where `wait` says healthy, healthy) before the sandbox starts."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$", description="its host name on the network")
    image: str = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = Field(None, description="None: the image's CMD")
    entrypoint: list[str] | None = Field(None, description="None: the image's ENTRYPOINT")
    healthcheck: ServiceHealthcheck | None = None
    wait: Literal["started", "healthy"] = Field("started", description="what the sandbox waits for before it starts")


class SandboxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: str = Field("docker", description="docker (Docker engine), local (bubblewrap + overlayfs), kubernetes "
                                               "(one pod each), or 'pkg.module:Class'")
    image: str | None = Field(None, description="image name (pulled when missing), a recipe's tag, or a `docker save` "
                                                ".tar (local); None = the patchgym base image")
    workdir: str = Field("/testbed", description="default working directory of commands")
    network: bool = Field(False, description="give sandboxes a network (off by default)")
    task_network: bool = Field(True, description="a Harbor task's sandbox gets the network its task.toml asks for "
                               "(on where it says nothing, as in Harbor); false: every sandbox stays offline, "
                               "whatever a task asks (RL on agents one does not trust)")
    keep_background: bool = Field(False, description="what a command leaves running in the background lives on (a "
                                  "Harbor task's services and jobs, as in Harbor); false: a command's whole process "
                                  "tree ends with it")
    private_mounts: bool = Field(False, description="the sandbox may run a command with directories only it sees (the "
                                 "Harbor verifier's /tests and /logs/verifier, out of reach of what the agent left "
                                 "running); its container holds CAP_SYS_ADMIN for this, which no command gets")
    services: list[ServiceConfig] = Field(default_factory=list, description="containers that run beside the "
                                          "sandbox on a network of their own (a Harbor compose task's other "
                                          "services); docker backend only")
    memory_mb: int = Field(4096, gt=0, description="memory limit per sandbox")
    pids: int = Field(1024, gt=0, description="process limit per sandbox")
    cpus: float = Field(1.0, gt=0, description="CPU quota per sandbox, in cores")
    exec_timeout_s: float = Field(90.0, gt=0, description="default per-command timeout")
    output_limit_bytes: int = Field(262_144, ge=1024, description="command output kept (head + tail), the rest is cut")
    start_timeout_s: float = Field(60.0, gt=0, description="time allowed for a sandbox to start and answer")
    pool_size: int = Field(0, ge=0, description="pre-started sandboxes per image (0 = no warm pool)")
    max_concurrency: int = Field(16, gt=0, description="sandboxes alive at once per pool")
    python: str = Field("python3", description="interpreter inside the image that runs patchgym's in-sandbox runner")
    agent_user: int = Field(1000, ge=1, le=65535,
                            description="uid and gid of the agent's commands (exec with agent=True), which need no "
                                        "/etc/passwd entry; the runner and grading stay root")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for every command")
    registry_auth: dict[str, RegistryLogin] | str | None = Field(
        None, description="registry host -> {username, password}, or the path of a Docker config.json; "
                          "None = the user's ~/.docker/config.json (as `docker pull` reads it)")
    image_mirror: dict[str, str] = Field(
        default_factory=dict, description="image name prefix -> replacement, e.g. {'swebench/': "
                                          "'mirror.local:5000/swebench/'} or {'docker.io/': 'mirror.local:5000/'}")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig,
                                         description="the kubernetes backend's cluster and pod spec")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in BACKENDS and ":" not in value:
            raise ValueError(f"unknown sandbox backend {value!r}; choose one of {', '.join(BACKENDS)} "
                             "or give an import path like 'mypkg.sandboxes:MySandbox'")
        return value
