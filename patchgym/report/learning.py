"""The plots of a learning benchmark's directory (bench/learning.py writes DIR/learning.json): resolve rate with its
standard error at each stage (base, warm start, GRPO++, flipped control) on the RL and the held-out tasks, and the
mean reward per iteration of the RL run beside its flipped control."""

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from patchgym.report.plots import BLUE, GREEN, GREY, RED, RunData, figure, legend

STAGES = (("base", "base model"), ("warm", "warm start"), ("rl", "GRPO++"), ("flipped", "flipped control"))


def stage_rates(data: RunData) -> Figure | str:
    splits = [(split, label, colour) for split, label, colour in
              (("train", "RL tasks", BLUE), ("heldout", "held-out tasks", GREY)) if data.summary.get(split)]
    if not splits:
        return "learning.json has no resolve rates yet"
    fig, ax = figure("Resolve rate per stage (T = 1; bars: ± 2 standard errors over tasks)")
    for offset, (split, label, colour) in zip((-0.1, 0.1), splits):
        rates = data.summary[split]
        points = [(i + offset, rates[stage]) for i, (stage, _) in enumerate(STAGES) if stage in rates]
        ax.errorbar([x for x, _ in points], [100 * r["rate"] for _, r in points],
                    yerr=[200 * r["se"] for _, r in points], fmt="o", capsize=4, color=colour,
                    label=f"{label} ({points[0][1]['tasks']} tasks)" if points else label)
    ax.set_xticks(range(len(STAGES)), [name for _, name in STAGES])
    ax.set_ylabel("resolved (% of attempts, mean over tasks)")
    ax.set_ylim(-5, 105)
    legend(fig, ax)
    return fig


def reward_curves(data: RunData) -> Figure | str:
    curves = data.summary.get("curves") or {}
    if not any(curves.values()):
        return "learning.json has no training iterations yet"
    fig, ax = figure("Mean reward per GRPO++ iteration: the run and its flipped control")
    for name, label, colour in (("rl", "GRPO++", GREEN), ("flipped", "flipped advantages", RED)):
        points = [(x["iteration"], x["reward_mean"]) for x in curves.get(name) or [] if x.get("reward_mean") is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colour, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean reward of the iteration's rollouts")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(fig, ax)
    return fig


PLOTS = (
    ("learning_rates.png", "Resolve rate per stage", stage_rates),
    ("learning_reward.png", "Reward per iteration, run and flipped control", reward_curves),
)
