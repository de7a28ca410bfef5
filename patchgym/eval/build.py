"""Build an evaluation from the run config and run it: eval's defaults (defaults.yaml beside this file), the agent
(a model through its engine, or a reference script) and the run directory. `patchgym eval` only parses arguments."""

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from patchgym.agent.scripts import SCRIPTS, has_solution
from patchgym.config import Config, dump_config, load_config
from patchgym.errors import UserError
from patchgym.eval.run import evaluate
from patchgym.inference import Engine
from patchgym.inference.factory import make_engine
from patchgym.rollout import Agent, ModelAgent, ScriptedAgent
from patchgym.tasks import read_tasks

EVAL_DEFAULTS = Path(__file__).with_name("defaults.yaml")


@dataclass(frozen=True)
class EvalRun:
    run_dir: Path
    summary: dict  # what RUN/summary.json holds
    warnings: tuple[str, ...] = ()  # what the caller should tell the user beside the summary


def load_eval_config(files: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> Config:
    """The config an evaluation runs with: configs/default.yaml's values, then EVAL_DEFAULTS, `files`, `overrides`."""
    return load_config([EVAL_DEFAULTS, *files], overrides)


def run_eval(config: Config, tasks_file: Path, *, script: str | None = None, runs: int = 1, out: Path | None = None,
             limit: int | None = None, progress: bool = True) -> EvalRun:
    """Evaluate the reference `script` (`patchgym eval --policy`), or else config.inference's model, `runs` times on
    each of the first `limit` tasks in `tasks_file`; in `out` (default RUN_DIR/eval-<name>-<time>), which a rerun
    resumes."""
    if script is not None and script not in SCRIPTS:
        raise UserError(f"unknown policy {script!r}; choose one of {', '.join(SCRIPTS)}")  # the flag's name
    tasks = read_tasks(tasks_file)[:limit]
    name = script or Path(config.inference.model).name
    out = out or Path(config.run_dir) / f"eval-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(config))
    agent, engine = make_agent(config, script)
    try:
        summary = evaluate(tasks, agent, config.sandbox, out, runs=runs, rollout=config.rollout, model_name=name,
                           progress=progress, tasks_file=tasks_file.resolve())
    finally:
        if engine is not None:
            engine.close()
    unplayable = [t.instance_id for t in tasks if script == "oracle" and not has_solution(t)]
    warnings = (f"the oracle had nothing to play on {len(unplayable)} task(s), which carry no gold patch or "
                f"solution/ folder, and only called finish: {', '.join(unplayable)}",) if unplayable else ()
    return EvalRun(out, summary, warnings)


def make_agent(config: Config, script: str | None) -> tuple[Agent, Engine | None]:
    """The agent to evaluate, and the engine it generates with (None for a script) for the caller to close."""
    if script is not None:
        return ScriptedAgent(SCRIPTS[script](), config.agent), None
    engine = make_engine(config.inference)
    return ModelAgent(engine, config.agent, model=config.inference.model), engine
