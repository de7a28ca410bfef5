"""The asyncio rollout engine: N tasks x G samples, each an episode in a sandbox from the warm pools, graded as soon
as it ends while other episodes keep generating.

Two separate bounds: `max_sandboxes` (episodes and gradings holding a sandbox) and `max_generations` (requests in
flight to the engine, which batches them). An infrastructure error (a dead sandbox, an engine that raised, a
grading sandbox that died) reruns the trajectory up to `retries` times; after that it is recorded as
`infra_error`, never scored. Finished trajectories are appended to RUN/trajectories.jsonl; running again with the
same RUN resumes: what is recorded is skipped. Ctrl-C cancels the episodes (their sandboxes are closed at once) and
leaves the file with whole lines only.

Episodes run in `SWEEnv`s and are graded by `grade_patch` in fresh sandboxes, except Harbor tasks, whose verifier
runs in the episode's own sandbox before it closes (`SWEEnv.verify`); `make_env` and `grader` replace either (any
`Env`, any function of (task, patch, pools) -> Grade), which is how the fast test tier runs without sandboxes.
"""

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from patchgym.agent.loop import engine_generate, open_env
from patchgym.agent.trajectory import Trajectory
from patchgym.agent.trajectory_id import TrajectoryId
from patchgym.env.base import Env
from patchgym.env.grading.families import family_of
from patchgym.env.grading.grade import Grade
from patchgym.env.grading.grader import grade_patch
from patchgym.inference import Generation, SamplingParams
from patchgym.rollout.agents import Agent
from patchgym.rollout.config import RolloutConfig
from patchgym.rollout.store import TrajectoryStore
from patchgym.sandbox import SandboxConfig, SandboxError
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import Task, TaskError
from patchgym.termination import UNGRADED

log = logging.getLogger(__name__)

EnvFactory = Callable[[PoolSet], Env]  # an environment for one episode, given the run's warm pools
Grader = Callable[[Task, str, PoolSet], Grade]  # blocking: it runs in a worker thread


@dataclass(kw_only=True)
class RolloutStats:
    """Live counters, shown on the progress bar and returned with the run; `total` and `resumed` are what the run
    was asked for and found recorded when it started."""

    started: float = field(default_factory=time.monotonic)
    total: int
    done: int = 0  # recorded, resumed ones included
    resolved: int = 0
    steps: int = 0
    resumed: int
    infra_errors: int = 0
    sandboxes_in_use: int = 0
    retries: int = 0
    sampled_tokens: int = 0

    @property
    def mean_steps(self) -> float:
        return self.steps / self.done if self.done else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.sampled_tokens / max(time.monotonic() - self.started, 1e-9)


