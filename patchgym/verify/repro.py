"""Reproduction tests written by a model from the issue text: `verifier.repro_tests` scripts per task, sampled
concurrently (the engine batches them); each is the first Python code block of its answer."""

import asyncio
import re
from collections.abc import Callable, Sequence

from patchgym.agent.config import render
from patchgym.agent.loop import engine_generate
from patchgym.agent.tokens import prompt_ids
from patchgym.tasks import Task
from patchgym.verify.config import VerifierConfig

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
MIN_NEW_TOKENS = 32  # a prompt that leaves less room than this in the context gets no test


def extract_code(text: str) -> str:
    """The first fenced code block of `text` (an unclosed one runs to the end), else the whole text."""
    match = _FENCE.search(text)
    return (match.group(1) if match else text).strip() + "\n"


def repro_messages(task: Task, config: VerifierConfig) -> list[dict]:
    return [{"role": "system", "content": render(config.repro_system_prompt, task=task)},
            {"role": "user", "content": render(config.repro_prompt, problem_statement=task.problem_statement,
                                               task=task)}]


def generate_repro_tests(engine, tasks: Sequence[Task], config: VerifierConfig,
                         advance: Callable[[], None] = lambda: None) -> dict[str, list[str]]:
    """{task id: [script source]}; an empty or whitespace-only answer is left out. `advance()` per answer."""
    return asyncio.run(_generate_all(engine, tasks, config, advance))


async def _generate_all(engine, tasks: Sequence[Task], config: VerifierConfig,
                        advance: Callable[[], None]) -> dict[str, list[str]]:
    keys = [(task, i) for task in tasks for i in range(config.repro_tests)]

    async def one(task: Task, index: int) -> str:
        code = await _one(engine, task, index, config)
        advance()
        return code

    # gather returns results in the order of its arguments, so each script stays with its (task, index).
    answers = await asyncio.gather(*(one(task, i) for task, i in keys))
    found: dict[str, list[str]] = {task.instance_id: [] for task in tasks}
    for (task, _), code in zip(keys, answers):
        if code.strip():
            found[task.instance_id].append(code)
    return found


async def _one(engine, task: Task, index: int, config: VerifierConfig) -> str:
    messages = repro_messages(task, config)
    ids = prompt_ids(engine.tokenizer, messages)
    context = getattr(engine, "max_len", None)
    room = config.repro_sampling.turn_tokens if context is None else context - len(ids) - 1
    if room < MIN_NEW_TOKENS:
        return ""
    params = config.repro_sampling.params(index, min(config.repro_sampling.turn_tokens, room))
    generation = await engine_generate(engine, ids, messages, params)
    return extract_code(engine.tokenizer.decode(generation.token_ids, skip_special_tokens=True))
