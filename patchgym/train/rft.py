"""Rejection fine-tuning (the Nebius first stage): run the policy N times per task, keep the trajectories whose patch
resolves, and fine-tune on them for one epoch, with observation tokens and format-error turns masked (`sft`).

`sft` takes any trajectories (`patchgym sft --trajectories FILE`) and runs patchgym.train.sft's loop, as the
trainer's warm start does; the result is a checkpoint in the trainer's layout, RUN/checkpoints/iter-1/model, which
`--model` / `inference.model` accept as a model directory.
"""

from collections.abc import Sequence
from pathlib import Path

from patchgym.agent.trajectory import Trajectory
from patchgym.config import Config, dump_config
from patchgym.inference.factory import make_engine
from patchgym.inference.models import load_model
from patchgym.rollout import ModelAgent, RolloutEngine
from patchgym.tasks import Task
from patchgym.train.checkpoint import save_checkpoint
from patchgym.train.loop import TrainError, console
from patchgym.train.metrics import MetricsLog
from patchgym.train.sft import run_sft, sft_batches, sft_sequences
from patchgym.train.update import enable_gradient_checkpointing, make_optimizer, make_scheduler, maybe_lora


def rft(config: Config, tasks: list[Task], runs: int, out: str | Path, *, progress: bool = True) -> Path:
    """N = `runs` rollouts per task (resumable from OUT/rollouts), then `sft` on the resolved ones."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(config))
    engine = make_engine(config.inference)
    try:
        agent = ModelAgent(engine, config.agent, model=config.inference.model)
        trajectories = RolloutEngine(agent, config.sandbox, config.rollout, run_dir=out / "rollouts",
                                     progress=progress).run(tasks, runs)
    finally:
        engine.close()
    resolved = [t for t in trajectories if t.resolved]
    console.print(f"rft: {len(resolved)} of {len(trajectories)} trajectories resolved their task "
                  f"({len({t.task_id for t in resolved})} of {len(tasks)} tasks)")
    if not resolved:
        raise TrainError("rft: no trajectory resolved its task, so there is nothing to fine-tune on; try more --runs "
                         "or a stronger --model")
    return sft(config, resolved, out)


def sft(config: Config, trajectories: Sequence[Trajectory], out: str | Path) -> Path:
    """One epoch of SFT on `trajectories` (train.sft_batch_size per optimizer step); returns the checkpoint."""
    train, out = config.train, Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sequences = sft_sequences(trajectories)
    if not sequences:
        raise TrainError(f"sft: none of the {len(trajectories)} trajectories has a sampled token to learn from: "
                         "format-error turns are masked, and scripts record no tokens")
    plan = sft_batches(sequences, train.sft_batch_size, 1, config.seed)
    model, tokenizer = load_model(config.inference.model, config.inference.device)
    if train.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model = maybe_lora(model, train.lora)
    optimizer = make_optimizer(model, train.lr, train.weight_decay, train.betas)
    scheduler = make_scheduler(optimizer, train.warmup_steps, len(plan[0]), train.lr_schedule)
    metrics = MetricsLog(out, loggers=train.loggers, config=config.model_dump(mode="json"))

    def log_step(epoch: int, step: int, update: dict) -> None:
        batch = plan[epoch][step]
        metrics.write({"iteration": step + 1, "sequences": len(batch), "loss": update["loss"],
                       "grad_norm": update["grad_norm"], "policy_tokens": update["tokens"],
                       "padding_fraction": update["padding_fraction"],
                       "lr": scheduler.get_last_lr()[0], "time_training_s": update["seconds"]})
        console.print(f"sft step {step + 1}/{len(plan[0])}: loss {update['loss']:.4f} on {len(batch)} trajectories")

    try:
        run_sft(model, optimizer, scheduler, plan, micro_token_budget=train.micro_token_budget,
                max_grad_norm=train.max_grad_norm, on_step=log_step, packing=train.packing)
    finally:
        metrics.close()
    return save_checkpoint(out, 1, model, tokenizer, optimizer, scheduler, keep=train.keep_checkpoints,
                           state={"kind": "sft", "trajectories": len(sequences), "optimizer_steps": len(plan[0])})
