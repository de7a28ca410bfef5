"""`agent.history: keep`: the chat the model sees keeps every turn's sampled text verbatim, thinking included, so each
prompt extends the previous one and a trajectory is one exact token sequence.

Templates that rewrite history (Qwen3's drops the `<think>` blocks of turns before the last user message, and
re-renders the latest one as `<think>\\n` + reasoning + `\\n</think>\\n\\n` + content, whitespace normalised) are
adapted the way SkyRL's `qwen3_acc_thinking` is: the assistant branch's reasoning logic is replaced by
`'<|im_start|>' + message.role + '\\n' + content`, the message written as it was sampled. Every other part (system,
tools, user, tool results, generation prompt) is the published template's own text.

`check_keep` proves the adaptation on a probe conversation at start-up: the adapted template must render it
append-only, and exactly as the real template does wherever the real one keeps the thinking (the first turns, and
whole conversations whose observations are `tool` messages). Either failure names the first differing character.
"""

import functools
import re
from dataclasses import dataclass

from patchgym.errors import UserError

# Qwen3's assistant branch up to its tool-call rendering: the part that splits, strips and drops the thinking.
_QWEN3_ASSISTANT = re.compile(r'(\{%-?\s*elif message\.role == "assistant"\s*-?%\})(.*?)'
                              r'(\{%-?\s*if message\.tool_calls\s*-?%\})', re.DOTALL)
_VERBATIM = "\n        {{- '<|im_start|>' + message.role + '\\n' + content }}\n        "


class TemplateMismatch(UserError, ValueError):
    """The chat template does not render the conversation as an append-only sequence, so deltas would be wrong."""


@functools.lru_cache(maxsize=16)
def keep_template(template: str) -> str:
    """The template adapted to keep history verbatim; an append-only template (ChatML, Llama) comes back as is."""
    match = _QWEN3_ASSISTANT.search(template)
    if match is None or "reasoning_content" not in match.group(2):
        return template
    return template[:match.start(2)] + _VERBATIM + template[match.end(2):]


def first_difference(got: str, expected: str) -> str:
    """Where two renderings part: the character offset, and both characters with some context."""
    at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return (f"first differing character at {at}: {got[at:at + 1]!r} instead of {expected[at:at + 1]!r} "
            f"(...{got[max(at - 30, 0):at + 30]!r} vs ...{expected[max(at - 30, 0):at + 30]!r})")


@dataclass(frozen=True)
class Probe:
    """A conversation to check a template on: system, user, then (assistant, observation) turns. Each assistant
    content is `opened` (what the generation prompt opened beyond the message's head, e.g. "<think>\\n") + a sample."""

    messages: list[dict]
    opened: str
    reasonings: list[str]  # each assistant message's thinking, to see where the real template keeps it


def probe_conversation(opened: str, think: bool, observation_role: str, actions: list[str]) -> Probe:
    """The probe with `actions` as the turns' actions; with `think`, each sample thinks before its action."""
    messages = [{"role": "system", "content": "You are a programming agent. Call one tool per turn."},
                {"role": "user", "content": "Fix the failing test in /testbed."}]
    reasonings = []
    think = think and "</think>" not in opened  # an empty think block in the generation prompt: no thinking
    for n, action in enumerate(actions):
        reasoning = f"Turn {n}: I should look at the repository first.\nThen act." if think else ""
        if not think:
            sampled = action
        elif opened.endswith("<think>\n"):
            sampled = f"{reasoning}\n</think>\n\n{action}"
        else:
            sampled = f"<think>\n{reasoning}\n</think>\n\n{action}"
        reasonings.append(reasoning)
        messages.append({"role": "assistant", "content": opened + sampled})
        messages.append({"role": observation_role, "content": f"output of turn {n}\nSteps remaining: {9 - n}"})
    return Probe(messages[:-1], opened, reasonings)


def check_append_only(render, probe: Probe) -> str | None:
    """None when `render(messages, add_generation_prompt)` renders the probe append-only: an assistant message is
    the generation prompt + its sample, any other message extends what came before it; else what differs."""
    messages = probe.messages
    for k in range(2, len(messages)):
        if messages[k]["role"] == "assistant":
            expected = render(messages[:k], True) + messages[k]["content"][len(probe.opened):]
        else:
            expected = render(messages[:k], False)
        with_message = render(messages[:k + 1], False)
        if not with_message.startswith(expected):
            return (f"adding message {k} ({messages[k]['role']}) does not extend the rendering before it: "
                    f"{first_difference(with_message, expected)}")
    return None


def check_against_real(render, render_real, probe: Probe) -> str | None:
    """None when the two templates agree on every prefix of the probe that the real one renders with every assistant
    message as written (thinking included)."""
    for k in range(2, len(probe.messages) + 1):
        prefix = probe.messages[:k]
        generation = prefix[-1]["role"] != "assistant"
        real = render_real(prefix, generation)
        if not all(m["content"] in real for m in prefix if m["role"] == "assistant"):
            continue  # the real template dropped earlier thinking here: keep differs on purpose
        adapted = render(prefix, generation)
        if adapted != real:
            return f"on the first {k} probe messages the adapted template renders differently: " \
                   f"{first_difference(adapted, real)}"
    return None
