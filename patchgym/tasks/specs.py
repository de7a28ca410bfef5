"""One execution spec per imported row (image, eval script, log parser, eval type, hidden paths), derived as the
dataset's own harness derives it.

- swebench (v5 rows): taken as they are through swebench 5's make_test_spec, which also makes the script record the
  test command's exit code. Needs the extra: pip install 'patchgym[swebench]'.
- swebench-classic, swegym, rebench: swebench 4.1.0's own code in its cached venv (harness_venv.py) writes a
  v5-shaped row, which then goes through the v5 path like any v5 row.
- smith: the repo profile's image, test command and test files from swesmith (same venv), for a profile of any
  language; the script is SWE-smith's eval.sh with the checkout its harness does first (see smith_eval_script). The
  agent's sandbox must start on the instance's branch (`git checkout <instance_id>`), as SWE-smith's harness does
  before anything else. The Python profiles' default parser is ported ("swesmith"); every other profile's parser
  runs in that venv when a log is graded (the "swesmith-profile" grading family).
- r2egym: the image's run_tests.sh over /r2e_tests, as R2E-Gym's DockerRuntime runs it.
Every script prints SWE-bench's `>>>>> Start/End Test Output` markers around the test command's output and the
command's exit code after the end marker, so the grader can slice any family's log the same way.
"""

import shlex

from patchgym.env.grading import harness_venv
from patchgym.tasks.task import TaskError

START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
EXIT_CODE, EXIT_CODE_VAR = ">>>>> Test Exit Code", "SWEBENCH_TEST_EXIT_CODE"  # swebench 5's constants
SMITH_REMOVAL = "Remove F2P Tests"  # the subject of the commit SWE-smith adds to a branch to hide the F2P test files
R2E_HIDDEN = ("/r2e_tests", "/testbed/run_tests.sh")  # R2E-Gym moves both out of the agent's reach (SKIP_FILES_NEW)

Spec = dict  # the Task fields a spec sets


def swebench_v5():
    """swebench 5's make_test_spec and parser registry, or a UserError naming the extra."""
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.utils import make_test_spec
    except ImportError:
        raise TaskError("SWE-bench rows need the swebench package: pip install 'patchgym[swebench]'") from None
    return make_test_spec, PARSER_REGISTRY


def v5_spec(row: dict) -> Spec:
    """A row in SWE-bench v5's schema (eval_script, image, log_parser, eval_type), as swebench 5 runs it."""
    missing = [k for k in ("eval_script", "image", "log_parser", "eval_type") if not row.get(k)]
    if missing:
        raise TaskError(f"field {missing[0]}: missing; a row without {', '.join(missing)} is a classic SWE-bench "
                        "row: import it with --format swebench-classic")
    make_test_spec, registry = swebench_v5()
    if row["log_parser"] not in registry:
        raise TaskError(f"field log_parser: {row['log_parser']!r} is not a parser swebench 5 knows")
    if row["eval_type"] not in ("pass_and_fail", "fail_only"):
        raise TaskError(f"field eval_type: {row['eval_type']!r} is neither pass_and_fail nor fail_only")
    version = row.get("version")
    spec = make_test_spec({**row, "version": "" if version is None else str(version)})
    if not any(END in line for line in spec.eval_script_list):
        raise TaskError(f"field eval_script: no {END!r} marker, so its test output cannot be found in the log")
    return dict(image=spec.image, eval_script=spec.eval_script, log_parser=spec.log_parser,
                eval_type=spec.eval_type, grading="swebench")


def smith_eval_script(instance_id: str, test_cmd: str, test_files: list[str]) -> str:
    """SWE-smith's eval, run on the agent's tree (the instance branch's tip plus the candidate patch).

    A branch holds the bug commit and, where the profile lists the F2P tests' files, a last commit that removes them.
    SWE-smith's harness checks out the branch, then `HEAD~1` (the bug commit), applies the patch and resets the
    patch's edits to the F2P/P2P test files, then runs eval.sh: `cd /testbed`, markers, test command. Here the patch
    is already on the tip, so when the tip is that removal commit, the files it changed and the test files are checked
    out from `<branch>~1`: the same tree. A branch without it (the harness's `HEAD~1` would be the clean snapshot,
    under the bug) is graded at its tip, with only the test files reset.
    """
    tip, bug = shlex.quote(instance_id), shlex.quote(f"{instance_id}~1")
    restore = [f"if [ \"$(git log -1 --format=%s {tip})\" = {shlex.quote(SMITH_REMOVAL)} ]; then",
               f"  removed=$(git diff --name-only {bug} {tip})",
               f'  if [ -n "$removed" ]; then git checkout {bug} -- $removed; fi',
               f"  base={bug}", f"else base={tip}; fi"]
    if test_files:
        restore.append(f"git checkout \"$base\" -- {' '.join(map(shlex.quote, test_files))}")
    return _script(["cd /testbed", *restore], test_cmd)


