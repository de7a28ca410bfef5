"""The warm start in bf16 autocast against fp32 on this CPU: the same SFT steps on make demo's demonstrations from the
same model, seconds per step and the token-mean NLL after them, and how far the two models' logprobs of the
demonstrations end up apart (the warm start's result, which the RL that follows starts from).

    python bench/warm_start.py [--steps 8] [--threads 2] [--json]

Demonstrations: runs/demo-demos (make demo's), else played here from make demo's tasks (built if missing).
speedup = fp32 seconds / bf16 seconds; nll_fp32 and nll_bf16 are both measured in fp32 after training, on the
demonstrations trained on; logprob_gap is the mean |log p_bf16-trained - log p_fp32-trained| over their sampled tokens.
"""

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patchgym.config import load_config  # noqa: E402
from patchgym.inference.chat_template import configure_tokenizer  # noqa: E402
from patchgym.inference.models import load_model, load_tokenizer  # noqa: E402
from patchgym.rollout.demos import build_demos  # noqa: E402
from patchgym.tasks import read_tasks  # noqa: E402
from patchgym.tasks.factory.build import build_tasks  # noqa: E402
from patchgym.train.batch import collate  # noqa: E402
from patchgym.train.logprobs import sequence_logprobs  # noqa: E402
from patchgym.train.policy import bf16_autocast  # noqa: E402
from patchgym.train.sft import read_demonstrations, run_sft, sft_batches  # noqa: E402
from patchgym.train.update import make_optimizer, make_scheduler  # noqa: E402

from report import print_result  # noqa: E402  (beside this script)

DEMO = ROOT / "configs" / "demo.yaml"


def demonstrations(config, out: Path) -> Path:
    demos = ROOT / "runs" / "demo-demos"
    if (demos / "trajectories.jsonl").exists():
        return demos
    tasks = ROOT / config.train.tasks
    if not tasks.exists():
        tasks = Path(build_tasks(["isodate", "toolz"], 3, 0, out / "tasks", backend=config.sandbox.backend,
                                 progress=False).tasks_file)
    tokenizer = configure_tokenizer(load_tokenizer(config.inference.model), config.inference.chat_template,
                                    config.inference.chat_template_kwargs)
    build_demos(read_tasks(tasks), tokenizer, config.agent, config.sandbox, out / "demos", per_task=2,
                rollout=config.rollout, model=config.inference.model)
    return out / "demos"


def train(config, sequences, steps: int, bf16: bool):
    model, _ = load_model(config.inference.model)
    model.train()
    train = config.train
    lr = train.warm_start.lr or train.lr
    plan = sft_batches(sequences, train.sft_batch_size, train.warm_start.epochs, config.seed)
    plan = [[step for epoch in plan for step in epoch][:steps]]
    optimizer = make_optimizer(model, lr, train.weight_decay, train.betas)
    scheduler = make_scheduler(optimizer, train.warmup_steps, steps, train.lr_schedule)
    with bf16_autocast("cpu") if bf16 else contextlib.nullcontext():
        result = run_sft(model, optimizer, scheduler, plan, micro_token_budget=train.micro_token_budget,
                         max_grad_norm=train.max_grad_norm, packing=train.packing)
    return model.eval(), result


def token_logprobs(model, sequences) -> torch.Tensor:
    values = []
    with torch.no_grad():
        for s in sequences:
            batch = collate([s], pad_id=0)
            logprobs = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                         positions=batch["loss_mask"])
            values.append(logprobs[batch["loss_mask"].bool()])
    return torch.cat(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=ROOT / "runs" / "bench-warm-start")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config([DEMO])
    source = demonstrations(config, args.dir)
    sequences = read_demonstrations(source).sequences
    runs = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        torch.manual_seed(config.seed)
        began = time.perf_counter()
        model, result = train(config, sequences, args.steps, bf16)
        runs[name] = (model, result, time.perf_counter() - began)
    fp32, bf16 = (token_logprobs(runs[n][0], sequences) for n in ("fp32", "bf16"))
    s32, s16 = runs["fp32"][1].seconds, runs["bf16"][1].seconds
    print_result({
        "demonstrations": str(source), "sequences": len(sequences), "tokens": sum(len(s) for s in sequences),
        "steps": args.steps, "threads": args.threads,
        "fp32_s_per_step": round(s32 / args.steps, 2), "bf16_s_per_step": round(s16 / args.steps, 2),
        "speedup": round(s32 / s16, 2), "train_loss_fp32": round(runs["fp32"][1].epoch_loss[-1], 4),
        "train_loss_bf16": round(runs["bf16"][1].epoch_loss[-1], 4),
        "nll_fp32": round(float(-fp32.mean()), 4), "nll_bf16": round(float(-bf16.mean()), 4),
        "logprob_gap": round(float((fp32 - bf16).abs().mean()), 4),
    }, args.json)


if __name__ == "__main__":
    main()
