"""The start-up check of a chat template: the agent's history mode must turn it into exact token sequences.

`check_history` runs when a model agent is made (before any rollout), so a template that cannot be made
append-only is a UserError naming the first differing character, never a stream of infra errors later.
`template_report` is the same check for every observation role, for `patchgym check-template`.
"""

from dataclasses import dataclass

from patchgym.agent import tokens
from patchgym.agent.history import Probe, TemplateMismatch, check_against_real, check_append_only, probe_conversation

ACTIONS = ["Let me look.\n<function=execute_bash>\n<parameter=command>ls -la</parameter>\n</function>",
           "<function=file_editor>\n<parameter=command>view</parameter>\n<parameter=path>/testbed/a.py</parameter>"
           "\n</function>",
           "Done.\n<function=finish>\n</function>"]


def probe_for(tokenizer, observation_role: str, tools: list[dict] | None = None) -> Probe:
    """The probe conversation in the shape this template's generation prompt gives (thinking when it has </think>)."""
    start = probe_conversation("", False, observation_role, []).messages
    opened, _ = tokens.assistant_frame(tokenizer, start, tools)
    think = tokens.THINK_END in tokenizer.get_added_vocab()
    return probe_conversation(opened, think, observation_role, ACTIONS)


def template_problem(tokenizer, observation_role: str, tools: list[dict] | None = None) -> str | None:
    """None when history `keep` gives exact sequences with this tokenizer's template; else what goes wrong."""
    def render(messages, generation):
        return tokens.render_text(tokenizer, messages, add_generation_prompt=generation, tools=tools)

    def render_real(messages, generation):
        return tokens.render_text(tokenizer, messages, add_generation_prompt=generation, tools=tools,
                                  history="template")

    try:
        probe = probe_for(tokenizer, observation_role, tools)
        problem = check_append_only(render, probe) or check_against_real(render, render_real, probe)
        return problem or _ids_problem(tokenizer, probe, tools)
    except TemplateMismatch as exc:
        return str(exc)


def _ids_problem(tokenizer, probe: Probe, tools: list[dict] | None) -> str | None:
    """Play the probe through the token builder as the loop does: every observation's ids must extend the ids before
    it (observation_ids raises otherwise), and every sample must come back as its message. The whole sequence may
    still differ from a re-tokenisation of the rendering where BPE would merge across a segment boundary: that is
    what check-tokens counts as non-canonical, not an error."""
    messages = probe.messages
    for k, message in enumerate(messages[2:], start=2):
        if message["role"] != "assistant":
            tokens.observation_ids(tokenizer, messages[:k], message, tools)
            continue
        sample = message["content"][len(probe.opened):]
        completion = tokenizer.encode(sample, add_special_tokens=False) + [tokenizer.eos_token_id]
        turn = tokens.sampled_turn(tokenizer, messages[:k], completion, tools)
        if turn.content != message["content"]:
            return f"a sample comes back as {turn.content!r}, not as the message {message['content']!r}"
    return None


def check_history(tokenizer, observation_role: str, tools: list[dict] | None = None) -> None:
    """Raise TemplateMismatch (a UserError) when history `keep` cannot give exact sequences with this template."""
    problem = template_problem(tokenizer, observation_role, tools)
    if problem:
        name = getattr(tokenizer, "name_or_path", "") or "the model's"
        raise TemplateMismatch(f"agent.history=keep: the chat template of {name} (inference.chat_template) cannot "
                               f"be made append-only for {observation_role} observations: {problem}")


@dataclass(frozen=True)
class TemplateFit:
    history: str
    observation_role: str
    problem: str | None

    @property
    def fits(self) -> bool:
        return self.problem is None


def template_report(tokenizer, tools: list[dict] | None = None) -> list[TemplateFit]:
    """Whether the template fits history `keep` for each observation role."""
    return [TemplateFit("keep", role, template_problem(tokenizer, role, tools)) for role in ("user", "tool")]
