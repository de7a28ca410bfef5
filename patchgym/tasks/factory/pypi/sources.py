"""The PyPI packages of the factory: recipes.yaml, each pinned sdist downloaded and unpacked on the host, and its
image."""

import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from patchgym.files import file_lock
from patchgym.paths import store_dir
from patchgym.sandbox import images
from patchgym.tasks.factory.sources import WORKDIR, SourceError, files_named, read_recipes

RECIPES_FILE = Path(__file__).with_name("recipes.yaml")
_TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)(test_[^/]*|[^/]*_tests?|conftest)\.py$")
# Every sandbox gets the same hash seed, so set and dict orders do not make tests flaky between runs;
# hypothesis keeps its example database in /tmp, not in the agent's workspace.
IMAGE_ENV = {"PYTHONHASHSEED": "0", "HYPOTHESIS_STORAGE_DIRECTORY": "/tmp/.hypothesis"}


class PypiRecipe(BaseModel):
    """One package of recipes.yaml: which sdist, what may be mutated, how its tests run."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    src: str = Field(".", description="directory put on sys.path, relative to the sdist root")
    packages: list[str] = Field(min_length=1, description="package dirs or modules that may be mutated")
    exclude: list[str] = Field(default_factory=list, description="source files or dirs never mutated")
    tests: list[str] = Field(min_length=1, description="pytest paths")
    pytest_args: list[str] = Field(default_factory=list)
    deps: list[str] = Field(default_factory=list, description="runtime dependencies, pinned")
    test_deps: list[str] = Field(default_factory=list, description="dependencies of the tests only, pinned")
    timeout: float = Field(120, gt=0, description="seconds one run of the whole suite may take")

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    def test_cmd(self, targets: list[str] | None = None) -> str:
        """The pytest command, run in /testbed; `targets` (node ids) instead of the whole suite."""
        # A module that fails to import must fail its own tests, not stop the whole run.
        argv = ["pytest", "-p", "no:cacheprovider", f"--rootdir={WORKDIR}", "--continue-on-collection-errors",
                *self.pytest_args, *(targets or self.tests)]
        return shlex.join(argv)

    @staticmethod
    def is_test_file(path: str) -> bool:
        return bool(_TEST_PATH.search(path))

    def source_files(self, tree: Path) -> dict[str, str]:
        """The files mutations may touch: .py files of `packages`, minus tests and `exclude`; path -> text."""
        return {rel: (tree / rel).read_text(encoding="utf-8")
                for rel in files_named(tree, self.packages, (".py",), self.key, "sdist")
                if not self.is_test_file(rel) and not any(_under(rel, e) for e in self.exclude)}


def _under(path: str, entry: str) -> bool:
    entry = entry.rstrip("/")
    return path == entry or path.startswith(entry + "/")


def load_recipes(path: Path = RECIPES_FILE) -> dict[str, PypiRecipe]:
    return read_recipes(path, PypiRecipe)


def fetch_source(recipe: PypiRecipe) -> Path:
    """The unpacked sdist under the store (`sources/<name>-<version>/tree`), downloaded from PyPI on first use."""
    home = store_dir() / "sources" / recipe.key
    tree = home / "tree"
    if tree.is_dir():
        return tree
    with file_lock(f"sdist-{recipe.key}"):
        if tree.is_dir():
            return tree
        home.mkdir(parents=True, exist_ok=True)
        sdist = home / "sdist.tar.gz"
        if not sdist.exists():
            _download(recipe, sdist)
        # Unpacked beside the final place and renamed into it, so a crash never leaves half a tree.
        with tempfile.TemporaryDirectory(dir=home, prefix=".unpack-") as scratch:
            with tarfile.open(sdist) as tar:
                tar.extractall(scratch, filter="data")
            tops = list(Path(scratch).iterdir())
            if len(tops) != 1 or not tops[0].is_dir():
                raise SourceError(f"{recipe.key}: the sdist does not hold exactly one top directory")
            if not (tops[0] / "PKG-INFO").is_file():
                raise SourceError(f"{recipe.key}: the sdist has no PKG-INFO")
            tops[0].rename(tree)
    return tree


def _download(recipe: PypiRecipe, dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as scratch:
        argv = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                "--disable-pip-version-check", "--dest", scratch, f"{recipe.name}=={recipe.version}"]
        result = subprocess.run(argv, capture_output=True, text=True)
        found = [p for p in Path(scratch).iterdir() if p.name.endswith((".tar.gz", ".tgz"))]
        if result.returncode != 0 or len(found) != 1:
            raise SourceError(f"{recipe.key}: pip download failed ({result.returncode}):\n{result.stderr[-2000:]}")
        shutil.move(found[0], dest)


def image_recipe(recipe: PypiRecipe, tree: Path) -> images.ImageRecipe:
    """The (package, version) image: dependencies in /opt/venv, the clean source at /testbed and importable
    from there through a .pth file, so the image holds no second copy of the source to diff the bug against."""
    dist = f"{re.sub(r'[-_.]+', '_', recipe.name)}-{recipe.version}.dist-info"
    q = shlex.quote
    step = (
        "set -e\n"
        "site=$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\n"
        # A dependency (or pytest itself, for packaging) may have installed this very package: remove that copy.
        f"if python -m pip show -q {q(recipe.name)} >/dev/null 2>&1; then "
        f"python -m pip uninstall -y -q --root-user-action=ignore {q(recipe.name)}; fi\n"
        f"echo {q(str(PurePosixPath(WORKDIR, recipe.src)))} > \"$site/patchgym-testbed.pth\"\n"
        # Metadata only (the sdist's PKG-INFO is the core metadata), for code that asks for its own version.
        f"mkdir \"$site/{dist}\"\n"
        f"cp {WORKDIR}/PKG-INFO \"$site/{dist}/METADATA\"\n"
        f"echo patchgym > \"$site/{dist}/INSTALLER\"\n"
    )
    return images.layer_recipe(
        f"patchgym/pkg-{recipe.name.lower()}-{recipe.version}",
        wheels=(*recipe.deps, *recipe.test_deps),
        files=((tree, WORKDIR),),
        steps=(step,),
        env=IMAGE_ENV,
    )
