"""Import public SWE datasets (SWE-bench, SWE-Gym, R2E-Gym, SWE-smith, SWE-rebench) into Task records.

Rows come from JSONL or Parquet files, or from `hf:<name>[:split]`; a bad row becomes an error, never a crash.
convert_row maps a row's columns to Task fields; import_tasks then adds each row's execution spec (specs.py), so every
imported Task names its image, eval script, log parser and eval type, or the row is refused as `file:row: why`.
"""

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from patchgym.env.grading.r2egym_log import decolor, parse_r2egym
from patchgym.tasks.decontaminate import exclude_repos
from patchgym.tasks.diffs import reverse_patch
from patchgym.tasks.specs import derive_specs
from patchgym.tasks.task import Task, TaskError, read_tasks

# swebench: SWE-bench v5 rows (they carry eval_script, image, log_parser, eval_type); swebench-classic: SWE-bench,
# Lite and Verified rows from before v5.
FORMATS = ("swebench", "swebench-classic", "swegym", "r2egym", "smith", "rebench")


@dataclass
class ImportResult:
    tasks: list[Task]
    errors: list[str]  # "<file>:<row>: field <name>: <problem>"
    dropped: list[Task] = field(default_factory=list)  # removed by decontamination
    warnings: list[str] = field(default_factory=list)  # kept, but something in them was ignored


def import_tasks(fmt: str, source: str, *, exclude_repos_of: str | None = None) -> ImportResult:
    """Convert every row of `source`; bad rows become errors and the valid ones are kept."""
    if fmt not in FORMATS:
        raise TaskError(_unknown_format(fmt))
    result, seen, converted, errors = ImportResult([], []), {}, [], []
    for number, row in _rows(source):
        try:
            if isinstance(row, TaskError):
                raise row
            task = convert_row(fmt, row)
            if task.instance_id in seen:
                raise _field_error("instance_id", f"{task.instance_id!r} already on row {seen[task.instance_id]}")
            seen[task.instance_id] = number
            converted.append((number, task))
        except TaskError as exc:
            errors += [(number, line) for line in str(exc).splitlines()]
    fields = [task.model_dump() for _, task in converted]
    for (number, task), spec in zip(converted, derive_specs(fmt, fields)):
        if isinstance(spec, TaskError):
            errors.append((number, str(spec)))
        else:
            result.tasks.append(task.model_copy(update=spec))
    result.errors = [f"{source}:{number}: {line}" for number, line in sorted(errors, key=lambda e: e[0])]
    if exclude_repos_of:
        result.tasks, result.dropped = exclude_repos(result.tasks, read_tasks(exclude_repos_of))
    return result


def task_rows(tasks: Iterable[Task], image_built: Callable[[str], bool]) -> list[tuple[str, str, int, int, str]]:
    """One row per task for the CLI table: id, repo, #FAIL_TO_PASS, #PASS_TO_PASS, image built (yes/no)."""
    return [(t.instance_id, t.repo, len(t.FAIL_TO_PASS), len(t.PASS_TO_PASS), "yes" if image_built(t.image) else "no")
            for t in tasks]


# --- reading rows -------------------------------------------------------------------------------------------------

