"""The report's plots: each function takes a run's data and returns a matplotlib Figure, or a string that says why
this run has nothing to plot there. Figures are drawn with the Agg canvas, never through pyplot's global state."""

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from patchgym.report.gain import NoIterationGain, iteration_gain
from patchgym.report.runs import RunKind

SIZE_IN, DPI = (9.0, 5.0), 100  # every PNG is 900 x 500 pixels
GREEN, RED, BLUE, ORANGE, GREY, PURPLE = "#2e9e4f", "#d0473f", "#3a6fc4", "#e8912d", "#8a8f98", "#7d4fb0"


@dataclass
class RunData:
    run: Path
    kind: RunKind
    summary: dict = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)  # one line per RL iteration
    trajectories: list[dict] = field(default_factory=list)
    warm_start: dict | None = None  # the warm start's line (iteration 0) of a train run that had one


def figure(title: str) -> tuple[Figure, object]:
    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def two_panels(title: str) -> tuple[Figure, object, object]:
    """A figure of two stacked axes sharing the iteration axis."""
    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    fig.suptitle(title)
    return fig, top, bottom


def legend(fig: Figure, ax, title: str | None = None) -> None:
    """The legend below the axes, so it never hides data."""
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3, title=title, frameon=False)


def series(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(iterations, values) of the lines that have a number under `key`."""
    points = [(m["iteration"], float(m[key])) for m in metrics
              if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool) and "iteration" in m]
    return [p[0] for p in points], [p[1] for p in points]


def reward(data: RunData) -> Figure | str:
    if data.kind != "train":
        return f"only train runs have iterations ({data.kind} runs do not)"
    its, rewards = series(data.metrics, "reward_mean")
    rate_its, rates = series(data.metrics, "resolve_rate")
    if not its and not rate_its:
        return "metrics.jsonl has no iteration with reward_mean or resolve_rate yet"
    fig, top, bottom = two_panels("Reward and resolve rate per training iteration")
    top.plot(its, rewards, marker="o", color=BLUE, label="mean reward")
    std_its, stds = series(data.metrics, "reward_std")
    if std_its == its and stds:
        top.fill_between(its, [r - s for r, s in zip(rewards, stds)], [r + s for r, s in zip(rewards, stds)],
                         color=BLUE, alpha=0.15, label="± 1 std")
    top.set_ylabel("reward (shaped)")
    legend(fig, top)
    bottom.plot(rate_its, [100 * r for r in rates], marker="o", color=GREEN)
    bottom.set_ylabel("resolved (% of trajectories)")
    bottom.set_ylim(-5, 105)
    bottom.set_xlabel("iteration")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


def task_gain(data: RunData) -> Figure | str:
    if data.kind != "train":
        return f"only train runs have iterations ({data.kind} runs do not)"
    try:
        result = iteration_gain(data.trajectories)
    except NoIterationGain as why:
        return str(why)
    fig, ax = figure(f"Resolved per iteration on the {result.gain.tasks} tasks of every iteration "
                     "(bars: ± 2 standard errors over tasks)")
    points = [{"iteration": i, **rate.as_dict()} for i, rate in result.curve.items()]
    rate_curve(ax, points, GREEN, result.verdict)
    rate_axes(fig, ax)
    return fig


def rate_curve(ax, points: list[dict], colour: str, label: str, offset: float = 0.0) -> None:
    """The mean of per-task resolve rates per iteration ({iteration, rate, se} points: MeanTaskRate records) with
    bars of ± 2 standard errors."""
    ax.errorbar([p["iteration"] + offset for p in points], [100 * p["rate"] for p in points],
                yerr=[200 * p["se"] for p in points], fmt="-o", capsize=4, color=colour, label=label)


def rate_axes(fig: Figure, ax) -> None:
    """The axes and legend of rate_curve's plots."""
    ax.set_xlabel("iteration (its rollouts are sampled before its update)")
    ax.set_ylabel("resolved (% of attempts, mean over tasks)")
    ax.set_ylim(-5, 105)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(fig, ax)


def pass_at_k(data: RunData) -> Figure | str:
    if data.kind == "train":
        return "train runs have no Pass@k: run `patchgym eval` on a checkpoint and report that run"
    if not data.summary:
        return "summary.json is not written yet (the run is unfinished)"
    curves = {name: sorted((int(key.split("@")[1]), float(value)) for key, value in data.summary.items()
                           if key.startswith(f"{name}@") and key.split("@")[1].isdigit()
                           and isinstance(value, (int, float)))
              for name in ("pass", "best")}
    if not curves["pass"] and not curves["best"]:
        return "summary.json has no pass@k or best@k values"
    title = "Best@k (verifier's choice) and Pass@k (oracle) vs k" if curves["best"] else "Pass@k vs k"
    fig, ax = figure(title)
    for name, color, label in (("pass", GREEN, "Pass@k (any of k resolves)"),
                               ("best", PURPLE, "Best@k (the verifier's pick resolves)")):
        if curves[name]:
            ks, values = zip(*curves[name])
            ax.plot(ks, [100 * v for v in values], marker="o", color=color, label=label)
    sem = data.summary.get("pass@1_sem")
    if isinstance(sem, (int, float)) and sem > 0 and isinstance(data.summary.get("pass@1"), (int, float)):
        ax.errorbar([1], [100 * data.summary["pass@1"]], yerr=[100 * sem], color=GREEN, capsize=5,
                    label="Pass@1 ± standard error")
    ks = sorted({k for curve in curves.values() for k, _ in curve})
    if ks[-1] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (attempts per task)")
    ax.set_ylabel("tasks resolved (%)")
    ax.set_ylim(-5, 105)
    ax.yaxis.set_major_formatter(PercentFormatter())
    legend(fig, ax)
    return fig


def steps(data: RunData) -> Figure | str:
    if not data.trajectories:
        return _no_trajectories(data)
    resolved = [t["steps"] for t in data.trajectories if t["resolved"]]
    failed = [t["steps"] for t in data.trajectories if not t["resolved"]]
    low, top = min(t["steps"] for t in data.trajectories), max(t["steps"] for t in data.trajectories)
    mean = sum(t["steps"] for t in data.trajectories) / len(data.trajectories)
    fig, ax = figure(f"Steps per trajectory ({len(data.trajectories)} trajectories, mean {mean:.1f})")
    ax.hist([resolved, failed], bins=[b - 0.5 for b in range(low, top + 2)], stacked=True, color=[GREEN, RED],
            label=[f"resolved ({len(resolved)})", f"not resolved ({len(failed)})"], edgecolor="white")
    ax.set_xlabel("steps (model turns) per trajectory")
    ax.set_ylabel("trajectories")
    ax.set_xlim(max(low - 1.5, -0.5), top + 1.5)  # a lone bar keeps the width of one step
    if top - low <= 25:
        ax.set_xticks(range(max(low - 1, 0), top + 2))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    legend(fig, ax)
    return fig


def tokens(data: RunData) -> Figure | str:
    if not data.trajectories:
        return _no_trajectories(data)
    thinking: dict[int, list[int]] = defaultdict(list)
    call: dict[int, list[int]] = defaultdict(list)
    for t in data.trajectories:
        for n, (a, b) in enumerate(zip(t["thinking_tokens"], t["call_tokens"]), 1):
            thinking[n].append(a)
            call[n].append(b)
    if not any(sum(v) for v in thinking.values()) and not any(sum(v) for v in call.values()):
        return "no sampled tokens: a script (oracle or null), not a model, wrote these trajectories"
    turns = sorted(thinking)
    mean_thinking = [sum(thinking[n]) / len(thinking[n]) for n in turns]
    mean_call = [sum(call[n]) / len(call[n]) for n in turns]
    fig, ax = figure("Sampled tokens per step: thinking vs tool call (mean over trajectories)")
    ax.bar(turns, mean_thinking, color=ORANGE, label="thinking (text before the tool call)")
    ax.bar(turns, mean_call, bottom=mean_thinking, color=BLUE, label="tool call")
    ax.set_xlabel("step (turn number within the trajectory)")
    ax.set_ylabel("sampled tokens per turn (mean)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(fig, ax, "tokens split by the character share of each part of the turn's text")
    return fig


def terminations(data: RunData) -> Figure | str:
    if data.trajectories:
        counts = Counter(t["termination"] for t in data.trajectories)
        solved = Counter(t["termination"] for t in data.trajectories if t["resolved"])
    else:
        counts = Counter()
        for m in data.metrics:
            counts.update({k: v for k, v in (m.get("terminations") or {}).items() if isinstance(v, int)})
        solved = None
        if not counts:
            return _no_trajectories(data)
    reasons = sorted(counts, key=lambda r: counts[r])
    fig, ax = figure(f"Termination reasons ({sum(counts.values())} trajectories)")
    if solved is None:
        ax.barh(reasons, [counts[r] for r in reasons], color=GREY, label="trajectories")
    else:
        ok = [solved[r] for r in reasons]
        ax.barh(reasons, ok, color=GREEN, label="resolved")
        ax.barh(reasons, [counts[r] - solved[r] for r in reasons], left=ok, color=RED, label="not resolved")
    for y, r in enumerate(reasons):
        ax.annotate(f" {counts[r]}", (counts[r], y), va="center")
    ax.set_xlim(0, max(counts.values()) * 1.12)
    ax.set_xlabel("trajectories")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(fig, ax)
    return fig


def learning_signal(data: RunData) -> Figure | str:
    if data.kind != "train":
        return f"only train runs have iterations ({data.kind} runs do not)"
    its, signal = series(data.metrics, "nonzero_advantage_group_fraction")
    lines = [m for m in data.metrics if isinstance(m.get("termination_fractions"), dict) and "iteration" in m]
    if not its and not lines:
        return "metrics.jsonl has no nonzero_advantage_group_fraction or termination_fractions yet"
    fig, top, bottom = two_panels("What each iteration could learn from, and how its trajectories ended")
    top.plot(its, [100 * v for v in signal], marker="o", color=PURPLE)
    top.set_ylabel("groups with a non-zero\nadvantage (%)")
    top.set_ylim(-5, 105)
    reasons = [r for r in dict.fromkeys(k for m in lines for k in m["termination_fractions"])
               if any(m["termination_fractions"].get(r) for m in lines)]
    colors = {"submitted": GREEN, "format_errors": RED, "max_steps": ORANGE, "max_context": BLUE}
    bottom.stackplot([m["iteration"] for m in lines],
                     [[100 * float(m["termination_fractions"].get(r) or 0) for m in lines] for r in reasons],
                     labels=reasons, colors=[colors.get(r, GREY) for r in reasons], alpha=0.85)
    bottom.set_ylabel("trajectories ending\nin each way (%)")
    bottom.set_ylim(0, 100)
    bottom.set_xlabel("iteration")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    legend(fig, bottom, "termination")
    return fig


def time_split(data: RunData) -> Figure | str:
    if data.kind == "train" and data.metrics:
        return _train_time(data)
    if not data.trajectories:
        return _no_trajectories(data)
    parts = {"generation": sum(t["generate_s"] for t in data.trajectories),
             "tool execution": sum(t["tool_s"] for t in data.trajectories),
             "grading": sum(t["grading_s"] for t in data.trajectories)}
    total = sum(parts.values())
    if total <= 0:
        return "the trajectories record no timings"
    fig, ax = figure(f"Time split over {len(data.trajectories)} trajectories (summed; they run concurrently)")
    bars = ax.bar(list(parts), list(parts.values()), color=[BLUE, ORANGE, GREEN])
    ax.bar_label(bars, [f"{v:.1f} s ({100 * v / total:.0f}%)" for v in parts.values()], padding=3)
    ax.set_ylim(0, max(parts.values()) * 1.15)
    ax.set_ylabel("seconds (sum over trajectories)")
    return fig


def _train_time(data: RunData) -> Figure | str:
    phases = (("time_rollout_s", "rollout (generation, tools, grading)", BLUE),
              ("time_training_s", "training", ORANGE), ("time_weight_sync_s", "weight sync", PURPLE))
    its = [m["iteration"] for m in data.metrics if "iteration" in m]
    if not any(series(data.metrics, key)[0] for key, _, _ in phases):
        return "metrics.jsonl has no time_*_s keys"
    fig, ax = figure("Wall-clock time per training iteration")
    bottom = [0.0] * len(its)
    for key, label, color in phases:
        values = [float(m.get(key) or 0.0) for m in data.metrics if "iteration" in m]
        ax.bar(its, values, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    grading_its, grading = series(data.metrics, "time_grading_s")
    if grading_its:
        ax.plot(grading_its, grading, color=GREEN, marker="o", linestyle="--",
                label="grading (summed over trajectories; runs inside rollout)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("seconds")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(fig, ax)
    return fig


def logprob_gap(data: RunData) -> Figure | str:
    if data.kind != "train":
        return f"only train runs compare rollout and trainer logprobs ({data.kind} runs do not)"
    its, gaps = series(data.metrics, "rollout_logprob_gap")
    if not its:
        return "metrics.jsonl has no rollout_logprob_gap values (no policy update has reported one yet)"
    fig, ax = figure("Rollout vs trainer logprob gap per iteration")
    ax.plot(its, gaps, marker="o", color=RED)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean |trainer − rollout| logprob (nats/token)")
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def _no_trajectories(data: RunData) -> str:
    if data.kind == "select":
        return "select runs hold no trajectories: report the eval runs it selected from"
    return "no finished trajectories in this run yet"


# (file name, heading, plot function), in the report's order
PLOTS = (
    ("reward.png", "Reward and resolve rate", reward),
    ("gain.png", "Gain on the tasks of every iteration", task_gain),
    ("signal.png", "Learning signal and terminations per iteration", learning_signal),
    ("pass_at_k.png", "Pass@k and Best@k", pass_at_k),
    ("steps.png", "Steps per trajectory", steps),
    ("tokens.png", "Thinking and tool-call tokens per step", tokens),
    ("terminations.png", "Termination reasons", terminations),
    ("time.png", "Time split", time_split),
    ("logprob_gap.png", "Rollout vs trainer logprob gap", logprob_gap),
)
