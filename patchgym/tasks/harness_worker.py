"""Runs inside the cached swebench 4.1.0 + swesmith venv (never in patchgym's own): rows in, execution specs out, JSON.

It imports nothing from patchgym, so the official packages' code is the only thing deriving the spec:
- classic SWE-bench / SWE-Gym rows: 4.1.0's MAP_REPO_VERSION_TO_SPECS, make_eval_script_list, TestSpec's eval_script
  and instance_image_key (namespace "swebench"), MAP_REPO_TO_PARSER and FAIL_ONLY_REPOS;
- SWE-rebench rows: the same functions with the row's install_config in place of the table entry, which is what the
  SWE-rebench fork's make_test_spec does (`specs = instance['install_config']`);
- SWE-smith rows: the repo profile's test command and test files (swesmith.profiles.registry).
make_test_spec itself is not called: it also builds the env script, which fetches requirements from GitHub.
stdin: {"kind": "classic"|"rebench"|"smith", "rows": [row, ...]}; stdout: [{"spec": {...}} | {"error": "why"}, ...].
"""

import json
import sys


class Refused(Exception):
    """The row cannot get a spec; the message says why."""


def classic_spec(row: dict, install_config: dict | None = None) -> dict:
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
    from swesmith.profiles import registry
    from swesmith.profiles.python import PythonProfile

    try:
        profile = registry.get_from_inst(row)
    except KeyError:
        raise Refused(f"swesmith knows no repo profile {row.get('repo')!r}") from None
    if not isinstance(profile, PythonProfile) or type(profile).log_parser is not PythonProfile.log_parser:
        # patchgym ports only the Python profiles' default parser (parsers.py "swesmith").
        raise Refused(f"profile {type(profile).__name__} parses logs its own way; only the Python profiles' "
                          "default pytest parser is supported")
    test_cmd, _ = profile.get_test_cmd(row)
    f2p_files, p2p_files = profile.get_test_files(row)
    return {"test_cmd": test_cmd, "test_files": sorted(set(f2p_files + p2p_files)), "image": profile.image_name,
            "timeout": profile.timeout}


def main() -> None:
    request = json.load(sys.stdin)
    derive = {"classic": classic_spec, "smith": smith_spec,
              "rebench": lambda row: classic_spec(row, row["install_config"])}[request["kind"]]
    answers = []
    for row in request["rows"]:
        try:
            answers.append({"spec": derive(row)})
        except Exception as exc:  # the official code raises many types (KeyError, AssertionError); each is the row's
            answers.append({"error": str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"})
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
