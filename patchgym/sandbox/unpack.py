"""Any Docker/OCI image as rootfs layers for the local backend: unpacked once from a `docker save` tar (one given as
the image, or saved from the local engine, pulled into it first if need be) into one directory per layer.

    rootfs/layers/<diff id>/    a layer's files, its whiteouts as overlayfs reads them (a 0:0 character device for
                                `.wh.NAME`, the xattr trusted.overlay.opaque=y for `.wh..wh..opq`); shared by images
    rootfs/images/<image id>.json   the image's layers (top first), Env and WorkingDir from its config

One dir per layer rather than one flattened tree: images built on the same base share its dirs, and stacking is
free here (python3 started from 1, 11 or 41 lower layers took the same 0.3-0.4 s, mount included); a stack longer
than one mount's options allow is refused by the local backend with the fix.

A layer directory is renamed into place whole once its content hashed to its diff id, and the image's file is
written last, so a crash mid-unpack leaves only scratch that the next unpack under the same lock removes.
"""

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path

from patchgym.files import file_lock, write_atomic
from patchgym.paths import rootfs_dir
from patchgym.sandbox.errors import SandboxError

WHITEOUT, OPAQUE = ".wh.", ".wh..wh..opq"
# Our own checks below stand in for tarfile's filters: an image needs what the "data" filter refuses (absolute
# symlinks, setuid bits, device nodes). Python before 3.11.4 has no filters and extracts everything.
_TRUSTED = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


class ImageUnpackError(SandboxError):
    """An image whose save tar is unreadable, malformed or unsafe (a member that would land outside its layer)."""


def tar_rootfs(path: Path) -> tuple[list[Path], dict[str, str]]:
    """The layer dirs (top first) and environment of the image in a `docker save` tar, unpacked once."""
    return _meta_rootfs(unpack_save_tar(path))


def engine_rootfs(client, image: str) -> tuple[list[Path], dict[str, str]]:
    """The layer dirs (top first) and environment of `image` in the Docker engine behind `client`, saved from it
    and unpacked once."""
    found = client.images.get(image)
    meta = _image_meta(found.id)
    if not meta.is_file():
        with file_lock(f"unpack-{_hex(found.id)}"):
            if not meta.is_file():
                scratch = rootfs_dir() / f".save-{_hex(found.id)}.tar"
                scratch.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with scratch.open("wb") as out:
                        for chunk in found.save(named=False):
                            out.write(chunk)
                    _unpack_locked(scratch, found.id)
                finally:
                    scratch.unlink(missing_ok=True)
    return _meta_rootfs(meta)


def save_tar_id(path: Path) -> str:
    """The image id of the image in a `docker save` tar: the digest of its config."""
    return "sha256:" + hashlib.sha256(_read_save(path)[2]).hexdigest()


def unpack_save_tar(path: Path) -> Path:
    """Unpack the image in a `docker save` tar (Docker's format, or the OCI layout with its manifest.json) once;
    returns its image file."""
    image_id = save_tar_id(path)
    meta = _image_meta(image_id)
    if not meta.is_file():
        with file_lock(f"unpack-{_hex(image_id)}"):
            if not meta.is_file():
                _unpack_locked(path, image_id)
    return meta


def _unpack_locked(path: Path, image_id: str) -> None:
    manifest, config, _ = _read_save(path)
    diff_ids = config["rootfs"]["diff_ids"]
    if len(diff_ids) != len(manifest["Layers"]):
        raise ImageUnpackError(f"{path}: {len(manifest['Layers'])} layers but {len(diff_ids)} diff ids in its config")
    layers = rootfs_dir() / "layers"
    layers.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path) as save:
        for member_name, diff_id in zip(manifest["Layers"], diff_ids):
            if (layers / _hex(diff_id)).is_dir():
                continue  # shared with an image unpacked before
            with file_lock(f"layer-{_hex(diff_id)}"):
                if not (layers / _hex(diff_id)).is_dir():
                    _unpack_layer(save, member_name, diff_id, layers, path)
    settings = config.get("config") or {}
    env = dict(item.split("=", 1) for item in settings.get("Env") or [] if "=" in item)
    meta = {"id": image_id, "layers": [_hex(d) for d in reversed(diff_ids)], "env": env,
            "workdir": settings.get("WorkingDir") or "", "tags": manifest.get("RepoTags") or []}
    target = _image_meta(image_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, json.dumps(meta, indent=1) + "\n")


