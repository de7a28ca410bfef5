"""The execution-free verifier: a model reads the issue, a condensed trajectory and the final patch, and the score is
P(YES) = exp(lp_yes) / (exp(lp_yes) + exp(lp_no)) at the verdict position, the first token after the assistant's
generation prompt (docs/algorithms.md §6).

The same judge prompt, with the verdict as the target, is what `train-verifier` fine-tunes on.
"""

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from patchgym.agent.config import render
from patchgym.agent.tokens import prompt_ids, render_ids
from patchgym.agent.trajectory import Trajectory
from patchgym.tasks import Task
from patchgym.verify.config import VerifierConfig
from patchgym.verify.scoring import VerifierError, batch_next_token_logprobs, p_yes

_ISSUE = re.compile(r"<github_issue>\s*(.*?)\s*</github_issue>", re.DOTALL)
_MIN_CHARS = 100  # condensing never cuts an observation or action below this


@dataclass(frozen=True)
class JudgePrompt:
    messages: list[dict]
    ids: list[int]


def verdict_ids(tokenizer, config: VerifierConfig) -> tuple[int, int]:
    """The token ids of YES and NO at the verdict position, as the chat template renders an assistant answer.

    A label the tokenizer splits (SmolLM2: "YES" -> "Y", "ES") is read at its first token, which must differ
    between the two labels.
    """
    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    before = prompt_ids(tokenizer, probe)
    found = []
    for label in (config.yes_label, config.no_label):
        full = render_ids(tokenizer, [*probe, {"role": "assistant", "content": label}], add_generation_prompt=False)
        if full[:len(before)] != before or len(full) == len(before):
            raise VerifierError(f"the chat template does not render the answer {label!r} right after its "
                                "generation prompt; the verdict position is undefined")
        found.append(full[len(before)])
    if found[0] == found[1]:
        raise VerifierError(f"verifier.yes_label {config.yes_label!r} and verifier.no_label {config.no_label!r} start "
                            f"with the same token ({found[0]}); choose labels whose first tokens differ")
    return found[0], found[1]


def problem_statement(trajectory: Trajectory, task: Task | None) -> str:
    """The task's statement, or (when only the trajectory is known) the issue in its first user message."""
    if task is not None:
        return task.problem_statement.strip()
    first = next((m["content"] for m in trajectory.messages if m.get("role") == "user"), "")
    match = _ISSUE.search(first)
    return match.group(1) if match else first


def judge_prompt(tokenizer, trajectory: Trajectory, task: Task | None, config: VerifierConfig,
                 max_tokens: int) -> JudgePrompt:
    """The judge's messages and prompt ids (ending with the generation prompt), condensed to `max_tokens`:
    observations and actions are cut shorter and shorter, then steps are dropped from the middle."""
    statement = problem_statement(trajectory, task)
    last = None
    for obs_chars, action_chars, keep, patch_chars in _condensations(trajectory, config):
        steps = _steps(trajectory, obs_chars, action_chars, keep)
        user = render(config.prompt, problem_statement=_cut(statement, patch_chars), steps=steps,
                      patch=_cut(trajectory.patch, patch_chars), task=task)
        messages = [{"role": "system", "content": render(config.system_prompt, task=task)},
                    {"role": "user", "content": user}]
        last = JudgePrompt(messages, prompt_ids(tokenizer, messages))
        if len(last.ids) <= max_tokens:
            return last
    raise VerifierError(f"{trajectory.trajectory_id}: the judge prompt has {len(last.ids)} tokens even condensed "
                        f"to the bone; the limit is {max_tokens} (verifier.max_prompt_tokens, the model's context)")


def _condensations(trajectory: Trajectory, config: VerifierConfig) -> Iterator[tuple[int, int, int | None, int]]:
    """(observation chars, action chars, steps kept or None for all, patch/issue chars), loosest first."""
    obs, action, whole = config.observation_chars, config.action_chars, 1 << 30
    yield obs, action, None, whole
    while obs > _MIN_CHARS or action > _MIN_CHARS:
        obs, action = max(_MIN_CHARS, obs // 2), max(_MIN_CHARS, action // 2)
        yield obs, action, None, whole
    keep = len(trajectory.turns)
    while keep > 2:
        keep //= 2
        yield obs, action, keep, whole
    for chars in (16000, 8000, 4000, 2000, 1000):
        yield obs, action, 2, chars


def _steps(trajectory: Trajectory, obs_chars: int, action_chars: int, keep: int | None) -> list[dict]:
    """The template's steps; with `keep`, the first step and the last keep - 1, the middle as one `omitted`."""
    steps = [{"index": i + 1, "action": _cut(t.action, action_chars), "observation": _cut(t.observation, obs_chars),
              "omitted": 0} for i, t in enumerate(trajectory.turns)]
    if keep is None or len(steps) <= keep:
        return steps
    tail = steps[len(steps) - (keep - 1):] if keep > 1 else []
    gap = {"index": 0, "action": "", "observation": "", "omitted": len(steps) - 1 - len(tail)}
    return [steps[0], gap, *tail]


def _cut(text: str, limit: int) -> str:
    """`text` with its middle replaced by a marker when longer than `limit` characters."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def prompt_limit(engine, config: VerifierConfig) -> int:
    """The longest judge prompt: the config's limit, and below the context of an in-process model."""
    context = getattr(engine, "max_len", None)
    return config.max_prompt_tokens if context is None else min(config.max_prompt_tokens, context - 1)


def score_trajectories(engine, candidates: Mapping[str, tuple[Trajectory, Task | None]], config: VerifierConfig,
                       advance: Callable[[int], None] = lambda n: None) -> dict[str, float]:
    """{candidate id: P(YES)} for every candidate, batched over the engine; keyed by id from end to end."""
    yes, no = verdict_ids(engine.tokenizer, config)
    limit = prompt_limit(engine, config)
    prompts = {key: judge_prompt(engine.tokenizer, trajectory, task, config, limit)
               for key, (trajectory, task) in candidates.items()}
    logprobs = batch_next_token_logprobs(
        engine, {key: p.ids for key, p in prompts.items()}, [yes, no],
        messages={key: p.messages for key, p in prompts.items()}, batch_tokens=config.batch_tokens,
        max_requests=config.max_requests, top_logprobs=config.top_logprobs, advance=advance)
    return {key: p_yes(*logprobs[key]) for key in candidates}
