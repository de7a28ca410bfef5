"""The plots of a learning benchmark's directory (bench/learning.py writes DIR/learning.json): each RL run's resolve
rate per iteration over the kept tasks with its standard error over tasks (the run and its flipped control), and
each run's paired gain on those tasks (before: its first iteration's rollouts; after: its final eval) with ± 2 standard
errors."""

from matplotlib.figure import Figure

from patchgym.report.plots import GREEN, GREY, RED, RunData, figure, legend, rate_axes, rate_curve

RUNS = (("rl", "GRPO++", GREEN), ("flipped", "flipped advantages (control)", RED))


def iteration_rates(data: RunData) -> Figure | str:
    runs = data.summary.get("runs") or {}
    if not any((runs.get(name) or {}).get("curve") for name, _, _ in RUNS):
        return "learning.json has no training iterations yet"
    fig, ax = figure("Resolved per iteration on the kept tasks (bars: ± 2 standard errors over tasks)")
    for offset, (name, label, colour) in zip((-0.05, 0.05), RUNS):
        points = (runs.get(name) or {}).get("curve") or []
        if points:
            rate_curve(ax, points, colour, label, offset)
    rate_axes(fig, ax)
    return fig


def paired_gains(data: RunData) -> Figure | str:
    runs = data.summary.get("runs") or {}
    shown = [(name, label, colour) for name, label, colour in RUNS if (runs.get(name) or {}).get("gain")]
    if not shown:
        return "learning.json has no final evaluation yet"
    fig, ax = figure("Paired gain on the kept tasks: final eval - first iteration (bars: ± 2 standard errors)")
    for i, (name, label, colour) in enumerate(shown):
        gain = runs[name]["gain"]
        ax.errorbar([i], [100 * gain["mean"]], yerr=[200 * gain["se"]], fmt="o", capsize=6, color=colour,
                    label=f"{label}: {100 * gain['mean']:+.1f} ± {200 * gain['se']:.1f} pts over {gain['tasks']} tasks")
    ax.axhline(0, color=GREY, linewidth=1)
    ax.set_xticks(range(len(shown)), [label for _, label, _ in shown])
    ax.set_xlim(-0.5, len(shown) - 0.5)
    ax.set_ylabel("resolve-rate change (percentage points)")
    legend(fig, ax)
    return fig


PLOTS = (
    ("learning_iterations.png", "Resolved per iteration, run and flipped control", iteration_rates),
    ("learning_gain.png", "Paired gain on the kept tasks", paired_gains),
)
