"""The editor's text edits, as pure functions on a file's text: the in-sandbox editor applies them to files
(env/tools/sandbox_tools.py, which carries this module's source: stdlib only, Python 3.6+) and the pivot stage's
local reward applies them to a state's files (pivot/reward.py), so both judge an edit by the same rules."""


def split_lines(text):
    """The file's lines, a last one without its newline included."""
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines if text else []


def occurrences(text, old):
    """Where `old` starts in `text`, overlapping matches included (the editor wants exactly one)."""
    starts, at = [], text.find(old)
    while at >= 0:
        starts.append(at)
        at = text.find(old, at + 1)
    return starts


def replace_at(text, start, old, new):
    return text[:start] + new + text[start + len(old):]


def insert_after_line(text, line, new):
    """`new` inserted after line `line` (0: at the top), given a newline of its own, and one after a last line that
    had none."""
    at, prefix = 0, ""
    for _ in range(line):
        end = text.find("\n", at)
        if end < 0:  # after a last line that has no newline
            at, prefix = len(text), "\n"
            break
        at = end + 1
    return text[:at] + prefix + new + ("" if new.endswith("\n") else "\n") + text[at:]
