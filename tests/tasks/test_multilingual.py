"""SWE-bench Multilingual, on a JavaScript replica (tests/replicas/multilingual.py): the v5 row imports as any
SWE-bench row does, and patchgym's grader and swebench's own run_instance agree on it: the gold patch resolves, the
empty patch and a wrong fix do not; the verdict comes from swebench's own `parse_log_tap`. (swebench itself never
runs an empty patch: run_evaluation drops it, so only patchgym's grade of it is checked.)"""

import json

import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.tasks import read_tasks
from tests.replicas.grading import gold_empty_and_wrong

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    from tests.replicas import images
    from tests.replicas.multilingual import row

    row_, patches = row()
    images.tag(images.local(row_["image"]), row_["image"])  # the published name, as a user who pulled it has it
    root = tmp_path_factory.mktemp("multilingual")
    (root / "rows.jsonl").write_text(json.dumps(row_) + "\n")
    result = CliRunner().invoke(app, ["tasks", "import", str(root / "rows.jsonl"), "--format", "swebench",
                                      "--out", str(root / "tasks.jsonl")])
    assert result.exit_code == 0, result.output
    yield row_, read_tasks(root / "tasks.jsonl")[0], {"gold": row_["patch"], "empty": "", **patches}, root
    images.remove(row_["image"])


def test_the_row_grades_as_swebench_grades_it(backend, multilingual, monkeypatch):
    import docker
    from swebench.harness.run_evaluation import run_instance
    from swebench.harness.utils import make_test_spec

    row, task, patches, root = multilingual
    assert (task.log_parser == "parse_log_tap" and task.image == row["image"]
            and task.FAIL_TO_PASS == row["FAIL_TO_PASS"])
    # The wrong fix keeps every old test passing and still lets `constructor` in the path pollute the prototype.
    ours = gold_empty_and_wrong(task, patches, backend)
    monkeypatch.chdir(root)  # run_instance writes its logs under ./logs
    spec = make_test_spec(row)
    client = docker.from_env()
    for name in ("gold", "wrong_fix"):  # swebench's run_evaluation drops empty patches before run_instance
        patch = patches[name]
        prediction = {"instance_id": row["instance_id"], "model_name_or_path": name, "model_patch": patch}
        _, report = run_instance(spec, prediction, client, "patchgym-multilingual", timeout=300)
        assert report[row["instance_id"]]["resolved"] == ours[name].resolved, (name, report)