def _rows(source: str) -> Iterator[tuple[int, dict | TaskError]]:
    """Rows of a .jsonl or .parquet file, or of `hf:<name>[:split]`, numbered from 1; a bad row is a TaskError."""
    if source.startswith("hf:"):
        return _hf_rows(source.removeprefix("hf:"))
    path = Path(source)
    if path.is_dir():
        raise TaskError(f"cannot read {source}: a directory, not a .jsonl or .parquet file")
    if not path.is_file():
        raise TaskError(f"cannot read {source}: no such file")
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    raise TaskError(f"cannot read {source}: expected a .jsonl or .parquet file, or hf:<dataset>[:split]")


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict | TaskError]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode())
            except UnicodeDecodeError as exc:
                yield number, _field_error("(row)", f"not UTF-8 text (byte {exc.start}): is the file binary?")
                continue
            except json.JSONDecodeError as exc:
                yield number, _field_error("(row)", f"not valid JSON: {exc.msg} at column {exc.colno}")
                continue
            yield number, row if isinstance(row, dict) else _field_error("(row)", "not a JSON object")


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(f"reading {path} needs pyarrow (pip install pyarrow)") from None
    def rows() -> Iterator[dict]:
        try:
            for batch in pq.ParquetFile(path).iter_batches():
                yield from batch.to_pylist()
        except Exception as exc:  # pyarrow raises several types (ArrowInvalid, OSError), also for a page cut short
            raise TaskError(f"cannot read {path} as Parquet: {exc}") from None

    return enumerate(rows(), 1)


def _hf_rows(spec: str) -> Iterator[tuple[int, dict]]:
    name, _, split = spec.partition(":")
    try:
        import datasets
    except ImportError:
        raise TaskError(f"hf:{spec} needs the `datasets` package (pip install datasets) and a network") from None
    try:
        data = datasets.load_dataset(name, split=split or None)
    except Exception as exc:  # offline, unknown name or split: the library raises many types
        raise TaskError(f"cannot load hf:{spec}: {exc}") from None
    if isinstance(data, datasets.DatasetDict):
        if len(data) != 1:
            raise TaskError(f"hf:{name} has splits {', '.join(data)}: name one, as hf:{name}:{next(iter(data))}")
        data = next(iter(data.values()))
    return enumerate(data, 1)


# --- converting rows ----------------------------------------------------------------------------------------------

def convert_row(fmt: str, row: dict) -> Task:
    """One dataset row's columns as a Task, before its execution spec; TaskError lines read
    `field <name>: <problem>`."""
    if fmt not in _CONVERTERS:
        raise TaskError(_unknown_format(fmt))
    fields = _CONVERTERS[fmt](row)
    try:
        # Empty values fall back to Task's defaults (log_parser, workdir).
        return Task(**{k: v for k, v in fields.items() if v not in ("", None)})
    except ValidationError as exc:
        raise TaskError("\n".join(f"field {'.'.join(map(str, e['loc']))}: {e['msg']}"
                                  for e in exc.errors(include_url=False))) from None


def _swebench_shaped(row: dict, source: str, default_image: Callable[[str], str] = lambda iid: "") -> dict:
    instance_id = _text(row, "instance_id", required=True)
    version = row.get("version")
    return dict(
        instance_id=instance_id, repo=_text(row, "repo", required=True),
        problem_statement=_text(row, "problem_statement", required=True),
        FAIL_TO_PASS=_tests(row, "FAIL_TO_PASS", required=True), PASS_TO_PASS=_tests(row, "PASS_TO_PASS"),
        # Some dumps store a version like 3.0 as a number.
        version=str(version) if isinstance(version, int | float) else _text(row, "version"),
        base_commit=_text(row, "base_commit", required=True), patch=_text(row, "patch", required=True),
        test_patch=_text(row, "test_patch"), image=_row_image(row) or default_image(instance_id),
        eval_script=_text(row, "eval_script"), log_parser=_text(row, "log_parser"), eval_type=_text(row, "eval_type"),
        hints_text=_text(row, "hints_text"), created_at=_text(row, "created_at"),
        difficulty=_text(row, "difficulty"), source=source)


def _swebench(row: dict) -> dict:
    """A v5 row names its image; a classic one gets swebench 4.1.0's published name (specs.py)."""
    return _swebench_shaped(row, "swebench")


def _swegym(row: dict) -> dict:
    # SWE-Gym's published images spell "__" as "_s_" (Docker Hub forbids "__").
    return _swebench_shaped(
        row, "swegym", lambda iid: f"xingyaoww/sweb.eval.x86_64.{iid.replace('__', '_s_').lower()}:latest")


