"""SWE-smith rows of other languages, on a JavaScript replica (tests/replicas/smith_js.py): the row imports with its
profile's test command, image and branch, its logs are read by the profile's own parser (mocha's) in the harness
venv, and patchgym's grader and swesmith's own run_evaluation agree on it: the gold patch resolves, the empty patch
and a wrong fix do not. (swesmith's harness runs a prediction's patch; an empty one is graded by patchgym only.)"""

import json
import subprocess

import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.env.grading import harness_venv
from patchgym.tasks import read_tasks
from tests.replicas.grading import gold_empty_and_wrong

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)

# swesmith's own evaluation of predictions, run in the harness venv: its run_evaluation (run_patch_in_container,
# then get_eval_report). The profile's one network call, a GitHub API lookup of whether the repo is private (for an
# SSH key), is answered "public" beforehand: this machine reaches no GitHub.
SMITH_EVAL = """
import json, os, sys
from swesmith.harness.eval import run_evaluation
from swesmith.profiles import registry
request = json.load(sys.stdin)
os.chdir(request["logs"])
registry.get_from_inst(request["instance"])._cache_repo_private = False
out = {}
for name, patch in request["predictions"].items():
    pred = {"instance_id": request["instance"]["instance_id"], "model_name_or_path": name, "model_patch": patch}
    out[name] = run_evaluation(pred, dict(request["instance"]), run_id=name)
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def smith_js(tmp_path_factory):
    from tests.replicas import images
    from tests.replicas.smith_js import IMAGE, row

    row_, patches = row()
    images.tag(images.local(IMAGE), f"{IMAGE}:latest")  # the published name, as a user who pulled it has it
    root = tmp_path_factory.mktemp("smith-js")
    (root / "rows.jsonl").write_text(json.dumps(row_) + "\n")
    result = CliRunner().invoke(app, ["tasks", "import", str(root / "rows.jsonl"), "--format", "smith",
                                      "--out", str(root / "tasks.jsonl")])
    assert result.exit_code == 0, result.output
    yield row_, read_tasks(root / "tasks.jsonl")[0], {"empty": "", **patches}, root
    images.remove(f"{IMAGE}:latest")


def test_the_row_grades_as_swesmith_grades_it(backend, smith_js):
    row, task, patches, root = smith_js
    assert (task.log_parser == "swesmith-profile" and task.image == row["image_name"]
            and task.start_ref == row["instance_id"] and task.FAIL_TO_PASS == row["FAIL_TO_PASS"])
    assert "npm test" in task.eval_script and "Remove F2P Tests" in task.eval_script
    ours = gold_empty_and_wrong(task, patches, backend)
    assert len(ours["gold"].p2p) > 200  # mocha's results by title, as parse_log_mocha names them

    logs = root / "swesmith-logs"
    logs.mkdir()
    request = {"logs": str(logs), "instance": {k: row[k] for k in ("instance_id", "repo", "FAIL_TO_PASS",
                                                                   "PASS_TO_PASS")},
               "predictions": {"gold": patches["gold"], "wrong_fix": patches["wrong_fix"]}}
    run = subprocess.run([str(harness_venv.ensure_venv()), "-I", "-c", SMITH_EVAL], input=json.dumps(request),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout)
    assert {n: r["status"] for n, r in theirs.items()} == {"gold": "completed", "wrong_fix": "completed"}, theirs
    assert {n: r["resolved"] for n, r in theirs.items()} == {n: ours[n].resolved for n in theirs}

