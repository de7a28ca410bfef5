"""The task record: a superset of SWE-bench v5 rows, plus the task factory's fields; JSONL in and out."""

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from patchgym.errors import UserError
from patchgym.files import read_text, write_atomic
from patchgym.sandbox.config import ServiceConfig


class TaskError(UserError, ValueError):
    """A task file or row that cannot be used; the message names the file, the row and the field."""


class HarborHealthcheck(BaseModel):
    """[steps.healthcheck]: a command polled as Docker's HEALTHCHECK polls, after the step's workdir/ is uploaded (and
    its setup.sh has run) and before the agent starts; the step fails unless it passes."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, description="shell command; exit 0 = healthy")
    interval_s: float = Field(5.0, ge=0, description="seconds between tries (interval_sec)")
    timeout_s: float = Field(30.0, gt=0, description="limit of one try (timeout_sec)")
    retries: int = Field(3, ge=1, description="consecutive failures that fail the check")
    start_period_s: float = Field(0.0, ge=0, description="grace after setup: failures in it are not counted "
                                  "(start_period_sec)")
    start_interval_s: float = Field(5.0, ge=0, description="seconds between tries during the start period "
                                    "(start_interval_sec)")


class HarborArtifact(BaseModel):
    """A path collected from the sandbox after a step's verifier (task.toml's `artifacts`: a path, or a table)."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, description="path in the sandbox (a file or a folder)")
    destination: str | None = Field(None, description="name it is stored under; None = the source's own name")
    exclude: list[str] = Field(default_factory=list, description="patterns left out of a folder (tar --exclude)")


class HarborStep(BaseModel):
    """One [[steps]] entry of a multi-step task, with the task-level values it inherits already applied: the agent
    works on its instruction in the sandbox the steps before it left, then its verifier grades it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="[[steps]].name; its files are steps/NAME/")
    instruction: str = Field(min_length=1, description="steps/NAME/instruction.md: what the agent is shown")
    tests: str = Field(min_length=1, description="the task's tests/ with steps/NAME/tests/ over it (the step's files "
                       "win), as a base64 tar.gz; uploaded to /tests for this step's verifier")
    solution: str = Field("", description="steps/NAME/solution/ as a base64 tar.gz ('' = none); the oracle runs "
                          "its solve.sh")
    workdir: str = Field("", description="steps/NAME/workdir/ as a base64 tar.gz ('' = none): uploaded to the "
                         "task's working directory before the agent starts; a setup.sh in it is then run there as "
                         "the agent's user (it deletes itself)")
    agent_timeout_s: float | None = Field(None, gt=0, description="[steps.agent].timeout_sec, else [agent]'s")
    agent_user: str = Field("root", description="[steps.agent].user, else [agent]'s")
    verifier_timeout_s: float = Field(600.0, gt=0, description="[steps.verifier].timeout_sec, else [verifier]'s")
    verifier_env: dict[str, str] = Field(default_factory=dict, description="[verifier].env with "
                                         "[steps.verifier].env over it")
    verifier_user: str = Field("root", description="[steps.verifier].user, else [verifier]'s")
    healthcheck: HarborHealthcheck | None = None
    min_reward: float | dict[str, float] | None = Field(None, description="early stop: when the step's reward is "
                                                        "below it (a number: the reward named 'reward'; a table: "
                                                        "each reward named, a missing one counting as below), the "
                                                        "steps after it are skipped")
    artifacts: list[HarborArtifact] = Field(default_factory=list, description="collected after this step's "
                                            "verifier: the task's artifacts, then the step's own")


class HarborSpec(BaseModel):
    """What a Harbor task folder adds to a task: its verifier and oracle (each a tar.gz, base64, so a row holds all
    it needs on any worker), and the limits of its task.toml. Such a task is graded in the agent's own sandbox after
    the episode (patchgym.env.grading.families.harbor), not by a patch in a fresh one. A multi-step task adds its
    steps, each with its own instruction, verifier and limits, run in order in one sandbox."""

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
    services: list[ServiceConfig] = Field(default_factory=list, description="a compose environment's services "
                                          "beside the agent's container (their images built at import)")
    runner_python: str = Field("python3", description="the interpreter patchgym's runner and tools use in the image "
                               "(the bundle patchgym added where the image has no python3)")
    metadata: dict = Field(default_factory=dict)
    steps: list[HarborStep] = Field(default_factory=list, description="a multi-step task's steps, in order ([] = "
                                    "a single-step task); `tests` is then the task's shared tests/ (helpers every "
                                    "step's tests are laid over) and the problem statement the first step's")
    multi_step_reward: Literal["mean", "final"] = Field("mean", description="multi_step_reward_strategy: the task's "
                                                         "reward from its steps' rewards. mean: each named reward's "
                                                         "mean over the steps verified (missing = 0); final: the "
                                                         "last verified step's rewards")
    artifacts: list[HarborArtifact] = Field(default_factory=list, description="task.toml's artifacts (collected "
                                            "after every step of a multi-step task)")
    instruction: str = Field("", description="a multi-step task's top-level instruction.md, kept to export it; "
                             "Harbor does not show it to the agent (each step's instruction is shown)")


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
