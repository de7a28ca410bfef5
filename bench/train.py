"""Trainer overhead: time per token of one `policy_update` against a bare transformers training step on the same batch.

    python bench/train.py [--model smollm2|tiny] [--sequences 8] [--length 512] [--threads 1] [--full-mask] [--json]

The batch: fixed random token sequences laid out as multi-turn trajectories (a 128-token prompt, then turns of 64
sampled and 64 observation tokens), fp32, the rollout logprobs set to the model's own.
- baseline: model(input_ids, attention_mask, labels) with -100 on unsampled tokens (the loss HF computes over
  all logits), backward, AdamW step: the least a trainer must do.
- trainer: policy_update with the grpo++ preset, one mini-batch packed as one micro-batch (pi_old is read off the
  same forward pass, so there is no extra pass), gradient clipping and every metric included.
One run each after a warm-up step on a short batch. overhead_ratio = trainer s/token / baseline s/token; target
<= 1.15. The trainer computes the vocabulary projection only at sampled positions, so it can beat the baseline;
--full-mask samples every token after the prompt, the least favourable case for it.
"""

import argparse
import sys
import time

import torch

from patchgym.inference.models import load_model
from patchgym.rl.config import load_preset
from patchgym.train.batch import TrainSequence, collate
from patchgym.train.logprobs import sequence_logprobs
from patchgym.train.update import make_optimizer, policy_update

from report import print_result  # bench/report.py, beside this script

TARGET = 1.15
PROMPT, TURN = 128, 64


def make_batch(vocab: int, sequences: int, length: int, full_mask: bool) -> list[TrainSequence]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(sequences):
        ids = torch.randint(100, vocab, (length,), generator=gen).tolist()
        mask = [0] * PROMPT + [1 if full_mask or ((k // TURN) % 2 == 0) else 0 for k in range(length - PROMPT)]
        out.append(TrainSequence(ids, mask, [0.0] * length, advantage=1.0 if i % 2 else -1.0))
    return out


def with_own_logprobs(model, sequences: list[TrainSequence]) -> None:
    """Rollout logprobs = the model's, as from an exact engine (keeps TIS weights at 1, as in a real run)."""
    batch = collate(sequences, 0)
    with torch.no_grad():
        lp = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], positions=batch["loss_mask"])
    for row, s in enumerate(sequences):
        s.rollout_logprobs = lp[row, :len(s)].tolist()


def baseline_step(model, optimizer, batch: dict[str, torch.Tensor]) -> None:
    labels = torch.where(batch["loss_mask"] > 0, batch["input_ids"], -100)
    loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--full-mask", action="store_true", help="every token after the prompt is sampled")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, _ = load_model(args.model)
    model.train()
    vocab = model.config.vocab_size
    sequences = make_batch(vocab, args.sequences, args.length, args.full_mask)
    with_own_logprobs(model, sequences)
    warm = make_batch(vocab, 1, PROMPT + 2 * TURN, args.full_mask)
    batch = collate(sequences, 0)
    tokens = int(batch["attention_mask"].sum())
    algo = load_preset("grpo++")

    # lr 0: both loops do all their work while the weights stay the same for the other one.
    optimizer = make_optimizer(model, lr=0.0)
    baseline_step(model, optimizer, collate(warm, 0))
    baseline_s = timed(lambda: baseline_step(model, optimizer, batch))
    update = lambda seqs: policy_update(model, optimizer, seqs, algo,  # noqa: E731
                                        micro_token_budget=tokens, mini_batches=1)
    update(warm)
    trainer_s = timed(lambda: update(sequences))

    ratio = trainer_s / baseline_s
    result = {
        "model": args.model,
        "sequences": args.sequences,
        "length": args.length,
        "sampled_fraction": round(float(batch["loss_mask"].sum()) / tokens, 3),
        "torch_threads": args.threads,
        "tokens": tokens,
        "baseline_s": round(baseline_s, 2),
        "baseline_tokens_per_s": round(tokens / baseline_s, 1),
        "trainer_s": round(trainer_s, 2),
        "trainer_tokens_per_s": round(tokens / trainer_s, 1),
        "overhead_ratio": round(ratio, 3),
        "target": TARGET,
        "meets_target": ratio <= TARGET,
    }
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