def r2e_eval_script() -> str:
    """R2E-Gym's run_tests(): the hidden tests linked into the repo only while run_tests.sh runs, then removed."""
    link = ["cd /testbed", "rm -rf /testbed/r2e_tests", "ln -s /r2e_tests /testbed/r2e_tests"]
    return _script(link, "bash /testbed/run_tests.sh", after=["rm -rf /testbed/r2e_tests"])


def _script(before: list[str], test_cmd: str, after: tuple[str, ...] | list[str] = ()) -> str:
    lines = ["#!/bin/bash", "set -uxo pipefail", *before, f": '{START}'", test_cmd, f"{EXIT_CODE_VAR}=$?",
             f": '{END}'", f'echo "{EXIT_CODE}: ${EXIT_CODE_VAR}"', *after]
    return "\n".join(lines) + "\n"


def classic_row(fields: dict) -> dict:
    """The row as swebench 4.1.0's functions read it."""
    return {"instance_id": fields["instance_id"], "repo": fields["repo"], "version": fields.get("version", ""),
            "base_commit": fields.get("base_commit", ""), "test_patch": fields.get("test_patch", ""),
            "FAIL_TO_PASS": fields["FAIL_TO_PASS"], "PASS_TO_PASS": fields.get("PASS_TO_PASS", []),
            **({"install_config": fields["install_config"]} if fields.get("install_config") else {})}


def derive_specs(fmt: str, rows: list[dict]) -> list[Spec | TaskError]:
    """Each converted row's spec fields, or the TaskError that refuses it (`field <name>: why`)."""
    if fmt in ("swebench", "swebench-classic", "swegym", "rebench") and rows:
        swebench_v5()  # a missing extra stops the import, with the pip line, before any row is tried
    if fmt == "swebench":
        return [_guard(v5_spec, row) for row in rows]
    if fmt == "r2egym":
        return [dict(eval_script=r2e_eval_script(), hidden_paths=list(R2E_HIDDEN), log_parser="r2egym",
                     grading="harness", eval_type="pass_and_fail") for _ in rows]
    if fmt in ("swebench-classic", "swegym", "rebench"):
        return _via_classic_harness(fmt, rows)
    if fmt == "smith":
        return _via_swesmith(rows)
    raise TaskError(f"no execution spec for format {fmt!r}")


def _via_classic_harness(fmt: str, rows: list[dict]) -> list[Spec | TaskError]:
    kind = "rebench" if fmt == "rebench" else "classic"
    ready, results = [], [None] * len(rows)
    for i, row in enumerate(rows):
        if fmt == "rebench" and not row.get("install_config"):
            results[i] = TaskError("field install_config: missing; SWE-rebench's harness takes the spec from it")
        elif fmt == "rebench" and not row.get("image"):
            results[i] = TaskError("field docker_image: missing; patchgym runs published images and cannot build "
                                   "one from install_config")
        elif not row.get("version"):
            results[i] = TaskError("field version: missing; the spec is chosen by repo and version")
        else:
            ready.append(i)
    answers = harness_venv.derive(kind, [classic_row(rows[i]) for i in ready])
    for i, answer in zip(ready, answers):
        if "error" in answer:
            results[i] = TaskError(f"no execution spec: {answer['error']}")
            continue
        spec = answer["spec"]
        if fmt == "swegym":  # SWE-Gym publishes its own images; "__" is spelled "_s_" there
            spec["image"] = rows[i]["image"]
        elif fmt == "rebench":
            spec["image"] = rows[i]["image"]
        v5_row = {**rows[i], **spec, "version": str(rows[i]["version"])}
        results[i] = _guard(v5_spec, v5_row)
    return results


def _via_swesmith(rows: list[dict]) -> list[Spec | TaskError]:
    answers = harness_venv.derive("smith", [{"instance_id": r["instance_id"], "repo": r["repo"],
                                             "FAIL_TO_PASS": r["FAIL_TO_PASS"],
                                             "PASS_TO_PASS": r.get("PASS_TO_PASS", [])} for r in rows])
    results = []
    for row, answer in zip(rows, answers):
        if "error" in answer:
            results.append(TaskError(f"no execution spec: {answer['error']}"))
            continue
        spec = answer["spec"]
        # The row's image_name where it names a published image (`<namespace>/swesmith.x86_64...`); the 2025-06 rows
        # carry the harness's local name (no namespace), and then the image is the profile's (rp.image_name).
        image = row.get("image") or ""  # the converted fields: image_name is `image` here
        results.append(dict(eval_script=smith_eval_script(row["instance_id"], spec["test_cmd"], spec["test_files"]),
                            image=image if "/" in image else spec["image"], log_parser=spec["parser"],
                            grading=spec["grading"], eval_type="pass_and_fail"))
    return results


def _guard(fn, row: dict) -> Spec | TaskError:
    try:
        return fn(row)
    except TaskError as exc:
        return exc
