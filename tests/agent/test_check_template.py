"""`patchgym check-template`: the probe verdict per history mode and observation role, and its exit status."""

import json

from typer.testing import CliRunner

from patchgym.cli import app

runner = CliRunner()


def test_qwen3_fits_keep_for_each_tool_format_and_observation_role(tiny, qwen3_template_path):
    result = runner.invoke(app, ["check-template", "--model", "tiny-qwen3", "--chat-template",
                                 str(qwen3_template_path("qwen3")), "--chat-template-kwargs",
                                 '{"enable_thinking": true}', "--json"])
    assert result.exit_code == 0, result.output
    fits = json.loads(result.output)
    assert [(f["history"], f["tool_format"], f["observation_role"], f["fits"]) for f in fits] == [
        ("keep", "text", "user", True), ("keep", "text", "tool", True), ("keep", "native", "tool", True)]


def test_a_template_that_drops_history_exits_1_naming_the_first_differing_character(tiny, tmp_path):
    template = tmp_path / "drops.jinja"
    template.write_text("{% for m in messages %}{% if m.role != 'user' or loop.last %}<|im_start|>{{ m.role }}\n"
                        "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    result = runner.invoke(app, ["check-template", "--model", "tiny-qwen3", "--chat-template", str(template)])
    assert result.exit_code == 1
    assert "history=keep tool_format=text observations=user: does not fit:" in result.output
    assert "first differing character at" in result.output


def test_bad_kwargs_exit_2():
    result = runner.invoke(app, ["check-template", "--model", "tiny-qwen3", "--chat-template-kwargs", "[1]"])
    assert result.exit_code == 2 and "must be a JSON object" in result.output
