"""The agent's config section: prompts as Jinja templates, the limits that end a trajectory, and sampling."""

from typing import Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from patchgym.env.tools import COMMAND_TIMEOUT_S
from patchgym.inference import SamplingParams
from patchgym.inference.config import DEFAULT_TURN_TOKENS

SYSTEM_PROMPT = """\
{% if task is defined and task.harbor %}
You are an agent with a bash environment. Carry out the task you are given; its own checks judge the environment as \
you leave it when you call finish.
{% else %}
You are a programming agent. You are given a GitHub issue and a bash environment with the repository in /testbed, \
and your job is to change the repository's non-test files so that the issue is resolved.
{% endif %}

You have these tools:
{% for tool in tools %}

## {{ tool.function.name }}
{{ tool.function.description }}
Parameters:
{% for name, spec in tool.function.parameters.properties.items() %}
- {{ name }} ({{ spec.type }}{% if name in tool.function.parameters.required %}, required{% endif %}): \
{{ spec.description }}
{% endfor %}
{% endfor %}

Call exactly one tool per response, in this format:
<function=TOOL_NAME>
<parameter=PARAM_NAME>value</parameter>
</function>
You may think before the call. The tool's output comes back in the next message.
"""

# tool_format native: the chat template presents the tools (as JSON schemas) and the call format itself.
NATIVE_SYSTEM_PROMPT = """\
{% if task is defined and task.harbor %}
You are an agent with a bash environment. Carry out the task you are given; its own checks judge the environment as \
you leave it when you call finish.
{% else %}
You are a programming agent. You are given a GitHub issue and a bash environment with the repository in /testbed, \
and your job is to change the repository's non-test files so that the issue is resolved.
{% endif %}

Call exactly one tool per response. You may think before the call. The tool's output comes back in the next message.
"""

# A Harbor task's instruction is given as it is, as Harbor gives it.
INSTRUCTION_PROMPT = "{{ problem_statement }}"

INSTANCE_PROMPT = """\
Consider the following GitHub issue:
<github_issue>
{{ problem_statement }}
</github_issue>

Implement the changes to the repository in {{ workdir }} that resolve the issue. The tests the issue needs are \
already taken care of: do not modify any test files or testing logic.

Tips:
1. Start by exploring the repository to learn its structure.
2. Write a small script that reproduces the error and run it to confirm the error.
3. Edit the source code to resolve the issue; keep the change minimal.
4. Run your script again to confirm the error is fixed, and think about edge cases.
5. View large files in ranges of 50 to 100 lines.
6. The current directory is already {{ workdir }}: use paths relative to it, or absolute ones.
7. Delete your scratch scripts, then call finish.
"""

OBSERVATION = """\
{{ observation }}

Steps remaining: {{ steps_remaining }}"""

# trim_blocks: a line that holds only a {% for %} or {% if %} tag leaves no blank line behind.
_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)


class SamplingConfig(BaseModel):
    """Per-turn sampling; the defaults are the unbiased behaviour policy that RL needs (docs/algorithms.md §9)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="1 = off")
    top_k: int = Field(0, ge=0, description="0 = off")
    min_p: float = Field(0.0, ge=0, lt=1, description="0 = off")
    max_new_tokens: int | None = Field(None, ge=1, description=(
        "most tokens one turn may sample; null = the model's turn budget (320 for smollm2, whose tool calls fit in "
        "it; 1024 for any other model)"))
    seed: int | None = Field(None, description="turn t samples with seed + t; null = fresh randomness")

    @property
    def turn_tokens(self) -> int:
        """max_new_tokens, or the budget of a model nobody named (a Config fills in its model's)."""
        return self.max_new_tokens or DEFAULT_TURN_TOKENS

    def params(self, turn: int, max_new_tokens: int) -> SamplingParams:
        seed = None if self.seed is None else self.seed + turn  # one seed for all turns would correlate them
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                              max_new_tokens=max_new_tokens, seed=seed)


