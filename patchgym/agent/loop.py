"""The ReAct loop: prompt ids -> engine.generate -> env.step -> observation ids appended, until a limit or finish.

Each trajectory ends with exactly one termination reason (patchgym.agent.trajectory.Termination); the record is
saved after every turn and once more at the end, also when an exception escapes.

`arun_agent` is the loop itself, a coroutine: generation is awaited (so many trajectories share one batching engine)
and the environment's blocking calls run in worker threads. `run_agent` is the same loop for one caller. It is the
only ReAct loop: scripts play through it too, as text-only engines (patchgym.agent.scripts).

An engine without a tokenizer (a script) gives text, not ids: its turns record no token ids, and the
context limit does not apply to it.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from patchgym.agent import tokens
from patchgym.agent.config import AgentConfig, render
from patchgym.agent.context import cut_to_fit
from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.env.base import Env
from patchgym.env.swe_env import SWEEnv
from patchgym.env.tools import tool_schemas
from patchgym.errors import UserError
from patchgym.inference import Engine, Generation, SamplingParams
from patchgym.sandbox import DiffFailed, DiffTooLarge, SandboxConfig, SandboxError, SandboxKilled
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import Task


class Terminated(Exception):
    """Ends the episode; `reason` is its termination reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def open_env(sandbox: SandboxConfig, config: AgentConfig, *, pools: PoolSet | None = None) -> SWEEnv:
    """The environment an agent with `config` expects: its per-command timeout applies to every tool call.
    `pools`: its sandboxes come from these warm pools."""
    return SWEEnv(sandbox, command_timeout=config.command_timeout_s, pools=pools)


Generate = Callable[[list[int], list[dict], SamplingParams], Awaitable[Generation]]


def run_agent(task: Task, engine: Engine, env: Env, config: AgentConfig, *,
              save_path: str | Path | None = None) -> Trajectory:
    """Run one episode of `task` in `env` (reset here; closing it is the caller's) and return its record.

    Generation calls `engine.generate` (in a worker thread). A SandboxKilled (the sandbox died during the agent's
    own command) is the `sandbox_killed` termination; any other SandboxError (from reset, a step or the final diff)
    is `infra_error`; a final patch over `config.max_patch_bytes` is `patch_too_large`, and one git cannot make in
    a sandbox that still answers is `patch_failed`; any other exception propagates after the partial record is
    saved.
    """
    async def generate(ids: list[int], messages: list[dict], params: SamplingParams) -> Generation:
        if engine.needs_messages:
            return await asyncio.to_thread(engine.generate_chat, messages, params)
        return await asyncio.to_thread(engine.generate, ids, params)

    return asyncio.run(arun_agent(task, engine, env, config, save_path=save_path, generate=generate))


async def arun_agent(task: Task, engine: Engine, env: Env, config: AgentConfig, *,
                     save_path: str | Path | None = None, generate: Generate | None = None,
                     engine_info: dict | None = None) -> Trajectory:
    """The loop as a coroutine. `generate(ids, messages, params)` samples one turn: by default the engine's
    `agenerate` on the ids (or `agenerate_chat` on the messages, for engines that only take chats).
    `engine_info` is recorded as the trajectory's `engine` (default: the engine's class and model).

    Cancelled (Ctrl-C), it closes the environment at once: a tool call running in a worker thread then fails
    fast instead of holding the sandbox, and the partial record is saved.
    """
    generate = generate or (lambda ids, messages, params: engine_generate(engine, ids, messages, params))
    trajectory = Trajectory(task_id=task.instance_id, engine=engine_info or describe_engine(engine),
                            sampling=config.sampling.model_dump(), started_at=time.time())
    start = time.monotonic()
    save = (lambda: trajectory.save_atomic(save_path)) if save_path is not None else (lambda: None)
    try:
        try:
            await _episode(trajectory, task, engine, env, config, start, save, generate)
        except Terminated as end:
            trajectory.termination = end.reason
        try:
            trajectory.patch = await asyncio.to_thread(env.patch, config.max_patch_bytes)
        except DiffTooLarge as exc:  # neither written nor graded: only its size is kept
            trajectory.termination, trajectory.error = "patch_too_large", f"{exc} (agent.max_patch_bytes)"
        except DiffFailed as exc:  # the sandbox answers, but what the agent did leaves no diff to grade
            trajectory.termination, trajectory.error = "patch_failed", str(exc)
    except SandboxKilled as exc:  # the agent's own command ended its sandbox: its outcome, scored 0
        trajectory.termination, trajectory.error = "sandbox_killed", f"{type(exc).__name__}: {exc}"
    except SandboxError as exc:
        trajectory.termination, trajectory.error = "infra_error", f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        env.close()  # thread-safe: unblocks a tool call in flight
        raise
    finally:
        trajectory.seconds = time.monotonic() - start
        save()
    return trajectory