def _unpack_layer(save: tarfile.TarFile, member_name: str, diff_id: str, layers: Path, path: Path) -> None:
    for leftover in layers.glob(f".unpack-{_hex(diff_id)}-*"):
        shutil.rmtree(leftover)  # a crashed unpack's: we hold this layer's lock
    scratch = layers / f".unpack-{_hex(diff_id)}-{os.getpid()}"
    scratch.mkdir()
    try:
        member = _resolve_member(save, member_name, path)
        raw = io.BufferedReader(save.extractfile(member), 1 << 20)
        stream = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" else raw
        hashed = _Hashing(stream)
        _extract(hashed, scratch, f"{path}:{member_name}")
        if f"sha256:{hashed.hexdigest()}" != diff_id:
            raise ImageUnpackError(f"{path}: layer {member_name} does not hash to its diff id {diff_id}")
        scratch.rename(layers / _hex(diff_id))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _extract(stream, dest: Path, what: str) -> None:
    """Extract one layer tar into `dest`, turning its whiteouts into overlayfs's."""
    opaque = []
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = _safe(member.name, what)
            if not name:
                continue
            parent, base = os.path.split(name)
            _check_inside(dest, parent, what)
            if base == OPAQUE:
                opaque.append(parent)
                continue
            if base.startswith(WHITEOUT):
                (dest / parent).mkdir(parents=True, exist_ok=True)
                os.mknod(dest / parent / base[len(WHITEOUT):], stat.S_IFCHR | 0o600, os.makedev(0, 0))
                continue
            if member.islnk():
                member.linkname = _safe(member.linkname, what)
                _check_inside(dest, os.path.dirname(member.linkname), what)
            target = dest / name
            if os.path.lexists(target):  # a later entry replaces an earlier one; never write through a symlink
                if target.is_symlink() or not target.is_dir():
                    target.unlink()
                elif not member.isdir():
                    shutil.rmtree(target)
            member.name = name
            tar.extract(member, dest, numeric_owner=True, **_TRUSTED)
    stream.drain()
    for parent in opaque:
        (dest / parent).mkdir(parents=True, exist_ok=True)
        os.setxattr(dest / parent, "trusted.overlay.opaque", b"y")


def _safe(name: str, what: str) -> str:
    """`name` relative to the layer's root ('' for the root itself); one that climbs out of it is refused."""
    normal = os.path.normpath(name).lstrip("/")
    if normal.split(os.sep)[0] == "..":
        raise ImageUnpackError(f"{what}: member {name!r} points outside the layer")
    return "" if normal == "." else normal


def _check_inside(dest: Path, parent: str, what: str) -> None:
    """A member's directory must not lead out of the layer through a symlink an earlier member made."""
    real = os.path.realpath(dest / parent)
    if real != str(dest) and not real.startswith(f"{dest}{os.sep}"):
        raise ImageUnpackError(f"{what}: {parent!r} leads outside the layer (through a symlink)")


def _read_save(path: Path) -> tuple[dict, dict, bytes]:
    try:
        with tarfile.open(path) as save:
            manifest = json.loads(save.extractfile("manifest.json").read())
            if len(manifest) != 1:
                raise ImageUnpackError(f"{path}: holds {len(manifest)} images; save one image per tar")
            config_bytes = save.extractfile(_resolve_member(save, manifest[0]["Config"], path)).read()
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise ImageUnpackError(f"{path}: not a readable `docker save` tar ({type(exc).__name__}: {exc})") from exc
    return manifest[0], json.loads(config_bytes), config_bytes


def _resolve_member(save: tarfile.TarFile, name: str, path: Path) -> tarfile.TarInfo:
    member = save.getmember(name)
    for _ in range(8):  # the OCI layout's legacy paths are symlinks to blobs/
        if not member.issym():
            return member
        member = save.getmember(os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname)))
    raise ImageUnpackError(f"{path}: {name} is a symlink loop")


def _meta_rootfs(meta: Path) -> tuple[list[Path], dict[str, str]]:
    data = json.loads(meta.read_text())
    layers = [rootfs_dir() / "layers" / layer for layer in data["layers"]]
    missing = [str(layer) for layer in layers if not layer.is_dir()]
    if missing:
        raise ImageUnpackError(f"image {data['id']}: layer dirs {missing} are gone; remove {meta} to unpack again")
    return layers, data["env"]


def _image_meta(image_id: str) -> Path:
    return rootfs_dir() / "images" / f"{_hex(image_id)}.json"


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


class _Hashing(io.RawIOBase):
    """A read-only stream that hashes what passes through it; `drain` reads the rest (a tar's trailing padding)."""

    def __init__(self, inner):
        self._inner, self._hash = inner, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._inner.read(len(buffer))
        self._hash.update(data)
        buffer[:len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
