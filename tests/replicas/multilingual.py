"""A SWE-bench Multilingual replica (JavaScript): a v5 row and its image in the published layout, around a real bug
of a real repository that can be fetched here, minimist's prototype pollution through `constructor`
(CVE-2021-44906): 1.2.5 blocks only `__proto__` keys; 1.2.6 also refuses a `constructor` that is a function. The
repository is minimist 1.2.5 from its npm tarball (git history cannot be fetched), the fix and the new tests are the
1.2.6 release's, and the tests run under tape with TAP output graded by swebench's own `parse_log_tap` (the parser
its Multilingual rows of axios and three.js name). The replica's new tests give each assertion a message of its own,
since parse_log_tap names a result by its TAP line.

The image is Node.js (Debian's) with the repository at /testbed, its dev dependency tape in /testbed/node_modules
(git-ignored), as SWE-bench's JavaScript images hold a repository after `npm ci`.
"""

import re
import shutil
from pathlib import Path

from patchgym.sandbox import images as patchgym_images
from tests.replicas import images, npm
from tests.replicas.images import HEREDOC
from tests.replicas.project import cache_dir, git

INSTANCE = "minimistjs__minimist-44906"
REPO = "minimistjs/minimist"
VERSION = "1.2"
TEST_FILE = "test/proto.js"
TEST_CMD = "./node_modules/.bin/tape test/proto.js"
PARSER = "parse_log_tap"
PROBLEM = """Prototype pollution through `constructor`

`parse(['--_.constructor.constructor.prototype.foo', 'bar'])` sets `foo` on `Function.prototype`, so every function
gets a `foo` property. minimist already refuses `__proto__` keys; a `constructor` key that reaches a function's
prototype must be refused too.
"""
NEW_TESTS = """
test('proto pollution (constructor function)', function (t) {
    var argv = parse(['--_.concat.constructor.prototype.y', '123']);
    function fnToBeTested() {}
    t.equal(fnToBeTested.y, undefined, 'a function does not get y through constructor.prototype');
    t.equal(argv.y, undefined, 'argv does not get y through constructor.prototype');
    t.end();
});

test('proto pollution (constructor function) snyk', function (t) {
    var argv = parse('--_.constructor.constructor.prototype.foo bar'.split(' '));
    t.equal((function () {}).foo, undefined, 'Function.prototype does not get foo');
    t.equal(argv.y, undefined, 'argv does not get y through constructor.constructor');
    t.end();
});
"""
FIX = ("function isConstructorOrProto (obj, key) {\n"
       "    return key === 'constructor' && typeof obj[key] === 'function' || key === '__proto__';\n}\n")


def tarball(version: str) -> Path:
    """minimist@version unpacked from its npm tarball."""
    return npm.package("minimist", version)


def tape_modules() -> Path:
    """node_modules with tape (1.2.5's dev dependency range)."""
    return npm.modules("tape-4", "tape@4.13.3")


def repository() -> tuple[Path, str, str, str, str]:
    """(the repo at its base commit, base_commit, the fix, the new tests, a wrong fix), the last three as diffs. The
    wrong fix checks only the last key: a `constructor` inside the path still walks into Function.prototype."""
    repo = cache_dir() / "repos" / "minimist"
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(tarball("1.2.5"), repo)
    git(repo, "init", "-q")
    (repo / ".git" / "info" / "exclude").write_text("node_modules/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "minimist 1.2.5 (npm tarball)")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "index.js").write_text((tarball("1.2.6") / "index.js").read_text())
    fix = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    (repo / TEST_FILE).write_text((repo / TEST_FILE).read_text() + NEW_TESTS)
    test_patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    text = (repo / "index.js").read_text()
    last_key = "        var key = keys[keys.length - 1];\n        if (key === '__proto__') return;\n"
    assert text.count(last_key) == 1, "minimist 1.2.5's index.js is not the one this replica was written for"
    (repo / "index.js").write_text(text.replace(last_key, last_key.replace(
        "key === '__proto__'", "isConstructorOrProto(o, key)")) + "\n" + FIX)
    wrong = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    return repo, base, fix, test_patch, wrong


def image(repo: Path) -> str:
    """The instance image under the published name (ours under images.PREFIX)."""
    node = patchgym_images.ensure_docker_image(patchgym_images.node_base_recipe(), progress=False)
    tag = f"{images.PREFIX}/swebench/sweb.eval.x86_64.{INSTANCE.replace('__', '_1776_')}:latest"
    dockerfile = f"FROM {node}\nCOPY testbed /testbed\nCOPY node_modules /testbed/node_modules\nWORKDIR /testbed\n"
    return images.build(tag, dockerfile, {"testbed": repo, "node_modules": tape_modules()})


def eval_script(base: str, test_patch: str) -> str:
    """What swebench's make_eval_script_list_common writes for a JavaScript row (the v5 row carries it)."""
    reset = f"git checkout {base} {TEST_FILE}"
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git config --global --add safe.directory /testbed",
        "cd /testbed", "git status", "git show", f"git -c core.fileMode=false diff {base}", reset,
        f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}", ": '>>>>> Start Test Output'", TEST_CMD,
        ": '>>>>> End Test Output'", reset]) + "\n"


def statuses(image_tag: str, script: str, patch: str) -> dict[str, str]:
    """The eval script's test statuses after `patch`, by swebench's own TAP parser."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    apply = f"cd /testbed && git apply -v - <<'{HEREDOC}'\n{patch}\n{HEREDOC}\n" if patch else ""
    _, log = images.run(image_tag, apply + script)
    marked = re.search(r">>>>> Start Test Output'\n(.*)\n\+ : '>>>>> End Test Output", log, re.DOTALL)
    return PARSER_REGISTRY[PARSER](marked.group(1) if marked else log, None)


def row() -> tuple[dict, dict]:
    """(the v5 row, {"wrong_fix": a patch that must not resolve}); F2P/P2P as the eval script shows them."""
    repo, base, fix, test_patch, wrong = repository()
    tag = image(repo)
    script = eval_script(base, test_patch)
    before, after = statuses(tag, script, ""), statuses(tag, script, fix)
    f2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
    p2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
    if not f2p:
        raise RuntimeError(f"{tag}: no FAIL_TO_PASS test (unpatched {before}, fixed {after})")
    return {"instance_id": INSTANCE, "repo": REPO, "base_commit": base, "patch": fix, "test_patch": test_patch,
            "problem_statement": PROBLEM, "hints_text": "", "created_at": "2022-03-17T00:00:00Z",
            "version": VERSION, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "environment_setup_commit": base,
            "image": images.published(tag), "eval_script": script, "log_parser": PARSER,
            "eval_type": "pass_and_fail"}, {"wrong_fix": wrong}