async def engine_generate(engine: Engine, ids: list[int], messages: list[dict], params: SamplingParams) -> Generation:
    """One turn from any engine: token ids in, or the chat messages for engines that only take chats."""
    if engine.needs_messages:
        return await engine.agenerate_chat(messages, params)
    return await engine.agenerate(ids, params)


def describe_engine(engine: Engine) -> dict:
    """Engine class and model, and the chat template its tokenizer renders with (check-tokens re-renders with it)."""
    template = getattr(engine.tokenizer, "chat_template", None)
    return {"class": type(engine).__name__, "model": getattr(engine.tokenizer, "name_or_path", ""),
            **({"chat_template": template} if isinstance(template, str) else {})}


async def _episode(trajectory: Trajectory, task: Task, engine: Engine, env: Env, config: AgentConfig,
                   start: float, save, generate: Generate) -> None:
    """Play turns until one raises Terminated."""
    tokenizer = engine.tokenizer
    if config.max_thinking_tokens is not None and tokenizer is not None and engine.needs_messages:
        raise UserError("agent.max_thinking_tokens: this engine takes only chat messages, so sampling cannot "
                        "resume after an inserted thought closing; unset it or use an engine that takes token ids")
    statement = await asyncio.to_thread(env.reset, task)
    messages = trajectory.messages
    schemas = tool_schemas(task.workdir, config.command_timeout_s)
    trajectory.tools = tools = schemas if config.tool_format == "native" else None
    first = config.instruction_prompt if task.harbor is not None else config.instance_prompt
    messages += [{"role": "system", "content": render(config.system_prompt, tools=schemas, task=task)},
                 {"role": "user", "content": render(first, problem_statement=statement, workdir=task.workdir,
                                                    task=task)}]
    trajectory.history = config.history
    stepwise = config.history == "template"  # each turn's prompt is rendered whole, not appended to
    ids: list[int] = []  # every token the model has seen or sampled, in order (step-wise: this turn's)
    segment = tokens.prompt_ids(tokenizer, messages, tools, config.history) if tokenizer is not None else []
    consecutive_errors = 0
    for step in range(config.max_steps):
        if time.monotonic() - start > time_limit(config, task):
            raise Terminated("timeout")
        ids = [] if stepwise else ids
        room = config.max_context_tokens - (len(ids) + len(segment) if tokenizer is not None else 0)
        if room < 1:  # not even one token could be sampled after this prompt
            raise Terminated("max_context")
        ids += segment
        turn = await sample_turn(generate, tokenizer, config, messages, ids, segment, step, room, tools)
        ids += turn.output_ids + turn.close_ids
        trajectory.turns.append(turn)  # before acting: if the sandbox dies now, turns still match messages
        done = await asyncio.to_thread(_act, env, turn)
        save()
        if done:
            raise Terminated("submitted")
        consecutive_errors = consecutive_errors + 1 if turn.format_error else 0
        if consecutive_errors >= config.max_format_errors:
            raise Terminated("format_errors")
        remaining = config.max_steps - step - 1
        if remaining == 0:
            break
        observation, segment = _observation(tokenizer, config, messages, turn, tools, remaining,
                                            used=0 if stepwise else len(ids))
        messages.append(observation)
    raise Terminated("max_steps")


def _observation(tokenizer, config: AgentConfig, messages: list[dict], turn: Turn, tools: list[dict] | None,
                 remaining: int, used: int) -> tuple[dict, list[int]]:
    """The observation message answering `turn` and the next prompt's ids; with truncate_observation, an output
    after which a whole turn would not fit in the `used` context is cut (the turn records how much)."""
    def message(text: str) -> dict:
        return {"role": config.observation_role,
                "content": render(config.observation_template, observation=text, steps_remaining=remaining)}

    def segment_of(text: str) -> list[int]:
        return _next_prompt(tokenizer, messages, message(text), tools, config.history)

    text, segment = turn.observation, segment_of(turn.observation)
    if config.on_context_full == "truncate_observation" and tokenizer is not None:
        limit = config.max_context_tokens - used - config.sampling.turn_tokens
        text, segment, turn.observation_cut_tokens = cut_to_fit(tokenizer, text, segment_of, limit)
    return message(text), segment


