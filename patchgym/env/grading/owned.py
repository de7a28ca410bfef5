"""The files the grader owns: tests, test configuration and packaging metadata, whose copies in the task (not the
patch's) decide how tests run and what they check. A fresh-sandbox grade undoes the patch's changes to them."""

import re

from patchgym.tasks.task import Task

# Files that decide how tests run or what they check: the grader's copies always win over the patch's.
TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$")
# Every file pytest 9 reads its configuration from (`_pytest/config/findpaths.py`: CONFIG_LOADERS_BY_NAME), and the
# modules Python or pytest import on their own at start.
CONFIG_NAMES = {"pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg",
                "conftest.py", "sitecustomize.py", "usercustomize.py"}
# Packaging metadata, which can register a pytest plugin (entry_points.txt) or run code at start (*.pth); the
# workspace is on sys.path, so importlib.metadata finds distributions there.
METADATA_PATH = re.compile(r"\.(dist-info|egg-info)(/|$)|\.(pth|egg-link)$", re.IGNORECASE)
# What Node.js and JavaScript test runners read their configuration or modules from (JavaScript tasks).
JS_CONFIG_PATH = re.compile(r"(^|/)(package\.json|\.npmrc|\.taprc|\.mocharc(\.[a-z]+)?|jest\.config\.[a-z]+|"
                            r"\.babelrc(\.[a-z]+)?|babel\.config\.[a-z]+)$|(^|/)node_modules(/|$)")


def grader_owns(path: str, task: Task) -> bool:
    """Whether `path` (relative to the workspace) is a file whose grader's copy wins over the patch's."""
    name = path.rsplit("/", 1)[-1]
    return (path in task.test_files or name in CONFIG_NAMES or bool(METADATA_PATH.search(path))
            or bool(TEST_PATH.search(path)) or bool(JS_CONFIG_PATH.search(path)))
