"""Does GRPO++ make SmolLM2 better at real SWE tasks it trains on? Measured as DeepSWE and Nebius set it up: a warm
start on expert demonstrations, a difficulty filter that keeps the tasks in the learnable band, RL epochs over that
fixed set, and the gain on the same tasks from fresh samples, against a control trained on flipped advantages.

    python bench/learning.py [--dir runs/learn] [--quick] [--json]      (make learn)

Stages, each under --dir and skipped when done (a rerun resumes):
1. tasks/: factory tasks of a few packages; per package the first ones are RL candidates (they get demonstrations),
   the next are held out (none).
2. demos/: `patchgym demos` of every candidate (the gold patch played through the agent, as the model's tokens).
3. The warm start (train.warm_start on those demonstrations), computed once and kept in the warm-start cache: both
   RL runs below start from that same entry.
4. band/: an eval of the warm model, k samples per task, on candidates and held-out tasks; the candidates solved
   sometimes but not always (patchgym.rl.shaping.learnable_band) are kept, and the tally says how many of how many.
5. rl/ and flipped/: GRPO++ from the warm entry over the kept tasks, every iteration attempting every kept task G
   times (tasks_per_iteration = kept); flipped/ is the same run with the advantages' sign flipped.
6. eval-rl/, eval-flipped/: each final policy, k fresh samples per task, on the kept and the held-out tasks.

The measure, per run: before = its iteration 1's rollouts (sampled by the warm policy, before any update, after the
band was chosen, so the filter's own luck does not count), after = its final eval; the gain is the mean of per-task
paired differences with its standard error over tasks (patchgym.eval.metrics.paired_gain). `ok`: the RL run's gain
exceeds twice its standard error and the control's does not. `ok_t` asks the same of Student's t at T - 1 degrees of
freedom (T kept tasks), the stricter test with few tasks. Held-out tasks are reported as they are (warm and final
rates with their standard error over tasks).

DIR/learning.json holds the result line, which `patchgym report DIR` plots.
"""

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patchgym.agent.trajectory_files import read_trajectories  # noqa: E402
from patchgym.config import load_config  # noqa: E402
from patchgym.eval.build import load_eval_config, run_eval  # noqa: E402
from patchgym.eval.metrics import mean_task_resolve_rate, paired_gain  # noqa: E402
from patchgym.inference.chat_template import configure_tokenizer  # noqa: E402
from patchgym.inference.models import load_tokenizer  # noqa: E402
from patchgym.rl.shaping import learnable_band  # noqa: E402
from patchgym.rollout.demos import build_demos  # noqa: E402
from patchgym.tasks import read_tasks, write_tasks  # noqa: E402
from patchgym.tasks.factory.build import build_tasks  # noqa: E402
from patchgym.train.loop import Trainer  # noqa: E402
from patchgym.train.metrics_schema import read_metrics  # noqa: E402
from patchgym.train.warm_cache import ensure_warm_start  # noqa: E402

from report import print_result  # noqa: E402  (beside this script)

BASE_CONFIG = ROOT / "configs" / "demo.yaml"  # SmolLM2 on vLLM (CPU), the demo's agent limits and GRPO++
TEMPERATURE = 0.5  # at T = 1 the 135 M model's tail breaks nearly every tool call (docs/results.md)


@dataclass(frozen=True)
class Setup:
    packages: list[str]
    candidates_per_package: int
    heldout_per_package: int
    demos_per_task: int
    warm_epochs: int
    warm_lr: float
    warm_batch: int
    band_samples: int         # k: attempts per task in the band eval and in the final evals
    iterations: int           # RL epochs over the kept tasks
    group: int                # G: rollouts per task per iteration
    lr: float
    mini_batches: int


FULL = Setup(["isodate", "cachetools", "toolz"], 4, 1, demos_per_task=2, warm_epochs=4, warm_lr=3e-4, warm_batch=2,
             band_samples=4, iterations=3, group=4, lr=1e-4, mini_batches=2)
QUICK = Setup(["isodate", "toolz"], 2, 1, demos_per_task=1, warm_epochs=1, warm_lr=3e-4, warm_batch=2,
              band_samples=2, iterations=1, group=2, lr=1e-4, mini_batches=1)


