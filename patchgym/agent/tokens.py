"""Token-in/token-out: a trajectory's token sequence is built by appending ids, never by re-tokenising what was sampled.

Per turn the sequence grows by three segments:
  prompt_ids      the first prompt (template rendering of system + user, with the generation prompt), or the
                  observation segment: ids(render(messages + [observation], generation prompt)) minus
                  ids(render(messages)), a delta taken on token ids and checked to extend the shorter one;
  completion_ids  the sampled ids exactly as the engine returned them, end-of-turn token included;
  close_ids       what the template writes after an assistant message's content, beyond what was sampled. ChatML
                  templates (SmolLM2, Qwen) close a message with "<|im_end|>\n": the model samples <|im_end|> and
                  stops, so the "\n" is appended here; a completion cut at max_new_tokens gets the whole closing.
A thought that runs past agent.max_thinking_tokens is ended by inserting the template's thought closing
(thought_closing_ids, e.g. "\n</think>\n\n") into the output, unsampled and out of the loss, and sampling resumes
after it; the turn's output_ids are the sampled ids with that closing in place.
When every sampled segment is the tokenizer's canonical encoding of its text, the sequence equals the tokenised
template rendering of the trajectory's messages, token for token (tests/agent/test_tokens.py checks it).

The rendering is the tokenizer's configured template (patchgym.inference.chat_template), adapted to keep history
verbatim (patchgym.agent.history). An assistant message's content is what the generation prompt opened beyond the
message's head (Qwen3-Thinking-2507's "<think>\n") followed by the sampled text, so rendering it gives back the
prompt and the sample. With history "template" (step-wise) every turn's prompt_ids are instead the whole prompt as
the published template renders it.
"""

from dataclasses import dataclass

from patchgym.agent.history import TemplateMismatch, first_difference, keep_template
from patchgym.agent.trajectory import Trajectory

# Stands in for an assistant message's content to find the template's closing text, which does not depend on it.
_PROBE = "PATCHGYM_PROBE"
_PROBE_THOUGHT = "PATCHGYM_THOUGHT"
THINK_START, THINK_END = "<think>", "</think>"
# Qwen3's layout between a thought and its action, for templates that do not render reasoning themselves.
THOUGHT_CLOSING = "\n</think>\n\n"

def render_text(tokenizer, messages: list[dict], *, add_generation_prompt: bool, tools: list[dict] | None = None,
                history: str = "keep") -> str:
    """The one rendering of a chat: the tokenizer's (configured) template, adapted to keep history verbatim unless
    `history` is "template" (patchgym.agent.history)."""
    template = getattr(tokenizer, "chat_template", None)
    extra: dict = {"chat_template": keep_template(template)} if history == "keep" and isinstance(template, str) else {}
    if tools:
        extra["tools"] = tools
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)


def render_ids(tokenizer, messages: list[dict], *, add_generation_prompt: bool, tools: list[dict] | None = None,
               history: str = "keep") -> list[int]:
    """The template rendering tokenised as apply_chat_template(tokenize=True) does: no extra special tokens."""
    text = render_text(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools, history=history)
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None, history: str = "keep") -> list[int]:
    """The first prompt: the conversation so far (system + user) followed by the assistant's generation prompt;
    with history "template", any turn's whole prompt as the published template renders it."""
    return render_ids(tokenizer, messages, add_generation_prompt=True, tools=tools, history=history)


