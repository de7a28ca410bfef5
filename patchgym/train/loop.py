"""The RL trainer: one loop, read top to bottom in `Trainer.iteration`:
sample tasks -> G rollouts each -> grades -> filters and shaping -> advantages -> K optimizer steps -> push the
weights into the inference engine -> metrics -> checkpoint. With train.warm_start, SFT on demonstrations comes
first (`Trainer.warm_start`): its metrics line is iteration 0 and its checkpoint iter-0, whose state marks it done,
so a run killed during it starts it over and one killed after it never runs it again.

Run directory: config.yaml, metrics.jsonl, tensorboard/, rollouts/iter-N/trajectories.jsonl (every finished
rollout, appended as it ends) and checkpoints/iter-N/. Resuming after a crash at any point loses no finished rollout
and counts none twice: the model, optimizer and loop state come from the latest checkpoint, the next iteration
draws the same tasks, and its rollout engine skips what iter-N/trajectories.jsonl already holds. With
rollout.max_staleness = S > 0, rollouts of S later iterations run during training (async_rollouts.py); a checkpoint
after N keeps the task stream as after N's draws, so a resumed N+1.. draws the same tasks and reuses what their
directories hold (sampled by older versions, as recorded: staleness stays <= S). Under torchrun, rank 0 runs the
rollouts and every rank trains (distributed.py). With cluster.backend=ray the policy is trained in a TrainerWorker
actor (patchgym.train.ray_trainer) behind the same calls as the in-process one (patchgym.train.policy).
"""

import importlib.util
import logging
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from patchgym.agent.trajectory import Trajectory
from patchgym.cluster import make_engine
from patchgym.cluster import make_rollouts as cluster_rollouts
from patchgym.config import Config, dump_config
from patchgym.errors import UserError
from patchgym.inference.config import resolved_engine
from patchgym.rl.shaping import dynamic_sampling, groups_still_needed
from patchgym.rollout import ModelAgent
from patchgym.tasks import Task, TaskError, read_tasks
from patchgym.train.async_rollouts import PolicyVersions, RolloutBatch, RolloutPipeline, VersionedAgent, staleness_stats
from patchgym.train.checkpoint import latest_checkpoint, read_state
from patchgym.train.diagnostics import zero_advantage_warning
from patchgym.train.distributed import Distributed, shard_sequences
from patchgym.train.metrics import MetricsLog, advantage_stats, group_stats, reward_stats, rollout_stats, update_metrics
from patchgym.train.policy import LocalPolicy, Policy
from patchgym.train.schedule import (
    LoopState,
    StageSettings,
    draw_tasks,
    enter_stage,
    record_outcomes,
    stage_of,
    stage_settings,
)
from patchgym.train.selection import group_of, select_training_batch, to_sample
from patchgym.train.sft import DemonstrationError, Demonstrations, rank_plans, read_demonstrations, warm_start_line
from patchgym.train.warm_cache import (
    WarmStartHit,
    find_warm_start,
    key_of,
    link_warm_start,
    store_warm_start,
    warm_start_fields,
)

__all__ = ["Trainer", "TrainError", "console", "group_of", "select_training_batch", "to_sample"]

console = Console()
log = logging.getLogger(__name__)


class TrainError(UserError, ValueError):
    """A training run that cannot start as configured; the message names the key or file to fix."""