class AgentConfig(BaseModel):
    """The ReAct agent: prompts, limits (each ends a trajectory with its own termination reason) and sampling."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str = Field(SYSTEM_PROMPT, description="Jinja; variables: tools (the tool schemas), task")
    instance_prompt: str = Field(INSTANCE_PROMPT, description="Jinja; variables: problem_statement, workdir, task")
    instruction_prompt: str = Field(INSTRUCTION_PROMPT, description=(
        "Jinja; the first user message of a task whose statement is an instruction to carry out as it is (a Harbor "
        "task's instruction.md), in place of instance_prompt; variables: problem_statement, workdir, task"))
    observation_template: str = Field(OBSERVATION, description="Jinja; variables: observation, steps_remaining")
    tool_format: Literal["text", "native"] = Field("text", description=(
        "text: the tools described in the system prompt, calls written as R2E-Gym XML (or JSON) in the text; "
        "native: the tools passed to the chat template as JSON schemas (with this run's workdir and timeout), calls "
        "as <tool_call>{json}</tool_call>, results as `tool` messages"))
    observation_role: Literal["user", "tool"] = Field(
        "user", description="chat role of observations; 'user' works with every chat template (native: tool)")
    history: Literal["keep", "template"] = Field("keep", description=(
        "keep: every turn's sampled text, thinking included, stays in the chat verbatim, so each prompt extends "
        "the previous one and a trajectory is one sequence (templates that drop old thinking, like Qwen3's, are "
        "adapted and checked at start-up: patchgym.agent.history); template: the history is what the published "
        "template renders (earlier thinking dropped), each turn's prompt is rendered whole and trains as its own "
        "step-wise sample (costs re-feeding the prefix every turn: metrics stepwise_extra_tokens)"))
    max_steps: int = Field(50, ge=1,
                           description="turns before `max_steps` (eval uses 100: patchgym/eval/defaults.yaml)")
    max_context_tokens: int = Field(8192, ge=16, description=(
        "prompt + all sampled tokens, checked before each generation (`max_context`); a turn cut to fit still "
        "gets its unsampled closing (ChatML: 2 tokens) after it"))
    on_context_full: Literal["end", "truncate_observation"] = Field("end", description=(
        "end: the trajectory ends as `max_context` when no token fits; truncate_observation: an observation after "
        "which a whole turn (sampling.max_new_tokens) would not fit is cut in its middle to make room, keeping its "
        "head and tail with a marker (the turn's observation_cut_tokens; metrics observations_cut)"))
    max_thinking_tokens: int | None = Field(None, ge=1, description=(
        "a thought still open after this many sampled ids of a turn is ended with the template's thought closing "
        "(Qwen3: \\n</think>\\n\\n, inserted, not sampled, out of the loss) and sampling resumes for the action "
        "within sampling.max_new_tokens (the turn's thought_close_ids; metrics thinking_truncated); null = no limit. "
        "Needs an engine that takes token ids"))
    max_seconds: float = Field(1800.0, gt=0, description="wall clock per trajectory before `timeout`")
    max_format_errors: int = Field(5, ge=1, description="consecutive turns without a valid tool call")
    command_timeout_s: float = Field(COMMAND_TIMEOUT_S, gt=0,
                                     description="per tool command, inside the sandbox")
    max_patch_bytes: int = Field(1_000_000, ge=1, description=(
        "a bigger final patch ends the trajectory as `patch_too_large` (reward 0), neither kept nor graded"))
    sampling: SamplingConfig = SamplingConfig()

    @model_validator(mode="after")
    def _native_defaults(self) -> "AgentConfig":
        if self.tool_format == "native":
            if self.system_prompt == SYSTEM_PROMPT:
                self.system_prompt = NATIVE_SYSTEM_PROMPT
            if "observation_role" not in self.model_fields_set:
                self.observation_role = "tool"
        return self

    _compiles = field_validator("system_prompt", "instance_prompt", "instruction_prompt", "observation_template")(
        classmethod(lambda cls, text: check_template(text)))


def check_template(text: str) -> str:
    """`text` if it compiles as a Jinja template; a ValueError naming the line otherwise (for config validators)."""
    try:
        _JINJA.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"invalid Jinja template (line {exc.lineno}): {exc.message}") from None
    return text


def render(template: str, **variables: object) -> str:
    """Render one of the config's Jinja templates; an unknown variable is an error, not an empty string."""
    return _JINJA.from_string(template).render(**variables)
