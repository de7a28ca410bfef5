"""Token-in/token-out on SmolLM2's chat template: appended segments equal the template rendering, token for token."""

import pytest

from patchgym.agent import tokens
from patchgym.agent.trajectory import Trajectory, Turn

MESSAGES = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix calc.add."}]


def play(tokenizer, completions: list[list[int]], observations: list[str], role: str = "user") -> Trajectory:
    """Build a trajectory the way the loop does: sampled ids as given, observation segments as deltas."""
    trajectory = Trajectory(task_id="t", messages=[dict(m) for m in MESSAGES])
    messages = trajectory.messages
    segment = tokens.prompt_ids(tokenizer, messages)
    for completion, observation in zip(completions, observations):
        content, close = tokens.close_completion(tokenizer, messages, completion)
        messages.append({"role": "assistant", "content": content})
        trajectory.turns.append(Turn(prompt_ids=segment, completion_ids=completion, logprobs=[-1.0] * len(completion),
                                     finish_reason="stop", close_ids=close, action=content))
        segment = tokens.observation_ids(tokenizer, messages, {"role": role, "content": observation})
        messages.append({"role": role, "content": observation})
    messages.pop()  # the last observation was never shown to the model
    return trajectory


def sampled(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


@pytest.mark.parametrize("role", ["user", "tool"])
def test_sequence_equals_the_rendering_of_the_messages(tokenizer, role):
    completions = [sampled(tokenizer, "<function=execute_bash>\n<parameter=command>ls</parameter>\n</function>"),
                   sampled(tokenizer, "Done.\n<function=finish>\n</function>")]
    trajectory = play(tokenizer, completions, ["calc\ntests\n", "<<< Finished >>>"], role)
    input_ids, mask, logprobs = tokens.build_training_sequence(trajectory)
    assert input_ids == tokens.render_ids(tokenizer, trajectory.messages, add_generation_prompt=False)
    assert [i for i, m in zip(input_ids, mask) if m] == completions[0] + completions[1]
    assert sum(mask) == sum(map(len, completions)) and len(mask) == len(logprobs) == len(input_ids)
    assert [lp for lp, m in zip(logprobs, mask) if not m] == [0.0] * (len(mask) - sum(mask))


def test_the_newline_after_im_end_is_a_close_token_not_a_sampled_one(tokenizer):
    content, close = tokens.close_completion(tokenizer, MESSAGES, sampled(tokenizer, "hi"))
    assert content == "hi" and tokenizer.decode(close) == "\n"


def test_a_completion_cut_short_gets_the_whole_closing(tokenizer):
    cut = tokenizer.encode("<function=execute_bash>\n<parameter=command>l", add_special_tokens=False)
    content, close = tokens.close_completion(tokenizer, MESSAGES, cut)
    assert tokenizer.decode(close) == "<|im_end|>\n"
    trajectory = play(tokenizer, [cut, sampled(tokenizer, "ok")], ["format error", "x"])
    input_ids, mask, _ = tokens.build_training_sequence(trajectory)
    assert input_ids == tokens.render_ids(tokenizer, trajectory.messages, add_generation_prompt=False)
    assert sum(mask) == len(cut) + 2


def test_non_canonical_samples_are_kept_as_sampled(tokenizer):
    """"hello" sampled letter by letter is not how the tokenizer writes it; the sequence keeps the sampled ids."""
    letters = [tokenizer.convert_tokens_to_ids(c) for c in "hello"] + [tokenizer.eos_token_id]
    assert tokenizer.encode("hello", add_special_tokens=False) != letters[:-1]
    trajectory = play(tokenizer, [letters], ["obs"])
    input_ids, mask, _ = tokens.build_training_sequence(trajectory)
    assert [i for i, m in zip(input_ids, mask) if m] == letters
    assert trajectory.messages[-1] == {"role": "assistant", "content": "hello"}


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    class Rewriting:
        """A fake tokenizer whose template renders the last user message differently from earlier ones."""

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "".join(("LAST:" if i == len(messages) - 1 else "") + m["content"] for i, m in enumerate(messages))

        def encode(self, text, add_special_tokens):
            return [ord(c) for c in text]

    with pytest.raises(tokens.TemplateMismatch):
        tokens.observation_ids(Rewriting(), [*MESSAGES, {"role": "assistant", "content": "a"}],
                               {"role": "user", "content": "o"})
