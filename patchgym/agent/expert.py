"""An expert episode planned from a task's gold patch: search for the code the failing tests name, view each hunk's
place, edit it in with the file editor, run the tests, finish. `plan_demo` makes the plan (seeded: order, search
term, context and wording vary); `ExpertEngine` plays it through the agent loop as sampled token ids.

The plan is made on the host from the workspace's text of the files the patch touches (read from the task's
sandbox by the caller), so each str_replace is checked there first to match exactly once. An edit whose old text
is not unique with the patch's own context is widened with more lines of the file, up to the whole file; a patch
that does not match the files, or that the editor cannot express (binary files, renames), is `Unplayable`.
"""

import random
import re
import shlex
from dataclasses import dataclass, field

from patchgym.agent import tokens
from patchgym.env.tools.calls import ToolCall, render_call_json, render_call_xml
from patchgym.errors import UserError
from patchgym.inference.base import Generation, SamplingParams
from patchgym.tasks import Task
from patchgym.tasks.diffs import FilePatch, Hunk, parse_patch

PYTEST = "python -m pytest -q -p no:cacheprovider"
MAX_TESTS = 3  # failing test ids on one command line


class Unplayable(UserError):
    """The task's gold patch cannot be played through the tools; the message says which task and why."""


@dataclass(frozen=True)
class Step:
    """One turn of the plan: a short thought, then the tool call."""

    reasoning: str
    call: ToolCall


@dataclass
class DemoPlan:
    steps: list[Step]
    notes: list[str] = field(default_factory=list)  # fallbacks taken, e.g. an edit widened beyond the hunk


def files_to_read(task: Task) -> list[str]:
    """The workspace files whose text a plan needs: those the gold patch changes (Unplayable for a patch that
    cannot be played)."""
    return [f.old_path for f in _file_patches(task) if f.old_path]


def test_files_of(task: Task) -> list[str]:
    """The files of the task's tests, failing ones first: the plan runs those the workspace has."""
    return list(dict.fromkeys(_test_file(t) for t in task.FAIL_TO_PASS + task.PASS_TO_PASS))


def plan_demo(task: Task, files: dict[str, str | None], visible_tests: set[str], seed: int) -> DemoPlan:
    """The plan of demo `seed` of `task`, given the workspace's `files` (path -> text, None when absent) and which
    test files it has."""
    rng = random.Random(f"{task.instance_id}#{seed}")
    patches = [_as_new_file(f, files) for f in _file_patches(task)]
    texts = {f.path: _start_text(task, f, files) for f in patches}
    plan = DemoPlan([_search(task, patches, texts, rng)])
    order = patches[:]
    rng.shuffle(order)
    edits: list[tuple[list[Step], list[Step]]] = []  # (views, edits) per hunk, in the order they are applied
    for patch in order:
        edits += _file_steps(task, patch, texts, plan.notes, rng)
    # Look at every place first, then edit; or view and edit one place at a time. Only the latter when a file has
    # several hunks: a view's line numbers are those of the file as the edits before it left it.
    if all(len(p.hunks) <= 1 for p in patches) and rng.random() < 0.5:
        plan.steps += [s for views, _ in edits for s in views] + [s for _, changes in edits for s in changes]
    else:
        plan.steps += [s for views, changes in edits for s in views + changes]
    plan.steps += [_test_step(task, visible_tests, [p.path for p in patches], rng), _finish(rng)]
    return plan


def _file_patches(task: Task) -> list[FilePatch]:
    if not task.patch.strip():
        raise Unplayable(f"task {task.instance_id} has no gold patch to play")
    try:
        patches = parse_patch(task.patch)
    except ValueError as exc:
        raise Unplayable(f"task {task.instance_id}: its gold patch is not a unified diff: {exc}") from None
    for f in patches:
        if f.binary:
            raise Unplayable(f"task {task.instance_id}: its gold patch changes the binary file {f.path}, which the "
                             "editor cannot write")
        if f.old_path and f.new_path and f.old_path != f.new_path:
            raise Unplayable(f"task {task.instance_id}: its gold patch renames {f.old_path} to {f.new_path}")
    return patches


