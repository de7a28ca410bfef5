"""The `verifier:` section of a patchgym config: the verifier's prompts (Jinja), what the execution-based checks run,
how Best@k is averaged, and how `train-verifier` fine-tunes."""

from pydantic import BaseModel, ConfigDict, Field, field_validator

from patchgym.agent.config import SamplingConfig, check_template

SYSTEM_PROMPT = """\
You are an expert judge of software engineering work. You read a GitHub issue, the log of an AI agent's attempt \
to resolve it in the repository, and the agent's final patch. You decide whether the patch resolves the issue: \
the tests written for the issue would pass, and nothing that worked before breaks. Answer with YES or NO only."""

PROMPT = """\
=== ISSUE ===
{{ problem_statement }}

=== INTERACTION LOG ===
{% for step in steps %}
{% if step.omitted %}
[... {{ step.omitted }} steps omitted ...]
{% else %}
[STEP {{ step.index }}]
[ASSISTANT]
{{ step.action }}
[/ASSISTANT]
[OBSERVATION]
{{ step.observation }}
[/OBSERVATION]
{% endif %}
{% endfor %}

=== FINAL PATCH ===
{{ patch if patch else "(empty: the agent changed nothing)" }}

Did the agent resolve the issue? Answer YES or NO."""

REPRO_SYSTEM_PROMPT = """\
You write reproduction tests for bug reports in Python repositories."""

REPRO_PROMPT = """\
The repository `{{ task.repo }}` is checked out in {{ task.workdir }} (it is the current directory, and the \
package is importable). A user reported this issue:

<issue>
{{ problem_statement }}
</issue>

Write one self-contained Python script that reproduces the issue. It must exit with status 0 when the issue is \
fixed and fail (an uncaught exception or a non-zero exit) while the bug is still there. Use plain `assert` \
statements and only the standard library and the repository itself. Do not modify any file.
Answer with the script in one ```python code block."""


class VerifierConfig(BaseModel):
    """Verifiers for test-time scaling: execution-free (P(YES)), execution-based, and their hybrid."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="the verifier model (smollm2, tiny, a directory, a hub id); "
                                                "null = inference.model. The engine is the inference section's")
    # Execution-free: the judge prompt and the verdict.
    system_prompt: str = Field(SYSTEM_PROMPT, description="Jinja; variables: task (null when unknown)")
    prompt: str = Field(PROMPT, description="Jinja; variables: problem_statement, steps (index, action, "
                                            "observation, omitted), patch, task (null when unknown)")
    # Not `yes:`/`no:`: YAML reads those keys as booleans.
    yes_label: str = Field("YES", min_length=1, description="the verdict that means resolved")
    no_label: str = Field("NO", min_length=1, description="the verdict that means not resolved")
    max_prompt_tokens: int = Field(6144, ge=64, description="judge prompts are condensed to fit (and to the "
                                                            "model's context)")
    observation_chars: int = Field(1500, ge=100, description="each observation is cut to its head and tail")
    action_chars: int = Field(2000, ge=100, description="each assistant message is cut to its head and tail")
    batch_tokens: int = Field(8192, ge=64, description="hf: padded tokens per scoring forward pass")
    max_requests: int = Field(8, ge=1, description="openai: scoring requests in flight")
    top_logprobs: int = Field(20, ge=2, description="openai: top logprobs asked for at the verdict position")
    # Execution-based: generated reproduction tests and the repository's regression tests.
    repro_system_prompt: str = Field(REPRO_SYSTEM_PROMPT, description="Jinja; variables: task")
    repro_prompt: str = Field(REPRO_PROMPT, description="Jinja; variables: problem_statement, task")
    repro_tests: int = Field(3, ge=0, description="reproduction tests generated per task")
    repro_sampling: SamplingConfig = SamplingConfig(temperature=0.7, max_new_tokens=512, seed=0)
    repro_cmd: str = Field("python {file}", description="runs one reproduction test in the workdir; passes on "
                                                        "exit 0. Placeholders: {file}, {workdir}")
    repro_timeout_s: float = Field(60.0, gt=0, description="per reproduction test run")
    regression_cmd: str = Field("python -m pytest -p no:cacheprovider --rootdir={workdir} {files}", description=(
        "runs the selected regression test files with pytest (patchgym's report plugin is added). "
        "Placeholders: {files}, {workdir}"))
    regression_timeout_s: float = Field(600.0, gt=0, description="per regression run")
    max_sandboxes: int = Field(4, ge=1, description="sandboxes in use at once by the execution-based checks")
    retries: int = Field(1, ge=0, description="reruns of a check whose sandbox died; then an infra error")
    # Best@k.
    subsets: int = Field(100, ge=1, description="Best@k: every k-subset when there are at most this many, "
                                                "else this many random ones (seeded by `seed`)")
    # train-verifier (batch shape and LoRA come from the train section).
    lr: float = Field(1e-5, gt=0, description="train-verifier: learning rate (R2E-Gym's verifier: 1e-5)")
    epochs: int = Field(2, ge=1, description="train-verifier: passes over the examples")
    batch_size: int = Field(16, ge=1, description="train-verifier: examples per optimizer step")

    _compiles = field_validator("system_prompt", "prompt", "repro_system_prompt", "repro_prompt")(
        classmethod(lambda cls, text: check_template(text)))
