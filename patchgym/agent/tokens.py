"""Token-in/token-out: a trajectory's token sequence is built by appending ids, never by re-tokenising what was sampled.

Per turn the sequence grows by three segments:
  prompt_ids      the first prompt (template rendering of system + user, with the generation prompt), or the
                  observation segment: ids(render(messages + [observation], generation prompt)) minus
                  ids(render(messages)), a delta taken on token ids and checked to extend the shorter one;
  completion_ids  the sampled ids exactly as the engine returned them, end-of-turn token included;
  close_ids       what the template writes after an assistant message's content, beyond what was sampled. ChatML
                  templates (SmolLM2, Qwen) close a message with "<|im_end|>\n": the model samples <|im_end|> and
                  stops, so the "\n" is appended here; a completion cut at max_new_tokens gets the whole closing.
When every sampled segment is the tokenizer's canonical encoding of its text, the sequence equals the tokenised
template rendering of the trajectory's messages, token for token (tests/agent/test_tokens.py checks it).
"""

from patchgym.agent.trajectory import Trajectory

# Stands in for an assistant message's content to find the template's closing text, which does not depend on it.
_PROBE = "PATCHGYM_PROBE"


class TemplateMismatch(ValueError):
    """The chat template does not render the conversation as an append-only sequence, so deltas would be wrong."""


def render_text(tokenizer, messages: list[dict], *, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def render_ids(tokenizer, messages: list[dict], *, add_generation_prompt: bool) -> list[int]:
    """The template rendering tokenised as apply_chat_template(tokenize=True) does: no extra special tokens."""
    text = render_text(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The first prompt: the conversation so far (system + user) followed by the assistant's generation prompt."""
    return render_ids(tokenizer, messages, add_generation_prompt=True)


def closing_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids the template writes after the content of an assistant message that would follow `messages`."""
    before = render_text(tokenizer, messages, add_generation_prompt=True)
    after = render_text(tokenizer, [*messages, {"role": "assistant", "content": _PROBE}], add_generation_prompt=False)
    if not after.startswith(before + _PROBE):
        raise TemplateMismatch("the chat template does not render an assistant message as generation prompt + "
                               f"content + closing; it renders: {after[len(before) - 20:]!r}")
    # The closing starts with a special token (<|im_end|>, <|eot_id|>), so tokenising it alone cannot merge it
    # with the content's last token.
    return tokenizer.encode(after[len(before) + len(_PROBE):], add_special_tokens=False)


def close_completion(tokenizer, messages: list[dict], completion_ids: list[int]) -> tuple[str, list[int]]:
    """(the assistant message's content, the close_ids to append after the sampled ids)."""
    content_ids, closing = split_completion(tokenizer, messages, completion_ids)
    return tokenizer.decode(content_ids, skip_special_tokens=False), closing


def split_completion(tokenizer, messages: list[dict], completion_ids: list[int]) -> tuple[list[int], list[int]]:
    """(the sampled ids of the content, the close_ids to append after all the sampled ids).

    A sampled end-of-turn token is the closing's first token, so it ends the content and only the rest of the
    closing is appended; a completion without it (cut at max_new_tokens) gets the whole closing.
    """
    closing = closing_ids(tokenizer, messages)
    if closing and completion_ids and completion_ids[-1] == closing[0]:
        return list(completion_ids[:-1]), closing[1:]
    return list(completion_ids), closing


def observation_ids(tokenizer, messages: list[dict], message: dict) -> list[int]:
    """The ids `message` adds after `messages` (which end with the assistant's), up to the next generation prompt."""
    without = render_ids(tokenizer, messages, add_generation_prompt=False)
    with_message = render_ids(tokenizer, [*messages, message], add_generation_prompt=True)
    if with_message[: len(without)] != without:
        raise TemplateMismatch(f"adding a {message['role']} message changes how the template renders the messages "
                               "before it, so its tokens cannot be appended")
    return with_message[len(without):]


def build_training_sequence(trajectory: Trajectory) -> tuple[list[int], list[int], list[float]]:
    """(input_ids, loss_mask, rollout_logprobs): mask 1 and the sampling logprob on sampled ids, 0 elsewhere."""
    input_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    for turn in trajectory.turns:
        for ids, sampled in ((turn.prompt_ids, False), (turn.completion_ids, True), (turn.close_ids, False)):
            input_ids += ids
            loss_mask += [int(sampled)] * len(ids)
        logprobs += [0.0] * len(turn.prompt_ids) + turn.logprobs + [0.0] * len(turn.close_ids)
    return input_ids, loss_mask, logprobs
