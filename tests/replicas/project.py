"""The real project inside every replica: marshmallow 3.0.0rc9 from its PyPI sdist, and SWE-bench instance
marshmallow-code__marshmallow-1359 (PR #1359, issue #1357): DateTime._bind_to_schema read `schema.opts`, but inside
a List or Tuple its `schema` is the container field, so building such a schema raised AttributeError; the fix reads
`self.root.opts`. rc9 still has the bug (3.0.0 shipped the fix).

Downloads land once in the host cache (PATCHGYM_REPLICA_CACHE, default patchgym's store: /var/lib/patchgym/replicas
as root) via `pip download`; git repositories are made on the host with fixed dates, so their commit hashes are the
same every build.
"""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from patchgym.paths import store_dir

NAME, VERSION = "marshmallow", "3.0.0rc9"
REPO = "marshmallow-code/marshmallow"
# What `pip install -e '.[dev]'` (SWE-bench's install for marshmallow 3.0) needs, so the eval script's re-install
# finds everything already there with the network off.
WHEELS = ("pytest", "pytz", "simplejson", "flake8==3.7.8", "flake8-bugbear==19.3.0", "pre-commit~=1.17", "tox",
          "setuptools", "wheel")
BUGGY = "            or getattr(schema.opts, self.SCHEMA_OPTS_VAR_NAME)\n"
FIXED = "            or getattr(self.root.opts, self.SCHEMA_OPTS_VAR_NAME)\n"
TEST_ANCHOR = "    # https://github.com/marshmallow-code/marshmallow/pull/572#issuecomment-275800288\n"
NEW_TEST = '''    def test_datetime_list_inner_format(self, schema):
        class MySchema(Schema):
            foo = fields.List(fields.DateTime())
            bar = fields.Tuple((fields.DateTime(),))

            class Meta:
                datetimeformat = "iso8601"
                dateformat = "iso8601"

        schema = MySchema()
        assert schema.fields["foo"].inner.format == "iso8601"
        assert schema.fields["bar"].tuple_fields[0].format == "iso8601"

'''
FAIL_TO_PASS = "tests/test_fields.py::TestParentAndName::test_datetime_list_inner_format"
TEST_FILE = "tests/test_fields.py"
PROBLEM = """3.0: DateTime fields cannot be used as inner field for List or Tuple fields

Between releases 3.0.0rc8 and 3.0.0rc9, `DateTime` fields have started throwing an error when being instantiated as
inner fields of container fields like `List` or `Tuple`:

```python
from marshmallow import fields, Schema

class MySchema(Schema):
    times = fields.List(fields.DateTime())

s = MySchema()
```

Traceback:
```
AttributeError: 'List' object has no attribute 'opts'
```
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "patchgym", "GIT_AUTHOR_EMAIL": "patchgym@localhost", "GIT_COMMITTER_NAME": "patchgym",
           "GIT_COMMITTER_EMAIL": "patchgym@localhost", "GIT_AUTHOR_DATE": "2019-08-13T12:00:00+00:00",
           "GIT_COMMITTER_DATE": "2019-08-13T12:00:00+00:00"}


def cache_dir() -> Path:
    path = Path(os.environ.get("PATCHGYM_REPLICA_CACHE") or store_dir() / "replicas")
    path.mkdir(parents=True, exist_ok=True)
    return path


def sdist_tree() -> Path:
    """The unpacked sdist (downloaded once)."""
    root = cache_dir() / "sdist"
    tree = root / f"{NAME}-{VERSION}"
    if not tree.exists():
        root.mkdir(exist_ok=True)
        _pip("download", "--no-deps", "--no-binary", ":all:", f"{NAME}=={VERSION}", "-d", str(root))
        with tarfile.open(root / f"{NAME}-{VERSION}.tar.gz") as archive:
            archive.extractall(root, filter="data")
    return tree


def wheelhouse() -> Path:
    """Wheels for the test environment (downloaded once; the image installs from them with no index)."""
    path = cache_dir() / "wheelhouse"
    if not (path / ".complete").exists():
        _pip("download", "--only-binary", ":all:", "-d", str(path), *WHEELS)
        (path / ".complete").write_text("\n".join(WHEELS))
    return path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", *args], cwd=repo,
                          check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}).stdout


def copy_source(dest: Path) -> None:
    """The sdist's tree without what sdist building adds (PKG-INFO, *.egg-info): what the repository holds."""
    shutil.copytree(sdist_tree(), dest, ignore=shutil.ignore_patterns("PKG-INFO", "*.egg-info"))


def fresh_repo(dest: Path, message: str) -> str:
    """`dest` becomes a git repo of the sdist's tree in one commit; returns its hash."""
    if dest.exists():
        shutil.rmtree(dest)
    copy_source(dest)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", message)
    return git(dest, "rev-parse", "HEAD").strip()


def edit(repo: Path, *, fix: bool, test: bool) -> None:
    """Apply the fix and/or the new test to the working tree of `repo`."""
    fields_py, tests_py = repo / "src/marshmallow/fields.py", repo / TEST_FILE
    if fix:
        text = fields_py.read_text()
        assert text.count(BUGGY) == 1, "the sdist no longer has the bug's line"
        fields_py.write_text(text.replace(BUGGY, FIXED))
    if test:
        text = tests_py.read_text()
        assert text.count(TEST_ANCHOR) == 1
        tests_py.write_text(text.replace(TEST_ANCHOR, NEW_TEST + TEST_ANCHOR))


def diff(repo: Path, *paths: str) -> str:
    """The working tree's changes to `paths` against HEAD, as git writes them."""
    return git(repo, "diff", "HEAD", "--", *paths)


def diff_between(repo: Path, old: str, new: str, *paths: str) -> str:
    return git(repo, "diff", old, new, "--", *paths)


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, capture_output=True, text=True)
