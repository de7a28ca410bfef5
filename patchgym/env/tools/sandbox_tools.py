"""The agent's tools, inside the sandbox: `sandbox_tools.py TOOL JSON_ARGS|@FILE TIMEOUT_S` prints the observation.
Stdlib only (process_tree.py travels inlined), Python >= 3.6. Relative paths are in the workspace (the cwd, /testbed).
Exits 0/1, or execute_bash's code.
"""

import hashlib
import json
import os
import re
import select
import stat
import subprocess
import sys
import time

# In a sandbox these lines are text_edits.py's and process_tree.py's source (sandbox/standalone.py): the tools are
# installed as one file.
from patchgym.env.tools.text_edits import insert_after_line, occurrences, replace_at, split_lines
from patchgym.sandbox.process_tree import OutputCap, become_subreaper, kill_tree

WORKDIR = os.getcwd()
# Undo history lives outside the repository so it never shows up in the agent's patch.
HISTORY_DIR = "/var/tmp/patchgym-tools/history"
MAX_RESPONSE_LEN = 10000  # characters of any observation, as R2E-Gym's editor
BASH_MAX_LINES = 80  # as R2E-Gym: the first and last 40 lines of a command's output
SNIPPET_LINES = 4  # context lines around an edit
MAX_SEARCH_FILES = 100
MAX_FILE_BYTES = 64 << 20  # larger files are for head/grep, not for reading whole into the tool's memory
CAPTURE_BYTES = 65536  # command output kept at each end while reading; far more than an observation shows
DRAIN_AFTER_EXIT_S = 0.1  # background children may hold the pipe open: take what they wrote by then, then answer
# `keep` (a Harbor task's sandbox): what a command leaves running in the background lives on.
KEEP_BACKGROUND = False
DIVIDER = "-" * 50
ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
# What bash runs: a login shell's /etc/profile resets PATH (Debian, Ubuntu), so put the sandbox's PATH (the task's
# venv) back, after what the profile added (a conda env). The command runs through eval, so bash's error messages
# show only the model's own text.
SHELL_SCRIPT = (
    '_pg_p=; IFS=: read -ra _pg_a <<< "$PATH"; for _pg_d in "${_pg_a[@]}"; do case ":$PATCHGYM_PATH:" in '
    '*":$_pg_d:"*) ;; *) _pg_p="$_pg_p$_pg_d:";; esac; done; _pg_p="$_pg_p$PATCHGYM_PATH"; export PATH="${_pg_p%:}"; '
    '_pg_c=$PATCHGYM_COMMAND; unset _pg_p _pg_a _pg_d PATCHGYM_PATH PATCHGYM_COMMAND; eval "$_pg_c"')


class ToolError(Exception):
    """A mistake the model can fix; the message is what it sees."""


def arg(args, name, required=False):
    value = args.get(name)
    if value is None and required:
        raise ToolError("Missing required parameter '{}'.".format(name))
    return value


def as_int(value, name):
    try:
        return int(str(value).strip())
    except ValueError:
        raise ToolError("'{}' must be an integer, got {!r}.".format(name, value))


# -- output shaping --------------------------------------------------------------------------------------------
def take(lines, count, budget, from_end):
    """Up to `count` whole lines within `budget` characters; a first line longer than that is shortened."""
    kept = []
    for line in lines:
        if len(kept) == count or (kept and len(line) >= budget):
            break
        if len(line) > budget:  # only the first line is ever shortened: whole lines otherwise
            cut = "[... {} characters cut ...]".format(len(line) - budget)
            line = cut + line[-budget:] if from_end else line[:budget] + cut
        kept.append(line)
        budget -= len(line) + 1
    return kept


def clip_middle(text, total_lines):
    """Keep the head and tail of long command output, as R2E-Gym, and also cap characters (long lines)."""
    lines = text.split("\n")
    if len(lines) <= BASH_MAX_LINES and len(text) <= MAX_RESPONSE_LEN:
        return text
    half, budget = BASH_MAX_LINES // 2, MAX_RESPONSE_LEN // 2
    head = take(lines, half, budget, False)
    tail = take(reversed(lines[len(head):]), half, budget, True)[::-1]
    hidden = max(total_lines, len(lines)) - len(head) - len(tail)
    if hidden <= 0:
        return "\n".join(head + tail)
    note = ("<Observation truncated in middle for saving context: {} of {} lines not shown; redirect long output "
            "to a file and search or view it>").format(hidden, max(total_lines, len(lines)))
    return "\n".join(head + [DIVIDER, note, DIVIDER] + tail)


