"""Runs inside the cached swebench 4.1.0 + swesmith venv (never in patchgym's own): rows in, execution specs out, JSON.

It imports nothing from patchgym, so the official packages' code is the only thing deriving the spec:
- classic SWE-bench / SWE-Gym rows: 4.1.0's MAP_REPO_VERSION_TO_SPECS, make_eval_script_list, TestSpec's eval_script
  and instance_image_key (namespace "swebench"), MAP_REPO_TO_PARSER and FAIL_ONLY_REPOS;
- SWE-rebench rows: the same functions with the row's install_config in place of the table entry, which is what the
  SWE-rebench fork's make_test_spec does (`specs = instance['install_config']`);
- SWE-smith rows: the repo profile's test command and test files (swesmith.profiles.registry), every language's;
- SWE-smith verdicts ("smith_grade"): a test log read by swesmith's own read_test_output, its profile's log_parser
  and get_eval_report, for profiles whose parser patchgym does not hold (every one but the Python profiles' default).
make_test_spec itself is not called: it also builds the env script, which fetches requirements from GitHub.
It serves requests until stdin closes, one JSON line each, {"kind": "classic"|"rebench"|"smith"|"smith_grade",
"rows": [row, ...]}, and answers each with one JSON line, [{"spec": {...}} | {"report": {...}} | {"error": "why"}, ...].
"""

import json
import sys


class Refused(Exception):
    """The row cannot get a spec; the message says why."""


def classic_spec(row: dict, install_config: dict | None = None) -> dict:
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS

    if install_config is None:
        return _classic_spec(row, None)
    # The row's install_config stands in for the table entry for this row only: the worker serves later rows too.
    repo, version = row["repo"], row["version"]
    ext, versions = MAP_REPO_TO_EXT.get(repo), MAP_REPO_VERSION_TO_SPECS.get(repo)
    entry = versions.get(version) if versions is not None else None
    try:
        return _classic_spec(row, install_config)
    finally:
        if ext is None:
            MAP_REPO_TO_EXT.pop(repo, None)
        if versions is None:
            MAP_REPO_VERSION_TO_SPECS.pop(repo, None)
        elif entry is None:
            versions.pop(version, None)
        else:
            versions[version] = entry


def _classic_spec(row: dict, install_config: dict | None) -> dict:
    from swebench.harness.constants import FAIL_ONLY_REPOS, MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.test_spec.create_scripts import make_eval_script_list
    from swebench.harness.test_spec.test_spec import TestSpec

    repo, version = row["repo"], row["version"]
    if install_config is not None:
        MAP_REPO_VERSION_TO_SPECS.setdefault(repo, {})[version] = install_config
        MAP_REPO_TO_EXT.setdefault(repo, "py")
        parser = install_config.get("log_parser") or getattr(MAP_REPO_TO_PARSER.get(repo), "__name__", "")
        if not parser:
            raise Refused("install_config names no log_parser and swebench knows no parser for this repo")
    else:
        if repo not in MAP_REPO_VERSION_TO_SPECS:
            raise Refused(f"repo {repo} is not in swebench 4.1.0's spec table")
        if version not in MAP_REPO_VERSION_TO_SPECS[repo]:
            raise Refused(f"version {version!r} of {repo} is not in swebench 4.1.0's spec table "
                              f"(it has {', '.join(sorted(MAP_REPO_VERSION_TO_SPECS[repo]))})")
        parser = MAP_REPO_TO_PARSER[repo].__name__
    specs = MAP_REPO_VERSION_TO_SPECS[repo][version]
    if "test_cmd" not in specs:
        raise Refused("the spec has no test_cmd")
    script = make_eval_script_list(row, specs, "testbed", "/testbed", row["base_commit"], row["test_patch"])
    spec = TestSpec(instance_id=row["instance_id"], repo=repo, version=version, repo_script_list=[],
                    eval_script_list=script, env_script_list=[], arch="x86_64", FAIL_TO_PASS=[], PASS_TO_PASS=[],
                    language=MAP_REPO_TO_EXT[repo], docker_specs={}, namespace="swebench")
    return {"eval_script": spec.eval_script, "image": spec.instance_image_key, "log_parser": parser,
            "eval_type": "fail_only" if repo in FAIL_ONLY_REPOS else "pass_and_fail"}


def smith_spec(row: dict) -> dict:
    from swesmith.profiles.python import PythonProfile

    profile = _profile(row)
    # The Python profiles' default parser is ported (patchgym's "swesmith"); any other is run here at grading time.
    ported = isinstance(profile, PythonProfile) and type(profile).log_parser is PythonProfile.log_parser
    try:
        test_cmd, _ = profile.get_test_cmd(row)
        f2p_files, p2p_files = profile.get_test_files(row)
    except Exception as exc:  # e.g. GoProfile lists test files from a clone of its GitHub mirror
        raise Refused(f"profile {type(profile).__name__} cannot list its test files offline "
                      f"({type(exc).__name__}: {str(exc)[:200]})") from None
    return {"test_cmd": test_cmd, "test_files": sorted(set(f2p_files + p2p_files)), "image": profile.image_name,
            "timeout": profile.timeout, "parser": "swesmith" if ported else "swesmith-profile",
            "grading": "harness" if ported else "swesmith-profile"}


def smith_grade(row: dict) -> dict:
    """SWE-smith's verdict on a test log: `row` has instance_id, repo, FAIL_TO_PASS, PASS_TO_PASS and `log`, the
    eval script's marked test output (patchgym's trusted section, between the start and end markers)."""
    import tempfile

    from swesmith.constants import TEST_OUTPUT_END, TEST_OUTPUT_START
    from swesmith.harness.grading import get_eval_report, read_test_output

    profile = _profile(row)
    inst = {k: row[k] for k in ("instance_id", "repo", "FAIL_TO_PASS", "PASS_TO_PASS")}
    # The log as swesmith's eval.sh writes it under `set -x`: its markers are traced `+ : '<marker>'` lines.
    section = row["log"].split(TEST_OUTPUT_START, 1)[-1].split(TEST_OUTPUT_END, 1)[0]
    text = f"+ : '{TEST_OUTPUT_START}'\n{section}\n+ : '{TEST_OUTPUT_END}'\n"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        output, found = read_test_output(f.name)
        statuses = profile.log_parser(output) if found else {}
        report = get_eval_report({"model_patch": "patch"}, inst, f.name)
    return {"statuses": statuses, "found": found, "resolved": bool(report.get("resolved"))}


def _profile(row: dict):
    from swesmith.profiles import registry

    try:
        return registry.get_from_inst(row)
    except KeyError:
        raise Refused(f"swesmith knows no repo profile {row.get('repo')!r}") from None


def answer(request: dict) -> list[dict]:
    kind = request["kind"]
    derive = {"classic": classic_spec, "smith": smith_spec, "smith_grade": smith_grade,
              "rebench": lambda row: classic_spec(row, row["install_config"])}[kind]
    key = "report" if kind == "smith_grade" else "spec"
    answers = []
    for row in request["rows"]:
        try:
            answers.append({key: derive(row)})
        except Exception as exc:  # the official code raises many types (KeyError, AssertionError); each is the row's
            answers.append({"error": str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"})
    return answers


def main() -> None:
    out, sys.stdout = sys.stdout, sys.stderr  # what the harness code prints must not land among the answers
    for line in sys.stdin:
        if line.strip():
            out.write(json.dumps(answer(json.loads(line))) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