def assistant_frame(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> tuple[str, list[int]]:
    """(opened, closing ids) of an assistant message that would follow `messages`.

    `opened` is what the generation prompt writes beyond the message's own head (Qwen3-Thinking-2507: "<think>\\n";
    Qwen3 with enable_thinking false: the empty think block; ChatML: ""): the message's content is opened + what
    was sampled, so that rendering it gives back the prompt and the sample unchanged. The closing is what the
    template writes after the content.
    """
    base = render_text(tokenizer, messages, add_generation_prompt=False, tools=tools)
    before = render_text(tokenizer, messages, add_generation_prompt=True, tools=tools)
    after = render_text(tokenizer, [*messages, {"role": "assistant", "content": _PROBE}],
                        add_generation_prompt=False, tools=tools)
    at = after.find(_PROBE, len(base))
    head, generation = after[len(base):at], before[len(base):]
    if at < 0 or not after.startswith(base) or not before.startswith(base) or not generation.startswith(head):
        raise TemplateMismatch("the chat template does not render an assistant message as generation prompt + "
                               f"content + closing: {first_difference(after, before + _PROBE)}")
    # The closing starts with a special token (<|im_end|>, <|eot_id|>), so tokenising it alone cannot merge it
    # with the content's last token.
    return generation[len(head):], tokenizer.encode(after[at + len(_PROBE):], add_special_tokens=False)


def closing_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The ids the template writes after the content of an assistant message that would follow `messages`."""
    return assistant_frame(tokenizer, messages, tools)[1]


def close_completion(tokenizer, messages: list[dict], completion_ids: list[int],
                     tools: list[dict] | None = None) -> tuple[str, list[int]]:
    """(the assistant message's content, the close_ids to append after the sampled ids)."""
    turn = sampled_turn(tokenizer, messages, completion_ids, tools)
    return turn.content, turn.close_ids


def split_completion(tokenizer, messages: list[dict], completion_ids: list[int],
                     tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """(the sampled ids of the content, the close_ids to append after all the sampled ids).

    A sampled end-of-turn token is the closing's first token, so it ends the content and only the rest of the
    closing is appended; a completion without it (cut at max_new_tokens) gets the whole closing.
    """
    closing = closing_ids(tokenizer, messages, tools)
    return _split(completion_ids, closing)


def _split(completion_ids: list[int], closing: list[int]) -> tuple[list[int], list[int]]:
    if closing and completion_ids and completion_ids[-1] == closing[0]:
        return list(completion_ids[:-1]), closing[1:]
    return list(completion_ids), closing


@dataclass(frozen=True)
class SampledTurn:
    """What one sampled completion is, as text and as token counts.

    content: the assistant message as the kept history stores it: opened + the sampled text (end-of-turn dropped).
    reasoning / action: the thinking and what follows it, split at the `</think>` token (not at a character share);
        a thought that never closed is all reasoning and no action.
    """

    content: str
    reasoning: str
    action: str
    close_ids: list[int]
    thinking_tokens: int
    action_tokens: int


def sampled_turn(tokenizer, messages: list[dict], completion_ids: list[int], tools: list[dict] | None = None,
                 thought_close_at: int = 0, thought_close_ids: list[int] | None = None) -> SampledTurn:
    """Split a completion sampled after `messages` into its message content, thinking, action and closing; with
    `thought_close_ids` inserted after `thought_close_at` sampled ids (agent.max_thinking_tokens), the content holds
    them and the token counts leave them out."""
    inserted = list(thought_close_ids or [])
    output_ids = completion_ids[:thought_close_at] + inserted + completion_ids[thought_close_at:]
    opened, closing = assistant_frame(tokenizer, messages, tools)
    content_ids, close = _split(output_ids, closing)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    sampled = decode(content_ids)
    end = tokenizer.get_added_vocab().get(THINK_END)
    thinking = THINK_START in opened and THINK_END not in opened
    if end is not None and end in content_ids:
        cut = content_ids.index(end) + 1
        reasoning = decode(content_ids[:cut - 1])
        action_ids = content_ids[cut:]
    elif thinking:  # the thought never closed (cut at max_new_tokens)
        reasoning, cut, action_ids = sampled, len(content_ids), []
    else:
        reasoning, cut, action_ids = "", 0, content_ids
    action = decode(action_ids)
    if cut:  # the template's "\n\n" after </think> is layout, not part of the action
        reasoning, action = reasoning.removeprefix(THINK_START).strip("\n"), action.lstrip("\n")
    thinking_tokens, action_tokens = cut, len(action_ids)
    if inserted:  # only sampled ids count: the thought's, and the action's after the inserted closing
        thinking_tokens = thought_close_at
        action_tokens -= len(inserted) - (inserted.index(end) + 1 if end in inserted else 0)
    return SampledTurn(opened + sampled, reasoning, action, close, thinking_tokens, action_tokens)


def thought_is_open(tokenizer, messages: list[dict], sampled_ids: list[int], tools: list[dict] | None = None) -> bool:
    """True when `sampled_ids` (sampled after `messages`) end inside a thought: one the generation prompt opened
    or the sample began, and no </think> token since."""
    vocab = tokenizer.get_added_vocab()
    end = vocab.get(THINK_END)
    if end is None or end in sampled_ids:
        return False
    opened, _ = assistant_frame(tokenizer, messages, tools)
    return (THINK_START in opened and THINK_END not in opened) or vocab.get(THINK_START) in sampled_ids[:1]


def thought_closing_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The ids the published template writes between an assistant message's thought and its action (Qwen3:
    "\n</think>\n\n"), from its rendering of a message given as reasoning_content + content; THOUGHT_CLOSING for
    a template that does not render reasoning."""
    probe = {"role": "assistant", "reasoning_content": _PROBE_THOUGHT, "content": _PROBE}
    text = render_text(tokenizer, [*messages, probe], add_generation_prompt=False, tools=tools, history="template")
    start, stop = text.rfind(_PROBE_THOUGHT) + len(_PROBE_THOUGHT), text.rfind(_PROBE)
    between = text[start:stop] if _PROBE_THOUGHT in text and THINK_END in text[start:stop] else THOUGHT_CLOSING
    return tokenizer.encode(between, add_special_tokens=False)


def observation_ids(tokenizer, messages: list[dict], message: dict, tools: list[dict] | None = None) -> list[int]:
    """The ids `message` adds after `messages` (which end with the assistant's), up to the next generation prompt."""
    without = render_ids(tokenizer, messages, add_generation_prompt=False, tools=tools)
    with_message = render_ids(tokenizer, [*messages, message], add_generation_prompt=True, tools=tools)
    if with_message[: len(without)] != without:
        text = render_text(tokenizer, [*messages, message], add_generation_prompt=True, tools=tools)
        raise TemplateMismatch(f"adding a {message['role']} message changes how the template renders the messages "
                               "before it, so its tokens cannot be appended: " + first_difference(
                                   text, render_text(tokenizer, messages, add_generation_prompt=False, tools=tools)))
    return with_message[len(without):]


def build_training_sequence(trajectory: Trajectory) -> tuple[list[int], list[int], list[float]]:
    """(input_ids, loss_mask, rollout_logprobs): mask 1 and the sampling logprob on sampled ids, 0 elsewhere
    (an inserted thought closing included)."""
    input_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    for turn in trajectory.turns:
        input_ids += turn.prompt_ids + turn.output_ids + turn.close_ids
        loss_mask += [0] * len(turn.prompt_ids) + turn.output_mask + [0] * len(turn.close_ids)
        logprobs += [0.0] * len(turn.prompt_ids) + turn.output_logprobs + [0.0] * len(turn.close_ids)
    return input_ids, loss_mask, logprobs
