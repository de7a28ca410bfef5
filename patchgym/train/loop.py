"""The RL trainer: one loop, read top to bottom in `Trainer.iteration`:
sample tasks -> G rollouts each -> grades -> filters and shaping -> advantages -> K optimizer steps -> push the
weights into the inference engine -> metrics -> checkpoint.

Run directory: config.yaml, metrics.jsonl, tensorboard/, rollouts/iter-N/trajectories.jsonl (every finished
rollout, appended as it ends) and checkpoints/iter-N/. Resuming after a crash at any point loses no finished rollout
and counts none twice: the model, optimizer and loop state come from the latest checkpoint, the next iteration
draws the same tasks, and its rollout engine skips what iter-N/trajectories.jsonl already holds.
"""

import contextlib
import random
import time
from pathlib import Path

import torch
from rich.console import Console

from patchgym.agent.config import AgentConfig
from patchgym.agent.trajectory import Trajectory
from patchgym.cluster import make_rollouts
from patchgym.config import Config, dump_config
from patchgym.inference.factory import make_engine
from patchgym.inference.models import load_model
from patchgym.rl.advantages import compute_advantages
from patchgym.rl.config import AlgorithmConfig
from patchgym.rl.shaping import (Sample, apply_turn_penalty, compact_filter, drop_zero_advantage, dynamic_sampling,
                                 groups_still_needed)
from patchgym.rollout import ModelAgent
from patchgym.tasks import Task, TaskError, read_tasks
from patchgym.train.batch import TrainSequence, sequences_from_trajectories
from patchgym.train.checkpoint import latest_checkpoint, load_adapter, load_training_state, save_checkpoint
from patchgym.train.metrics import MetricsLog, advantage_stats, reward_stats, rollout_stats, update_metrics
from patchgym.train.schedule import LoopState, draw_tasks, enter_stage, record_outcomes, stage_of
from patchgym.train.update import (enable_gradient_checkpointing, full_state_dict, make_optimizer, make_scheduler,
                                   maybe_lora, policy_update)

console = Console()


class TrainError(ValueError):
    """A training run that cannot start as configured; the message names the key or file to fix."""


