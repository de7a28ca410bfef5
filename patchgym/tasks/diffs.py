"""Unified diffs as data: reversing a patch (a bug patch's reverse is its fix) exactly as git would write it, and
reading one as files and hunks (parse_patch)."""

import re
from dataclasses import dataclass

_HUNK = re.compile(r"^@@ -(\d+(?:,(\d+))?) \+(\d+(?:,(\d+))?) @@(.*)$")
# Header line pairs whose values trade places; --- and +++ also trade their a/ and b/ prefixes.
_PAIRS = {"--- ": "+++ ", "old mode ": "new mode ", "rename from ": "rename to "}
_SWAPPED = {"new file mode ": "deleted file mode ", "deleted file mode ": "new file mode "}


def reverse_patch(patch: str) -> str:
    """The unified diff that undoes `patch`; ValueError for what cannot be reversed as text (binary, copies)."""
    lines, out, i = patch.split("\n"), [], 0
    while i < len(lines):
        line, following = lines[i], lines[i + 1] if i + 1 < len(lines) else ""
        if hunk := _HUNK.match(line):
            old, old_len, new, new_len, tail = hunk.groups()
            out.append(f"@@ -{new} +{old} @@{tail}")
            items, i = _hunk_items(lines, i + 1, _count(old_len), _count(new_len))
            out += _reversed_items(items)
            continue
        if line.startswith(("GIT binary patch", "Binary files ", "copy from ")):
            raise ValueError(f"binary diffs and copies are not reversible as text: {line[:60]!r}")
        pair = next((p for p in _PAIRS if line.startswith(p) and following.startswith(_PAIRS[p])), None)
        if pair:
            flip = _flip if pair == "--- " else str
            out += [pair + flip(following[len(_PAIRS[pair]):]), _PAIRS[pair] + flip(line[len(pair):])]
            i += 2
            continue
        out.append(_reverse_header(line))
        i += 1
    return "\n".join(out)


def _reverse_header(line: str) -> str:
    if line.startswith("diff --git a/") and " b/" in line:
        old, new = line.removeprefix("diff --git a/").split(" b/", 1)
        return f"diff --git a/{new} b/{old}"
    if index := re.match(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)$", line):
        return f"index {index[2]}..{index[1]}{index[3]}"
    swap = next((s for s in _SWAPPED if line.startswith(s)), None)
    return _SWAPPED[swap] + line[len(swap):] if swap else line


def _count(length: str | None) -> int:
    return 1 if length is None else int(length)  # "@@ -3 +3 @@" means one line


def _hunk_items(lines: list[str], i: int, old: int, new: int) -> tuple[list[list[str]], int]:
    """A hunk's lines, each with its "\\ No newline" marker if any; read by count, since a body line may look
    like a header ("--- x" is a deleted "-- x")."""
    items: list[list[str]] = []
    while old > 0 or new > 0:
        if i >= len(lines):
            raise ValueError("a hunk ends before its line counts")
        line, i = lines[i], i + 1
        kind = line[:1] or " "  # tools that strip trailing spaces turn an empty context line into ""
        if kind == "\\" and items:
            items[-1].append(line)
            continue
        if kind not in " +-":
            raise ValueError(f"unexpected line in a hunk: {line[:40]!r}")
        old, new = old - (kind in " -"), new - (kind in " +")
        items.append([line])
    if i < len(lines) and lines[i].startswith("\\") and items:
        items[-1].append(lines[i])
        i += 1
    return items, i


def _reversed_items(items: list[list[str]]) -> list[str]:
    """Swap + and -; in each run of changes the (new) deletions go first, as git writes them."""
    out, removed, added = [], [], []
    for item in items + [[" "]]:  # the sentinel flushes the last run
        kind = item[0][:1]
        if kind in ("+", "-"):
            (removed if kind == "+" else added).append([("-" if kind == "+" else "+") + item[0][1:], *item[1:]])
            continue
        out += removed + added
        removed, added = [], []
        out.append(item)
    return [line for item in out[:-1] for line in item]


def _flip(path: str) -> str:
    if path.startswith(("a/", "b/")):
        return ("b/" if path[0] == "a" else "a/") + path[2:]
    return path  # /dev/null, or a diff without a/ b/ prefixes


# --- row fields ---------------------------------------------------------------------------------------------------


# --- patches as files and hunks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hunk:
    """One hunk: where it starts in the old file (1-based; 0 for an insertion into an empty file), and its old and
    new lines, each with its newline unless "\\ No newline at end of file" followed it. `before` and `after` count
    the context lines that lead and trail the change."""

    old_start: int
    old: list[str]
    new: list[str]
    before: int
    after: int


@dataclass(frozen=True)
class FilePatch:
    """What a patch does to one file: old_path None for a new file, new_path None for a deleted one."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk]
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def parse_patch(patch: str) -> list[FilePatch]:
    """The files of a unified diff (git's or plain), in order; ValueError for text that is no diff."""
    lines, files, i = patch.split("\n"), [], 0
    current: dict | None = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            current = _new_file(files, line)
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if current is None or current["hunks"] or current["seen_names"]:
                current = _new_file(files, "")
            current["old_path"], current["new_path"] = _diff_path(line[4:]), _diff_path(lines[i + 1][4:])
            current["seen_names"] = True
            i += 1
        elif hunk := _HUNK.match(line):
            if current is None:
                raise ValueError(f"a hunk before any file header: {line[:60]!r}")
            items, i = _hunk_items(lines, i + 1, _count(hunk.group(2)), _count(hunk.group(4)))
            current["hunks"].append(_hunk(int(hunk.group(1).split(",")[0]), items))
            continue
        elif current is not None and line.startswith(("GIT binary patch", "Binary files ")):
            current["binary"] = True
        elif current is not None and line.startswith(("new file mode ", "deleted file mode ", "rename from ")):
            current["mode"] = line
        i += 1
    if not files:
        raise ValueError("no file header (diff --git, or ---/+++) in the patch")
    return [FilePatch(f["old_path"], f["new_path"], f["hunks"], f["binary"]) for f in files]


def _new_file(files: list[dict], header: str) -> dict:
    old = new = None
    if header.startswith("diff --git a/") and " b/" in header:
        old, new = header.removeprefix("diff --git a/").split(" b/", 1)
    files.append({"old_path": old, "new_path": new, "hunks": [], "binary": False, "seen_names": False})
    return files[-1]


def _diff_path(name: str) -> str | None:
    name = name.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def _hunk(old_start: int, items: list[list[str]]) -> Hunk:
    old, new, kinds = [], [], []
    for item in items:
        kind, text = item[0][:1] or " ", item[0][1:]
        line = text if len(item) > 1 else text + "\n"  # a "\ No newline" marker follows the line
        kinds.append(kind)
        if kind in " -":
            old.append(line)
        if kind in " +":
            new.append(line)
    before = next((n for n, k in enumerate(kinds) if k != " "), len(kinds))
    after = next((n for n, k in enumerate(reversed(kinds)) if k != " "), 0)
    return Hunk(old_start, old, new, before, after)
