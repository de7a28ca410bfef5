"""What every ecosystem's packages share: the workspace they are unpacked to in the image, the error of a source
that cannot be had, the reading of an ecosystem's recipes.yaml, and the files a recipe names."""

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel

WORKDIR = "/testbed"
R = TypeVar("R", bound=BaseModel)


class SourceError(RuntimeError):
    """A package that cannot be downloaded or unpacked, a recipe that does not fit it, or an image that shows what a
    task hides."""


def read_recipes(path: Path, model: type[R]) -> dict[str, R]:
    """The recipes of a recipes.yaml (package name -> its fields) as `model`s, in the file's order."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    return {name: model(name=name, **fields) for name, fields in raw.items()}


def files_named(tree: Path, entries: list[str], suffixes: tuple[str, ...], key: str, archive: str) -> Iterator[str]:
    """The path (relative to `tree`) of each file that `entries` name: a file itself, or a directory's files ending
    in one of `suffixes`, sorted; a SourceError for an entry that the package `key` (from an `archive`) lacks."""
    for entry in entries:
        root = tree / entry
        if not root.exists():
            raise SourceError(f"{key}: recipe names {entry!r}, which the {archive} does not have")
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in suffixes):
            yield path.relative_to(tree).as_posix()
