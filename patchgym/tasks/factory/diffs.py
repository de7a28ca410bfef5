"""Unified diffs in the form `git apply` takes: one file changed, and files created from nothing."""

import difflib


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _body(diff_lines) -> str:
    out = []
    for line in diff_lines:
        # difflib leaves a last line without its newline as is; git wants the line ended and a marker after it.
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def file_diff(path: str, old: str, new: str) -> str:
    """The diff that turns `old` into `new` for the file at `path` (relative to the repository root)."""
    body = _body(difflib.unified_diff(_lines(old), _lines(new), f"a/{path}", f"b/{path}", n=3))
    return f"diff --git a/{path} b/{path}\n{body}" if body else ""


def new_file_diff(path: str, text: str) -> str:
    """The diff that creates the file at `path` with `text` where there is no such file."""
    body = _body(difflib.unified_diff([], _lines(text), "/dev/null", f"b/{path}", n=3))
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n{body}"
