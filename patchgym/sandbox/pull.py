"""Pulling an image into the Docker engine: the login for its registry, progress in bytes, retries with back-off on
transient failures, and an `ImagePullError` that names the image, the registry and why."""

import sys
import threading
import time

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from patchgym.sandbox.registry import ImagePullError, parse_ref, registry_login

RETRIES = 4
BACKOFF_S = 1.0  # waits 1, 2, 4, 8 s between tries
# What the engine says, lower-cased, mapped to why the pull failed; only unreachable and failed are worth another try.
_REASONS = (
    ("unauthorized", ("unauthorized", "no basic auth credentials", "authentication required", "access denied",
                      "denied:", "incorrect username or password", "forbidden")),
    ("not found", ("manifest unknown", "not found", "does not exist", "name unknown", "repository name not known")),
    # A registry name no name server knows (offline, or a typo) stays unknown: not worth another try.
    ("unknown host", ("no such host", "name or service not known")),
    ("unreachable", ("connection refused", "i/o timeout", "timeout", "dial tcp", "eof",
                     "connection reset", "network is unreachable", "tls handshake")),
)
TRANSIENT = {"unreachable", "failed"}
_pull_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


class ByteProgress:
    """Bytes downloaded over bytes to download, summed over layers (shared by concurrent pulls, keyed by layer id,
    so a layer two images share counts once); drawn as a bar when `show`, else only counted."""

    def __init__(self, description: str, *, show: bool = True):
        self._lock = threading.Lock()
        self._layers: dict[str, tuple[int, int]] = {}
        self._bar = None
        if show:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeElapsedColumn(), console=Console(file=sys.stderr),
                                 transient=False)
            self._task = self._bar.add_task(description, total=None)

    def __enter__(self) -> "ByteProgress":
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar:
            self._bar.stop()

    @property
    def done(self) -> int:
        return sum(current for current, _ in self._layers.values())

    @property
    def total(self) -> int:
        return sum(total for _, total in self._layers.values())

    def event(self, event: dict) -> None:
        """One line of the engine's pull stream: Downloading carries current/total; complete means all of it."""
        layer, status = event.get("id"), event.get("status", "")
        if not layer or ":" in layer:  # the image's own lines ("latest: Pulling from ..."), not a layer's
            return
        with self._lock:
            current, total = self._layers.get(layer, (0, 0))
            detail = event.get("progressDetail") or {}
            if status == "Downloading" and detail.get("total"):
                current, total = detail.get("current", 0), detail["total"]
            elif status in ("Download complete", "Pull complete", "Verifying Checksum"):
                current = total
            else:
                return
            self._layers[layer] = (current, total)
            if self._bar:
                self._bar.update(self._task, completed=self.done, total=self.total or None)


def pull_image(client, image: str, auth=None, *, progress: ByteProgress | None = None, retries: int = RETRIES,
               backoff_s: float = BACKOFF_S) -> None:
    """Pull `image` into the engine behind `client`, with the login `registry_login` finds for its registry.

    Unauthorized and not found fail at once; an unreachable registry or a broken transfer is tried `retries` more
    times, waiting backoff_s, 2 backoff_s, ... between tries."""
    import docker

    ref = parse_ref(image)
    login = registry_login(ref.registry, auth)
    for attempt in range(retries + 1):
        try:
            stream = client.api.pull(ref.pull_name, tag=ref.reference, stream=True, decode=True, auth_config=login)
            for event in stream:
                if "error" in event:
                    raise _error(image, ref.registry, event.get("errorDetail", {}).get("message") or event["error"])
                if progress is not None:
                    progress.event(event)
            return
        except ImagePullError as exc:
            failure = exc
        except docker.errors.APIError as exc:
            failure = _error(image, ref.registry, str(exc.explanation or exc))
        except (docker.errors.DockerException, OSError) as exc:  # the stream broke off mid-transfer
            failure = _error(image, ref.registry, f"{type(exc).__name__}: {exc}")
        if failure.reason not in TRANSIENT or attempt == retries:
            if attempt:
                failure.args = (f"{failure.args[0]}; after {attempt + 1} tries",)
            raise failure
        time.sleep(backoff_s * 2**attempt)


def ensure_pulled(client, image: str, auth=None, *, show_progress: bool = True) -> str:
    """`image` present in the engine, pulled with a progress bar if it was missing; returns its name. Threads that
    want the same image (a pool filling up) wait for one pull."""
    import docker

    with _locks_lock:
        lock = _pull_locks.setdefault(image, threading.Lock())
    with lock:
        try:
            client.images.get(image)
            return image
        except docker.errors.ImageNotFound:
            pass
        with ByteProgress(f"pull {image}", show=show_progress) as progress:
            pull_image(client, image, auth, progress=progress)
    return image


def _error(image: str, registry: str, message: str) -> ImagePullError:
    lowered = message.lower()
    reason = next((why for why, signs in _REASONS if any(sign in lowered for sign in signs)), "failed")
    return ImagePullError(image, registry, reason, message.strip())
