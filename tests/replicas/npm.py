"""npm packages for the JavaScript replicas, fetched once into the replica cache by the host's npm client (the
registry is reachable from the host only; images get the files, never the network)."""

import json
import subprocess
import tarfile
from pathlib import Path

from tests.replicas.project import cache_dir


def package(name: str, version: str) -> Path:
    """name@version unpacked from its npm tarball: the tarball's `package/` folder."""
    home = cache_dir() / "npm" / f"{name}-{version}"
    if not (home / "package").is_dir():
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", f"{name}@{version}", "--pack-destination", str(home), "--silent"],
                       check=True, capture_output=True)
        with tarfile.open(next(home.glob("*.tgz"))) as tar:
            tar.extractall(home, filter="data")
    return home / "package"


def modules(key: str, *specs: str) -> Path:
    """A node_modules folder with `specs` (e.g. "tape@4.13.3") installed, scripts off; `key` names it in the cache."""
    home = cache_dir() / "npm" / key
    if not (home / ".complete").exists():
        home.mkdir(parents=True, exist_ok=True)
        (home / "package.json").write_text(json.dumps({"private": True}))
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", *specs], cwd=home,
                       check=True, capture_output=True)
        (home / ".complete").write_text(" ".join(specs))
    return home / "node_modules"
