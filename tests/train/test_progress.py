"""The progress line of training steps where the output is not a terminal (a log file): plain lines at the first
step, at most one per interval after it, and at the last, each with the step, what it measured and the time left;
nothing when it is off. A real warm start's steps print it too."""

import io

from rich.console import Console

from patchgym.train.progress import StepBar
from patchgym.train.sft import run_sft
from patchgym.train.update import make_optimizer


def log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_a_log_gets_the_first_step_the_last_and_one_line_per_interval_between():
    console, out = log_console()
    with StepBar("warm start", 4, every_s=3600, console=console) as bar:
        for step in range(4):
            bar.update(bar.task_ids[0], advance=1, description=f"epoch 1/1, loss {1 / (step + 1):.3f}")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("warm start: 1/4, epoch 1/1, loss 1.000, 0:00:00 elapsed, 0:00:00 left")
    assert lines[1].startswith("warm start: 4/4, epoch 1/1, loss 0.250, ")

    console, out = log_console()
    with StepBar("pivot", 3, every_s=0, console=console) as bar:
        for _ in range(3):
            bar.update(bar.task_ids[0], advance=1, description="reward 0.5")
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == ["pivot: 1/3", "pivot: 2/3", "pivot: 3/3"]

    console, out = log_console()
    with StepBar(None, 3, every_s=0, console=console) as bar:
        bar.update(bar.task_ids[0], advance=3, description="reward 0.5")
    assert out.getvalue() == ""


def test_a_warm_start_shows_its_steps_in_a_log(tiny, monkeypatch):
    from patchgym.train import sft
    from patchgym.train.batch import TrainSequence

    console, out = log_console()
    monkeypatch.setattr(sft, "step_bar", lambda label, total: StepBar(label, total, every_s=0, console=console))
    from patchgym.inference.models import tiny_model

    model = tiny_model()[0]  # its own copy: the session's tiny model stays untrained
    sequences = [TrainSequence([1, 2, 3, 4], [0, 1, 1, 1], [0.0] * 4, 1.0)]
    plan = [[sequences, sequences], [sequences]]
    result = run_sft(model, make_optimizer(model, 1e-3, 0.0, (0.9, 0.999)), None, plan, micro_token_budget=64,
                     max_grad_norm=1.0, progress="warm start")
    lines = out.getvalue().splitlines()
    assert result.steps == 3 and len(lines) == 3, lines
    assert lines[0].startswith("warm start: 1/3, epoch 1/2, loss ")
    assert lines[2].startswith("warm start: 3/3, epoch 2/2, loss ")
    assert all(" elapsed, " in line and line.endswith(" left") for line in lines)
