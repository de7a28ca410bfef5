"""The task record: a superset of SWE-bench v5 rows, plus the task factory's fields; JSONL in and out."""

from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from patchgym.errors import UserError
from patchgym.files import read_text, write_atomic


class TaskError(UserError, ValueError):
    """A task file or row that cannot be used; the message names the file, the row and the field."""


class HarborSpec(BaseModel):
    """What a Harbor task folder adds to a task: its verifier and oracle (each a tar.gz, base64, so a row holds all
    it needs on any worker), and the limits of its task.toml. Such a task is graded in the agent's own sandbox after
    the episode (patchgym.env.grading.families.harbor), not by a patch in a fresh one."""

    model_config = ConfigDict(extra="forbid")

    folder: str = Field("", description="the task folder it was imported from")
    schema_version: str = ""
    tests: str = Field(min_length=1, description="tests/ as a base64 tar.gz; uploaded to /tests only to grade")
    solution: str = Field("", description="solution/ as a base64 tar.gz ('' = none); the oracle runs solve.sh")
    verifier_timeout_s: float = Field(600.0, gt=0)
    verifier_env: dict[str, str] = Field(default_factory=dict)
    verifier_user: str = Field("root", description="user test.sh runs as (root or a uid)")
    agent_timeout_s: float | None = Field(None, gt=0, description="the episode's wall clock (caps agent.max_seconds)")
    agent_user: str = Field("root", description="user the agent's commands run as (root or a uid)")
    solution_env: dict[str, str] = Field(default_factory=dict)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0, description="recorded; not enforced by the sandbox backends")
    network: bool = Field(False, description="the agent's sandbox has a network (task.toml allows it)")
    env: dict[str, str] = Field(default_factory=dict, description="[environment].env: set for every command")
    metadata: dict = Field(default_factory=dict)


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1, description="owner/name, or the PyPI package for factory tasks")
    problem_statement: str = Field(min_length=1, description="what the agent is shown")
    harbor: HarborSpec | None = Field(None, description="a Harbor task folder's verifier, oracle and limits")
    # validate_default: a row that lacks the key is checked too (the empty patch would resolve it)
    FAIL_TO_PASS: list[str] = Field(default_factory=list, validate_default=True,
                                    description="tests that must go from failing to passing (at least one, except on "
                                    "a Harbor task, which its own verifier grades)")
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
    test_seconds: dict[str, float] = Field(default_factory=dict, description="factory: the time of each test of the "
                                           "graded files in the clean runs; the grader copies quick ones as canaries")
    test_cmd: str = Field("", description="command that runs the tests; '' = eval_script or the parser's default")
    eval_script: str = ""
    log_parser: str = "pytest"
    grading: str = Field("", description="the grading family that grades it (patchgym.env.grading.family): "
                         "pytest-report, tape-report, log, swebench, harness, swesmith-profile or harbor; '' = the "
                         "one its log_parser, source and harbor imply")
    eval_type: str = Field("", description="SWE-bench v5: pass_and_fail or fail_only; '' = pass_and_fail")
    hidden_paths: list[str] = Field(default_factory=list, description="image paths only the grader may see; "
                                    "removed from the agent's sandbox before its first step (R2E-Gym: /r2e_tests)")
    validated: bool = Field(False, description="its tests were seen to run, unpatched and gold (`tasks validate`)")
    hints_text: str = ""
    created_at: str = ""
    source: str = Field("", description="swebench, swegym, r2egym, smith, rebench, harbor or factory")
    difficulty: str = ""
    strategy: str = Field("", description="factory: the mutation that made the bug")
    install_config: dict | None = Field(None, description="SWE-rebench: how to build the environment")

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _has_tests(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if not value and info.data.get("harbor") is None:  # a Harbor task's verifier is its test.sh
            raise PydanticCustomError("too_short", "List should have at least 1 item after validation, not 0")
        return value

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
    write_atomic(path, "".join(task.model_dump_json(exclude_defaults=False) + "\n" for task in tasks))