def _rebench(row: dict) -> dict:
    fields = _swebench_shaped(row, "rebench")
    fields["install_config"] = _decoded(row, "install_config", dict, "a JSON object", required=False) or None
    return fields


def _smith(row: dict) -> dict:
    bug = _text(row, "patch", required=True)
    try:
        fix = reverse_patch(bug)
    except ValueError as exc:
        raise _field_error("patch", f"cannot reverse the bug patch: {exc}") from None
    return dict(
        instance_id=_text(row, "instance_id", required=True), repo=_text(row, "repo", required=True),
        problem_statement=_text(row, "problem_statement", required=True),
        FAIL_TO_PASS=_tests(row, "FAIL_TO_PASS", required=True), PASS_TO_PASS=_tests(row, "PASS_TO_PASS"),
        base_commit=_text(row, "base_commit"), image=_text(row, "image_name", required=True),
        # The image holds the bug already, on a branch named after the instance (SWE-smith's harness checks it out).
        patch=fix, start_ref=_text(row, "instance_id"), created_at=_text(row, "created_at"), source="smith")


def _r2egym(row: dict) -> dict:
    """R2E-Gym: the gold patch is rebuilt from parsed_commit_content; `prompt` embeds it and is never read."""
    commit = _decoded(row, "parsed_commit_content", dict, "a JSON object", required=True)
    try:
        patch, test_patch = _r2e_patch(commit["file_diffs"], tests=False), _r2e_patch(commit["file_diffs"], tests=True)
    except (KeyError, TypeError, AttributeError) as exc:
        raise _field_error("parsed_commit_content", f"malformed file_diffs ({type(exc).__name__}: {exc})") from None
    if not patch:
        raise _field_error("parsed_commit_content", "no change outside test files, so no gold patch")
    statement = _text(row, "problem_statement", required=True)
    if re.search(r"^(diff --git |@@ -\d)", statement, re.MULTILINE):
        raise _field_error("problem_statement", "quotes a diff; the gold patch must never reach the agent")
    fail_to_pass, pass_to_pass = _r2e_tests(row)
    repo, commit_hash = _text(row, "repo_name", required=True), _text(row, "commit_hash", required=True)
    return dict(
        instance_id=_text(row, "instance_id") or f"{repo}__{commit_hash}", repo=repo,
        problem_statement=statement, FAIL_TO_PASS=fail_to_pass, PASS_TO_PASS=pass_to_pass,
        # The image is checked out at the parent of the fix commit.
        base_commit=str(commit.get("old_commit_hash") or ""), image=_text(row, "docker_image", required=True),
        patch=patch, test_patch=test_patch, created_at=str(commit.get("commit_date") or ""),
        log_parser="r2egym", source="r2egym")


_CONVERTERS = {"swebench": _swebench, "swebench-classic": _swebench, "swegym": _swegym, "r2egym": _r2egym,
               "smith": _smith, "rebench": _rebench}


# --- R2E-Gym ------------------------------------------------------------------------------------------------------

def _r2e_tests(row: dict) -> tuple[list[str], list[str]]:
    """Tests expected to pass after the fix: FAIL_TO_PASS unless the old commit's run passed them (PASS_TO_PASS).

    expected_output_json holds only the statuses after the fix; the before side comes from the old run's log in
    execution_result_content. Without that log every expected pass counts as failing before: grading is the same
    (every listed test must pass), only the split is coarser. Tests expected to fail after the fix are left out.
    """
    expected = _decoded(row, "expected_output_json", dict, "a JSON object", required=True)
    passing = [decolor(name) for name, status in expected.items() if status == "PASSED"]
    execution = _decoded(row, "execution_result_content", dict, "a JSON object", required=False)
    before = parse_r2egym(str(execution.get("old_commit_res_stdout") or ""))
    fail_to_pass = [name for name in passing if before.get(name) != "PASSED"]
    if not fail_to_pass:
        raise _field_error("expected_output_json", "no test goes from failing to passing")
    return fail_to_pass, [name for name in passing if before.get(name) == "PASSED"]


