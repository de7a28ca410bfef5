"""The ReAct loop: prompt ids -> engine.generate -> env.step -> observation ids appended, until a limit or finish.

Each trajectory ends with exactly one termination reason (patchgym.agent.trajectory.Termination); the record is
saved after every turn and once more at the end, also when an exception escapes.
"""

import time
from pathlib import Path

from patchgym.agent import tokens
from patchgym.agent.config import AgentConfig, render
from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.env.swe_env import SWEEnv
from patchgym.env.tools import TOOL_SCHEMAS, parse_tool_call
from patchgym.inference import Engine
from patchgym.sandbox import SandboxConfig, SandboxError
from patchgym.tasks import Task


class Terminated(Exception):
    """Ends the episode; `reason` is its termination reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def open_env(sandbox: SandboxConfig, config: AgentConfig) -> SWEEnv:
    """The environment an agent with `config` expects: its per-command timeout applies to every tool call."""
    return SWEEnv(sandbox, command_timeout=config.command_timeout_s)


def run_agent(task: Task, engine: Engine, env: SWEEnv, config: AgentConfig, *,
              save_path: str | Path | None = None) -> Trajectory:
    """Run one episode of `task` in `env` (reset here; closing it is the caller's) and return its record.

    A SandboxError (from reset, a step or the final diff) is the `infra_error` termination; any other exception
    propagates after the partial record is saved.
    """
    trajectory = Trajectory(task_id=task.instance_id, engine=describe_engine(engine),
                            sampling=config.sampling.model_dump(), started_at=time.time())
    start = time.monotonic()
    save = (lambda: trajectory.save_atomic(save_path)) if save_path is not None else (lambda: None)
    try:
        try:
            _episode(trajectory, task, engine, env, config, start, save)
        except Terminated as end:
            trajectory.termination = end.reason
        trajectory.patch = env.patch()
    except SandboxError as exc:
        trajectory.termination, trajectory.error = "infra_error", f"{type(exc).__name__}: {exc}"
    finally:
        trajectory.seconds = time.monotonic() - start
        save()
    return trajectory


def describe_engine(engine: Engine) -> dict:
    return {"class": type(engine).__name__, "model": getattr(engine.tokenizer, "name_or_path", "")}


def _episode(trajectory: Trajectory, task: Task, engine: Engine, env: SWEEnv, config: AgentConfig,
             start: float, save) -> None:
    """Play turns until one raises Terminated."""
    tokenizer = engine.tokenizer
    statement = env.reset(task)
    messages = trajectory.messages
    messages += [{"role": "system", "content": render(config.system_prompt, tools=TOOL_SCHEMAS)},
                 {"role": "user", "content": render(config.instance_prompt, problem_statement=statement,
                                                    workdir=task.workdir, task=task)}]
    ids: list[int] = []  # every token the model has seen or sampled, in order
    segment = tokens.prompt_ids(tokenizer, messages)
    consecutive_errors = 0
    for step in range(config.max_steps):
        if time.monotonic() - start > config.max_seconds:
            raise Terminated("timeout")
        room = config.max_context_tokens - len(ids) - len(segment)
        if room < 1:  # not even one token could be sampled after this prompt
            raise Terminated("max_context")
        ids += segment
        turn = _generate(engine, config, messages, ids, segment, step, room)
        ids += turn.completion_ids + turn.close_ids
        trajectory.turns.append(turn)  # before acting: if the sandbox dies now, turns still match messages
        done = _act(env, turn)
        save()
        if done:
            raise Terminated("submitted")
        consecutive_errors = consecutive_errors + 1 if turn.format_error else 0
        if consecutive_errors >= config.max_format_errors:
            raise Terminated("format_errors")
        remaining = config.max_steps - step - 1
        if remaining == 0:
            break
        observation = {"role": config.observation_role,
                       "content": render(config.observation_template, observation=turn.observation,
                                         steps_remaining=remaining)}
        segment = tokens.observation_ids(tokenizer, messages, observation)
        messages.append(observation)
    raise Terminated("max_steps")


def _generate(engine: Engine, config: AgentConfig, messages: list[dict], ids: list[int], segment: list[int],
              step: int, room: int) -> Turn:
    """Sample one turn after `ids` (which end with `segment`) and append the assistant message to `messages`."""
    began = time.monotonic()
    generation = engine.generate(ids, config.sampling.params(step, min(config.sampling.max_new_tokens, room)))
    elapsed = time.monotonic() - began
    content, close = tokens.close_completion(engine.tokenizer, messages, generation.token_ids)
    messages.append({"role": "assistant", "content": content})
    return Turn(prompt_ids=segment, completion_ids=list(generation.token_ids), logprobs=list(generation.logprobs),
                finish_reason=generation.finish_reason, close_ids=close, action=content, generate_s=elapsed)


def _act(env: SWEEnv, turn: Turn) -> bool:
    """Run the turn's action, record the call and the answer on the turn; True when the agent submitted."""
    began = time.monotonic()
    result = env.step(turn.action)
    turn.step_s = time.monotonic() - began
    turn.observation = result.observation
    turn.exit_code = result.info.get("exit_code")
    turn.format_error = bool(result.info.get("format_error"))
    if not turn.format_error:  # the environment parsed the same text, so this parse succeeds too
        call = parse_tool_call(turn.action)
        turn.tool_call = {"name": call.name, "arguments": call.arguments}
    return result.done
