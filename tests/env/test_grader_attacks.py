"""The reward cannot be forged: every attack of tests/attacks, each first shown to fool the plain test runner on a
factory task, is graded not resolved there (tampered, or its tests failing), while gold resolves and the empty
patch does not. One image per ecosystem, many patches, on docker; bench/attacks.py runs every attack on every task.
"""

import contextlib
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from patchgym import paths
from patchgym.env.grading.grader import grade_patch
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.tasks import read_tasks
from tests.attacks import js_attacks, patches, python_attacks
from tests.attacks.run import first_fooled, grade

pytestmark = pytest.mark.docker
PYTHON_TASKS = 3  # the tasks an attack is tried on, in order, until one shows it fools the plain runner


@pytest.fixture(scope="module")
def python_tasks(ready_backend):
    from patchgym.tasks.factory.build import build_tasks
    from tests.conftest import CI_PACKAGES

    ready_backend("docker")
    out = paths.store_dir() / "factory-ci" / "docker"
    build_tasks(CI_PACKAGES, 3, seed=0, out_dir=out, backend="docker", progress=False)
    tasks = read_tasks(out / "tasks.jsonl")
    return [t for t in tasks if t.repo == "isodate"] + [t for t in tasks if t.repo != "isodate"]


def _all(attacks: dict[str, str], tasks) -> dict:
    with ThreadPoolExecutor(2) as threads:
        found = threads.map(lambda item: first_fooled(item[0], item[1], tasks), attacks.items())
        return {result.attack: result for result in found}


@pytest.fixture(scope="module")
def python_results(python_tasks):
    return _all(python_attacks.ATTACKS, python_tasks[:PYTHON_TASKS])


@pytest.fixture(scope="module")
def javascript_results(npm_tasks):
    # Tasks whose failing tests are not in the first file the suite loads first: some attacks can only reach
    # the files loaded after the package.
    order = sorted(npm_tasks, key=lambda t: (t.repo != "qs", t.repo != "object-inspect", t.instance_id))
    return _all(js_attacks.ATTACKS, order)


@pytest.mark.parametrize("name", sorted(python_attacks.ATTACKS))
def test_a_python_attack_that_fools_pytest_does_not_resolve(python_results, name):
    result = python_results[name]
    assert result.fooled_plain, f"{name} should fool plain pytest on one of the tasks, or it proves nothing"
    assert result.outcome in ("tampered", "unresolved"), result


@pytest.mark.parametrize("name", sorted(js_attacks.ATTACKS))
def test_a_javascript_attack_that_fools_tape_does_not_resolve(javascript_results, name):
    result = javascript_results[name]
    assert result.fooled_plain, f"{name} should fool plain tape on one of the tasks, or it proves nothing"
    assert result.outcome in ("tampered", "unresolved"), result


def test_canaries_never_fail_honest_patches(python_tasks, npm_tasks):
    """Gold resolves and the empty patch does not (the canaries' names are drawn anew at each grade; the factory
    graded each gold patch once already)."""
    tasks = python_tasks[:PYTHON_TASKS] + npm_tasks[::3]
    jobs = [(t, which) for t in tasks for which in ("gold", "empty")]
    with ThreadPoolExecutor(2) as threads:
        grades = list(threads.map(lambda job: grade(job[0], job[0].patch if job[1] == "gold" else ""), jobs))
    for (task, which), g in zip(jobs, grades):
        assert g.outcome == ("resolved" if which == "gold" else "unresolved"), (task.instance_id, which, g)


PYTHON_PROBE = r'''
import json, os, sys
_seen = {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(), "path": sys.path,
         "modules": sorted("%s %s" % (n, getattr(m, "__file__", "") or "") for n, m in list(sys.modules.items())),
         "fds": sorted(os.readlink("/proc/self/fd/" + fd) for fd in os.listdir("/proc/self/fd")
                       if os.path.exists("/proc/self/fd/" + fd)),
         "cmdline": open("/proc/self/cmdline").read(),
         "exists": [p for p in ("/opt/patchgym", "/var/lib/patchgym", "/root/.grading") if os.path.exists(p)]}
with open("/tmp/probe.json", "w") as _f:
    json.dump(_seen, _f)
'''
JS_PROBE = r'''
;(function () {
    var fs = require('fs');
    fs.writeFileSync('/tmp/probe.json', JSON.stringify({
        argv: process.argv, env: process.env, cwd: process.cwd(), modules: Object.keys(require.cache),
        fds: fs.readdirSync('/proc/self/fd').map(function (fd) {
            try { return fs.readlinkSync('/proc/self/fd/' + fd); } catch (e) { return ''; } }),
        cmdline: fs.readFileSync('/proc/self/cmdline', 'utf8'),
        exists: ['/opt/patchgym', '/var/lib/patchgym', '/root/.grading'].filter(fs.existsSync)
    }));
}());
'''


class _KeptSandbox:
    """A stand-in for the grader's sandbox pool that hands it one sandbox and leaves it open afterwards."""

    def __init__(self, sandbox):
        self.kept = sandbox

    @contextlib.contextmanager
    def sandbox(self, image):
        yield self.kept


@pytest.mark.parametrize("ecosystem", ["python", "javascript"])
def test_nothing_in_the_tests_process_names_patchgym_or_a_grader(ecosystem, python_tasks, npm_tasks):
    """Arguments, environment, working directory, module paths, open files: 'am I being graded?' has no cheap
    answer, so code that forges only when it is graded never sees a reason to."""
    task = python_tasks[0] if ecosystem == "python" else npm_tasks[0]
    patch = patches.appended(task, PYTHON_PROBE if ecosystem == "python" else JS_PROBE)
    with open_sandbox(SandboxConfig(backend="docker", memory_mb=1024), image=task.image) as sandbox:
        g = grade_patch(task, patch, pools=_KeptSandbox(sandbox), timeout=300)
        seen = json.loads(sandbox.read_file("/tmp/probe.json"))
    assert g.outcome == "unresolved", g  # the probe fixes nothing
    named = re.compile(r"patchgym|grader|grading", re.IGNORECASE)
    assert not named.search(json.dumps(seen)), {k: v for k, v in seen.items() if named.search(json.dumps(v))}
    assert seen["env"]["HOME"].startswith("/tmp/home-") and seen["exists"] == []
