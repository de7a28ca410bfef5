"""The npm packages of the factory: recipes.yaml, each pinned tarball fetched and unpacked on the host, its
dependencies installed on the host from the npm client's cache, and the image that holds both."""

import json
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from patchgym.files import file_lock
from patchgym.paths import store_dir
from patchgym.sandbox import images
from patchgym.tasks.factory.sources import WORKDIR, SourceError, files_named, read_recipes

RECIPES_FILE = Path(__file__).with_name("recipes.yaml")
MODULES_DIR = "/node_modules"  # Node looks here after /testbed/node_modules: outside the workspace, root's
_JS = (".js", ".cjs", ".mjs")


class NpmRecipe(BaseModel):
    """One package of npm/recipes.yaml."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    sources: list[str] = Field(min_length=1)
    tests: list[str] = Field(min_length=1, description="test file globs")
    deps: list[str] = Field(default_factory=list, description="NAME@VERSION, pinned")
    timeout: float = Field(60, gt=0)

    @property
    def key(self) -> str:
        return f"npm-{self.name}-{self.version}"

    def test_cmd(self, files: list[str] | None = None) -> str:
        """tape's own command for the suite (or `files`), run in /testbed; the grader runs the same files under
        patchgym's reporter (patchgym.env.grading.tape)."""
        targets = " ".join(shlex.quote(f) for f in files) if files else " ".join(self.tests)
        return f"tape {targets}"

    @staticmethod
    def is_test_file(path: str) -> bool:
        return path.startswith(("test/", "tests/")) or "/test/" in path

    def source_files(self, tree: Path) -> dict[str, str]:
        """The files mutations may touch: .js, .cjs and .mjs files of `sources`, minus tests and node_modules."""
        return {rel: (tree / rel).read_text(encoding="utf-8")
                for rel in files_named(tree, self.sources, _JS, self.key, "tarball")
                if not self.is_test_file(rel) and "node_modules/" not in rel}


def load_npm_recipes(path: Path = RECIPES_FILE) -> dict[str, NpmRecipe]:
    return read_recipes(path, NpmRecipe)


def _npm(args: list[str], cwd: Path, what: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise SourceError(f"{what}: the npm client is not on this machine (apt-get install npm)")
    cache = store_dir() / "npm-cache"
    result = subprocess.run([npm, *args, "--cache", str(cache), "--prefer-offline", "--no-audit", "--no-fund",
                             "--loglevel=error"], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SourceError(f"{what}: npm {args[0]} failed ({result.returncode}):\n{result.stderr[-2000:]}")


def fetch_package(recipe: NpmRecipe) -> tuple[Path, Path]:
    """(the unpacked tarball, the node_modules of its deps) under the store, made on first use."""
    home = store_dir() / "sources" / recipe.key
    tree, modules = home / "tree", home / "deps" / "node_modules"
    if tree.is_dir() and modules.is_dir():
        return tree, modules
    with file_lock(f"npm-{recipe.key}"):
        home.mkdir(parents=True, exist_ok=True)
        if not tree.is_dir():
            with tempfile.TemporaryDirectory(dir=home, prefix=".unpack-") as scratch:
                _npm(["pack", f"{recipe.name}@{recipe.version}", "--pack-destination", scratch], Path(scratch),
                     recipe.key)
                (tarball,) = Path(scratch).glob("*.tgz")
                with tarfile.open(tarball) as tar:
                    tar.extractall(scratch, filter="data")
                if not (Path(scratch) / "package" / "package.json").is_file():
                    raise SourceError(f"{recipe.key}: the tarball has no package/package.json")
                (Path(scratch) / "package").rename(tree)
        if not modules.is_dir():
            deps = home / "deps"
            shutil.rmtree(deps, ignore_errors=True)
            deps.mkdir()
            (deps / "package.json").write_text(json.dumps({"private": True}))
            _npm(["install", "--ignore-scripts", "--no-package-lock", *recipe.deps], deps, recipe.key)
    return tree, modules


def image_recipe(recipe: NpmRecipe, tree: Path, modules: Path) -> images.ImageRecipe:
    """The package's image: Debian's Node.js (the node base), the clean source at /testbed and its dependencies at
    /node_modules. A dependency that brings its own copy of the package (tape brings minimist and object-inspect)
    gets the workspace instead, so the image holds no unmutated copy, and no copy of the hidden tests."""
    name = shlex.quote(recipe.name)
    link = (f"find {MODULES_DIR} -depth -type d -path '*/node_modules/'{name} | while read -r copy; do "
            f'rm -rf "$copy" && ln -s {WORKDIR} "$copy"; done')
    return images.layer_recipe(f"patchgym/npm-{recipe.name.lower()}-{recipe.version}",
                               parent=images.node_base_recipe(),
                               files=((tree, WORKDIR), (modules, MODULES_DIR)), steps=(link,))
