"""The Task record's JSONL round trip and the errors it gives for bad files."""

import json

import pytest

from patchgym.tasks.task import Task, TaskError, read_tasks, write_tasks


def make_task(**overrides) -> Task:
    fields = dict(instance_id="psf__requests-1", repo="psf/requests", problem_statement="Session drops cookies.",
                  FAIL_TO_PASS=["tests/test_cookies.py::test_keep"], PASS_TO_PASS=["tests/test_cookies.py::test_set"],
                  patch="diff --git a/r.py b/r.py\n", install_config={"python": "3.11", "pip_packages": ["pytest"]})
    return Task(**{**fields, **overrides})


def test_round_trip_keeps_every_field(tmp_path):
    tasks = [make_task(), make_task(instance_id="psf__requests-2", hints_text="see #12", difficulty="1-4 hours")]
    path = tmp_path / "tasks.jsonl"
    write_tasks(tasks, path)
    assert read_tasks(path) == tasks
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.jsonl"]  # no temporary file left behind


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n" + make_task().model_dump_json() + "\n\n")
    assert read_tasks(path) == [make_task()]


def test_every_bad_row_is_named_by_file_row_and_field(tmp_path):
    good = make_task().model_dump()
    rows = [json.dumps(good),
            json.dumps({**good, "FAIL_TO_PASS": []}),
            json.dumps({k: v for k, v in good.items() if k != "repo"}),
            "{not json",
            json.dumps({**good, "surprise": 1}),
            json.dumps({k: v for k, v in good.items() if k != "FAIL_TO_PASS"})]  # absent, not only empty
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(TaskError) as err:
        read_tasks(path)
    message = str(err.value)
    assert f"{path}:2: field FAIL_TO_PASS:" in message
    assert f"{path}:3: field repo: Field required" in message
    assert f"{path}:4: field (row):" in message
    assert f"{path}:5: field surprise: Extra inputs are not permitted" in message
    assert f"{path}:6: field FAIL_TO_PASS: List should have at least 1 item" in message
    assert f"{path}:1:" not in message


def test_missing_file_is_a_task_error(tmp_path):
    with pytest.raises(TaskError, match="tasks file .*nope.jsonl.* not found"):
        read_tasks(tmp_path / "nope.jsonl")