def _next_prompt(tokenizer, messages: list[dict], observation: dict, tools: list[dict] | None,
                 history: str) -> list[int]:
    """The ids of the next turn's prompt segment: the observation's delta (keep) or the whole prompt (template)."""
    if tokenizer is None:
        return []
    if history == "template":
        return tokens.prompt_ids(tokenizer, [*messages, observation], tools, history)
    return tokens.observation_ids(tokenizer, messages, observation, tools)


async def sample_turn(generate: Generate, tokenizer, config: AgentConfig, messages: list[dict], ids: list[int],
                      segment: list[int], step: int, room: int, tools: list[dict] | None) -> Turn:
    """Sample one turn after `ids` (which end with `segment`) and append the assistant message to `messages`
    (the pivot stage samples its actions at decision points through this too)."""
    began = time.monotonic()
    params = config.sampling.params(step, min(config.sampling.turn_tokens, room))
    if tokenizer is None:  # a text-only engine: its text is the message, and no token was sampled
        generation = await generate(list(ids), messages, params)
        text = generation.text or ""
        sampled, at, inserted = tokens.SampledTurn(text, "", text, [], 0, 0), 0, []
    else:
        generation, at, inserted = await _sample(generate, tokenizer, config, messages, ids, params, room, tools)
        sampled = tokens.sampled_turn(tokenizer, messages, generation.token_ids, tools, at, inserted)
    elapsed = time.monotonic() - began
    messages.append({"role": "assistant", "content": sampled.content})
    return Turn(prompt_ids=segment, completion_ids=list(generation.token_ids), logprobs=list(generation.logprobs),
                finish_reason=generation.finish_reason, thought_close_ids=inserted, thought_close_at=at,
                close_ids=sampled.close_ids, action=sampled.action, reasoning=sampled.reasoning,
                thinking_tokens=sampled.thinking_tokens, action_tokens=sampled.action_tokens, generate_s=elapsed,
                exact=getattr(generation, "exact", True))


async def _sample(generate: Generate, tokenizer, config: AgentConfig, messages: list[dict], ids: list[int],
                  params: SamplingParams, room: int, tools: list[dict] | None) -> tuple[Generation, int, list[int]]:
    """(the turn's sampled ids, where a thought closing goes in them, its ids). Under agent.max_thinking_tokens the
    first max_thinking_tokens ids are sampled alone; if a thought is still open then, the template's thought
    closing is appended (unsampled) and sampling resumes after it, as it does after a thought that closed in time:
    the model sees the same ids it would in one call, and the turn keeps its max_new_tokens in all."""
    limit = config.max_thinking_tokens
    if limit is None or limit >= params.max_new_tokens:
        return await generate(list(ids), messages, params), 0, []
    first = await generate(list(ids), messages, replace(params, max_new_tokens=limit))
    if first.finish_reason != "length":
        return first, 0, []
    cut = tokens.thought_is_open(tokenizer, messages, first.token_ids, tools)
    inserted = tokens.thought_closing_ids(tokenizer, messages, tools) if cut else []
    left = min(params.max_new_tokens, room - len(inserted)) - len(first.token_ids)
    if left < 1:  # no room for an action after the closing: the turn ends cut, as it would without the limit
        return first, 0, []
    rest = await generate([*ids, *first.token_ids, *inserted], messages, replace(params, max_new_tokens=left))
    joined = Generation(first.token_ids + rest.token_ids, first.logprobs + rest.logprobs, rest.finish_reason,
                        exact=first.exact and rest.exact)
    return joined, len(first.token_ids) if cut else 0, inserted


def _act(env: Env, turn: Turn) -> bool:
    """Run the turn's action, record the call and the answer on the turn; True when the agent submitted."""
    began = time.monotonic()
    result = env.step(turn.action)
    turn.step_s = time.monotonic() - began
    turn.observation, turn.exit_code = result.observation, result.exit_code
    turn.format_error = result.call is None
    if result.call is not None:
        turn.tool_call = {"name": result.call.name, "arguments": result.call.arguments}
    return result.done


def time_limit(config: AgentConfig, task: Task) -> float:
    """An episode's wall clock: agent.max_seconds, or a Harbor task's own agent timeout where that is shorter (a
    multi-step task's: the sum of its steps', each step's own being kept by the environment)."""
    own = task.harbor.agent_timeout_s if task.harbor is not None else None
    if task.harbor is not None and task.harbor.steps:
        each = [s.agent_timeout_s for s in task.harbor.steps]
        own = None if None in each else sum(each)
    return config.max_seconds if own is None else min(config.max_seconds, own)