class RolloutEngine:
    def __init__(self, agent: Agent, sandbox: SandboxConfig, config: RolloutConfig | None = None, *,
                 run_dir: str | Path, progress: bool = True, grade: bool = True, make_env: EnvFactory | None = None,
                 grader: Grader | None = None):
        self.agent, self.sandbox, self.config = agent, sandbox, config or RolloutConfig()
        self.make_env = make_env or (lambda pools: open_env(self.sandbox, self.agent.config, pools=pools))
        self.grader = grader or (lambda task, patch, pools: grade_patch(
            task, patch, self.sandbox, timeout=self.config.grade_timeout_s, pools=pools))
        self.run_dir = Path(run_dir)
        self.store = TrajectoryStore(self.run_dir / "trajectories.jsonl")
        self.progress, self.grade = progress, grade
        self.stats = RolloutStats(total=0, resumed=0)

    def run(self, tasks: list[Task], samples: int = 1, *, round: int = 0) -> list[Trajectory]:
        """Every task `samples` times; returns the trajectories (resumed ones included) in task, sample order.
        `round`: the dynamic-sampling round of a train iteration, which the trajectory ids name (TrajectoryId)."""
        return asyncio.run(self.arun(tasks, samples, round=round))

    async def arun(self, tasks: list[Task], samples: int = 1, *, round: int = 0) -> list[Trajectory]:
        keys, todo = self._pending(tasks, samples, round, RolloutStats)
        self._sandbox_slots = asyncio.Semaphore(self.config.max_sandboxes)
        self._generation_slots = asyncio.Semaphore(self.config.max_generations)
        pools = PoolSet(self.sandbox)
        with self._bar() as bar:
            self._bar_task = bar.add_task("rollouts", total=len(keys), completed=self.stats.done, **self._fields())
            self._live = bar
            ticker = asyncio.create_task(self._tick())
            try:
                await asyncio.gather(*(self._trajectory(k, t, s, pools) for k, t, s in todo))
            finally:
                ticker.cancel()
                await asyncio.to_thread(pools.close)
                with contextlib.suppress(OSError):
                    (self.run_dir / "partial").rmdir()  # only when empty: what is left there was cut short
        return self._in_order(keys)

    def _pending(self, tasks: list[Task], samples: int, round: int,
                 stats: type[RolloutStats]) -> tuple[dict[str, tuple[Task, int]], list[tuple[str, Task, int]]]:
        """(every trajectory id -> (task, sample), the ones the store does not hold yet); fresh `stats` that
        already count the recorded ones."""
        keys = {str(TrajectoryId(t.instance_id, s, round)): (t, s) for t in tasks for s in range(samples)}
        if len(keys) != len(tasks) * samples:
            twice = sorted(i for i, n in Counter(t.instance_id for t in tasks).items() if n > 1)
            raise TaskError(f"task ids must be unique within a rollout; given more than once: {', '.join(twice)}")
        finished = self.store.finished()
        todo = [(k, t, s) for k, (t, s) in keys.items() if k not in finished]
        self.stats = stats(total=len(keys), resumed=len(keys) - len(todo))
        for key in keys.keys() & finished.keys():
            self._count(finished[key])
        return keys, todo

    def _in_order(self, keys) -> list[Trajectory]:
        """The recorded trajectories of `keys`, in that order."""
        records = {t.trajectory_id or t.task_id: t for t in self.store.records()}
        return [records[k] for k in keys]

    async def play_one(self, key: str, task: Task, sample: int, pools: PoolSet) -> Trajectory:
        """One trajectory, played and graded, rerun after infrastructure errors up to `retries` times; the caller
        records it (here `_trajectory`; on a Ray worker, the driver)."""
        for attempt in range(1, self.config.retries + 2):
            trajectory = await self._episode(task, pools, self._partial_path(key))
            trajectory.trajectory_id, trajectory.sample, trajectory.attempt = key, sample, attempt
            if trajectory.termination not in ("infra_error", *UNGRADED) and self.grade:
                await self._grade(task, trajectory, pools)
            if trajectory.termination != "infra_error":
                break
            log.warning("%s: infrastructure error on attempt %d: %s", key, attempt, trajectory.error)
            if attempt <= self.config.retries:
                self.stats.retries += 1
        return trajectory

    async def _trajectory(self, key: str, task: Task, sample: int, pools: PoolSet) -> None:
        trajectory = await self.play_one(key, task, sample, pools)
        self.store.append(trajectory)
        self._partial_path(key).unlink(missing_ok=True)
        self._count(trajectory)
        self._refresh(advance=1)

    def _partial_path(self, key: str) -> Path:
        return self.run_dir / "partial" / (re.sub(r"[^\w.#-]", "_", key) + ".json")

    async def _episode(self, task: Task, pools: PoolSet, partial: Path) -> Trajectory:
        async with self._sandbox_slots:
            env = self.make_env(pools)
            self.stats.sandboxes_in_use += 1
            self._refresh()
            try:
                trajectory = await self.agent.play(task, env, self._generate, partial)
                if self.grade and family_of(task).in_place and trajectory.termination not in ("infra_error",
                                                                                               *UNGRADED):
                    await self._verify_in_place(task, env, trajectory)
                return trajectory
            except Exception as exc:  # noqa: BLE001 - an engine that raised is an infrastructure error
                log.exception("%s: the episode raised", task.instance_id)
                return Trajectory(task_id=task.instance_id, engine=self.agent.describe(), termination="infra_error",
                                  error=f"{type(exc).__name__}: {exc}")
            finally:
                env.close()
                self.stats.sandboxes_in_use -= 1

    async def _verify_in_place(self, task: Task, env: Env, trajectory: Trajectory) -> None:
        """The grade of a task whose family grades in place (Harbor: its verifier), from the episode's own sandbox
        (the env's `verify`)."""
        try:
            grade = await asyncio.to_thread(env.verify, self.config.resolved_reward, self.config.harbor_score)
        except SandboxError as exc:
            grade = Grade(instance_id=task.instance_id, error="infra", error_detail=str(exc))
        grade.tests_known_to_run = task.validated
        trajectory.grade = grade
        if grade.error == "infra":
            trajectory.termination, trajectory.error = "infra_error", f"grading: {grade.error_detail}"

    async def _grade(self, task: Task, trajectory: Trajectory, pools: PoolSet) -> None:
        """Grade the final patch in a fresh sandbox; a grading sandbox that keeps dying makes it an infra error."""
        if family_of(task).in_place:
            return  # graded in its own sandbox as the episode ended
        if not trajectory.patch.strip() and not self.config.grade_empty_patches:
            trajectory.grade = Grade(instance_id=task.instance_id, error="empty_patch")
            return
        async with self._sandbox_slots:
            self.stats.sandboxes_in_use += 1
            try:
                grade = await asyncio.to_thread(self.grader, task, trajectory.patch, pools)
            finally:
                self.stats.sandboxes_in_use -= 1
        trajectory.grade = grade
        if grade.error == "infra":
            trajectory.termination, trajectory.error = "infra_error", f"grading: {grade.error_detail}"

    async def _generate(self, ids: list[int], messages: list[dict], params: SamplingParams) -> Generation:
        async with self._generation_slots:
            generation = await engine_generate(self.agent.engine, ids, messages, params)
        self.stats.sampled_tokens += len(generation.token_ids)
        return generation

    def _count(self, trajectory: Trajectory) -> None:
        self.stats.done += 1
        if trajectory.termination == "infra_error":
            self.stats.infra_errors += 1
        self.stats.resolved += trajectory.resolved
        self.stats.steps += trajectory.steps

    def _bar(self) -> Progress:
        return Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("resolved {task.fields[resolved]}"), TextColumn("steps {task.fields[steps]}"),
                        TextColumn("sandboxes {task.fields[sandboxes]}"), TextColumn("{task.fields[tps]} tok/s"),
                        TextColumn("infra {task.fields[infra]}"), TimeElapsedColumn(), disable=not self.progress)

    def _fields(self) -> dict:
        s = self.stats
        return {"resolved": s.resolved, "steps": f"{s.mean_steps:.1f}", "sandboxes": s.sandboxes_in_use,
                "tps": f"{s.tokens_per_s:.1f}", "infra": s.infra_errors}

    def _refresh(self, advance: int = 0) -> None:
        self._live.update(self._bar_task, advance=advance, **self._fields())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._refresh()
