"""Where patchgym keeps what it builds on the host (rootfs layers, wheelhouses, sandbox scratch)."""

import os
from pathlib import Path


def store_dir() -> Path:
    """The root of patchgym's host-side state: $PATCHGYM_HOME, else /var/lib/patchgym (root) or ~/.cache/patchgym."""
    env = os.environ.get("PATCHGYM_HOME")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/patchgym")
    return Path.home() / ".cache" / "patchgym"


def rootfs_dir() -> Path:
    """Image layers as plain directories, one per image key; the daemon-less backend stacks them with overlayfs."""
    return store_dir() / "rootfs"


def wheelhouse_dir() -> Path:
    """Wheels downloaded on the host, installed offline inside images (containers have no network)."""
    return store_dir() / "wheelhouse"


def sandboxes_dir() -> Path:
    """Per-sandbox scratch (overlay upper/work dirs) of the local backend; leftovers are reaped."""
    return store_dir() / "sandboxes"


def warm_starts_dir() -> Path:
    """Warm-start models kept by what made them (patchgym.train.warm_cache): $PATCHGYM_WARM_STARTS, else under the
    store."""
    env = os.environ.get("PATCHGYM_WARM_STARTS")
    return Path(env) if env else store_dir() / "warm-starts"