class Trainer:
    """Owns the trainer's model (a copy separate from the engine's), its optimizer, the engine and the loop state."""

    def __init__(self, config: Config, out: str | Path | None = None, *, progress: bool = True):
        self.config, self.train, self.algo = config, config.train, config.algorithm
        self.out = Path(out) if out else Path(config.run_dir) / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
        self.progress = progress

    def run(self, resume: bool = False) -> Path:
        """Train until train.iterations; with `resume`, continue the run in `out` from its latest checkpoint."""
        self.tasks = self._read_tasks()
        self._check()
        checkpoint = self._prepare_run_dir(resume)
        state = self._setup(checkpoint)
        metrics = MetricsLog(self.out, resume_after=state.iteration)
        try:
            while state.iteration < self.train.iterations:
                metrics.write(self.iteration(state))
                if state.iteration % self.train.checkpoint_every == 0 or state.iteration == self.train.iterations:
                    self._checkpoint(state)
        finally:
            metrics.close()
            self.engine.close()
        return self.out

    def iteration(self, state: LoopState) -> dict:
        """One RL iteration; advances `state` and returns its metrics line."""
        n, began = state.iteration + 1, time.monotonic()
        curriculum = self._maybe_enter_stage(state, n)
        agent_config, algo, max_turns = self._stage_settings(state.stage)

        t = time.monotonic()
        trajectories, batch, rounds, filters, sampled_tokens = self._collect(state, n, agent_config, algo)
        rollout_s = time.monotonic() - t
        record_outcomes(state, [(x.task_id, x.resolved) for x in trajectories if x.termination != "infra_error"])

        rewards, advantages, sequences = select_training_batch(batch, algo, max_turns, filters)
        random.shuffle(sequences)  # mixes groups across the K mini-batches; the RNG is checkpointed

        t = time.monotonic()
        with self._autocast():
            update = policy_update(self.model, self.optimizer, sequences, algo,
                                   micro_token_budget=self.train.micro_token_budget,
                                   mini_batches=self.train.mini_batches, max_grad_norm=self.train.max_grad_norm,
                                   scheduler=self.scheduler, ref_model=self.ref_model)
        training_s = time.monotonic() - t
        state.optimizer_steps += self.train.mini_batches

        t = time.monotonic()
        self.engine.load_weights(full_state_dict(self.model))
        sync_s = time.monotonic() - t

        state.iteration = n
        record = {
            "iteration": n, "stage": state.stage, "optimizer_steps": state.optimizer_steps,
            "lr": self.scheduler.get_last_lr()[0], "rounds": rounds, **rollout_stats(trajectories),
            **reward_stats(rewards), **advantage_stats(advantages), "trained_trajectories": len(sequences),
            "rollout_tokens_per_s": sampled_tokens / max(rollout_s, 1e-9),
            "filters": {**filters, **({"curriculum": curriculum} if curriculum else {})},
            **update_metrics(update),
            "time_rollout_s": rollout_s, "time_training_s": training_s, "time_weight_sync_s": sync_s,
            "time_iteration_s": time.monotonic() - began,
        }
        console.print(f"iteration {n}/{self.train.iterations}: reward {record['reward_mean']:.3f}, resolved "
                      f"{record['resolved']}/{record['trajectories']}, trained {len(sequences)}, loss "
                      f"{record['loss'] or 0:.4f}; rollout {rollout_s:.0f} s, training {training_s:.0f} s, "
                      f"sync {sync_s:.1f} s", soft_wrap=True)
        return record

    def _collect(self, state: LoopState, n: int, agent_config: AgentConfig, algo: AlgorithmConfig):
        """Rollouts of this iteration: (all trajectories, the batch to train on, rounds, filter counts, tokens
        sampled here). With dynamic sampling, more tasks are drawn until tasks_per_iteration groups have
        0 < resolved < G, for at most max_generation_rounds rounds; round r > 0 prefixes its ids with 'round<r>/'."""
        agent = ModelAgent(self.engine, agent_config, model=self.config.inference.model)
        rollouts = make_rollouts(self.config, agent, run_dir=self.out / "rollouts" / f"iter-{n}",
                                 progress=self.progress)
        want, G = self.train.tasks_per_iteration, self.train.samples_per_task
        everything: list[Trajectory] = []
        kept_groups: dict[str, None] = {}  # insertion-ordered set
        counts: dict[str, int] = {}
        sampled_tokens = rounds = 0
        needed = want
        while needed:
            ids = draw_tasks(state, needed, self.config.seed, self.train.shuffle_tasks)
            fresh = rollouts.run([self.tasks[i] for i in ids], G, prefix=f"round{rounds}/" if rounds else "")
            sampled_tokens += rollouts.stats.sampled_tokens
            rounds += 1
            everything += fresh
            if not algo.dynamic_sampling:
                return everything, everything, rounds, {}, sampled_tokens
            samples = [to_sample(x) for x in fresh if x.termination != "infra_error"]
            kept, round_counts = dynamic_sampling(samples)
            kept_groups.update(dict.fromkeys(s.group_id for s in kept))
            counts = {k: counts.get(k, 0) + v for k, v in round_counts.items()}
            needed = groups_still_needed(len(kept_groups), want, rounds, algo.max_generation_rounds)
        batch_groups = set(list(kept_groups)[:want])
        batch = [x for x in everything if group_of(x) in batch_groups]
        return everything, batch, rounds, {"dynamic_sampling": counts}, sampled_tokens

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

    def _stage_settings(self, stage: int) -> tuple[AgentConfig, AlgorithmConfig, int]:
        """The agent and algorithm of a stage, and T_max of the turn penalty."""
        agent, algo = self.config.agent, self.algo
        if not algo.stages:
            return agent, algo, agent.max_steps
        s = algo.stages[stage]
        agent = agent.model_copy(update={"max_steps": s.max_turns, "max_context_tokens": s.max_context_tokens})
        if s.clip_high is not None:
            algo = algo.model_copy(update={"clip_high": s.clip_high})
        return agent, algo, s.max_turns

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
        """Settings that are valid one by one but not together."""
        train, algo, agent = self.train, self.algo, self.config.agent
        if self.config.inference.engine != "hf":
            raise TrainError("inference.engine: train needs 'hf' (the trainer pushes new weights into the engine)")
        if train.tasks_per_iteration > len(self.tasks):
            raise TrainError(f"train.tasks_per_iteration ({train.tasks_per_iteration}) is more than the "
                             f"{len(self.tasks)} tasks in '{train.tasks}'")
        if algo.stages and len(train.stage_iterations) != len(algo.stages) - 1:
            raise TrainError(f"train.stage_iterations needs {len(algo.stages) - 1} entries (one per algorithm.stages "
                             f"entry but the last), got {train.stage_iterations}")
        if not algo.stages and train.stage_iterations:
            raise TrainError("train.stage_iterations is set but algorithm.stages is empty")
        threshold = algo.turn_penalty_threshold
        if threshold is not None and not algo.stages and agent.max_steps <= threshold:
            raise TrainError(f"agent.max_steps ({agent.max_steps}) must exceed algorithm.turn_penalty_threshold "
                             f"({threshold}): it is T_max of the turn penalty")
        if train.bf16 and not str(self.config.inference.device).startswith("cuda"):
            raise TrainError(f"train.bf16 needs a CUDA inference.device, got '{self.config.inference.device}'")

    def _prepare_run_dir(self, resume: bool) -> Path | None:
        """The checkpoint to start from (None: from the model spec); refuses to overwrite a run without resume."""
        started = (self.out / "metrics.jsonl").exists() or (self.out / "rollouts").exists()
        if started and not resume:
            raise TrainError(f"{self.out} already holds a training run: pass --resume to continue it, or another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.yaml").write_text(dump_config(self.config))
        return latest_checkpoint(self.out) if resume else None

    def _setup(self, checkpoint: Path | None) -> LoopState:
        """The trainer's model, optimizer, scheduler, reference model and engine, and the loop state."""
        spec, device = self.config.inference.model, self.config.inference.device
        model, self.tokenizer = load_model(str(checkpoint / "model") if checkpoint and not self.train.lora else spec,
                                           device)
        if self.train.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.model = maybe_lora(model, self.train.lora)
        if checkpoint is not None and self.train.lora:
            load_adapter(self.model, checkpoint)
        self.optimizer = make_optimizer(self.model, self.train.lr, self.train.weight_decay, self.train.betas)
        self.scheduler = make_scheduler(self.optimizer, self.train.warmup_steps,
                                        self.train.iterations * self.train.mini_batches, self.train.lr_schedule)
        self.ref_model = load_model(spec, device)[0].requires_grad_(False) if self.algo.kl_coef > 0 else None
        if checkpoint is None:
            random.seed(self.config.seed)
            torch.manual_seed(self.config.seed)
            state = LoopState(pool=list(self.tasks))
        else:
            state = LoopState.from_dict(load_training_state(checkpoint, self.optimizer, self.scheduler))
            missing = [t for t in state.pool if t not in self.tasks]
            if missing:
                raise TrainError(f"train.tasks: '{self.train.tasks}' lacks {len(missing)} tasks of the run being "
                                 f"resumed, e.g. {missing[0]}")
            console.print(f"resuming {self.out} after iteration {state.iteration} ({checkpoint})", soft_wrap=True)
        self.engine = make_engine(self.config.inference)
        self.engine.load_weights(full_state_dict(self.model))
        return state

    def _checkpoint(self, state: LoopState) -> Path:
        t = time.monotonic()
        path = save_checkpoint(self.out, state.iteration, self.model, self.tokenizer, self.optimizer, self.scheduler,
                               state=state.to_dict(), keep=self.train.keep_checkpoints)
        console.print(f"checkpoint {path} in {time.monotonic() - t:.1f} s", soft_wrap=True)
        return path

    def _autocast(self):
        if self.train.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()


