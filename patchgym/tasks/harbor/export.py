"""`patchgym tasks export TASKS --format harbor --out DIR`: tasks written as Harbor task folders that Harbor's own
tooling runs.

A factory task (graded from pytest's own report) becomes:
    environment/Dockerfile   FROM the task's image; the bug applied, the hidden test files removed, the workspace
                             committed, and a copy of that commit kept outside it (as the agent's sandbox starts)
    tests/test.sh            runs tests/verify.py (patchgym.tasks.harbor.verify_script), which grades as patchgym's
                             grader does and writes /logs/verifier/reward.txt; beside it the hidden test files, the
                             report plugin and its reader, task.json (the test ids, the command, the owned files)
    solution/solve.sh        applies the gold patch (solution/gold.patch) in the working directory
A task imported from a Harbor folder is written back as it came (its image as the Dockerfile's FROM), a multi-step
one with its [[steps]] and steps/NAME/{instruction.md,tests/,solution/,workdir/}, so that reading it again gives the
same task. Other
imported rows are graded by their harness's log parsers, which do not travel yet: they are refused by name.
"""

import json
import re
import shlex
from pathlib import Path

from patchgym.env.grading import owned, report, steps
from patchgym.env.grading.families import family_of
from patchgym.env.grading.families.harbor import HarborVerifier
from patchgym.env.grading.families.pytest_report import PytestReport
from patchgym.env.workspace import BASE_GIT_DIR, apply_patch, check_out_start
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.sandbox.images import base_recipe
from patchgym.tasks.harbor.folders import HarborTaskError, unpack
from patchgym.tasks.task import HarborArtifact, HarborSpec, HarborStep, Task

VERIFY_SOURCE = (Path(__file__).parent / "verify_script.py").read_text()
REPORT_PATH = "/logs/verifier/report.jsonl"
PLUGIN = report.InstalledPlugin("/tests", "report_plugin")  # the report plugin as the exported tests/ holds it
_FILE_IN_DIFF = re.compile(r"^\+\+\+ b/(.+)$", re.MULTILINE)


def export_harbor(tasks: list[Task], out: Path, sandbox: SandboxConfig, *, verifier_timeout_s: float = 1800.0,
                  agent_timeout_s: float = 1800.0) -> list[Path]:
    """Write each task as OUT/<instance_id>/; returns the folders."""
    out = Path(out)
    folders = []
    for task in tasks:
        folder = out / re.sub(r"[^\w.-]", "_", task.instance_id)
        family = family_of(task)
        if isinstance(family, HarborVerifier):
            write_back(task, folder)
        elif isinstance(family, PytestReport):
            write_factory(task, folder, sandbox, verifier_timeout_s, agent_timeout_s)
        else:
            raise HarborTaskError(f"task {task.instance_id}: only factory tasks of Python (graded from pytest's "
                                  f"report) and Harbor tasks export yet; its grading family is {family.name!r}")
        folders.append(folder)
    return folders


