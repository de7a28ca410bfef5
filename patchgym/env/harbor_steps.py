"""A multi-step Harbor task ([[steps]]) played in one sandbox, as Harbor plays it: step by step, each graded by its
own verifier before the next begins.

    for each step:  its workdir/ uploaded to the working directory, its setup.sh run there as the agent's user (it
                    deletes itself), its healthcheck polled -> the agent works on the step's instruction, within the
                    step's [agent].timeout_sec -> the step's verifier (its tests laid over the task's shared tests/,
                    its env, user and timeout) -> its artifacts collected -> stop early when its reward is below
                    its min_reward

The agent's conversation goes on across steps: when it calls finish (or the step's time runs out), the next step's
instruction is the observation. The task's reward is its steps' rewards combined as multi_step_reward_strategy says:
`mean`, each named reward's mean over the steps verified (a step that lacks one counts 0 for it); `final`, the last
verified step's. Each step's grade is kept in the task's grade (`steps`).
"""

import base64
import shlex
import time

from patchgym.env.grading.families.harbor import score_of, user_uid, verify
from patchgym.env.grading.grade import Grade, StepGrade
from patchgym.sandbox import Sandbox
from patchgym.tasks.task import HarborArtifact, HarborStep, Task

ARTIFACTS_LIMIT = 256 << 10  # base64 bytes of one step's artifacts kept in its grade


class StepRun:
    """Where a multi-step task stands: the step being played, its deadline, and the grades of the steps done."""

    def __init__(self, sandbox: Sandbox, task: Task):
        self.sandbox, self.task = sandbox, task
        self.steps = task.harbor.steps
        self.index = 0
        self.graded: list[StepGrade] = []
        self.deadline: float | None = None
        self.over = False  # no step is left to play (all played, or an early stop)

    @property
    def step(self) -> HarborStep:
        return self.steps[self.index]

    def begin(self) -> str | None:
        """Set up the current step (workdir, setup.sh, healthcheck) and start its clock; None, or why it failed."""
        step = self.step
        try:
            uid = user_uid(self.sandbox, step.agent_user)
        except LookupError as exc:
            return f"the step's [agent].user {exc}"
        self.sandbox.config = self.sandbox.config.model_copy(update={"agent_user": uid})
        problem = _upload_workdir(self.sandbox, self.task.workdir, step) or _healthcheck(self.sandbox, self.task, step)
        self.deadline = None if step.agent_timeout_s is None else time.monotonic() + step.agent_timeout_s
        return problem

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def finish_step(self, problem: str | None = None) -> str | None:
        """Grade the current step (unless `problem` says why it could not be played: then it is an error without a
        verifier run), then begin the next one; the next step's instruction, or None when the task is over."""
        step = self.step
        if problem is not None:  # a step that could not be set up ends the task, as Harbor ends the trial
            grade = StepGrade(name=step.name, error="no_tests_ran", error_detail=problem)
        else:
            grade = _grade_step(self.sandbox, self.task, step)
        self.graded.append(grade)
        if problem is not None or self.index + 1 >= len(self.steps) or not _meets(grade, step.min_reward):
            self.over = True
            return None
        self.index += 1
        problem = self.begin()
        if problem is not None:
            return self.finish_step(problem)
        return self.step.instruction

    def task_grade(self, threshold: float, score: str, strategy: str) -> Grade:
        """The task's grade from its steps' grades (the current step graded first, if the episode ended in it)."""
        if not self.over:
            self.finish_step()
        grade = Grade(instance_id=self.task.instance_id, steps=self.graded,
                      duration=sum(g.duration for g in self.graded))
        verified = [g for g in self.graded if g.error is None]
        if not verified:
            first = self.graded[0]
            return grade.model_copy(update={"error": first.error, "error_detail": f"step {first.name}: "
                                                                                    f"{first.error_detail}"})
        named = combine([g.rewards for g in verified], strategy)
        try:
            value = score_of(named, score)
        except Exception as exc:  # noqa: BLE001 - RewardMissing: a score named by a reward no step wrote
            return grade.model_copy(update={"score": 0.0, "rewards": named, "error_detail": str(exc)})
        return grade.model_copy(update={"score": value, "resolved": value >= threshold, "rewards": named,
                                        "exit_code": verified[-1].exit_code})


def combine(rewards: list[dict[str, float]], strategy: str) -> dict[str, float]:
    """The task's named rewards from its verified steps' (in order), by multi_step_reward_strategy."""
    if strategy == "final":
        return dict(rewards[-1])
    names = sorted({name for named in rewards for name in named})
    return {name: sum(named.get(name, 0.0) for named in rewards) / len(rewards) for name in names}