def _r2e_patch(file_diffs: list[dict], *, tests: bool) -> str:
    # A binary diff carries no content in the row, so it cannot be rebuilt and is left out.
    return "".join(_r2e_file_patch(d) for d in file_diffs
                   if not d.get("is_binary_file") and _is_test_path(d["header"]["file"]["path"]) == tests)


def _is_test_path(path: str) -> bool:
    """R2E-Gym's rule for a test file."""
    parts = path.split("/")
    return (path.endswith("_test.py") or parts[-1].startswith("test_")
            or any(p in ("tests", "Tests", "test", "Test") for p in parts[:-1]))


def _r2e_file_patch(diff: dict) -> str:
    path, header = diff["header"]["file"]["path"], diff["header"]
    lines = [f"diff --git a/{path} b/{path}"] + ([header["misc_line"]] if header.get("misc_line") else [])
    if index := diff.get("index_line"):
        lines.append(f"index {index['old_commit_hash']}..{index['new_commit_hash']} {index.get('mode') or ''}".rstrip())
    if diff.get("hunks"):
        lines += [f"--- {(diff.get('minus_file') or {}).get('path') or 'a/' + path}",
                  f"+++ {(diff.get('plus_file') or {}).get('path') or 'b/' + path}"]
    prefix = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}
    for hunk in diff.get("hunks") or []:
        d = hunk["descriptor"]
        section = f" {d['section']}" if d.get("section") else ""
        lines.append(f"@@ -{_r2e_range(d['old_range'])} +{_r2e_range(d['new_range'])} @@{section}")
        lines += [prefix[line["type"]] + line["content"] for line in hunk["line_group"]["all_lines"]]
    return "\n".join(lines) + "\n"


def _r2e_range(r: dict) -> str:
    return str(r["start"]) if r.get("length") is None else f"{r['start']},{r['length']}"


# --- reversing a unified diff (SWE-smith ships the bug; the fix is its reverse) ---------------------------------

def _field_error(name: str, problem: str) -> TaskError:
    return TaskError(f"field {name}: {problem}")


def _unknown_format(fmt: str) -> str:
    return f"unknown dataset format {fmt!r}: choose one of {', '.join(FORMATS)}"


def _text(row: dict, key: str, *, required: bool = False) -> str:
    value = row.get(key)
    if value is None or value == "":
        if required:
            raise _field_error(key, "missing" if key not in row else "empty")
        return ""
    if isinstance(value, datetime):  # Parquet and HF timestamps
        return value.isoformat()
    if not isinstance(value, str):
        raise _field_error(key, f"expected text, got {type(value).__name__}")
    return value


def _tests(row: dict, key: str, *, required: bool = False) -> list[str]:
    tests = _decoded(row, key, list, "a list of test ids", required=required)
    if not all(isinstance(t, str) for t in tests):
        raise _field_error(key, "expected a list of test ids, got a list holding non-text")
    return tests


def _decoded(row: dict, key: str, kind: type, what: str, *, required: bool):
    """A list or object given as itself or as its JSON text (SWE-bench stores test lists as text)."""
    value = row.get(key)
    if value is None or value == "":
        if required:
            raise _field_error(key, "missing" if key not in row else "empty")
        return kind()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _field_error(key, f"not valid JSON: {exc.msg}") from None
    if not isinstance(value, kind):
        raise _field_error(key, f"expected {what}, got {type(value).__name__}")
    return value


def _row_image(row: dict) -> str:
    # SWE-bench v5 says "image", SWE-rebench's leaderboard "docker_image", SWE-smith "image_name".
    return next((_text(row, k) for k in ("image", "docker_image", "image_name") if row.get(k)), "")
