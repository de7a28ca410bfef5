"""The `kubernetes` backend: one pod per sandbox; the runner is one exec in it, talked to over the exec websocket.

The pod's PID 1 only waits (and exits on TERM). The runner is started by `exec` through the API server, and
its stdin/stdout are the stream's channels 0 and 1, so a command costs a runner round trip, not an API call.
A host process that dies closes the websocket and the runner sees end of file; the pod itself stays until
`_stop` deletes it (grace 0) or the reaper finds it by label with its owner gone.
"""

import base64
import functools
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from patchgym.sandbox import images, lifecycle
from patchgym.sandbox.base import Sandbox
from patchgym.sandbox.docker import docker_client
from patchgym.sandbox.errors import SandboxError
from patchgym.sandbox.kube_channel import KubeExecChannel
from patchgym.sandbox.kubernetes_config import KubernetesConfig
from patchgym.sandbox.limits import parse_oom_kill

CONTAINER = "sandbox"
LABEL_NETWORK_OFF = "patchgym.network-off"
POLICY_NAME = "patchgym-sandbox-deny-all"
# PID 1 must die on TERM (a plain `sleep` ignores it and a delete would wait out the grace period), and has no
# child: then the runner sees only PID 1 and its own tree, and may end a fork bomb with one kill(-1).
PID1 = ("import signal, sys\nfor s in (signal.SIGTERM, signal.SIGINT): signal.signal(s, lambda *_: sys.exit(0))\n"
        "while True: signal.pause()")
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerError",
                "CreateContainerConfigError")
KUBE_FIX = ("start a cluster (`scripts/k8s-cluster.sh up`, then export KUBECONFIG), set sandbox.kubernetes.kubeconfig, "
            "or use `sandbox.backend=docker`")
_setup_done: set[tuple] = set()
_setup_lock = threading.Lock()


