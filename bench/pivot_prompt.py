"""The pivot stage's update cost for one state: forward and backward of its G sampled actions one by one (`prompt +
action` each, as TrainSequences are) against one shared row (patchgym.pivot.shared_prompt), on the same model and
tokens. Prints both times, their ratio, and the largest logprob difference.

    python bench/pivot_prompt.py                      # SmolLM2-135M, a 1,000-token prompt, G = 8 actions of 100
    python bench/pivot_prompt.py --tiny --json
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of SmolLM2")
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--action", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from patchgym.inference.models import load_model, tiny_model
    from patchgym.pivot.shared_prompt import shared_prompt_logprobs
    from patchgym.train.logprobs import sequence_logprobs

    model = tiny_model()[0] if args.tiny else load_model("smollm2")[0]
    model.train()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 10000, (args.prompt,), generator=g).tolist()
    actions = [torch.randint(5, 10000, (args.action,), generator=g).tolist() for _ in range(args.group)]

    def one_by_one():
        found = []
        for action in actions:
            ids = torch.tensor([prompt + action])
            wanted = torch.zeros_like(ids)
            wanted[0, len(prompt):] = 1
            logprobs = sequence_logprobs(model, ids, torch.ones_like(ids), positions=wanted)[0, len(prompt):]
            logprobs.sum().backward()  # one sequence at a time, as micro-batches of one would
            found.append(logprobs.detach())
        return found

    def shared():
        found = shared_prompt_logprobs(model, prompt, actions)
        sum(lp.sum() for lp in found).backward()
        return [lp.detach() for lp in found]

    times = {}
    for name, run in (("one_by_one", one_by_one), ("shared", shared)):
        model.zero_grad()
        began = time.perf_counter()
        times[name], result = None, run()
        times[name] = time.perf_counter() - began
        if name == "one_by_one":
            reference = result
    gap = max((a - b).abs().max().item() for a, b in zip(reference, result))
    row = {"model": "tiny" if args.tiny else "smollm2", "prompt": args.prompt, "group": args.group,
           "action": args.action, "threads": args.threads, "one_by_one_s": round(times["one_by_one"], 2),
           "shared_s": round(times["shared"], 2), "speedup": round(times["one_by_one"] / times["shared"], 2),
           "max_logprob_gap": gap}
    print(json.dumps(row) if args.json else
          f"{row['model']}: prompt {args.prompt}, G {args.group} x {args.action}: one by one {row['one_by_one_s']} s, "
          f"shared {row['shared_s']} s, {row['speedup']}x; largest logprob gap {gap:.2e}")


if __name__ == "__main__":
    main()
