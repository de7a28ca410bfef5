"""Problem statements for JavaScript bugs, written like a user's report from what one failing tape assertion shows:
the code that fails and the wrong value or error, never the test's name or file, nor where the bug is."""

import re

from patchgym.tasks.factory.statements import bug_report, showing_code

_TEST_HEADER = re.compile(r"^# (.*)$")
_NOT_OK = re.compile(r"^not ok \d+ (.*)$")
_AT = re.compile(r"\(?([^\s()]+\.[cm]?js):(\d+):\d+\)?$")
_FIELD = re.compile(r"^    (operator|expected|actual|at): ?(.*)$")
_TEST_CALL = re.compile(r"\b(test|t\.test|tape)\s*\(")
MAX_CODE_LINES = 8
MAX_VALUE = 400


def failure_in_tap(tap: str, name: str) -> dict | None:
    """The first failed assertion of test `name` (its last ' > ' part for a nested one) in tape's TAP output:
    {operator, expected, actual, at: (file, line)}; None when it has none."""
    leaf = name.rsplit(" > ", 1)[-1].rsplit(" #", 1)[0]
    lines, inside, found = tap.splitlines(), False, None
    for number, line in enumerate(lines):
        header = _TEST_HEADER.match(line)
        if header:
            inside = header.group(1).strip() == leaf.strip()
            continue
        if inside and _NOT_OK.match(line):
            found = _fields(lines[number + 1:])
            break
    if not found or "at" not in found:
        return None
    where = _AT.search(found.pop("at"))
    if where is None:
        return None
    return {**found, "at": (where.group(1), int(where.group(2)))}


def _fields(block: list[str]) -> dict:
    """operator, expected, actual and at of one TAP YAML block (block scalars `|-` read to their end)."""
    fields, key = {}, None
    for line in block[1:]:
        if line.startswith("  ...") or not line.startswith("    "):
            break
        match = _FIELD.match(line)
        if match:
            key, value = match.group(1), match.group(2).strip()
            fields[key] = "" if value in ("|-", "|", ">-") else value
        elif key in ("expected", "actual") and line.startswith("      "):
            fields[key] = (fields[key] + "\n" + line[6:]).strip("\n")
        else:
            key = None
    return fields


def code_leading_to(source: str, line: int) -> str:
    """The failing assertion (to the end of its statement) and the lines of its test before it, at most
    MAX_CODE_LINES, never the line that names the test."""
    lines = source.splitlines()
    end = line - 1
    while end < len(lines) - 1 and not lines[end].rstrip().endswith((";", ")")):
        end += 1
    start = line - 1
    while start > 0 and line - start < MAX_CODE_LINES and not _TEST_CALL.search(lines[start - 1]):
        start -= 1
    chosen = [text for text in lines[start:end + 1] if not re.search(r"\bt\.(plan|end)\(", text)]
    indent = min((len(t) - len(t.lstrip()) for t in chosen if t.strip()), default=0)
    return "\n".join(t[indent:] for t in chosen).strip("\n")


def write_statement(*, package: str, version: str, evidence: dict, seed: str, code: str = "") -> str:
    """The statement for one bug: `code` (from `code_leading_to`) and the failed assertion of `evidence` (its
    operator, expected and actual values); `seed` (the task's id) picks the phrasing."""
    expected, actual = evidence.get("expected", "")[:MAX_VALUE], evidence.get("actual", "")[:MAX_VALUE]
    if evidence.get("operator") == "error" or not expected:
        outcome = f"fails with:\n\n```\n{actual or expected}\n```"
    else:
        outcome = f"gives\n\n```\n{actual}\n```\n\nbut I expected\n\n```\n{expected}\n```"
    return bug_report(package, version, seed, [showing_code(code, "js", seed), outcome])
