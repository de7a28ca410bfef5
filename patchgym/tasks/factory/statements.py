"""The voice of every problem statement, whatever the language: a user's bug report that opens, shows the code that
fails and what it did, and closes, each phrase picked by the task's id so that a task's statement is stable."""

import hashlib

_OPENINGS = (
    "I think I found a bug in `{package}` {version}.",
    "Something is wrong in `{package}` ({version}).",
    "While using `{package}` {version} I ran into this.",
    "`{package}` {version} does not behave the way I expect here.",
)
_CALL_INTROS = ("This code:", "Running this:", "When I do this:", "Here is a minimal example:")
_CLOSINGS = ("", "Could you take a look?", "Is this intended? It looks like a regression to me.",
             "I would expect this to work.")


def _pick(options: tuple[str, ...], seed: str, salt: str) -> str:
    return options[int(hashlib.sha1(f"{salt}:{seed}".encode()).hexdigest(), 16) % len(options)]


def showing_code(code: str, language: str, seed: str) -> str:
    """The paragraph that shows the failing code, fenced as `language`."""
    return f"{_pick(_CALL_INTROS, seed, 'intro')}\n\n```{language}\n{code}\n```"


def bug_report(package: str, version: str, seed: str, body: list[str]) -> str:
    """The statement: an opening naming the package, the `body` paragraphs (what fails and how), maybe a closing."""
    parts = [_pick(_OPENINGS, seed, "open").format(package=package, version=version), *body]
    closing = _pick(_CLOSINGS, seed, "close")
    if closing:
        parts.append(closing)
    return "\n\n".join(parts) + "\n"
