"""A Python for task images that have none (a Harbor folder FROM ubuntu or a Debian minbase): the host's own
interpreter, the shared libraries it and its extension modules load, and its standard library, laid out to run from
BUNDLE_ROOT in any x86-64 (or arm64) Linux image through the bundled dynamic loader, whatever libc the image has.

The in-sandbox runner and the agent's tools need a Python (3.6 or newer). `with_python(image)` gives back the image
itself when it has python3, else an image made from it with the bundle added under BUNDLE_ROOT (content-addressed,
built once); a task started from that image runs the runner and the tools with BUNDLE_PYTHON. Nothing else in the
image changes: the bundle is not on PATH, and commands of the agent or the task never see it as their python3.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from patchgym.paths import store_dir

BUNDLE_ROOT = "/.patchgym/python"
BUNDLE_PYTHON = f"{BUNDLE_ROOT}/bin/python3"
# Parts of the standard library a runner never imports (and the static library of a build's config dir).
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
               "dist-packages", "__pycache__", "pydoc_data"}
SKIP_MODULES = re.compile(r"^_tkinter|^_test|^xxlimited")
_LIB = re.compile(r"(/\S+\.so[.\d]*)")


def bundle_key() -> str:
    executable = os.path.realpath(sys.executable)
    return hashlib.sha256(f"{executable}\0{sys.version}\0{os.stat(executable).st_size}".encode()).hexdigest()[:12]


def bundle_dir() -> Path:
    """This host's bundle on disk (built at first use): bin/python3 (the launcher), bin/<the interpreter>, lib/."""
    path = store_dir() / "python-bundle" / bundle_key()
    if not (path / "bin" / "python3").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=path.parent))
        try:
            build_bundle(scratch)
            try:
                scratch.rename(path)
            except OSError:  # another process built it meanwhile
                pass
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return path


def build_bundle(dest: Path) -> None:
    """Lay out the running interpreter as a bundle in `dest`."""
    executable = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dynload = Path(sysconfig.get_paths()["platstdlib"]) / "lib-dynload"
    (dest / "bin").mkdir(parents=True)
    (dest / "lib").mkdir()
    shutil.copy2(executable, dest / "bin" / executable.name)
    target = dest / "lib" / stdlib.name
    shutil.copytree(stdlib, target, symlinks=False,
                    ignore=lambda folder, names: [n for n in names if n in SKIP_STDLIB or n.startswith("config-")
                                                  or (folder.endswith("lib-dynload") and SKIP_MODULES.match(n))])
    if not (target / "lib-dynload").is_dir() and dynload.is_dir():  # Debian keeps it beside the stdlib
        shutil.copytree(dynload, target / "lib-dynload",
                        ignore=lambda folder, names: [n for n in names if SKIP_MODULES.match(n)])
    objects = [executable, *(target / "lib-dynload").glob("*.so")]
    loader = ""
    for path in sorted(shared_libraries(objects)):
        shutil.copy2(path, dest / "lib" / Path(path).name, follow_symlinks=True)
        if Path(path).name.startswith("ld-linux"):
            loader = Path(path).name
    if not loader:
        raise RuntimeError(f"{executable}: no dynamic loader among its libraries (a static build needs no bundle "
                           "loader; not supported here)")
    launcher = dest / "bin" / "python3"
    launcher.write_text(f'#!/bin/sh\nhere={BUNDLE_ROOT}\nexec "$here/lib/{loader}" --library-path "$here/lib" '
                        f'"$here/bin/{executable.name}" "$@"\n')
    launcher.chmod(0o755)


def shared_libraries(objects: list[Path]) -> set[str]:
    """Every shared library the given executables and modules load (ldd), the dynamic loader included."""
    found = set()
    for item in objects:
        out = subprocess.run(["ldd", str(item)], capture_output=True, text=True).stdout
        found.update(_LIB.findall(out))
    return found


def image_python(client, image: str) -> str | None:
    """The python the runner can use in `image` (3.6 or newer): python3, the bundle (an image made by
    with_python), or None; asked of a container of its own."""
    import docker

    probe = (f"if [ -x {BUNDLE_PYTHON} ]; then echo {BUNDLE_PYTHON}; elif command -v python3 >/dev/null && "
             "python3 -c 'import sys; sys.exit(sys.version_info < (3, 6))'; then echo python3; fi")
    try:
        out = client.containers.run(image, entrypoint=["/bin/sh", "-c", probe], remove=True, network_mode="none")
    except docker.errors.ContainerError:
        return None
    return out.decode().strip() or None


def with_python(client, image: str) -> tuple[str, str]:
    """(the image to start, the python the runner uses there): `image` itself where it has python3 (or the
    bundle already), else an image made from it with the bundle under BUNDLE_ROOT."""
    import docker

    if (found := image_python(client, image)) is not None:
        return image, found
    bundle = bundle_dir()
    repository, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    derived = f"{repository}:{tag}-py{bundle.name}"
    try:
        client.images.get(derived)
        return derived, BUNDLE_PYTHON
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory() as context:
        shutil.copytree(bundle, Path(context) / "python", symlinks=True)
        (Path(context) / "Dockerfile").write_text(f"FROM {image}\nCOPY python {BUNDLE_ROOT}\n")
        client.images.build(path=context, tag=derived, rm=True, forcerm=True, network_mode="none")
    return derived, BUNDLE_PYTHON
