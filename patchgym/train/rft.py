"""Rejection fine-tuning (the Nebius first stage): run the policy N times per task, keep the trajectories whose patch
resolves, and fine-tune on them for one epoch, with observation tokens and format-error turns masked (`sft`).

`sft` takes any trajectories (`patchgym sft --trajectories FILE`); the result is a checkpoint in the trainer's
layout, RUN/checkpoints/iter-1/model, which `--model` / `inference.model` accept as a model directory.
"""

import random
from collections.abc import Sequence
from pathlib import Path

from patchgym.agent.trajectory import Trajectory
from patchgym.config import Config, dump_config
from patchgym.inference.factory import make_engine
from patchgym.inference.models import load_model
from patchgym.rollout import ModelAgent, RolloutEngine
from patchgym.tasks import Task
from patchgym.train.batch import sequences_from_trajectories
from patchgym.train.checkpoint import save_checkpoint
from patchgym.train.loop import TrainError, console
from patchgym.train.metrics import MetricsLog
from patchgym.train.update import enable_gradient_checkpointing, make_optimizer, make_scheduler, maybe_lora, sft_update


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
    usable = [t for t in trajectories if t.termination != "infra_error"]
    sequences = sequences_from_trajectories(usable, [1.0] * len(usable), mask_format_errors=True)
    if not sequences:
        raise TrainError(f"sft: none of the {len(trajectories)} trajectories has a sampled token to learn from: "
                         "format-error turns are masked, and scripted policies record no tokens")
    random.Random(config.seed).shuffle(sequences)
    batches = [sequences[i:i + train.sft_batch_size] for i in range(0, len(sequences), train.sft_batch_size)]
    model, tokenizer = load_model(config.inference.model, config.inference.device)
    if train.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model = maybe_lora(model, train.lora)
    optimizer = make_optimizer(model, train.lr, train.weight_decay, train.betas)
    scheduler = make_scheduler(optimizer, train.warmup_steps, len(batches), train.lr_schedule)
    metrics = MetricsLog(out)
    try:
        for step, batch in enumerate(batches, 1):
            update = sft_update(model, optimizer, batch, micro_token_budget=train.micro_token_budget,
                                max_grad_norm=train.max_grad_norm, scheduler=scheduler, packing=train.packing)
            metrics.write({"iteration": step, "sequences": len(batch), "loss": update["loss"],
                           "grad_norm": update["grad_norm"], "policy_tokens": update["tokens"],
                           "padding_fraction": update["padding_fraction"],
                           "lr": scheduler.get_last_lr()[0], "time_training_s": update["seconds"]})
            console.print(f"sft step {step}/{len(batches)}: loss {update['loss']:.4f} on {len(batch)} trajectories")
    finally:
        metrics.close()
    return save_checkpoint(out, 1, model, tokenizer, optimizer, scheduler, keep=train.keep_checkpoints,
                           state={"kind": "sft", "trajectories": len(sequences), "optimizer_steps": len(batches)})
