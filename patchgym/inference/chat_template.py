"""The chat template every engine and the token builder render with: `inference.chat_template` (a file or a name
shipped in patchgym/inference/templates/) with `inference.chat_template_kwargs` written into it.

The kwargs are set at the top of the template text (`{%- set enable_thinking = false %}`), and that text replaces the
tokenizer's `chat_template`. So there is one rendering: the hf engine, the token builder, `serve`, check-tokens and the
vLLM server (given the same text as `--chat-template`) cannot disagree on an argument one of them forgot.
"""

import json
import re
from pathlib import Path

from patchgym.errors import UserError

TEMPLATES_DIR = Path(__file__).parent / "templates"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ChatTemplateError(UserError, ValueError):
    """`inference.chat_template` or `inference.chat_template_kwargs` cannot be used; the message says which."""


def shipped_templates() -> list[str]:
    return sorted(path.stem for path in TEMPLATES_DIR.glob("*.jinja"))


def load_template(spec: str) -> str:
    """The text of a template given as a file path or as the name of one shipped with patchgym."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path.read_text()
    if (TEMPLATES_DIR / f"{spec}.jinja").is_file():
        return (TEMPLATES_DIR / f"{spec}.jinja").read_text()
    raise ChatTemplateError(f"inference.chat_template: {spec!r} is neither a file nor a shipped template "
                            f"({', '.join(shipped_templates())})")


def with_kwargs(template: str, kwargs: dict[str, object]) -> str:
    """`template` with each kwarg set as a Jinja variable before its first line."""
    lines = []
    for name, value in kwargs.items():
        if not _NAME.fullmatch(name):
            raise ChatTemplateError(f"inference.chat_template_kwargs: {name!r} is not a template variable name")
        if not isinstance(value, (bool, int, float, str)):
            raise ChatTemplateError(f"inference.chat_template_kwargs.{name}: only true/false, numbers and strings "
                                    f"can be set, got {value!r}")
        literal = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
        lines.append(f"{{%- set {name} = {literal} %}}")
    return "".join(lines) + template


def configure_tokenizer(tokenizer, chat_template: str | None, chat_template_kwargs: dict[str, object]):
    """Give `tokenizer` the configured template (its own when `chat_template` is None) with the kwargs set in it."""
    template = load_template(chat_template) if chat_template else tokenizer.chat_template
    if template is None:
        raise ChatTemplateError(f"the tokenizer of {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template: "
                                "set inference.chat_template")
    if not isinstance(template, str):  # a dict of named templates (a few tokenizers): the default one is used
        template = template.get("default") or next(iter(template.values()))
    tokenizer.chat_template = with_kwargs(template, chat_template_kwargs)
    return tokenizer