def write_factory(task: Task, folder: Path, sandbox: SandboxConfig, verifier_timeout_s: float,
                  agent_timeout_s: float) -> None:
    hidden = hidden_files(task, sandbox)
    tests = folder / "tests"
    for path, data in hidden.items():
        (tests / "hidden" / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / "hidden" / path).write_bytes(data)
    _write(tests / "verify.py", VERIFY_SOURCE)
    _write(tests / f"{PLUGIN.module}.py", report.plugin_source(REPORT_PATH, strict=True))
    _write(tests / "report_reader.py", report.READER_SOURCE)
    spec = {"workdir": task.workdir, "base_git_dir": BASE_GIT_DIR, "FAIL_TO_PASS": task.FAIL_TO_PASS,
            "PASS_TO_PASS": task.PASS_TO_PASS,
            "command": report.pytest_command(task.test_cmd, PLUGIN, None),
            "owned": {"files": task.test_files, "names": sorted(owned.CONFIG_NAMES),
                      "patterns": [owned.TEST_PATH.pattern, "(?i)" + owned.METADATA_PATH.pattern]}}
    _write(tests / "task.json", json.dumps(spec, indent=1))
    _write(tests / "test.sh", "#!/bin/bash\n# The hidden tests, graded from pytest's own report (tests/verify.py): "
                              "writes /logs/verifier/reward.txt.\nexec python3 /tests/verify.py\n", mode=0o755)
    env = folder / "environment"
    _write(env / "start.patch", task.bug_patch)
    wd = shlex.quote(task.workdir)
    hide = " ".join(shlex.quote(p) for p in task.test_files)
    steps = [f"mkdir -p {wd}", f"cd {wd}",
             *([f"git checkout -q -f {shlex.quote(task.start_ref)}"] if task.start_ref else []),
             "if [ -s /tmp/patchgym-start.patch ]; then git apply --whitespace=nowarn /tmp/patchgym-start.patch; fi",
             "rm -f /tmp/patchgym-start.patch",
             *([f"rm -f -- {hide}"] if hide else []),
             "rm -rf .git", "git init -q .", "git add -A",
             "git -c user.name=patchgym -c user.email=patchgym@localhost commit -q --no-verify -m 'Initial state'",
             f"mkdir -p -m 700 {BASE_GIT_DIR.rsplit('/', 1)[0]}", f"rm -rf {BASE_GIT_DIR}",
             f"cp -a .git {BASE_GIT_DIR}"]
    _write(env / "Dockerfile", f"FROM {task.image or base_recipe().tag}\n"
                               "COPY start.patch /tmp/patchgym-start.patch\n"
                               f"RUN set -e; {'; '.join(steps)}\nWORKDIR {task.workdir}\n")
    if task.patch.strip():
        _write(folder / "solution" / "gold.patch", task.patch if task.patch.endswith("\n") else task.patch + "\n")
        _write(folder / "solution" / "solve.sh", f"#!/bin/bash\nset -e\ncd {wd}\ngit apply --whitespace=nowarn "
                                                 "/solution/gold.patch || patch --batch -p1 -i /solution/gold.patch\n",
               mode=0o755)
    _write(folder / "instruction.md", task.problem_statement.rstrip("\n") + "\n")
    _write(folder / "task.toml", to_toml({
        "schema_version": "1.4",
        "task": {"name": f"patchgym/{task.instance_id}"},
        "metadata": {k: v for k, v in {"repo": task.repo, "source": task.source or "factory",
                                       "strategy": task.strategy, "difficulty": task.difficulty,
                                       "instance_id": task.instance_id}.items() if v},
        "verifier": {"timeout_sec": float(verifier_timeout_s)},
        "agent": {"timeout_sec": float(agent_timeout_s)},
        "environment": {"build_timeout_sec": 600.0, "workdir": task.workdir, "network_mode": "no-network"}}))


def hidden_files(task: Task, sandbox: SandboxConfig) -> dict[str, bytes]:
    """The files the grader owns as it runs the tests: the task's test files and every file its test_patch makes
    or changes, read from the task's image after the bug and the test patch are applied (as the grader does)."""
    paths = sorted(set(task.test_files) | set(_FILE_IN_DIFF.findall(task.test_patch)))
    found = {}
    with open_sandbox(sandbox.model_copy(update={"workdir": task.workdir}), image=task.image or None) as box:
        check_out_start(box, task)
        apply_patch(box, task.bug_patch, task.workdir, "bug")
        created = steps.CREATED_FILE.findall(task.test_patch)
        if created:
            box.exec(["rm", "-f", "--", *created], cwd=task.workdir)
        apply_patch(box, task.test_patch, task.workdir, "tests")
        for path in paths:
            try:
                found[path] = box.read_file(f"{task.workdir}/{path}")
            except FileNotFoundError:
                pass  # deleted by the test patch: nothing to write back
    return found


def write_back(task: Task, folder: Path) -> None:
    """A task imported from a Harbor folder, written as a folder again (its built image as the FROM)."""
    spec = task.harbor
    unpack(spec.tests, folder / "tests")
    if spec.solution:
        unpack(spec.solution, folder / "solution")
    _write(folder / "environment" / "Dockerfile", f"FROM {task.image}\nWORKDIR {task.workdir}\n")
    if spec.services:
        _write(folder / "environment" / "docker-compose.yaml", compose_text(spec.services))
    instruction = spec.instruction if spec.steps else task.problem_statement
    if instruction:
        _write(folder / "instruction.md", instruction)
    for step in spec.steps:
        write_step(step, folder / "steps" / step.name, folder / "tests")
    environment = {"workdir": task.workdir, "network_mode": "public" if spec.network else "no-network",
                   **({"cpus": spec.cpus} if spec.cpus else {}),
                   **({"memory_mb": spec.memory_mb} if spec.memory_mb else {}),
                   **({"storage_mb": spec.storage_mb} if spec.storage_mb else {}),
                   **({"env": spec.env} if spec.env else {})}
    _write(folder / "task.toml", to_toml({
        "schema_version": spec.schema_version or "1.4", "task": {"name": task.repo}, "metadata": spec.metadata,
        "verifier": {"timeout_sec": spec.verifier_timeout_s, "user": spec.verifier_user,
                     **({"env": spec.verifier_env} if spec.verifier_env else {})},
        "agent": {"user": spec.agent_user, **({"timeout_sec": spec.agent_timeout_s} if spec.agent_timeout_s else {})},
        "environment": environment,
        **({"solution": {"env": spec.solution_env}} if spec.solution_env else {}),
        **({"multi_step_reward_strategy": spec.multi_step_reward}
           if spec.steps or spec.multi_step_reward != "mean" else {}),
        **({"artifacts": [_artifact(a) for a in spec.artifacts]} if spec.artifacts else {}),
        **({"steps": [step_table(task, step) for step in spec.steps]} if spec.steps else {})}))