def select_training_batch(batch: list[Trajectory], algo: AlgorithmConfig, max_turns: int,
                          filters: dict) -> tuple[list[float], torch.Tensor, list[TrainSequence]]:
    """Shaping, filters and advantages over a batch: (shaped rewards, one advantage per scored trajectory, the
    sequences that take loss). Adds each filter's counts to `filters`. Infrastructure errors carry no reward and
    are left out; compact-filtered trajectories stay in their group's statistics (algorithm.invalid_as_zero) but
    take no loss."""
    scored = [x for x in batch if x.termination != "infra_error"]
    filters["infra_error"] = len(batch) - len(scored)
    samples = [to_sample(x) for x in scored]
    if algo.turn_penalty_threshold is not None:
        samples, filters["turn_penalty"] = apply_turn_penalty(samples, algo.turn_penalty_threshold, max_turns)
    valid = [True] * len(samples)
    if algo.compact_filter:
        valid, filters["compact"] = compact_filter(samples, algo.compact_terminations)
    rewards = [s.reward for s in samples]
    advantages = compute_advantages(algo.advantage, torch.tensor(rewards, dtype=torch.float64),
                                    [s.group_id for s in samples], torch.tensor(valid, dtype=torch.bool),
                                    eps=algo.advantage_eps, invalid_as_zero=algo.invalid_as_zero)
    trained = [i for i, ok in enumerate(valid) if ok]
    if algo.drop_zero_advantage:
        kept, filters["zero_advantage"] = drop_zero_advantage(advantages[torch.tensor(trained, dtype=torch.long)])
        trained = [trained[k] for k in kept]
    sequences = sequences_from_trajectories([scored[i] for i in trained], [float(advantages[i]) for i in trained])
    return rewards, advantages, sequences


def to_sample(trajectory: Trajectory) -> Sample:
    """A graded trajectory as shaping sees it; its reward is 1 if it resolved its task, else 0."""
    t = trajectory
    return Sample(t.task_id, group_of(t), float(t.resolved), t.termination, t.steps, t.resolved)


def group_of(trajectory: Trajectory) -> str:
    """The group a trajectory's advantage compares it within: its task (and round), i.e. its id without '#sample'."""
    return trajectory.trajectory_id.rsplit("#", 1)[0]

