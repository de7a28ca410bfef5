"""A SWE-smith replica of another language (JavaScript): a row and its image in SWE-smith's published layout, for
the repo profile swesmith 0.0.9 names `PapaParseb10b87ef` (mholt/PapaParse at b10b87ef, test command `npm test`,
verdict by its own `parse_log_mocha`).

The image is SWE-smith's per-snapshot image under the profile's name (`swebench/swesmith.x86_64.mholt_1776_papaparse.
b10b87ef`): the repository in /testbed with one "Initial commit" on main, node_modules installed (git-ignored), and
the task a branch named after its instance_id holding the bug ("Bug Patch") and a last commit removing the file of
its FAIL_TO_PASS tests ("Remove F2P Tests"), the two commits SWE-smith's eval harness assumes (it checks out the
branch, then `HEAD~1`). The bug is a procedural mutation of the kind SWE-smith's `func_pm_op_change` makes: `&&`
for `||` in the range check of PapaParse's dynamic typing, so a number beyond 2^53 becomes a lossy float.

Replica, not the real snapshot: the source is PapaParse 5.4.1 from its npm tarball (git history cannot be fetched
here; the tarball ships the tests), and `npm test` runs the shared test cases under Node only (`mocha
tests/test-cases.js`), because the real script also lints and runs the browser tests in headless Chromium, which
cannot be installed offline, and its `test-node` script's other file spends 7 s on stream timers. mocha 5.2 and
chai 4.2 are the package's dev dependency ranges.
"""

import json
import shutil
from pathlib import Path

from patchgym.env.grading import harness_venv
from patchgym.sandbox import images as patchgym_images
from tests.replicas import images, npm
from tests.replicas.images import HEREDOC
from tests.replicas.project import cache_dir, git

PROFILE = "mholt__PapaParse.b10b87ef"
INSTANCE = f"{PROFILE}.func_pm_op_change__pg0dyn1"
IMAGE = "swebench/swesmith.x86_64.mholt_1776_papaparse.b10b87ef"  # the profile's image_name
F2P_FILE = "tests/test-cases.js"
NODE_TESTS = "mocha tests/test-cases.js"
RANGE = "if (floatValue > MIN_FLOAT && floatValue < MAX_FLOAT) {"
PROBLEM = """Dynamic typing turns huge integers into lossy floats

With `dynamicTyping: true`, a field such as `16142028098527942586` (beyond 2^53) comes back as the number
16142028098527942000 instead of the string it was, so the value is silently changed. Numbers that a double cannot
hold exactly, positive or negative, must stay strings.
"""


def repository() -> tuple[Path, str, str, str]:
    """(the mirror, the bug as a diff, the gold fix, a wrong fix), the branch laid out as SWE-smith lays it out. The
    wrong fix drops the range check's lower bound: -2^53 still becomes a float."""
    repo = cache_dir() / "repos" / "smith-papaparse"
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(npm.package("papaparse", "5.4.1"), repo)
    manifest = json.loads((repo / "package.json").read_text())
    manifest["scripts"]["test"] = NODE_TESTS
    (repo / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    git(repo, "init", "-q")
    (repo / ".git" / "info" / "exclude").write_text("node_modules/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "Initial commit")
    source = repo / "papaparse.js"
    text = source.read_text()
    assert text.count(RANGE) == 1, "papaparse 5.4.1's papaparse.js is not the one this replica was written for"
    git(repo, "checkout", "-qb", INSTANCE)
    source.write_text(text.replace(RANGE, RANGE.replace("&&", "||")))
    bug = git(repo, "diff")
    git(repo, "commit", "-qam", "Bug Patch")
    source.write_text(text.replace(RANGE, "if (floatValue < MAX_FLOAT) {"))
    wrong = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    git(repo, "rm", "-q", F2P_FILE)
    git(repo, "commit", "-qm", "Remove F2P Tests")
    git(repo, "checkout", "-q", "main")
    fix = git(repo, "diff", INSTANCE, "main", "--", "papaparse.js")
    return repo, bug, fix, wrong


def image(repo: Path) -> str:
    """The snapshot image under the profile's published name (ours under images.PREFIX)."""
    node = patchgym_images.ensure_docker_image(patchgym_images.node_base_recipe(), progress=False)
    modules = npm.modules("papaparse-dev", "mocha@5.2.0", "chai@4.2.0")
    # The published image is FROM node:18, whose npm runs `npm test`; Debian's nodejs has none, so npm 10 (the last
    # line that runs on Node 18) goes in from its own tarball, which bundles its dependencies.
    dockerfile = (f"FROM {node}\nCOPY npm /usr/local/lib/node_modules/npm\n"
                  "RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm\n"
                  "COPY testbed /testbed\nCOPY node_modules /testbed/node_modules\nWORKDIR /testbed\n")
    return images.build(f"{images.PREFIX}/{IMAGE}:latest", dockerfile,
                        {"testbed": repo, "node_modules": modules, "npm": npm.package("npm", "10.8.2")})


def statuses(tag: str, patch: str) -> dict[str, str]:
    """The test statuses at the bug commit (the F2P tests present) after `patch`, by the profile's own parser."""
    apply = f"git apply - <<'{HEREDOC}'\n{patch}\n{HEREDOC}\n" if patch else ""
    script = (f"cd /testbed && git checkout -q {INSTANCE}~1\n{apply}"
              f": '>>>>> Start Test Output'\nnpm test\n: '>>>>> End Test Output'\n")
    _, log = images.run(tag, script)
    (answer,) = harness_venv.smith_grade([{"instance_id": INSTANCE, "repo": f"swesmith/{PROFILE}",
                                           "FAIL_TO_PASS": [], "PASS_TO_PASS": [], "log": log}])
    return answer["report"]["statuses"]


def row() -> tuple[dict, dict]:
    """(the SWE-smith row, {"gold": the fix, "wrong_fix": a patch that must not resolve}); F2P/P2P as observed."""
    repo, bug, fix, wrong = repository()
    tag = image(repo)
    buggy, fixed = statuses(tag, ""), statuses(tag, fix)
    f2p = sorted(t for t, s in fixed.items() if s == "PASSED" and buggy.get(t) != "PASSED")
    p2p = sorted(t for t, s in fixed.items() if s == "PASSED" and buggy.get(t) == "PASSED")
    if not f2p:
        raise RuntimeError(f"{tag}: no FAIL_TO_PASS test (buggy {len(buggy)} results, fixed {len(fixed)})")
    return {"instance_id": INSTANCE, "repo": f"swesmith/{PROFILE}", "patch": bug, "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p, "created_at": "2025-08-01T00:00:00Z", "image_name": IMAGE,
            "problem_statement": PROBLEM}, {"gold": fix, "wrong_fix": wrong}
