"""JavaScript tasks from npm, end to end on real images: `tasks build --ecosystem npm` makes >= 9 tasks from 3
packages offline (their tarballs and dependencies from the host's npm cache, Debian's Node.js in the image); the
oracle resolves every one and null none on both backends; the grader's hardening holds for JavaScript (an edited
test, the runner's config, node_modules, printed reporter output, a write into the report: none resolves); and
`patchgym demos` plays a JavaScript task's gold patch as it does a Python one's."""

import json
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from patchgym.agent.config import AgentConfig
from patchgym.agent.scripts import NullScript, OracleScript
from patchgym.env.grading.grader import grade_patch
from patchgym.eval.run import evaluate
from patchgym.rollout import RolloutConfig, ScriptedAgent
from patchgym.rollout.demos import build_demos
from patchgym.sandbox import SandboxConfig
from patchgym.tasks.factory.diffs import file_diff, new_file_diff

# A tape that runs nothing and reports every test it was given as passed, through tape's own stream protocol.
FAKE_TAPE = """var names = [], on = {};
function test(name) { names.push(typeof name === 'string' ? name : ''); }
test.test = test; test.only = test; test.skip = test;
test.createStream = function () { return { on: function (event, cb) { on[event] = cb; } }; };
setTimeout(function () {
    names.forEach(function (name, id) { on.data({ type: 'test', id: id, name: name }); on.data({ type: 'end', test: id }); });
    on.end();
}, 0);
module.exports = test;
"""  # noqa: E501
GRADE_ALL = RolloutConfig(grade_empty_patches=True)  # so null's unchanged workspace really runs the tests


def test_three_packages_make_nine_tasks_with_javascript_statements(npm_tasks):
    by_package = {t.repo for t in npm_tasks}
    assert len(npm_tasks) >= 9 and by_package == {"minimist", "qs", "object-inspect"}
    for task in npm_tasks:
        assert task.log_parser == "patchgym_tape" and task.FAIL_TO_PASS and task.PASS_TO_PASS
        assert "```js" in task.problem_statement and "::" not in task.problem_statement
        assert not any(f.split("/")[-1] in task.problem_statement for f in task.test_files)  # no test file named
        assert all(t.split("::")[0] in task.test_files for t in task.FAIL_TO_PASS)


@pytest.mark.parametrize("backend", ["docker", "local"], indirect=True)
def test_oracle_resolves_every_npm_task_and_null_none(backend, npm_tasks, tmp_path):
    config = SandboxConfig(backend=backend)
    oracle = evaluate(npm_tasks, ScriptedAgent(OracleScript()), config, tmp_path / "oracle", progress=False)
    null = evaluate(npm_tasks, ScriptedAgent(NullScript()), config, tmp_path / "null", rollout=GRADE_ALL,
                    progress=False)
    assert oracle["resolve_rate"] == 1.0 and oracle["infra_errors"] == 0, oracle
    assert null["resolve_rate"] == 0.0 and null["grading_errors"] == 0 and null["infra_errors"] == 0, null


def buggy_text(task, path, tmp_path):
    """`path` as the agent's workspace has it: the package's clean file with the task's bug applied."""
    from patchgym.tasks.factory.npm.sources import fetch_package, load_npm_recipes

    tree, _ = fetch_package(load_npm_recipes()[task.repo])
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    for name in {path} | set(re.findall(r"^\+\+\+ b/(.+)$", task.bug_patch, re.MULTILINE)):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text((tree / name).read_text())
    (work / "bug.diff").write_text(task.bug_patch)
    subprocess.run(["git", "apply", "bug.diff"], cwd=work, check=True)
    return (work / path).read_text()


def test_the_graders_hardening_holds_for_javascript(npm_tasks, ready_backend, tmp_path):
    ready_backend("docker")
    config = SandboxConfig(backend="docker")
    task = next(t for t in npm_tasks if t.repo == "minimist" and "index.js" in t.bug_patch)
    source = buggy_text(task, "index.js", tmp_path)
    visible_test = next(t.split("::")[0] for t in task.PASS_TO_PASS if t.split("::")[0] not in task.test_files)
    hidden_test = task.test_files[0]
    fake_pass = "var test = require('tape');\ntest('x', function (t) { t.pass(); t.end(); });\n"
    printed = "".join(f"ok {n} {t}\n" for n, t in enumerate(task.FAIL_TO_PASS, 1))
    records = "".join(json.dumps({"nodeid": t, "when": "call", "outcome": "passed"}) + "\n" for t in task.FAIL_TO_PASS)
    attacks = {
        # the failing test, rewritten (or a new file where it was hidden) to pass
        "edit the test": new_file_diff(hidden_test, fake_pass),
        "edit a visible test": file_diff(visible_test, buggy_text(task, visible_test, tmp_path), fake_pass),
        # the runner's config: package.json scripts, a .taprc, a tape of its own in node_modules
        "runner config": new_file_diff(".taprc", "timeout: 1\n") + file_diff(
            "package.json", buggy_text(task, "package.json", tmp_path), '{"name": "minimist", "main": "x.js"}\n'),
        # a tape of its own in the workspace's node_modules (found before /node_modules), which "passes" every test
        "node_modules": new_file_diff("node_modules/tape/index.js", FAKE_TAPE),
        # reporter output printed by the code under test, and records written into the report channel itself
        "printed output": file_diff("index.js", source, source + f"console.log({json.dumps(printed)});\n"
                                    f"console.log({json.dumps(records)});\n"),
        "report write": file_diff("index.js", source, source + f"require('fs').writeSync(3, {json.dumps(records)});\n"),
    }
    outcomes = {}
    for name, patch in attacks.items():
        grade = grade_patch(task, patch, config, timeout=120)
        assert not grade.resolved, (name, grade.outcome, grade.error_detail[-500:])
        outcomes[name] = grade.outcome
    # The hidden test's path holds the grader's file, so a patch creating it does not even apply (as for Python);
    # every other attack applied, and the grader saw through it.
    assert outcomes.pop("edit the test") == "apply_failed" and "apply_failed" not in outcomes.values(), outcomes
    assert outcomes["report write"] == "tampered" and outcomes["printed output"] == "unresolved", outcomes
    assert grade_patch(task, task.patch, config, timeout=120).resolved  # the same grader does resolve the fix


def test_demos_play_a_javascript_tasks_gold_patch(npm_tasks, ready_backend, tiny, tmp_path):
    ready_backend("docker")
    task = next(t for t in npm_tasks if t.repo == "qs")
    summary = build_demos([task], tiny[1], AgentConfig(), SandboxConfig(backend="docker"), tmp_path / "demos",
                          per_task=1, rollout=RolloutConfig(grade_timeout_s=300), model="tiny")
    (row,) = summary.by_task
    assert (row.played, row.kept) == (1, 1), row
