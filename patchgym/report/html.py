"""`patchgym report RUN`: RUN/report.html with the summary table and the PNG plots in RUN/report/, referenced
relatively, so the directory can be copied anywhere and opened offline."""

import html
import time
from pathlib import Path

from patchgym.report import learning
from patchgym.report.gain import NoIterationGain, iteration_gain
from patchgym.report.plots import DPI, PLOTS, SIZE_IN, RunData
from patchgym.report.runs import read_json, run_kind, trajectory_rows
from patchgym.train.metrics_schema import read_metrics

# train metrics (patchgym.train.metrics_schema's KEYS and UPDATE_KEYS) shown per iteration in the summary table, when
# present
TRAIN_COLUMNS = ("iteration", "reward_mean", "resolve_rate", "resolved", "trajectories",
                 "nonzero_advantage_group_fraction", "steps_per_trajectory",
                 "sampled_tokens_per_trajectory", "rollout_logprob_gap", "entropy", "grad_norm", "clip_frac_high",
                 "time_iteration_s")
MAX_ROWS = 40

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 960px; color: #1d2129; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border: 1px solid #d5d9e0; padding: 3px 10px; text-align: right; }
th { background: #f1f3f6; } td:first-child, th:first-child { text-align: left; }
img { border: 1px solid #d5d9e0; max-width: 100%; height: auto; }
.skip { color: #6b7280; font-style: italic; }
"""


def load_run(run: Path) -> RunData:
    kind = run_kind(run)
    if kind == "learning":  # a benchmark's result; its stages' runs have their own reports
        return RunData(run, kind, summary=read_json(run / "learning.json") or {})
    lines = read_metrics(run) if kind == "train" else []
    warm = [m["warm_start"] for m in lines if isinstance(m.get("warm_start"), dict)]
    return RunData(run, kind, summary=read_json(run / "summary.json") or {},
                   metrics=[m for m in lines if "warm_start" not in m], trajectories=trajectory_rows(run),
                   warm_start=warm[-1] if warm else None)


def write_report(run: str | Path) -> Path:
    """Draw every plot this run has data for, write RUN/report.html, and return its path."""
    data = load_run(Path(run))
    images = data.run / "report"
    images.mkdir(exist_ok=True)
    sections = []
    for name, heading, plot in learning.PLOTS if data.kind == "learning" else PLOTS:
        result = plot(data)
        sections.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(result, str):
            (images / name).unlink(missing_ok=True)  # a stale plot of an earlier report would contradict the text
            sections.append(f'<p class="skip">Skipped: {html.escape(result)}.</p>')
        else:
            result.savefig(images / name, dpi=DPI)
            width, height = int(SIZE_IN[0] * DPI), int(SIZE_IN[1] * DPI)
            sections.append(f'<img src="report/{name}" width="{width}" height="{height}" alt="{html.escape(heading)}">')
    out = data.run / "report.html"
    title = f"patchgym {data.kind} run: {data.run.resolve().name}"
    out.write_text(f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
                   f"<style>{CSS}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
                   f"<p>{html.escape(str(data.run.resolve()))} &middot; written {time.strftime('%Y-%m-%d %H:%M')}"
                   f"</p>\n<h2>Summary</h2>\n{summary_html(data)}\n" + "\n".join(sections) + "\n</body></html>\n")
    return out


def summary_html(data: RunData) -> str:
    about = [["run kind", data.kind]]
    if data.kind not in ("select", "learning"):
        about.append(["trajectories read", str(len(data.trajectories))])
    if data.kind == "train":
        about.append(["iterations in metrics.jsonl", str(len(data.metrics))])
        if data.warm_start is not None:
            about.append(["warm start", warm_start_text(data.warm_start)])
        about.extend(gain_rows(data.trajectories))
    parts = [_table(["run", ""], about)]
    if data.kind == "train":
        if not data.metrics:
            return parts[0] + '<p class="skip">metrics.jsonl has no iterations yet.</p>'
        columns = [c for c in TRAIN_COLUMNS if any(c in m for m in data.metrics)]
        rows = [[fmt(c, m.get(c)) for c in columns] for m in data.metrics[-MAX_ROWS:]]
        if len(data.metrics) > MAX_ROWS:
            parts.append(f"<p>The last {MAX_ROWS} of {len(data.metrics)} iterations (all in metrics.jsonl):</p>")
        parts.append(_table(columns, rows))
        return "\n".join(parts)
    if data.kind == "select":
        ks = sorted({int(key.split("@")[1]) for key in data.summary
                     if "@" in key and key.split("@")[1].isdigit() and key.split("@")[0] in ("best", "pass")})
        parts.append(_table(["k", "best@k", "pass@k"],
                            [[str(k), fmt("best@", data.summary.get(f"best@{k}")),
                              fmt("pass@", data.summary.get(f"pass@{k}"))] for k in ks]))
    if not data.summary:
        return parts[0] + '<p class="skip">summary.json is not written yet.</p>'
    rows = [[key, fmt(key, value)] for key, value in flatten(data.summary).items()
            if not (data.kind == "select" and ("best@" in key or "pass@" in key))]
    parts.append(_table(["summary.json", "value"], rows))
    return "\n".join(parts)


def gain_rows(trajectories: list[dict]) -> list[list[str]]:
    """The summary rows of a train run's gain on the tasks of every iteration: the paired t-test's verdict, and the
    2-standard-error rule's, labelled as the large-sample rule it is; or why there is no gain."""
    try:
        gain = iteration_gain(trajectories)
    except NoIterationGain as why:
        return [["gain on the tasks of every iteration", str(why)]]
    rows = [["gain on the tasks of every iteration", gain.verdict]]
    if gain.gain.tasks > 1:
        rows.append(["the same gain, large-sample rule (too lenient with few tasks)", gain.two_se_verdict])
    return rows


def warm_start_text(warm: dict) -> str:
    """One line on the warm start: what it trained on and how its SFT loss went, epoch by epoch."""
    losses = " -> ".join(f"{x:.4g}" for x in warm.get("sft_loss") or [])
    return (f"{warm.get('epochs')} epochs of SFT on {warm.get('trajectories')} demonstrations "
            f"({warm.get('tokens')} tokens) from {warm.get('source', '?')}; loss per epoch {losses or 'n/a'}")


def flatten(record: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def fmt(key: str, value) -> str:
    """A summary value as a person reads it: rates in %, floats to 4 significant digits, lists comma-joined."""
    if value is None:
        return "n/a"
    if isinstance(value, list):
        return ", ".join(fmt(key, v) for v in value[:20]) + (" ..." if len(value) > 20 else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and any(mark in key for mark in ("pass@", "best@", "rate", "fraction")):
        return f"{100 * value:.1f}%"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>\n{body}</table>"
