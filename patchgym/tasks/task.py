"""The task record: a superset of SWE-bench v5 rows, plus the task factory's fields; JSONL in and out."""

import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from patchgym.errors import UserError
from patchgym.files import read_text


class TaskError(UserError, ValueError):
    """A task file or row that cannot be used; the message names the file, the row and the field."""


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1, description="owner/name, or the PyPI package for factory tasks")
    problem_statement: str = Field(min_length=1, description="what the agent is shown")
    FAIL_TO_PASS: list[str] = Field(min_length=1, description="tests that must go from failing to passing")
    PASS_TO_PASS: list[str] = Field(default_factory=list, description="tests that must keep passing")
    version: str = ""
    base_commit: str = ""
    image: str = Field("", description="image tag the sandbox starts from; '' = the patchgym base image")
    workdir: str = "/testbed"
    patch: str = Field("", description="the gold fix; never shown to the agent")
    test_patch: str = Field("", description="hidden test changes, applied only when grading")
    bug_patch: str = Field("", description="factory: applied to the image's clean source to make the task")
    start_ref: str = Field("", description="git ref the image's repository is checked out at before anything else "
                           "(SWE-smith: the instance's branch, whose tip holds the bug)")
    test_files: list[str] = Field(default_factory=list, description="files the grader owns (hidden from the agent)")
    test_cmd: str = Field("", description="command that runs the tests; '' = eval_script or the parser's default")
    eval_script: str = ""
    log_parser: str = "pytest"
    eval_type: str = Field("", description="SWE-bench v5: pass_and_fail or fail_only; '' = pass_and_fail")
    hidden_paths: list[str] = Field(default_factory=list, description="image paths only the grader may see; "
                                    "removed from the agent's sandbox before its first step (R2E-Gym: /r2e_tests)")
    validated: bool = Field(False, description="its tests were seen to run, unpatched and gold (`tasks validate`)")
    hints_text: str = ""
    created_at: str = ""
    source: str = Field("", description="swebench, swegym, r2egym, smith, rebench or factory")
    difficulty: str = ""
    strategy: str = Field("", description="factory: the mutation that made the bug")
    install_config: dict | None = Field(None, description="SWE-rebench: how to build the environment")

    @property
    def imported(self) -> bool:
        """A public dataset's row, graded as its own harness grades it (the factory's tasks have stricter rules)."""
        return self.source not in ("", "factory")


def read_tasks(path: str | Path) -> list[Task]:
    """Load a JSONL task file; every bad row is reported (file, row, field) in one TaskError."""
    path = Path(path)
    lines = read_text(path, "tasks file", TaskError).splitlines()
    tasks, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            tasks.append(Task.model_validate_json(line))
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                field = ".".join(str(p) for p in err["loc"]) or "(row)"
                problems.append(f"{path}:{number}: field {field}: {err['msg']}")
    if problems:
        raise TaskError("invalid tasks:\n" + "\n".join(problems))
    return tasks


def write_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    """Write tasks as JSONL atomically (a crash never leaves half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        for task in tasks:
            f.write(task.model_dump_json(exclude_defaults=False) + "\n")
    os.replace(tmp, path)