class Bench:
    def __init__(self, setup: Setup, out: Path, quick: bool):
        self.setup, self.out, self.quick = setup, out, quick
        self.timings_file = out / "timings.json"
        self.timings = json.loads(self.timings_file.read_text()) if self.timings_file.exists() else {}

    def timed(self, name: str, fn):
        began = time.monotonic()
        result = fn()
        if name not in self.timings:
            self.timings[name] = round(time.monotonic() - began, 1)
            self.timings_file.write_text(json.dumps(self.timings, indent=1))
        return result

    def split_tasks(self) -> tuple[Path, Path]:
        """DIR/candidates.jsonl and DIR/heldout.jsonl: per package, the first tasks are RL candidates, the next held
        out."""
        s = self.setup
        if (self.out / "heldout.jsonl").exists():
            return self.out / "candidates.jsonl", self.out / "heldout.jsonl"
        want = s.candidates_per_package + s.heldout_per_package
        built = build_tasks(s.packages, want, 0, self.out / "tasks", backend=load_config([BASE_CONFIG]).sandbox.backend,
                            progress=False)
        tasks = read_tasks(built.tasks_file)
        candidates, heldout = [], []
        for package in s.packages:
            mine = [t for t in tasks if t.repo == package]
            if len(mine) < want:
                sys.exit(f"{package}: {len(mine)} tasks built, {want} needed")
            candidates += mine[:s.candidates_per_package]
            heldout += mine[s.candidates_per_package:want]
        write_tasks(candidates, self.out / "candidates.jsonl")
        write_tasks(heldout, self.out / "heldout.jsonl")
        return self.out / "candidates.jsonl", self.out / "heldout.jsonl"

    def demos(self, candidates: Path) -> Path:
        out = self.out / "demos"
        if not (out / "summary.json").exists():
            config = load_config([BASE_CONFIG])
            tokenizer = configure_tokenizer(load_tokenizer(config.inference.model), config.inference.chat_template,
                                            config.inference.chat_template_kwargs)
            build_demos(read_tasks(candidates), tokenizer, config.agent, config.sandbox, out,
                        per_task=self.setup.demos_per_task, rollout=config.rollout, model=config.inference.model)
        return out

    def settings(self, demos: Path, tasks: Path | None = None, kept: int = 1, flip: bool = False) -> dict:
        """The overrides of configs/demo.yaml every stage shares (the warm start's, so each finds the same cache
        entry), and a run's RL settings."""
        s = self.setup
        train = {"sft_batch_size": s.warm_batch, "warm_start": {"trajectories": str(demos), "epochs": s.warm_epochs,
                                                                "lr": s.warm_lr}}
        if tasks is not None:
            train.update({"tasks": str(tasks), "iterations": s.iterations, "tasks_per_iteration": kept,
                          "samples_per_task": s.group, "lr": s.lr, "mini_batches": s.mini_batches,
                          "checkpoint_every": s.iterations, "keep_checkpoints": 1})
        return {"train": train, "algorithm": {"flip_advantages": flip},
                "agent": {"sampling": {"temperature": TEMPERATURE}}}

    def config_file(self, name: str, settings: dict) -> Path:
        path = self.out / f"config-{name}.yaml"
        path.write_text(yaml.safe_dump(settings))
        return path

    def evaluate(self, name: str, model: str, tasks: list[Path]) -> dict[str, list[bool]]:
        """Task id -> outcomes of k attempts of `model` at TEMPERATURE, on the tasks of `tasks`, in DIR/<name>/."""
        out, combined = self.out / name, self.out / f"{name}-tasks.jsonl"
        if not (out / "summary.json").exists():
            write_tasks([t for path in tasks for t in read_tasks(path)], combined)
            config = load_eval_config([BASE_CONFIG], [f"inference.model={model}",
                                                      f"agent.sampling.temperature={TEMPERATURE}"])
            run_eval(config, combined, runs=self.setup.band_samples, out=out, progress=False)
        return outcomes(out / "trajectories.jsonl")

    def band(self, band: dict[str, list[bool]], candidates: Path) -> tuple[Path, dict]:
        counts = {t.instance_id: (sum(band.get(t.instance_id, [])), len(band.get(t.instance_id, [])))
                  for t in read_tasks(candidates)}
        kept, tally = learnable_band(counts)
        path = self.out / "kept.jsonl"
        write_tasks([t for t in read_tasks(candidates) if t.instance_id in kept], path)
        return path, tally

    def train(self, name: str, demos: Path, kept: Path, flip: bool) -> Path:
        run, s = self.out / name, self.setup
        final = run / "checkpoints" / f"iter-{s.iterations}"
        if not final.exists():
            settings = self.settings(demos, kept, len(read_tasks(kept)), flip)
            config = load_config([BASE_CONFIG, self.config_file(name, settings)])
            Trainer(config, run, progress=False).run(resume=True)
        return final

    def run(self) -> dict:
        began, s = time.monotonic(), self.setup
        self.out.mkdir(parents=True, exist_ok=True)
        candidates, heldout = self.timed("tasks", self.split_tasks)
        demos = self.timed("demos", lambda: self.demos(candidates))
        warm_config = load_config([BASE_CONFIG, self.config_file("warm", self.settings(demos))])
        warm = self.timed("warm_start", lambda: ensure_warm_start(warm_config, progress=True))
        warm_model = str(warm.path / "model")
        band = self.timed("band", lambda: self.evaluate("band", warm_model, [candidates, heldout]))
        kept, tally = self.band(band, candidates)
        result = {"quick": self.quick, "dir": str(self.out), "model": warm_config.inference.model,
                  "packages": s.packages, "temperature": TEMPERATURE, "setup": s.__dict__,
                  "warm_start": {**warm.line["warm_start"], "key": warm.key},
                  "band": {**tally, "candidates": len(read_tasks(candidates)), "samples": s.band_samples}}
        if not tally["kept"]:
            return {**result, "ok": False, "why": "no candidate task is in the learnable band after the warm start",
                    "seconds": self.timings, "this_run_s": round(time.monotonic() - began, 1)}
        ids = {t.instance_id for t in read_tasks(kept)}
        held = {t.instance_id for t in read_tasks(heldout)}
        runs, gains = {}, {}
        for name, flip in (("rl", False), ("flipped", True)):
            final = self.timed(f"train-{name}", lambda: self.train(name, demos, kept, flip))
            after = self.timed(f"eval-{name}", lambda: self.evaluate(f"eval-{name}", str(final / "model"),
                                                                     [kept, heldout]))
            before = outcomes(self.out / name / "rollouts" / "iter-1" / "trajectories.jsonl")
            gains[name] = paired_gain(before, {k: v for k, v in after.items() if k in ids})
            runs[name] = {"gain": gains[name].as_dict(),
                          "heldout": mean_task_resolve_rate({k: v for k, v in after.items() if k in held}).as_dict(),
                          "curve": curve(self.out / name)}
        return {**result, "kept_tasks": sorted(ids),
                "heldout_warm": mean_task_resolve_rate({k: v for k, v in band.items() if k in held}).as_dict(),
                "runs": runs, "seconds": self.timings, "stages_s": round(sum(self.timings.values()), 1),
                "this_run_s": round(time.monotonic() - began, 1),
                "ok": gains["rl"].two_se_significant and not gains["flipped"].two_se_significant,
                "ok_t": gains["rl"].t_significant and not gains["flipped"].t_significant}