class Trainer:
    """Owns the policy being trained (patchgym.train.policy), the engine and the loop state. `make_rollouts`
    (config, agent, run_dir=, progress=) builds each iteration's rollout engine: patchgym.cluster's by default."""

    def __init__(self, config: Config, out: str | Path | None = None, *, progress: bool = True,
                 make_rollouts=cluster_rollouts):
        self.config, self.train, self.algo = config, config.train, config.algorithm
        self.out = Path(out) if out else Path(config.run_dir) / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
        self.progress, self.make_rollouts = progress, make_rollouts
        self.staleness = config.rollout.max_staleness
        self.warned_zero_advantage = False
        self.policy: Policy | None = None  # a LocalPolicy, or a RayPolicy with cluster.backend=ray (run() sets it)

    def run(self, resume: bool = False) -> Path:
        """Train until train.iterations; with `resume`, continue the run in `out` from its latest checkpoint."""
        self.dist = Distributed.from_env(str(self.config.inference.device), self.train.sequence_parallel)
        self.engine = self.pipeline = self.policy = self.versions = metrics = None
        try:
            self.out = self.dist.share(self.out)  # the default name has the time in it
            self.tasks = self._read_tasks()
            self._check()
            checkpoint = self._prepare_run_dir(resume)
            demonstrations = self._demonstrations(checkpoint)
            warm_key, cached = self._cached_warm_start(demonstrations)
            self.state = state = self._setup(checkpoint, warm_weights=cached.path if cached else None)
            if self.dist.main:
                # -1 drops the line of a warm start that was cut before its checkpoint, as it runs again
                kept = state.iteration if state.iteration or state.warm_started else -1
                metrics = MetricsLog(self.out, resume_after=kept, loggers=self.train.loggers,
                                     config=self.config.model_dump(mode="json"))
            if self.dist.share(demonstrations is not None):
                if cached is not None:
                    record = {**cached.line, "warm_start": {**cached.line["warm_start"], "cached": cached.key}}
                    state.warm_started = True
                    console.print(f"warm start: reused {cached.path} (same model, demonstrations and SFT settings)",
                                  soft_wrap=True)
                else:
                    record = self.warm_start(state, demonstrations)
                if metrics is not None:
                    metrics.write(record)
                saved = self._checkpoint(state)
                if warm_key is not None and cached is None and saved is not None:
                    try:
                        store_warm_start(*warm_key, saved, record)
                    except OSError as exc:  # the run goes on; the next one trains its warm start again
                        log.warning("train.warm_start.cache: the warm start was not kept: %s", exc)
            self.policy.sync(self.engine)
            if self.dist.main:
                self.versions = PolicyVersions(state.iteration)
                self._draws = LoopState(pool=list(state.pool), drawn=state.drawn)  # the stream running ahead
                self.pipeline = RolloutPipeline(self._produce, self.versions, self.staleness, self.train.iterations)
            while state.iteration < self.train.iterations:
                record = self.iteration(state)
                if metrics is not None:
                    metrics.write(record)
                if state.iteration % self.train.checkpoint_every == 0 or state.iteration == self.train.iterations:
                    self._checkpoint(state)
        finally:
            for part in (self.pipeline, metrics, self.policy, self.engine):
                if part is not None:
                    part.close()
            self.dist.close()
        return self.out

    def iteration(self, state: LoopState) -> dict:
        """One RL iteration; advances `state` and returns its metrics line (on rank 0; {} on the others)."""
        n, began = state.iteration + 1, time.monotonic()
        shards = None
        if self.dist.main:
            rollouts = self.pipeline.get(n)
            wait_s = time.monotonic() - began
            state.drawn = rollouts.drawn
            record_outcomes(state, [(x.task_id, x.resolved) for x in rollouts.trajectories
                                    if x.termination != "infra_error"])
            settings = rollouts.settings  # the stage's, computed once as its rollouts began
            rewards, advantages, sequences = select_training_batch(rollouts.batch, settings.algorithm,
                                                                   settings.max_turns, rollouts.filters)
            signal = group_stats([group_of(x) for x in rollouts.batch if x.scored], advantages)
            self._warn_if_nothing_to_learn(n, signal, rollouts.batch)
            random.shuffle(sequences)  # mixes groups across the K mini-batches; the RNG is checkpointed
            shards = [(state.stage, settings.algorithm, shard)
                      for shard in shard_sequences(sequences, self.train.mini_batches, self.dist.mesh.dp)]
        state.stage, algorithm, mine = self.dist.scatter(shards)  # every rank trains with rank 0's settings

        t = time.monotonic()
        update = self.policy.update(mine, algorithm)
        training_s = time.monotonic() - t
        state.optimizer_steps += self.train.mini_batches

        t = time.monotonic()
        self.policy.sync(self.engine, self.versions)  # waits for the generations in flight: one version each
        sync_s = time.monotonic() - t
        state.iteration = n
        if not self.dist.main:
            return {}
        record = {
            "iteration": n, "stage": state.stage, "optimizer_steps": state.optimizer_steps,
            "lr": self.policy.lr(), "rounds": rollouts.rounds, **rollout_stats(rollouts.trajectories),
            **reward_stats(rewards), **advantage_stats(advantages), **signal,
            "trained_trajectories": round(sum(s.weight for s in sequences)),  # step-wise rows weigh 1/steps
            "rollout_tokens_per_s": rollouts.sampled_tokens / max(rollouts.seconds, 1e-9),
            "filters": {**rollouts.filters, **({"curriculum": rollouts.curriculum} if rollouts.curriculum else {})},
            **update_metrics(update), **staleness_stats(rollouts.batch, n - 1),
            "time_rollout_s": rollouts.seconds, "time_rollout_wait_s": wait_s, "time_training_s": training_s,
            "time_weight_sync_s": sync_s, "time_iteration_s": time.monotonic() - began,
        }
        console.print(f"iteration {n}/{self.train.iterations}: reward {record['reward_mean']:.3f}, resolved "
                      f"{record['resolved']}/{record['trajectories']}, trained {len(sequences)}, loss "
                      f"{record['loss'] or 0:.4f}; rollout {rollouts.seconds:.0f} s (waited {wait_s:.0f} s, "
                      f"staleness <= {record['staleness_max']}), training {training_s:.0f} s, sync {sync_s:.1f} s",
                      soft_wrap=True)
        return record

    def warm_start(self, state: LoopState, demonstrations: Demonstrations | None) -> dict:
        """SFT on the demonstrations (rank 0 reads them, the other ranks pass None) for train.warm_start.epochs,
        every rank training on its share of each step as in the update; marks `state` warm-started and returns
        the metrics line of iteration 0 (on rank 0; {} on the others)."""
        warm, plans = self.train.warm_start, None
        if self.dist.main:
            plans = rank_plans(demonstrations.sequences, self.train.sft_batch_size, warm.epochs, self.config.seed,
                               self.dist.world)
        lr = warm.lr or self.train.lr
        result = self.policy.warm_start(self.dist.scatter(plans), lr, progress=self.progress)
        state.warm_started = True
        if not self.dist.main:
            return {}
        console.print(f"warm start: {warm.epochs} epochs on {demonstrations.trajectories} demonstrations "
                      f"({demonstrations.tokens} tokens) from {demonstrations.source}: sft loss "
                      + " -> ".join(f"{x:.4f}" for x in result.epoch_loss) + f" in {result.seconds:.0f} s",
                      soft_wrap=True)
        return warm_start_line(demonstrations, warm.epochs, lr, result)

    def _demonstrations(self, checkpoint: Path | None) -> Demonstrations | None:
        """The warm start's demonstrations, read and checked on rank 0 before any model loads, when the warm start
        is still to run: configured, and not done by the run being resumed (nor is that run past iteration 0)."""
        demonstrations = error = None
        if self.dist.main and self.train.warm_start is not None:
            saved = read_state(checkpoint) if checkpoint is not None else {}
            if saved.get("iteration", 0) > 0 and not saved.get("warm_started"):
                console.print(f"train.warm_start: not run, the run being resumed is past iteration "
                              f"{saved['iteration']} without one", soft_wrap=True)
            elif not saved.get("warm_started"):
                try:
                    demonstrations = read_demonstrations(self.train.warm_start.trajectories)
                except DemonstrationError as exc:
                    error = str(exc)
        error = self.dist.share(error)
        if error:
            raise DemonstrationError(error)
        return demonstrations

    def _cached_warm_start(self, demonstrations: Demonstrations | None
                           ) -> tuple[tuple[str, dict] | None, WarmStartHit | None]:
        """((key, its fields), the cached entry or None) for a warm start still to run with train.warm_start.cache;
        (None, None) otherwise. Rank 0 decides; every rank gets its answer."""
        answer = (None, None)
        if self.dist.main and demonstrations is not None and self.train.warm_start.cache:
            fields = warm_start_fields(self.config, demonstrations.sequences, self.dist.world)
            key = key_of(fields)
            hit = find_warm_start(key)
            answer = ((key, fields), hit and link_warm_start(hit, self.out / "warm-start"))
        return self.dist.share(answer)

    def _warn_if_nothing_to_learn(self, n: int, signal: dict, batch: list[Trajectory]) -> None:
        """Once per run: every group of iteration n has advantage 0, with the likely cause."""
        if signal["groups"] and signal["nonzero_advantage_group_fraction"] == 0 and not self.warned_zero_advantage:
            self.warned_zero_advantage = True
            log.warning(zero_advantage_warning(n, batch))

    def _produce(self, n: int) -> RolloutBatch:
        """Iteration n's rollouts. Synchronous, they draw from the loop state itself (and enter the stage of n);
        running ahead, from the stream copy only this worker advances, whose position the iteration takes over."""
        draws = self.state if self.staleness == 0 else self._draws
        began = time.monotonic()
        curriculum = self._maybe_enter_stage(draws, n)
        rollouts = self._collect(draws, n, stage_settings(self.config.agent, self.algo, draws.stage))
        return replace(rollouts, curriculum=curriculum, seconds=time.monotonic() - began)

    def _collect(self, state: LoopState, n: int, settings: StageSettings) -> RolloutBatch:
        """Rollouts of this iteration, played and trained with `settings`. With dynamic sampling, more tasks are
        drawn until tasks_per_iteration groups have 0 < resolved < G, for at most max_generation_rounds rounds;
        the ids of round r > 0 name it (TrajectoryId)."""
        algo = settings.algorithm
        agent = VersionedAgent(ModelAgent(self.engine, settings.agent, model=self.config.inference.model),
                               self.versions)
        rollouts = self.make_rollouts(self.config, agent, run_dir=self.out / "rollouts" / f"iter-{n}",
                                      progress=self.progress)
        want, G = self.train.tasks_per_iteration, self.train.samples_per_task
        everything: list[Trajectory] = []
        kept_groups: dict[str, None] = {}  # insertion-ordered set
        counts: dict[str, int] = {}
        sampled_tokens = rounds = 0
        needed = want
        while needed:
            ids = draw_tasks(state, needed, self.config.seed, self.train.shuffle_tasks)
            fresh = rollouts.run([self.tasks[i] for i in ids], G, round=rounds)
            sampled_tokens += rollouts.stats.sampled_tokens
            rounds += 1
            everything += fresh
            if not algo.dynamic_sampling:
                return RolloutBatch(trajectories=everything, batch=everything, rounds=rounds, filters={},
                                    sampled_tokens=sampled_tokens, drawn=state.drawn, settings=settings)
            samples = [to_sample(x) for x in fresh if x.termination != "infra_error"]
            kept, round_counts = dynamic_sampling(samples)
            kept_groups.update(dict.fromkeys(s.group_id for s in kept))
            counts = {k: counts.get(k, 0) + v for k, v in round_counts.items()}
            needed = groups_still_needed(len(kept_groups), want, rounds, algo.max_generation_rounds)
        batch_groups = set(list(kept_groups)[:want])
        batch = [x for x in everything if group_of(x) in batch_groups]
        return RolloutBatch(trajectories=everything, batch=batch, rounds=rounds, filters={"dynamic_sampling": counts},
                            sampled_tokens=sampled_tokens, drawn=state.drawn, settings=settings)

    def _maybe_enter_stage(self, state: LoopState, n: int) -> dict[str, int]:
        if not self.algo.stages:
            return {}
        stage = stage_of(n, self.train.stage_iterations, len(self.algo.stages))
        if stage == state.stage:
            return {}
        counts = enter_stage(state, stage, self.algo)
        if len(state.pool) < self.train.tasks_per_iteration:
            raise TrainError(f"stage {stage}'s curriculum left {len(state.pool)} tasks ({counts}), fewer than "
                             f"train.tasks_per_iteration ({self.train.tasks_per_iteration})")
        console.print(f"stage {stage} from iteration {n}: pool of {len(state.pool)} tasks {counts or ''}",
                      soft_wrap=True)
        return counts

    def _read_tasks(self) -> dict[str, Task]:
        if not self.train.tasks:
            raise TrainError("train.tasks is not set: give a tasks JSONL, e.g. train.tasks=runs/demo-tasks/tasks.jsonl")
        try:
            tasks = read_tasks(self.train.tasks)
        except TaskError as exc:
            raise TrainError(f"train.tasks: {exc}") from None
        by_id = {t.instance_id: t for t in tasks}
        if len(by_id) != len(tasks):
            raise TrainError(f"train.tasks: '{self.train.tasks}' repeats instance ids")
        return by_id

    def _check(self) -> None:
        """Settings that fit the config (Config checks those that clash with each other) but not this run: its
        engine, its tasks, its processes."""
        train = self.train
        if resolved_engine(self.config.inference) not in ("hf", "vllm"):
            raise TrainError("inference.engine: train needs 'hf' or 'vllm' (the trainer pushes new weights into the "
                             "engine)")
        if train.tasks_per_iteration > len(self.tasks):
            raise TrainError(f"train.tasks_per_iteration ({train.tasks_per_iteration}) is more than the "
                             f"{len(self.tasks)} tasks in '{train.tasks}'")
        if self.config.cluster.backend == "ray" and self.dist.world > 1:
            raise TrainError("cluster.backend=ray trains in one TrainerWorker actor: run it without torchrun "
                             "(WORLD_SIZE 1), so train.fsdp has nothing to shard; or use cluster.backend=local")
        if train.fsdp and train.lora is not None and self.dist.world > 1:
            raise TrainError("train.fsdp with train.lora is not supported: shard full fine-tuning only")
        if "wandb" in train.loggers and importlib.util.find_spec("wandb") is None:
            raise TrainError("train.loggers names wandb, but wandb is not installed: pip install 'patchgym[wandb]'")

    def _prepare_run_dir(self, resume: bool) -> Path | None:
        """The checkpoint to start from (None: from the model spec); refuses to overwrite a run without resume.
        Rank 0 decides; every rank gets its answer (or its error)."""
        found = error = None
        if self.dist.main:
            started = (self.out / "metrics.jsonl").exists() or (self.out / "rollouts").exists()
            if started and not resume:
                error = f"{self.out} already holds a training run: pass --resume to continue it, or another --out"
            else:
                self.out.mkdir(parents=True, exist_ok=True)
                (self.out / "config.yaml").write_text(dump_config(self.config))
                found = latest_checkpoint(self.out) if resume else None
        error, found = self.dist.share((error, found))
        if error:
            raise TrainError(error)
        return found

    def _setup(self, checkpoint: Path | None, warm_weights: Path | None = None) -> LoopState:
        """The policy (here, sharded under torchrun with train.fsdp, or in a Ray actor), (on rank 0) the engine
        (run() pushes the weights into it, after a warm start), and the loop state. `warm_weights`: a cached warm
        start's model to start from, as a fresh run whose warm start is done."""
        start = checkpoint or warm_weights
        if self.config.cluster.backend == "ray":
            from patchgym.train.ray_trainer import RayPolicy

            self.engine = make_engine(self.config)  # connects to the cluster, which the trainer worker joins
            try:
                self.policy = RayPolicy(self.config, start)
            except ValueError as exc:  # no node for it: a setting to fix, not a crash
                raise TrainError(str(exc)) from None
        else:
            self.policy = LocalPolicy(self.config, self.dist, start)
        if checkpoint is None:
            random.seed(self.config.seed)
            torch.manual_seed(self.config.seed)
            state = LoopState(pool=list(self.tasks))
        else:
            state = LoopState.from_dict(self.policy.restore(checkpoint))
            missing = [t for t in state.pool if t not in self.tasks]
            if missing:
                raise TrainError(f"train.tasks: '{self.train.tasks}' lacks {len(missing)} tasks of the run being "
                                 f"resumed, e.g. {missing[0]}")
            if self.dist.main:
                console.print(f"resuming {self.out} after iteration {state.iteration} ({checkpoint})", soft_wrap=True)
        if self.dist.main and self.engine is None:
            self.engine = make_engine(self.config)
        return state

    def _checkpoint(self, state: LoopState) -> Path | None:
        return self.policy.save(self.out, state.iteration, state.to_dict(), self.train.keep_checkpoints)

    # The in-process policy's parts, for tools and tests that read them (a Ray run's live in its TrainerWorker).
    model = property(lambda self: self.policy.model)
    tokenizer = property(lambda self: self.policy.tokenizer)