def _test_file(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def _as_new_file(patch: FilePatch, files: dict[str, str | None]) -> FilePatch:
    """A plain diff (not git's) names a new file as a/PATH, not /dev/null: its only hunk adds to nothing."""
    if patch.old_path and files.get(patch.old_path) is None and all(not h.old and not h.old_start
                                                                    for h in patch.hunks):
        return FilePatch(None, patch.new_path, patch.hunks)
    return patch


def _start_text(task: Task, patch: FilePatch, files: dict[str, str | None]) -> list[str]:
    """The file's lines (newlines kept) before the patch; [] for a new file."""
    if patch.old_path is None:
        return []
    text = files.get(patch.old_path)
    if text is None:
        raise Unplayable(f"task {task.instance_id}: its gold patch changes {patch.old_path}, which is not in the "
                         "workspace")
    return text.splitlines(keepends=True)


def _identifiers(text: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{3,}", text) if w not in _COMMON]


_COMMON = {"self", "return", "None", "True", "False", "test", "tests", "assert", "def", "class", "import", "from",
           "else", "elif", "while", "with", "lambda", "pass", "raise", "yield", "async", "await", "print"}


def _search(task: Task, patches: list[FilePatch], texts: dict[str, list[str]], rng: random.Random) -> Step:
    """Search for a name the failing tests use that the changed files hold (else a name near the change)."""
    test = rng.choice(task.FAIL_TO_PASS)
    named = [part.removeprefix("test_").removeprefix("Test").removesuffix("Test")
             for part in re.split(r"::|\[", test)[1:]]
    changed = "".join(line for f in patches for line in texts[f.path])
    candidates = [w for w in dict.fromkeys(named) if len(w) >= 3 and w in changed]
    if not candidates:  # the test's name says nothing the code holds: search for a name the change touches
        near = [line for f in patches for h in f.hunks for line in h.old + h.new]
        candidates = list(dict.fromkeys(w for w in _identifiers("".join(near)) if w in changed)) or [
            f.path.rsplit("/", 1)[-1].split(".")[0] for f in patches]
    term = rng.choice(candidates[:4])
    top = patches[0].path.split("/")[0] if "/" in patches[0].path else "."
    arguments = {"search_term": term} if rng.random() < 0.5 else {"search_term": term, "path": top}
    why = rng.choice([f"The failing test is {test}. Let me find the code it exercises, starting with `{term}`.",
                      f"{test} fails. I'll search for `{term}` to see where it is implemented.",
                      f"Let me locate `{term}`, which the failing test {test} is about."])
    return Step(why, ToolCall("search", arguments))


def _file_steps(task: Task, patch: FilePatch, texts: dict[str, list[str]], notes: list[str],
                rng: random.Random) -> list[tuple[list[Step], list[Step]]]:
    path = patch.path
    if patch.new_path is None:
        why = rng.choice([f"{path} is no longer needed; I'll delete it.", f"The fix removes {path}."])
        return [([], [Step(why, ToolCall("execute_bash", {"command": f"rm -- {shlex.quote(path)}"}))])]
    if patch.old_path is None:
        text = "".join(line for h in patch.hunks for line in h.new)
        why = rng.choice([f"The fix needs a new file, {path}.", f"I'll create {path} with what is missing."])
        return [([], [Step(why, ToolCall("file_editor", {"command": "create", "path": path, "file_text": text}))])]
    lines = texts[path]
    applied: list[tuple[int, int]] = []  # (old_start, lines added) of the hunks applied so far
    order = list(enumerate(patch.hunks, 1))
    rng.shuffle(order)  # hunks apply in any order: each edit is checked to match once in the text at that point
    out = []
    for number, hunk in order:
        # "@@ -5,2" starts at line 5; an insertion without context ("@@ -5,0") goes after line 5
        at = hunk.old_start - bool(hunk.old) + sum(n for s, n in applied if s < hunk.old_start)
        if lines[at:at + len(hunk.old)] != hunk.old:
            raise Unplayable(f"task {task.instance_id}: its gold patch does not apply: hunk {number} of {path} expects "
                             f"{(hunk.old or [''])[0].rstrip()!r} at line {at + 1}")
        out.append((_view(path, lines, at, len(hunk.old), rng), _edit(path, lines, at, hunk, number, notes, rng)))
        lines[at:at + len(hunk.old)] = hunk.new
        applied.append((hunk.old_start, len(hunk.new) - len(hunk.old)))
    return out


def _view(path: str, lines: list[str], at: int, size: int, rng: random.Random) -> list[Step]:
    if not lines:
        return []
    first = max(1, at + 1 - rng.randint(3, 12))
    last = min(len(lines), at + size + rng.randint(3, 12))
    why = rng.choice([f"Let me look at {path} around line {at + 1}.", f"I'll view the relevant part of {path}.",
                      f"Let me read lines {first}-{last} of {path} before changing anything."])
    return [Step(why, ToolCall("file_editor", {"command": "view", "path": path, "view_range": [first, last]}))]


def _edit(path: str, lines: list[str], at: int, hunk: Hunk, number: int, notes: list[str],
          rng: random.Random) -> list[Step]:
    """The str_replace (or, into an empty file, insert) that turns the hunk's old lines at `at` into its new ones."""
    why = rng.choice([f"This is what needs to change in {path}; I'll edit it.",
                      f"The bug is here in {path}. Fixing it.", f"I'll make the change in {path} now."])
    if not lines:
        return [Step(why, ToolCall("file_editor", {"command": "insert", "path": path, "insert_line": 0,
                                                   "new_str": "".join(hunk.new)}))]
    text = "".join(lines)
    # Start from the changed lines with a seeded share of the hunk's context, and widen until the old text is unique.
    lead, trail = rng.randint(min(1, hunk.before), hunk.before), rng.randint(min(1, hunk.after), hunk.after)
    if not hunk.old[hunk.before:len(hunk.old) - hunk.after] and not lead and not trail:  # a pure insertion
        lead = hunk.before or 0
        trail = 0 if lead else min(1, hunk.after)
    start, end = at + hunk.before - lead, at + len(hunk.old) - hunk.after + trail
    while text.count("".join(lines[start:end])) != 1 or not "".join(lines[start:end]):
        if start == 0 and end == len(lines):
            break
        start, end = max(0, start - 1), min(len(lines), end + 1)
    if start < at or end > at + len(hunk.old):
        notes.append(f"hunk {number} of {path}: its old text is not unique with the patch's context, so the edit "
                     f"spans lines {start + 1}-{end} of the file")
    core_start, core_end = at + hunk.before, at + len(hunk.old) - hunk.after  # the lines the hunk changes
    old = "".join(lines[start:end])
    new = "".join(lines[start:core_start] + hunk.new[hunk.before:len(hunk.new) - hunk.after] + lines[core_end:end])
    return [Step(why, ToolCall("file_editor", {"command": "str_replace", "path": path, "old_str": old,
                                               "new_str": new}))]


def _test_step(task: Task, visible_tests: set[str], changed: list[str], rng: random.Random) -> Step:
    """Run the failing tests where the workspace has their files; else tests that must keep passing; else compile
    the changed Python files (factory tasks hide the failing tests' files from the agent)."""
    visible = lambda ids: [t for t in ids if _test_file(t) in visible_tests]  # noqa: E731
    failing, passing = visible(task.FAIL_TO_PASS), visible(task.PASS_TO_PASS)
    if failing:
        ids, why = failing[:MAX_TESTS], "Now let me run the failing test to confirm the fix."
    elif passing:  # whole files: a few ids of tests that must keep passing would cost more tokens than they say
        files = list(dict.fromkeys(map(_test_file, passing)))
        ids = rng.sample(files, min(2, len(files)))
        why = "The failing test's file is not in the workspace; let me run tests that must keep passing."
    else:
        ids = []
    if ids:
        return Step(why, ToolCall("execute_bash", {"command": f"{PYTEST} {' '.join(map(shlex.quote, ids))}"}))
    sources = [p for p in changed if p.endswith(".py")] or changed
    command = f"python -m py_compile {' '.join(map(shlex.quote, sources))}" if sources[0].endswith(".py") else \
        f"git status --short {' '.join(map(shlex.quote, sources))}"
    return Step("No test of this change is in the workspace; let me at least check the edited files.",
                ToolCall("execute_bash", {"command": command}))


def _finish(rng: random.Random) -> Step:
    why = rng.choice(["The change is in place; submitting.", "That fixes the issue. Done.",
                      "The fix is complete, so I'll finish."])
    return Step(why, ToolCall("finish", {}))


class ExpertEngine:
    """A plan as an engine with the model's real tokenizer: turn i answers with step i's thought and call, in the
    model's own format, as the tokenizer's encoding of that text plus the template's end-of-turn token, so the loop
    records it exactly as it would record a sample (logprob 0: the expert was certain). Past the plan it finishes."""

    needs_messages = True  # it reads the chat only to know the turn and the template's frame

    def __init__(self, tokenizer, plan: DemoPlan, tool_format: str, tools: list[dict] | None = None):
        """`tools`: the schemas the template renders (agent.tool_format native), as the loop passes them."""
        self.tokenizer, self.plan, self.tool_format, self.tools = tokenizer, plan, tool_format, tools

    def generate_chat(self, messages: list[dict], params: SamplingParams | None = None) -> Generation:
        turn = sum(m["role"] == "assistant" for m in messages)
        step = self.plan.steps[min(turn, len(self.plan.steps) - 1)]
        opened, closing = tokens.assistant_frame(self.tokenizer, messages, self.tools)
        text = sampled_text(self.tokenizer, opened, step, self.tool_format)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + closing[:1]
        limit = params.max_new_tokens if params is not None else len(ids)
        return Generation(ids[:limit], [0.0] * min(limit, len(ids)), "stop" if len(ids) <= limit else "length")

    async def agenerate_chat(self, messages: list[dict], params: SamplingParams | None = None) -> Generation:
        return self.generate_chat(messages, params)

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        raise TypeError("the expert engine takes the chat (generate_chat), not token ids")

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        return self.generate(prompt_ids, params)

    def load_weights(self, state_dict) -> None:
        raise TypeError("the expert engine plays a plan: it has no weights to load")

    def close(self) -> None:
        pass


def sampled_text(tokenizer, opened: str, step: Step, tool_format: str) -> str:
    """What the model would sample for `step` after the generation prompt opened `opened`: the thought inside the
    template's thinking block where it has one (Qwen3), else as plain text before the call (ChatML)."""
    call = render_call_json(step.call) if tool_format == "native" else render_call_xml(step.call)
    thinks = tokens.THINK_END in tokenizer.get_added_vocab()
    if thinks and opened.rstrip().endswith("<think>"):  # the generation prompt opened the thought
        return f"{step.reasoning}\n{tokens.THINK_END}\n\n{call}"
    if thinks and tokens.THINK_END not in opened:
        return f"<think>\n{step.reasoning}\n{tokens.THINK_END}\n\n{call}"
    return f"{step.reasoning}\n\n{call}"