def clip(text, note):
    """Cap an observation at MAX_RESPONSE_LEN characters, cutting at a line end, with a note on what to do."""
    if len(text) <= MAX_RESPONSE_LEN:
        return text
    end = text.rfind("\n", 0, MAX_RESPONSE_LEN)
    return text[: end if end > 0 else MAX_RESPONSE_LEN] + "\n<response clipped><NOTE>" + note + "</NOTE>"


# -- execute_bash ----------------------------------------------------------------------------------------------
def captured_text(cap):
    """The command's output as a terminal would show it (ANSI codes gone, each line as its last \\r redraw left
    it), with the lines it had in all."""
    head, tail, cut = cap.ends()
    raw = head + (b"\n" if cut else b"") + tail
    text = ANSI.sub("", raw.decode("utf-8", "replace"))
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
    return "\n".join(lines).rstrip("\n"), cap.lines()


def collect(proc, deadline):
    """Read the merged output until the command ends (or the deadline); True when it timed out."""
    cap, fd, drain_until = OutputCap(2 * CAPTURE_BYTES), proc.stdout.fileno(), None
    while True:
        now = time.monotonic()
        if drain_until is None and proc.poll() is not None:
            drain_until = now + DRAIN_AFTER_EXIT_S
        limit = deadline if drain_until is None else min(deadline, drain_until)
        if now >= limit:
            return cap, proc.poll() is None
        if select.select([fd], [], [], min(limit - now, 0.1))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:  # every writer closed the pipe; the command may still be running
                try:
                    proc.wait(max(deadline - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    return cap, True
                return cap, False
            cap.add(chunk)


def keep_reading(fd):
    """What the command left running in the background lives on (a Harbor task's sandbox): a process of its own
    reads their output to its end and drops it, so that they are never stopped by a closed pipe when we exit."""
    if select.select([fd], [], [], 0)[0] and not os.read(fd, 65536):
        return  # nothing holds the pipe any more
    if os.fork() == 0:
        try:
            os.setsid()
            os.closerange(0, fd)
            os.closerange(fd + 1, 65536)
            while os.read(fd, 65536):
                pass
        finally:
            os._exit(0)


def execute_bash(args, timeout):
    command = arg(args, "command", True)
    if not command.strip():
        raise ToolError("The command is empty.")
    env = dict(os.environ, PATCHGYM_PATH=os.environ.get("PATH", ""), PATCHGYM_COMMAND=command, GIT_PAGER="cat",
               PAGER="cat")
    if "GIT_CONFIG_COUNT" not in env:  # the repository may belong to another uid: git would refuse to read it
        env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="safe.directory", GIT_CONFIG_VALUE_0="*")
    proc = subprocess.Popen(["bash", "-lc", SHELL_SCRIPT], cwd=WORKDIR, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    cap, timed_out = collect(proc, time.monotonic() + timeout)
    if timed_out:
        kill_tree(proc)
    elif KEEP_BACKGROUND:
        keep_reading(proc.stdout.fileno())
    text, lines = captured_text(cap)
    body = clip_middle(text, lines) if text else "(no output)"
    code = 124 if timed_out else (proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)
    if timed_out:
        body += ("\n[The command timed out after {:g} s: it and every process it started were killed. Make it "
                 "faster, or split it into shorter commands.]").format(timeout)
    return body, code


# -- files -----------------------------------------------------------------------------------------------------
def resolve(raw, must_exist=True):
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("'path' must be a file or directory path, e.g. {}/setup.py.".format(WORKDIR))
    raw = raw.strip()
    path = os.path.normpath(os.path.join(WORKDIR, raw))
    if must_exist and not os.path.exists(path):
        hint = " Did you mean '/{}'?".format(raw) if not raw.startswith("/") and os.path.exists("/" + raw) else ""
        raise ToolError("The path '{}' does not exist.{}".format(path, hint))
    return path


def read_bytes(path):
    """A regular file's bytes, or None for anything else (a device would never end, a huge file fills memory)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
        return None
    with open(path, "rb") as f:
        return f.read()


def read_text(path):
    data = read_bytes(path)
    if data is None:
        raise ToolError("'{}' is not a regular file of at most {} MB; use execute_bash (head, sed -n, grep) on it."
                        .format(path, MAX_FILE_BYTES >> 20))
    if b"\0" in data[:8192]:
        raise ToolError("'{}' is a binary file; the editor works on text files only.".format(path))
    return data.decode("utf-8", "surrogateescape")  # undecodable bytes survive an edit unchanged


def write_text(path, text):
    with open(path, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))


def history_dir(path):
    return os.path.join(HISTORY_DIR, hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest())


def push_history(path, text):
    """Remember `path`'s content before an edit (None: it did not exist), one file per version."""
    folder = history_dir(path)
    if not os.path.isdir(folder):
        os.makedirs(folder)
    name = "%06d%s" % (len(os.listdir(folder)) + 1, "" if text is not None else ".absent")
    write_text(os.path.join(folder, name), text or "")


def pop_history(path):
    folder = history_dir(path)
    versions = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if not versions:
        raise ToolError("No previous edits found for {} to undo.".format(path))
    last = os.path.join(folder, versions[-1])
    text = None if last.endswith(".absent") else read_text(last)
    os.remove(last)
    return text


def numbered_view(lines, first, last, heading):
    """Lines first..last (1-based) in `cat -n` form, as many as fit in an observation."""
    rows = ("{:6d}\t{}".format(i, lines[i - 1].rstrip("\r")) for i in range(first, last + 1))
    shown = take(rows, last - first + 1, MAX_RESPONSE_LEN - len(heading), False)
    text = heading + "\n".join(shown)
    end = first + len(shown) - 1
    if end < last:
        text += ("\n<response clipped><NOTE>Only lines {}-{} are shown, to save context. View the rest with "
                 "view_range, e.g. [{}, {}], or find line numbers with search or `grep -n`.</NOTE>").format(
                     first, end, end + 1, min(last, end + 200))
    return text


def snippet(path, text, first, last):
    """The edited lines first..last with SNIPPET_LINES of context, for the model to check its edit."""
    lines = split_lines(text)
    first, last = max(1, first - SNIPPET_LINES), min(len(lines), last + SNIPPET_LINES)
    heading = "Here's the result of running `cat -n` on a snippet of {}:\n".format(path)
    return numbered_view(lines, first, last, heading) + "\nReview the changes and make sure they are as expected. " \
        "Edit the file again if necessary."


def view_range_of(value, count):
    if isinstance(value, str):
        parts = value.strip().strip("[]()").replace(",", " ").split()
    else:
        parts = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(parts) != 2:
        raise ToolError("view_range must be two line numbers, e.g. [10, 40]; [10, -1] shows line 10 to the end.")
    first, last = as_int(parts[0], "view_range"), as_int(parts[1], "view_range")
    if not 1 <= first <= count:
        raise ToolError("Invalid view_range [{}, {}]: the first line must be in [1, {}] (the file has {} lines)."
                        .format(first, last, count, count))
    if last != -1 and last < first:
        raise ToolError("Invalid view_range [{}, {}]: the last line must be >= the first, or -1 for the end of "
                        "the file.".format(first, last))
    return first, count if last == -1 else min(last, count)


def view_directory(path):
    listing = [path]

    def walk(folder, depth):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return
        for name in names:
            if name.startswith(".") or name == "__pycache__":
                continue
            full = os.path.join(folder, name)
            listing.append(full + "/" if os.path.isdir(full) else full)
            if depth < 2 and os.path.isdir(full):
                walk(full, depth + 1)

    walk(path, 1)
    text = "Here's the files and directories up to 2 levels deep in {}, excluding hidden:\n".format(path)
    return clip(text + "\n".join(listing), "The listing is too long; view a subdirectory instead.")


def view(path, args):
    view_range = arg(args, "view_range")
    if os.path.isdir(path):
        if view_range is not None:
            raise ToolError("view_range applies to files only; '{}' is a directory.".format(path))
        return view_directory(path)
    lines = split_lines(read_text(path))
    heading = "Here's the result of running `cat -n` on {}".format(path)
    if not lines:
        return heading + ":\n(the file is empty)"
    first, last = 1, len(lines)
    if view_range is not None:
        first, last = view_range_of(view_range, len(lines))
        heading += " (lines {}-{} of {})".format(first, last, len(lines))
    return numbered_view(lines, first, last, heading + ":\n")


def create(path, args):
    file_text = arg(args, "file_text", True)
    if os.path.exists(path):
        raise ToolError("File already exists at: {}. Cannot overwrite with 'create'; edit it with str_replace or "
                        "insert instead.".format(path))
    # Editors end text files with a newline; the XML call format drops the one before </parameter>.
    if file_text and not file_text.endswith("\n"):
        file_text += "\n"
    if not os.path.isdir(os.path.dirname(path)):
        os.makedirs(os.path.dirname(path))
    push_history(path, None)
    write_text(path, file_text)
    lines = split_lines(file_text)
    return "File created at {}. ".format(path) + numbered_view(
        lines, 1, len(lines), "Here's the result of running `cat -n` on {}:\n".format(path))


def shorten(text):
    """old_str quoted back in an error: the model wrote it, so a long one need not come back whole."""
    return text if len(text) <= 300 else text[:200] + " [...] " + text[-60:]


def str_replace(path, args):
    old, new = arg(args, "old_str", True), arg(args, "new_str") or ""
    if not old:
        raise ToolError("old_str is empty; give the exact text to replace.")
    if old == new:
        raise ToolError("new_str is the same as old_str, so nothing would change.")
    text = read_text(path)
    starts = occurrences(text, old)
    if not starts:
        hint = (" It does occur if leading/trailing whitespace is ignored: check the indentation and blank lines of "
                "old_str.") if old.strip() and old.strip() in text else ""
        raise ToolError("No occurrences of '{}' found in {} for replacement. old_str must match the file exactly, "
                        "whitespace included; view the file to copy the text.{}".format(shorten(old), path, hint))
    if len(starts) > 1:
        where = ", ".join(str(text.count("\n", 0, s) + 1) for s in starts[:10]) + (", ..." if len(starts) > 10 else "")
        raise ToolError("Multiple occurrences of '{}' found in {} ({} times, starting at lines {}). Include more "
                        "surrounding lines in old_str so that it matches exactly once.".format(
                            shorten(old), path, len(starts), where))
    push_history(path, text)
    updated = replace_at(text, starts[0], old, new)
    write_text(path, updated)
    first = text.count("\n", 0, starts[0]) + 1
    return "The file {} has been edited. ".format(path) + snippet(path, updated, first, first + new.count("\n"))


def insert(path, args):
    line, new = as_int(arg(args, "insert_line", True), "insert_line"), arg(args, "new_str", True)
    text = read_text(path)
    count = len(split_lines(text))
    if not 0 <= line <= count:
        raise ToolError("Invalid insert_line {}: it must be in [0, {}] (0 inserts at the top; the file has {} lines)."
                        .format(line, count, count))
    push_history(path, text)
    updated = insert_after_line(text, line, new)
    write_text(path, updated)
    return "The file {} has been edited. ".format(path) + snippet(path, updated, line + 1, line + len(split_lines(new)))


def undo_edit(path, args):
    previous = pop_history(path)
    if previous is None:
        if os.path.exists(path):
            os.remove(path)
        return "Last edit to {} undone successfully: the file was created by that edit, so it was removed.".format(path)
    write_text(path, previous)
    lines = split_lines(previous)
    return "Last edit to {} undone successfully. ".format(path) + numbered_view(
        lines, 1, len(lines), "Here's the result of running `cat -n` on {}:\n".format(path))


EDITOR = {"view": view, "create": create, "str_replace": str_replace, "insert": insert, "undo_edit": undo_edit}


def file_editor(args, timeout):
    command = arg(args, "command", True)
    if command not in EDITOR:
        raise ToolError("Unknown command '{}'. Use one of: {}.".format(command, ", ".join(EDITOR)))
    path = resolve(arg(args, "path", True), must_exist=command in ("view", "str_replace", "insert"))
    if command != "view" and os.path.isdir(path):
        raise ToolError("The path '{}' is a directory; only 'view' works on directories.".format(path))
    return EDITOR[command](path, args), 0


# -- search ----------------------------------------------------------------------------------------------------
def shown_path(path):
    relative = os.path.relpath(path, WORKDIR)
    return path if relative.startswith("..") else "./" + relative


def search_file(term, path):
    hits = ["{}:{}".format(i, line.rstrip("\r")) for i, line in enumerate(split_lines(read_text(path)), 1)
            if term in line]
    if not hits:
        return 'No matches found for "{}" in {}'.format(term, path)
    text = 'Matches for "{}" in {}:\n'.format(term, path) + "\n".join(hits)
    return clip(text, "Too many matching lines; search for a more specific term.")


def search(args, timeout):
    term = arg(args, "search_term", True)
    if not term or "\n" in term:
        raise ToolError("search_term must be one non-empty line of text; use execute_bash with grep for more.")
    path = resolve(arg(args, "path") or ".")
    if not os.path.isdir(path):
        return search_file(term, path), 0
    needle, deadline, counts, stopped = term.encode("utf-8", "surrogateescape"), time.monotonic() + timeout, [], False
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            try:
                data = read_bytes(os.path.join(root, name))
            except (OSError, IOError):
                continue
            if data is not None and needle in data and b"\0" not in data[:8192]:
                counts.append((os.path.join(root, name), sum(needle in line for line in data.split(b"\n"))))
        if time.monotonic() > deadline:
            stopped = True
            break
    counts.sort()
    matches = sum(c for _, c in counts)
    if not counts:
        text = 'No matches found for "{}" in {}'.format(term, path)
    elif len(counts) > MAX_SEARCH_FILES:
        text = ('More than {} files matched for "{}" in {} ({} matches in {} files). Please narrow your search.'
                .format(MAX_SEARCH_FILES, term, path, matches, len(counts)))
    else:
        rows = ["{} ({} match{})".format(shown_path(p), c, "" if c == 1 else "es") for p, c in counts]
        text = 'Found {} matches for "{}" in {}:\n{}\nEnd of matches for "{}" in {}'.format(
            matches, term, path, "\n".join(rows), term, path)
    if stopped:
        text += "\n[The search stopped after {:g} s, before the whole directory was read; give a narrower path.]" \
            .format(timeout)
    return clip(text, "Too many files matched; narrow the path or the term."), 0


def finish(args, timeout):
    return "<<< Finished >>>", 0


TOOLS = {"execute_bash": execute_bash, "search": search, "file_editor": file_editor, "finish": finish}


def main(argv):
    global KEEP_BACKGROUND
    if len(argv) not in (4, 5) or argv[1] not in TOOLS or argv[4:] not in ([], ["keep"]):
        sys.stderr.write("usage: sandbox_tools.py {{{}}} JSON_ARGS|@FILE TIMEOUT_S [keep]\n".format(",".join(TOOLS)))
        return 2
    KEEP_BACKGROUND = argv[4:] == ["keep"]
    name, raw = argv[1], argv[2]
    if raw.startswith("@"):  # arguments too long for a command line come in a file
        with open(raw[1:], "rb") as f:
            raw = f.read().decode("ascii")  # json.dumps escapes everything else
    timeout = float(argv[3])  # the agent's command timeout, given by run_tool
    become_subreaper()  # a command's detached processes stay below us, for kill_tree to find when it times out
    try:
        body, code = TOOLS[name](json.loads(raw), timeout)
        ran = True
    except (ToolError, OSError, IOError) as exc:  # an unreadable file is the model's to handle, like a bad argument
        body, code, ran = "ERROR: {}".format(exc), 1, False
    if name == "finish":
        text = body
    else:
        text = "Execution output of [{}]:\n{}".format(name, body)
        if name == "execute_bash" and ran:
            text = "Exit code: {}\n".format(code) + text
    sys.stdout.buffer.write((text + "\n").encode("utf-8", "replace"))  # lone surrogates (bad bytes) become "?"
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