def label_value(value: str) -> str:
    """`value` as a valid label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value)[:63].strip("._-")


@functools.lru_cache(maxsize=8)
def _configuration(kubeconfig: str | None, context: str | None, env_kubeconfig: str | None):
    from kubernetes import client, config

    conf = client.Configuration()
    try:
        if kubeconfig or env_kubeconfig or Path("~/.kube/config").expanduser().exists():
            # Named explicitly: the client reads $KUBECONFIG once, at import, and tests set it later.
            config.load_kube_config(config_file=kubeconfig or env_kubeconfig, context=context,
                                    client_configuration=conf)
        else:
            config.load_incluster_config(client_configuration=conf)
    except (config.ConfigException, OSError) as exc:
        raise SandboxError(f"no Kubernetes cluster configured ({exc}); {KUBE_FIX}") from exc
    return conf


def core_api(kcfg: KubernetesConfig, fresh: bool = False):
    """A CoreV1Api for the configured cluster. `fresh`: its own ApiClient, as `stream()` needs (it patches the
    client it is given for the duration of the call, which would hijack other threads' calls)."""
    from kubernetes import client

    conf = _configuration(kcfg.kubeconfig, kcfg.context, os.environ.get("KUBECONFIG"))
    if fresh:
        return client.CoreV1Api(client.ApiClient(conf))
    return _shared_api(conf)


@functools.lru_cache(maxsize=8)
def _shared_api(conf):
    from kubernetes import client

    return client.CoreV1Api(client.ApiClient(conf))


def _api_error(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    try:
        return json.loads(body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(exc)


def ensure_network_policy(kcfg: KubernetesConfig) -> None:
    """A deny-all (ingress and egress) NetworkPolicy for the namespace's sandbox pods that have no network."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    body = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": POLICY_NAME, "labels": {lifecycle.LABEL_SANDBOX: "1"}},
            "spec": {"podSelector": {"matchLabels": {lifecycle.LABEL_SANDBOX: "1", LABEL_NETWORK_OFF: "1"}},
                     "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}}
    api = client.NetworkingV1Api(core_api(kcfg).api_client)
    try:
        api.create_namespaced_network_policy(kcfg.namespace, body, _request_timeout=kcfg.request_timeout_s)
    except ApiException as exc:
        if exc.status != 409:  # 409: it exists already (another process made it)
            raise SandboxError(f"cannot create NetworkPolicy {POLICY_NAME}: {_api_error(exc)}") from exc


def reap_pods(kcfg: KubernetesConfig, everything: bool = False, dry_run: bool = False) -> list[str]:
    """Delete (grace 0) the namespace's sandbox pods whose owner process is gone; returns `namespace/name`s."""
    from kubernetes.client.rest import ApiException

    api = core_api(kcfg)
    pods = api.list_namespaced_pod(kcfg.namespace, label_selector=lifecycle.LABEL_SANDBOX,
                                   _request_timeout=kcfg.request_timeout_s).items
    gone = []
    for pod in pods:
        # The exact stamp is an annotation: label values cannot hold its colons.
        owner = (pod.metadata.annotations or {}).get(lifecycle.LABEL_OWNER, "")
        if everything or not lifecycle.owner_alive(owner):
            try:
                if not dry_run:
                    api.delete_namespaced_pod(pod.metadata.name, kcfg.namespace, grace_period_seconds=0,
                                              _request_timeout=kcfg.request_timeout_s)
                gone.append(f"{kcfg.namespace}/{pod.metadata.name}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
    return gone


def run_pods(kcfg: KubernetesConfig, run: str) -> list[str]:
    """`namespace/name` of the sandbox pods of run `run` that still exist."""
    pods = core_api(kcfg).list_namespaced_pod(kcfg.namespace,
                                              label_selector=f"{lifecycle.LABEL_RUN}={label_value(run)}",
                                              _request_timeout=kcfg.request_timeout_s).items
    return [f"{kcfg.namespace}/{p.metadata.name}" for p in pods]


def _quantity_min(request: str, limit: str | None) -> str:
    from kubernetes.utils import parse_quantity

    return limit if limit is not None and parse_quantity(request) > parse_quantity(limit) else request


class KubernetesSandbox(Sandbox):
    backend = "kubernetes"

    def _start(self):
        self._pod = None
        self._kcfg = kcfg = self.config.kubernetes
        tag = self._image_tag()
        self._setup_once(kcfg)
        from kubernetes.client.rest import ApiException
        from kubernetes.stream import stream
        from websocket import WebSocketException

        api = core_api(kcfg)
        try:
            api.create_namespaced_pod(kcfg.namespace, self.pod_manifest(tag), _request_timeout=kcfg.request_timeout_s)
        except ApiException as exc:
            raise SandboxError(f"{self.id}: cannot create its pod in namespace {kcfg.namespace!r}: "
                               f"{_api_error(exc)}") from exc
        self._pod = self.id
        self._wait_running(tag)
        try:
            ws = stream(core_api(kcfg, fresh=True).connect_get_namespaced_pod_exec, self.id, kcfg.namespace,
                        container=CONTAINER, command=self.runner_command(),
                        stdin=True, stdout=True, stderr=True, tty=False, binary=True, _preload_content=False,
                        _request_timeout=kcfg.request_timeout_s)
        except (ApiException, WebSocketException, OSError) as exc:
            raise SandboxError(f"{self.id}: cannot exec the runner in its pod: {_api_error(exc)}") from exc
        return KubeExecChannel(self.id, ws.sock)

    def _image_tag(self) -> str:
        # Recipes are built with the local Docker engine: right for a single-node cluster on this machine; on a
        # real cluster give a tag the nodes have (pre-loaded) or can pull.
        if self.image is None or isinstance(self.image, images.ImageRecipe):
            return images.ensure_docker_image(self.image or images.base_recipe(), client=docker_client())
        return self.image

    def _setup_once(self, kcfg: KubernetesConfig) -> None:
        """Once per cluster and namespace and process, reap dead owners' pods; make sure of the NetworkPolicy."""
        key = (kcfg.kubeconfig, kcfg.context, os.environ.get("KUBECONFIG"), kcfg.namespace)
        with _setup_lock:  # held while reaping, like reaper.reap_once: our own new pods start after it
            if key not in _setup_done:
                from kubernetes.client.rest import ApiException

                try:
                    reap_pods(kcfg)
                except ApiException as exc:
                    raise SandboxError(f"cannot list pods in namespace {kcfg.namespace!r}: {_api_error(exc)}") from exc
                except Exception as exc:  # urllib3 raises several types for "no API server answers"
                    raise SandboxError(f"no Kubernetes API server answers ({exc}); {KUBE_FIX}") from exc
                _setup_done.add(key)
        # Every start, not once: someone may have deleted it (one request; 409 when it is there).
        if not self.config.network and kcfg.network_policy:
            ensure_network_policy(kcfg)

    def pod_manifest(self, tag: str) -> dict[str, Any]:
        cfg, kcfg = self.config, self.config.kubernetes
        limits = {"cpu": f"{round(cfg.cpus * 1000)}m", "memory": f"{cfg.memory_mb}Mi", **kcfg.resources.limits}
        requests = {k: _quantity_min(v, limits.get(k)) for k, v in kcfg.resources.requests.items()}
        labels = {**kcfg.labels, **{k: label_value(v) for k, v in self.labels.items()}}
        if not cfg.network:
            labels[LABEL_NETWORK_OFF] = "1"
        spec: dict[str, Any] = {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
            "enableServiceLinks": False,  # no service env vars leaking into commands
            "nodeSelector": kcfg.node_selector or None, "tolerations": kcfg.tolerations or None,
            "imagePullSecrets": [{"name": s} for s in kcfg.image_pull_secrets] or None,
            "serviceAccountName": kcfg.service_account,
            "containers": [{
                "name": CONTAINER, "image": tag, "imagePullPolicy": kcfg.image_pull_policy,
                "command": [cfg.python, "-c", PID1],
                "env": [{"name": k, "value": v} for k, v in cfg.env.items()] or None,
                "resources": {"limits": limits, "requests": requests},
                # The runner (exec'd as this user) must be root, whatever the image's USER, to drop to the agent's
                # uid; no_new_privs (allowPrivilegeEscalation off) leaves setuid by root alone.
                "securityContext": {"allowPrivilegeEscalation": False, "runAsUser": 0, "runAsGroup": 0,
                                    # private_mounts: the runner keeps it to itself (every command gives it up).
                                    **({"capabilities": {"add": ["SYS_ADMIN"]}} if cfg.private_mounts else {})},
            }],
        }
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self.id, "labels": labels,
                             "annotations": {**kcfg.annotations, **self.labels}},  # exact values, for the reaper
                "spec": {k: v for k, v in spec.items() if v is not None}}

    def _wait_running(self, tag: str) -> None:
        from kubernetes.client.rest import ApiException

        kcfg = self._kcfg
        deadline = time.monotonic() + self.config.start_timeout_s
        why = "not scheduled yet"
        while time.monotonic() < deadline:
            try:
                pod = core_api(kcfg).read_namespaced_pod(self.id, kcfg.namespace,
                                                         _request_timeout=kcfg.request_timeout_s)
            except ApiException as exc:
                raise SandboxError(f"{self.id}: its pod vanished while starting: {_api_error(exc)}") from exc
            status = pod.status
            if status.phase == "Running":
                return
            if status.phase in ("Succeeded", "Failed"):
                raise SandboxError(f"{self.id}: its pod ended while starting ({status.phase}): {self._diagnose()}")
            for cond in status.conditions or []:
                if cond.type == "PodScheduled" and cond.status != "True" and cond.message:
                    why = f"unschedulable: {cond.message}"
            for cs in status.container_statuses or []:
                waiting = cs.state.waiting if cs.state else None
                if waiting and waiting.reason in IMAGE_ERRORS:
                    raise SandboxError(
                        f"{self.id}: image {tag!r} cannot be run on node {status.host_ip}: {waiting.reason}: "
                        f"{waiting.message}; build it first (`patchgym image build` builds the base image) and "
                        "pre-load it on the nodes or push it to a registry they can pull from")
                if waiting:
                    why = f"{waiting.reason}: {waiting.message or ''}"
            time.sleep(0.1)
        raise SandboxError(f"{self.id}: its pod was not Running within {self.config.start_timeout_s:g} s ({why})")

    def _stop(self) -> None:
        from kubernetes.client.rest import ApiException

        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()  # the runner sees end of file; a receive in another thread fails at once
        if getattr(self, "_pod", None) is None:
            return
        kcfg = self._kcfg
        try:
            core_api(kcfg).delete_namespaced_pod(self.id, kcfg.namespace, grace_period_seconds=0,
                                                 _request_timeout=kcfg.request_timeout_s)
        except ApiException as exc:
            if exc.status != 404:
                raise SandboxError(f"{self.id}: could not delete its pod: {_api_error(exc)}") from exc

    def _died_inside(self) -> bool:
        # The API server reports the runner's exit status on the stream when it ended inside a pod that lives on;
        # a deleted pod, a lost node or a dropped stream comes without one.
        from kubernetes.client.rest import ApiException

        if not getattr(self._channel, "status", ""):
            return False
        try:
            pod = core_api(self._kcfg).read_namespaced_pod(self.id, self._kcfg.namespace,
                                                           _request_timeout=self._kcfg.request_timeout_s)
        except (ApiException, SandboxError, OSError):
            return False
        return pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None

    # The memory limit is the container's cgroup, which only the node sees: ask the runner for its counter.
    _OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")

    def _oom_kills(self) -> int | None:
        for path in getattr(self, "_oom_files", self._OOM_FILES):
            try:
                text = base64.b64decode(self._request("read", 10, path=path)["data"]).decode()
            except (OSError, SandboxError):
                continue
            if (count := parse_oom_kill(text)) is not None:
                self._oom_files = (path,)  # the one that answers; no misses on later commands
                return count
        self._oom_files = ()  # neither answers: no requests for it on later commands either
        return None

    def _diagnose(self) -> str:
        from kubernetes.client.rest import ApiException

        parts = []
        channel = getattr(self, "_channel", None)
        if channel is not None and channel.status:
            parts.append(f"runner exit: {channel.status}")
        try:
            pod = core_api(self._kcfg).read_namespaced_pod(self.id, self._kcfg.namespace,
                                                           _request_timeout=self._kcfg.request_timeout_s)
        except (ApiException, SandboxError, AttributeError):
            return "; ".join(parts + ["its pod is gone"])
        parts.append(f"pod phase {pod.status.phase}")
        for cs in pod.status.container_statuses or []:
            term = cs.state.terminated if cs.state else None
            if term:
                parts.append(f"container {term.reason} (exit code {term.exit_code})")
        if channel is not None and channel.stderr_tail:
            parts.append(f"runner stderr: {channel.stderr_tail[-500:]}")
        return "; ".join(parts)