def outcomes(trajectories: Path) -> dict[str, list[bool]]:
    """Task id -> the resolved flags of its scored trajectories in a file."""
    per_task: dict[str, list[bool]] = {}
    for t in read_trajectories(trajectories):
        if t.scored:
            per_task.setdefault(t.task_id, []).append(t.resolved)
    return per_task


def curve(run: Path) -> list[dict]:
    """Per RL iteration of `run`: its mean of per-task resolve rates over the kept tasks, with the standard error
    over tasks."""
    points = []
    for line in read_metrics(run):
        n = line.get("iteration", 0)
        if n > 0:
            rate = mean_task_resolve_rate(outcomes(run / "rollouts" / f"iter-{n}" / "trajectories.jsonl"))
            points.append({"iteration": n, "reward_mean": line.get("reward_mean"), **rate.as_dict(),
                           "nonzero_advantage_group_fraction": line.get("nonzero_advantage_group_fraction")})
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="run directory (default runs/learn, or "
                                                                "runs/learn-quick with --quick); a rerun resumes")
    parser.add_argument("--quick", action="store_true", help="2 packages, 2+1 tasks each, 2 samples, 1 iteration")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = args.dir or ROOT / "runs" / ("learn-quick" if args.quick else "learn")
    result = Bench(QUICK if args.quick else FULL, out.resolve(), args.quick).run()
    (out / "learning.json").write_text(json.dumps(result, indent=1))
    print_result(result, args.json)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
