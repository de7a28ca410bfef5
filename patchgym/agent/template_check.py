"""The start-up check of a chat template: the agent's history mode must turn it into exact token sequences.

`check_history` runs when a model agent is made (before any rollout), so a template that cannot be made
append-only is a UserError naming the first differing character, never a stream of infra errors later.
`template_report` is the same check for every observation role, for `patchgym check-template`.
"""

from dataclasses import dataclass

from patchgym.agent import tokens
from patchgym.agent.config import AgentConfig
from patchgym.agent.history import Probe, TemplateMismatch, check_against_real, check_append_only, probe_conversation
from patchgym.env.tools import ToolCall, render_call_json, render_call_xml, tool_schemas

CALLS = [ToolCall("execute_bash", {"command": "ls -la"}),
         ToolCall("file_editor", {"command": "view", "path": "/testbed/a.py"}), ToolCall("finish", {})]


def probe_for(tokenizer, observation_role: str, tools: list[dict] | None = None) -> Probe:
    """The probe conversation in the shape this template's generation prompt gives (thinking when it has </think>),
    its calls written natively when the template is given `tools`, else as R2E-Gym XML."""
    start = probe_conversation("", False, observation_role, []).messages
    opened, _ = tokens.assistant_frame(tokenizer, start, tools)
    think = tokens.THINK_END in tokenizer.get_added_vocab()
    write = render_call_json if tools else render_call_xml
    actions = [f"Step {n}.\n{write(call)}" for n, call in enumerate(CALLS)]
    return probe_conversation(opened, think, observation_role, actions)


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


def check_history(tokenizer, config: AgentConfig) -> None:
    """Raise TemplateMismatch (a UserError) when history `keep` cannot give exact sequences with this template and
    the agent's tool format and observation role."""
    tools = tool_schemas(command_timeout_s=config.command_timeout_s) if config.tool_format == "native" else None
    if config.history == "template":  # every prompt is rendered whole; only the sample's frame must be found
        start = probe_conversation("", False, config.observation_role, []).messages
        tokens.assistant_frame(tokenizer, start, tools)
        return
    problem = template_problem(tokenizer, config.observation_role, tools)
    if problem:
        name = getattr(tokenizer, "name_or_path", "") or "the model's"
        raise TemplateMismatch(f"agent.history=keep: the chat template of {name} (inference.chat_template) cannot "
                               f"be made append-only for tool_format={config.tool_format} with "
                               f"{config.observation_role} observations: {problem}")


@dataclass(frozen=True)
class TemplateFit:
    history: str
    tool_format: str
    observation_role: str
    problem: str | None

    @property
    def fits(self) -> bool:
        return self.problem is None


def template_report(tokenizer) -> list[TemplateFit]:
    """Whether the template fits history `keep` for each tool format and observation role the agent can use."""
    cases = [("text", "user", None), ("text", "tool", None), ("native", "tool", tool_schemas())]
    return [TemplateFit("keep", form, role, template_problem(tokenizer, role, tools)) for form, role, tools in cases]
