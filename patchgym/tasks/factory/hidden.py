"""Hidden is hidden: a factory image must hold no copy that the agent's user can read of the package's tests (the
hidden ones of any task are among them) or of its source as published (the unmutated code, to diff a bug against):
no second copy of a file, no other installed copy of the package (one a dependency vendors or installs), no archive
of it, no git objects. The scan runs in a sandbox of the image, as the agent's user, so only what it can read counts.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from patchgym.files import write_atomic
from patchgym.sandbox import Sandbox, SandboxConfig, open_sandbox
from patchgym.tasks.factory.sources import SourceError

# Files smaller than this say too little to matter (an empty __init__.py, a one-line index.js), and their twins
# are everywhere.
MIN_BYTES = 128
SCAN_TIMEOUT_S = 300
_SKIP = ("/proc", "/sys", "/dev", "/run")

# Stdlib only, Python 3.6 syntax: it runs on the image's interpreter. Prints one JSON list of [path, why].
_SCAN = r"""
import hashlib, json, os, sys

spec = json.loads(sys.argv[1])
sizes = {}
for digest, size, original in spec["files"]:
    sizes.setdefault(size, {})[digest] = original
workdir, names, archives = spec["workdir"], set(spec["names"]), tuple(spec["archives"])
kind = spec["kind"]
found = []


def inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


for folder, dirs, files in os.walk("/", onerror=lambda error: None):
    dirs[:] = [d for d in dirs if not any(inside(os.path.join(folder, d), s) for s in spec["skip"])]
    in_workdir = inside(folder, workdir)
    for d in list(dirs):
        path = os.path.join(folder, d)
        if os.path.islink(path):
            continue
        if d == ".git" and not in_workdir:
            found.append([path, "git objects"])
        elif not in_workdir and d in names and (
                (kind == "npm" and os.path.basename(folder) == "node_modules")
                or (kind == "pypi" and os.path.isfile(os.path.join(path, "__init__.py")))):
            found.append([path, "an installed copy of the package"])
    for name in files:
        path = os.path.join(folder, name)
        if not in_workdir and name.startswith(archives) and name.endswith((".tar.gz", ".tgz", ".zip", ".whl")):
            found.append([path, "an archive of the package"])
            continue
        if not in_workdir and kind == "pypi" and name in names and not os.path.islink(path):
            found.append([path, "an installed copy of the package"])
            continue
        try:
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            by_digest = sizes.get(os.path.getsize(path))
            if not by_digest:
                continue
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except (OSError, IOError):
            continue
        original = by_digest.get(digest)
        if original is not None and path != os.path.join(workdir, original):
            found.append([path, "a copy of " + original])
print(json.dumps(found))
"""


@dataclass(frozen=True)
class Protected:
    """What must not be readable twice in an image: these files of the package (path in the workspace -> text), any
    installed copy under one of `names` (a package directory, or a module file `NAME.py`), any archive whose name
    starts with one of `archives`."""

    files: dict[str, str]
    names: list[str] = field(default_factory=list)
    archives: list[str] = field(default_factory=list)
    kind: str = "pypi"  # or "npm": a copy of the package is a node_modules/NAME directory


def scan(sandbox: Sandbox, protected: Protected, workdir: str) -> list[tuple[str, str]]:
    """(path, what it copies) for every copy of what is `protected` that the agent's user can read in `sandbox`."""
    files = [[hashlib.sha256(text.encode()).hexdigest(), len(text.encode()), path]
             for path, text in sorted(protected.files.items()) if len(text.encode()) >= MIN_BYTES]
    spec = {"files": files, "names": protected.names, "archives": protected.archives, "kind": protected.kind,
            "workdir": workdir, "skip": list(_SKIP)}
    result = sandbox.exec(["python3", "-c", _SCAN, json.dumps(spec)], timeout=SCAN_TIMEOUT_S, agent=True,
                          output_limit=1 << 20)
    if not result.ok:
        raise SourceError(f"{sandbox.image}: the scan for hidden copies failed: {result.output[-2000:]}")
    return [tuple(pair) for pair in json.loads(result.output.strip().splitlines()[-1])]


def find_copies(image, protected: Protected, workdir: str, config: SandboxConfig) -> list[tuple[str, str]]:
    """scan() of a fresh sandbox of `image` (a tag, or a recipe where the backend builds its own)."""
    with open_sandbox(config, image=image) as sandbox:
        return scan(sandbox, protected, workdir)


def check_hidden(image, protected: Protected, workdir: str, what: str, config: SandboxConfig,
                 cache: Path | None = None) -> None:
    """Refuse (SourceError, naming each path) an image where the agent's user can read a copy of what is
    `protected`. `cache`: a file that keeps a clean verdict for this image and protection (a rebuild skips the scan)."""
    key = hashlib.sha256(json.dumps([getattr(image, "tag", image), asdict(protected), workdir],
                                    sort_keys=True).encode()).hexdigest()
    if cache is not None and cache.exists() and json.loads(cache.read_text()).get("clean") == key:
        return
    copies = find_copies(image, protected, workdir, config)
    if copies:
        shown = "; ".join(f"{path} ({why})" for path, why in copies[:10])
        more = f" and {len(copies) - 10} more" if len(copies) > 10 else ""
        raise SourceError(f"{what}: its image lets the agent read what a task hides: {shown}{more}")
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps({"clean": key}) + "\n")