def compose_text(services: list) -> str:
    """A compose file of a task's services (their built images named), which main waits for as it did."""
    import yaml

    def service(s) -> dict:
        check = s.healthcheck
        return {"image": s.image, **({"environment": s.env} if s.env else {}),
                **({"command": s.command} if s.command is not None else {}),
                **({"entrypoint": s.entrypoint} if s.entrypoint is not None else {}),
                **({"healthcheck": {"test": check.test, "interval": f"{check.interval_s:g}s",
                                    "timeout": f"{check.timeout_s:g}s", "retries": check.retries,
                                    "start_period": f"{check.start_period_s:g}s"}} if check else {})}

    waits = {s.name: {"condition": f"service_{s.wait}"} for s in services}
    return yaml.safe_dump({"services": {"main": {"depends_on": waits}, **{s.name: service(s) for s in services}}},
                          sort_keys=False)


def write_step(step: HarborStep, folder: Path, shared: Path) -> None:
    """steps/NAME/: its instruction, its tests (less what the task's tests/ already gives), solution/ and workdir/."""
    _write(folder / "instruction.md", step.instruction)
    unpack(step.tests, folder / "tests")
    _drop_shared(folder / "tests", shared)
    for name, data in (("solution", step.solution), ("workdir", step.workdir)):
        if data:
            unpack(data, folder / name)


def _drop_shared(tests: Path, shared: Path) -> None:
    """Remove from a step's tests/ the files and empty folders the task's tests/ has the same: laid over it again,
    what is left gives the step's tests back."""
    for item in sorted(tests.rglob("*"), reverse=True):  # a folder's files before the folder
        twin = shared / item.relative_to(tests)
        if item.is_file() and not item.is_symlink() and twin.is_file() and not twin.is_symlink() \
                and item.read_bytes() == twin.read_bytes() and _executable(item) == _executable(twin):
            item.unlink()
        elif item.is_dir() and twin.is_dir() and not any(item.iterdir()):
            item.rmdir()
    if not any(tests.iterdir()):
        tests.rmdir()


def _executable(path: Path) -> bool:
    return bool(path.stat().st_mode & 0o111)


def step_table(task: Task, step: HarborStep) -> dict:
    """A [[steps]] table that reads back as `step`: its values written out whole, as they override the task's."""
    check = step.healthcheck
    return {
        "name": step.name,
        "agent": {"user": step.agent_user, **({"timeout_sec": step.agent_timeout_s} if step.agent_timeout_s else {})},
        "verifier": {"timeout_sec": step.verifier_timeout_s, "user": step.verifier_user,
                     **({"env": step.verifier_env} if step.verifier_env else {})},
        **({"min_reward": step.min_reward} if step.min_reward is not None else {}),
        **({"healthcheck": {"command": check.command, "interval_sec": check.interval_s, "timeout_sec": check.timeout_s,
                            "retries": check.retries, "start_period_sec": check.start_period_s,
                            "start_interval_sec": check.start_interval_s}} if check else {}),
        **({"artifacts": [_artifact(a) for a in own]} if (own := _own_artifacts(task, step)) else {})}


def _own_artifacts(task: Task, step: HarborStep) -> list[HarborArtifact]:
    """The step's artifacts past the task's (a step's list starts with the task's, as Harbor appends them)."""
    spec: HarborSpec = task.harbor
    if step.artifacts[:len(spec.artifacts)] != spec.artifacts:
        raise HarborTaskError(f"task {task.instance_id}: step {step.name!r}: its artifacts do not start with the "
                              "task's, so no task.toml gives them (a step's are the task's and then its own)")
    return step.artifacts[len(spec.artifacts):]


def _artifact(artifact: HarborArtifact) -> str | dict:
    if artifact.destination is None and not artifact.exclude:
        return artifact.source
    return {"source": artifact.source, **({"destination": artifact.destination} if artifact.destination else {}),
            **({"exclude": artifact.exclude} if artifact.exclude else {})}


def to_toml(data: dict) -> str:
    """A task.toml: top-level values, then one [table] per dict, then one [[name]] per dict of a list of dicts (a dict
    inside a table is an inline table)."""
    lines = [f"{k} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict) and not _tables(v)]
    for name, table in data.items():
        if isinstance(table, dict) and table:
            lines += ["", f"[{name}]"] + [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    for name, tables in data.items():
        for table in tables if _tables(tables) else []:
            lines += ["", f"[[{name}]]"] + [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _tables(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} to TOML")


def _write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
