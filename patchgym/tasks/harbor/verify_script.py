"""The verifier of a task patchgym exported as a Harbor folder: copied into the folder's tests/ as verify.py and run
by tests/test.sh inside the task's image after the agent is done. Standard library only, Python >= 3.6 syntax.

It grades as patchgym's grader does: every file the grader owns (tests, test configuration, packaging metadata) is
put back as the task started and new ones removed, using the starting commit the image keeps outside the workspace;
the hidden test files are written; the test command runs with the report pytest plugin (tests/report_plugin.py); the
task is resolved when every FAIL_TO_PASS and PASS_TO_PASS test passed in pytest's own report (printed lines do not
count).
It writes /logs/verifier/reward.txt (1 or 0) and grade.json (the statuses, or why there are none).
"""

import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LOGS = "/logs/verifier"


def owned_by_grader(path, owned):
    name = path.rsplit("/", 1)[-1]
    return (path in owned["files"] or name in owned["names"]
            or any(re.search(pattern, path) for pattern in owned["patterns"]))


def git(spec, *args):
    env = dict(os.environ, GIT_DIR=spec["base_git_dir"], GIT_WORK_TREE=".")
    result = subprocess.run(["git", "-c", "core.quotepath=off"] + list(args), cwd=spec["workdir"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if result.returncode != 0:
        raise RuntimeError("git %s failed: %s" % (args[0], result.stdout[-2000:]))
    return result.stdout


def restore_owned(spec):
    """Undo what the agent did to files the grader owns: changed or deleted ones restored, new ones removed."""
    changed = git(spec, "diff", "--name-only", "--no-renames").splitlines()
    new = git(spec, "ls-files", "--others").splitlines()
    restore = [p for p in changed if owned_by_grader(p, spec["owned"])]
    if restore:
        git(spec, "checkout", "--", *restore)
    for path in new:
        if owned_by_grader(path, spec["owned"]):
            os.remove(os.path.join(spec["workdir"], path))


def write_hidden(spec):
    root = os.path.join(HERE, "hidden")
    for folder, _, names in os.walk(root):
        for name in names:
            source = os.path.join(folder, name)
            target = os.path.join(spec["workdir"], os.path.relpath(source, root))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.lexists(target) or os.path.isdir(target):
                subprocess.run(["rm", "-rf", target])
            with open(source, "rb") as src, open(target, "wb") as dst:
                dst.write(src.read())


def verdict(spec, report_path):
    sys.path.insert(0, HERE)
    import report_reader

    try:
        with open(report_path, encoding="utf-8", errors="replace") as f:
            statuses = report_reader.statuses_of(f.read(), report_path)
    except FileNotFoundError:
        return {"resolved": False, "error": "no test report: pytest did not start, or not with the plugin"}
    except report_reader.ReportMissing as exc:
        return {"resolved": False, "error": str(exc)}
    f2p = {t: statuses.get(t, "MISSING") for t in spec["FAIL_TO_PASS"]}
    p2p = {t: statuses.get(t, "MISSING") for t in spec["PASS_TO_PASS"]}
    resolved = all(s in report_reader.PASSING for s in list(f2p.values()) + list(p2p.values()))
    return {"resolved": resolved, "f2p": f2p, "p2p": p2p}


def main():
    with open(os.path.join(HERE, "task.json")) as f:
        spec = json.load(f)
    os.makedirs(LOGS, exist_ok=True)
    report_path = os.path.join(LOGS, "report.jsonl")
    if os.path.lexists(report_path):
        os.remove(report_path)
    restore_owned(spec)
    write_hidden(spec)
    run = subprocess.run(["bash", "-c", spec["command"]], cwd=spec["workdir"])
    grade = verdict(spec, report_path)
    grade["exit_code"] = run.returncode
    with open(os.path.join(LOGS, "grade.json"), "w") as f:
        json.dump(grade, f, indent=1)
    with open(os.path.join(LOGS, "reward.txt"), "w") as f:
        f.write("1\n" if grade["resolved"] else "0\n")
    print("patchgym verifier: %s" % ("resolved" if grade["resolved"] else grade.get("error", "unresolved")))


if __name__ == "__main__":
    main()