def _meets(grade: StepGrade, min_reward: float | dict[str, float] | None) -> bool:
    """Whether the steps after this one are played: its rewards reach min_reward (a number: the one named
    "reward"; a table: each named one, a missing one counting as below). A step whose verifier failed stops the task
    only where a min_reward is set."""
    if min_reward is None:
        return True
    wanted = {"reward": min_reward} if isinstance(min_reward, (int, float)) else min_reward
    return grade.error is None and all(grade.rewards.get(k, float("-inf")) >= v for k, v in wanted.items())


def _grade_step(sandbox: Sandbox, task: Task, step: HarborStep) -> StepGrade:
    spec = task.harbor.model_copy(update={"tests": step.tests, "verifier_timeout_s": step.verifier_timeout_s,
                                          "verifier_env": step.verifier_env, "verifier_user": step.verifier_user})
    start = time.monotonic()
    grade = verify(sandbox, task.model_copy(update={"harbor": spec}))
    duration = time.monotonic() - start
    named = grade.rewards or ({"reward": grade.score} if grade.score is not None and grade.error is None else {})
    return StepGrade(name=step.name, score=grade.score if grade.error is None else None, rewards=named,
                     error=grade.error, error_detail=grade.error_detail, exit_code=grade.exit_code,
                     duration=duration, artifacts=_collect(sandbox, step.artifacts))


def _upload_workdir(sandbox: Sandbox, workdir: str, step: HarborStep) -> str | None:
    """The step's workdir/ unpacked into the working directory (as root, then given to the agent's user), and its
    setup.sh run there as the agent's user; None, or what failed."""
    if not step.workdir:
        return None
    archive = f"/var/lib/patchgym/step-{step.name}.tar.gz"  # root's: out of the agent's reach
    sandbox.write_file(archive, base64.b64decode(step.workdir))
    unpack = sandbox.exec(["bash", "-c", 'mkdir -p "$1" && tar -xzf "$2" -C "$1" --no-same-owner && rm -f "$2"',
                           "unpack", workdir, archive], timeout=300)
    if not unpack.ok:
        return f"uploading steps/{step.name}/workdir/: {unpack.output[-1000:]}"
    if sandbox.config.agent_user:
        sandbox.give_to_agent(workdir)
    setup = f"{workdir.rstrip('/')}/setup.sh"
    has_setup = sandbox.exec(["test", "-f", setup], timeout=30).ok
    if has_setup:
        run = sandbox.exec(["bash", setup], cwd=workdir, agent=True, timeout=step.agent_timeout_s or 600)
        if not run.ok:
            return f"steps/{step.name}/workdir/setup.sh failed ({run.exit_code}): {run.output[-1000:]}"
    return None


def _healthcheck(sandbox: Sandbox, task: Task, step: HarborStep) -> str | None:
    """Poll the step's healthcheck as Docker's HEALTHCHECK does: tries every interval_s (start_interval_s during the
    start period, whose failures do not count) until one passes or `retries` counted ones failed."""
    check = step.healthcheck
    if check is None:
        return None
    started, failures, last = time.monotonic(), 0, ""
    while True:
        run = sandbox.exec(["bash", "-c", check.command], cwd=task.workdir, timeout=check.timeout_s)
        if run.ok:
            return None
        last = run.output.strip()[-500:]
        in_start = time.monotonic() - started < check.start_period_s
        failures += 0 if in_start else 1
        if failures >= check.retries:
            return (f"steps {step.name}: the healthcheck {check.command!r} failed {failures} times "
                    f"(exit {run.exit_code}): {last}")
        time.sleep(check.start_interval_s if in_start else check.interval_s)


def _collect(sandbox: Sandbox, artifacts: list[HarborArtifact]) -> dict[str, str]:
    """Each artifact that exists, as a base64 tar.gz, while the step's total stays under ARTIFACTS_LIMIT; one that is
    missing or over the limit is named with why."""
    kept, used = {}, 0
    for artifact in artifacts:
        name = artifact.destination or artifact.source.rstrip("/").rsplit("/", 1)[-1]
        excludes = " ".join(f"--exclude={shlex.quote(p)}" for p in artifact.exclude)
        source = artifact.source.rstrip("/") or "/"
        parent, base = source.rsplit("/", 1) if source.count("/") and source != "/" else ("", source)
        run = sandbox.exec(f"[ -e {shlex.quote(source)} ] || {{ echo missing; exit 3; }}; "
                           f"tar -czf - {excludes} -C {shlex.quote(parent or '/')} {shlex.quote(base)} | base64 -w0",
                           timeout=120, output_limit=ARTIFACTS_LIMIT + 1024)
        if run.exit_code == 3:
            kept[name] = "missing"
        elif not run.ok or run.cut_bytes or used + len(run.output) > ARTIFACTS_LIMIT:
            kept[name] = f"not kept: {'over the limit' if run.ok or run.cut_bytes else run.output[-200:]}"
        else:
            kept[name], used = run.output.strip(), used + len(run.output)
    return kept
