"""Problem statements for Python bugs, written like a user's bug report from what one failing test shows: the call,
and the wrong value or the exception (pytest's `E` lines) — never the test's name or file, nor where the bug is."""

import ast
import re
import textwrap
from collections.abc import Callable

from patchgym.tasks.factory.statements import bug_report, showing_code

_SECTION = re.compile(r"^_+ \S.* _+$")  # a long test name leaves room for one "_" on each side
_SECTION_END = re.compile(r"^(={3,}|-{3,} Captured|_+ \S.* _+$)")
_FRAME = re.compile(r"^(\S+?\.py):(\d+): in \S+$")
_CARETS = re.compile(r"^\s*[\^~]+\s*$")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_ASSERT_EQ = re.compile(r"^assert (.+?) == (.+)$")
MAX_ERROR_LINES = 12
MAX_LINE = 240
MAX_CODE_LINES = 10


def names_of_test(test: str) -> list[str]:
    """What names a test: its file path and module name, and its class and function names."""
    path, _, rest = test.partition("::")
    names = [n.split("[", 1)[0] for n in rest.split("::") if n]
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    return [t for t in (path, module, *names) if len(t) > 2]


def failure_evidence(output: str, test: str, is_test_file: Callable[[str], bool],
                     hidden: tuple[str, ...] = ()) -> dict | None:
    """From a `pytest --tb=short` run of one failing `test`: the test's line that failed ("call") and the
    error lines ("error"), with any line that names the test or a `hidden` string (the bug's file) left out."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if _SECTION.match(line)), None)
    if start is None:
        return None
    section = []
    for line in lines[start + 1:]:
        if _SECTION_END.match(line):
            break
        section.append(line)
    banned = [*names_of_test(test), *hidden, "/testbed"]
    call, error, frame_in_test, where = [], [], False, None
    for line in section:
        if frame := _FRAME.match(line):
            frame_in_test, error = is_test_file(frame[1]), []
            if frame_in_test:
                call, where = [], [frame[1], int(frame[2])]
        elif line.startswith("E"):
            error.append(_ADDRESS.sub("0x...", line[4:] if line.startswith("E   ") else line[1:].lstrip()))
        elif frame_in_test and line.startswith("    ") and not _CARETS.match(line) and not error:
            call.append(line[4:])
    clean = [line[:MAX_LINE] for line in error if line.strip() and not any(b in line for b in banned)]
    if not clean:
        return None
    if any(b in line for line in call for b in banned):
        call, where = [], None
    return {"call": "\n".join(call).strip(), "error": clean[:MAX_ERROR_LINES], "where": where}


def code_leading_to(source: str, line: int, banned: list[str]) -> str:
    """The failing statement at `line` of a test file and the statements of its function just before it (whole
    statements, at most MAX_CODE_LINES lines; never the `def` line, the docstring, or a line naming `banned`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.body[0].lineno <= line <= n.end_lineno]
    if not funcs:
        return ""
    func = max(funcs, key=lambda n: n.lineno)  # the innermost
    body = func.body[1:] if ast.get_docstring(func) is not None and len(func.body) > 1 else func.body
    inner = [n for n in ast.walk(func)
             if isinstance(n, ast.stmt) and n is not func and n.lineno <= line <= n.end_lineno]
    if not inner:
        return ""
    failing = max(inner, key=lambda n: n.lineno)
    end = failing.end_lineno
    starts = [_first_line(n) for n in body if n.lineno <= failing.lineno and end - _first_line(n) < MAX_CODE_LINES]
    first = min(starts, default=failing.lineno)
    lines = source.splitlines()[first - 1: end]
    return textwrap.dedent("\n".join(t for t in lines if not any(b in t for b in banned))).strip()


def _first_line(node: ast.stmt) -> int:
    """Where a statement starts, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _outcome(call: str, error: list[str]) -> str:
    """One sentence (and a block) on what went wrong: expected vs got, a missing exception, or the exception."""
    first = error[0]
    block = "\n".join(error)
    if m := re.match(r"^Failed: DID NOT RAISE (.+)$", first):
        return f"I expected it to raise `{m[1]}`, but nothing was raised."
    if (m := _ASSERT_EQ.match(first)) and (c := _ASSERT_EQ.match(call)) and "(" in c[1] and len(error) <= 3:
        expected = c[2] if _is_literal(c[2]) else m[2]
        return f"I expected `{c[1]}` to be `{expected}`, but it is `{m[1]}`:\n\n```\n{block}\n```"
    if re.match(r"^(AssertionError\b|assert\b)", first):
        return f"The result is not what it should be:\n\n```\n{block}\n```"
    if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Warning|Exit|Interrupt)\b", first):
        return f"It raises an exception instead:\n\n```\n{block}\n```"
    return f"It fails with:\n\n```\n{block}\n```"


def write_statement(*, package: str, version: str, evidence: dict, seed: str, code: str = "") -> str:
    """The problem statement for one bug. `code` (from `code_leading_to`) shows more than the failing line;
    `seed` (the task's id) picks the phrasing, so it is stable."""
    call, error = evidence.get("call", ""), list(evidence["error"])
    if call:
        body = [showing_code(code or call, "python", seed), _outcome(call, error)]
    else:
        body = [f"Using it fails like this:\n\n```\n{chr(10).join(error)}\n```"]
    return bug_report(package, version, seed, body)
