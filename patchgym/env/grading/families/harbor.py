"""The `harbor` family: a Harbor task's own verifier, run in the agent's sandbox as the episode ends (in place, not a
patch in a fresh sandbox), as Harbor's shared mode runs it, with what the agent left running (services, background
jobs) still running.

    test.sh runs in a mount namespace of its own where /tests and /logs/verifier are empty tmpfs directories only it
    sees -> the task's tests/ unpacked into /tests -> `bash /tests/test.sh` from the working directory, as the
    verifier's user, under the verifier's timeout -> the reward from /logs/verifier/reward.txt (one number), else
    reward.json (an object of named numbers, every one kept in the grade's `rewards`), read through a descriptor of
    that directory and sent back through the runner's side channel

What the agent left running (even as root) can neither plant nor overwrite the tests or the reward: it does not see
those directories, cannot enter the namespace (no CAP_SYS_ADMIN), and cannot trace or read the verifier's processes
(the runner's `isolate` option takes CAP_AUDIT_WRITE from the agent's commands, and the kernel lets one process
trace another of its uid only when it holds every capability the other holds). As in Harbor's shared mode, an agent
that runs as root can still change the programs test.sh runs. Where a backend cannot give a command private
directories, /tests and /logs/verifier are emptied in place instead, and the agent's root processes could race the
verifier there.

The grade's `score` is the reward training sees (non-binary rewards reach training as they are): the one number of
reward.txt, or of reward.json's named ones the one `rollout.harbor_score` picks (`score_of`); `resolved` is score >=
the config's threshold. A verifier that ran and wrote no reward, or one that is not a number, scores 0 (the detail
says why); `no_tests_ran` is a verifier that could not run (its tests/ did not unpack, its user does not exist); a
run over the timeout is `timeout`.
"""

import base64
import json
import math
import shlex
import time

from patchgym.env.grading.family import GradingFamily, Guarantees, register_family
from patchgym.env.grading.grade import Grade
from patchgym.sandbox import Sandbox
from patchgym.tasks.task import Task

TESTS_DIR, VERIFIER_LOGS = "/tests", "/logs/verifier"
ARCHIVE = "/var/lib/patchgym/harbor-tests.tar.gz"  # root's, outside /tests, removed once unpacked
LOG_LIMIT = 4 << 20
REWARD_LIMIT = 1 << 20  # of each reward file
_ARCHIVE_NAME = ".patchgym-tests.tar.gz"


@register_family
class HarborVerifier(GradingFamily):
    name = "harbor"
    in_place = True
    # What the agent leaves in /tests and /logs/verifier is emptied before the verifier runs; the verifier's tests
    # reach the sandbox only then.
    guarantees = Guarantees(report_channel=False, hidden_tests=True, restores_owned_files=False, tamper_checks=False,
                            fixed_plugins=False)

    def verify(self, sandbox: Sandbox, task: Task, *, threshold: float = 1.0, score: str = "auto") -> Grade:
        start = time.monotonic()
        grade = verify(sandbox, task, threshold=threshold, score=score)
        grade.duration = time.monotonic() - start  # the verifier's time: its upload, test.sh and the reward's read
        return grade


def verify(sandbox: Sandbox, task: Task, *, threshold: float = 1.0, score: str = "auto") -> Grade:
    """Run `task`'s Harbor verifier in `sandbox` (the agent's, after its episode); a SandboxError means infra. The
    grade's score is `score_of(rewards, score)`; every named reward is kept in the grade. A verifier that ran and
    wrote no reward (or one that is not a number) scores 0; `no_tests_ran` is for a verifier that could not run."""
    spec = task.harbor
    if spec is None:
        raise ValueError(f"task {task.instance_id} is not a Harbor task: it is graded by its patch")
    grade = Grade(instance_id=task.instance_id)
    uid = _verifier_uid(sandbox, spec.verifier_user)
    if isinstance(uid, str):
        return grade.model_copy(update={"error": "no_tests_ran", "error_detail": uid})
    command = ["bash", f"{TESTS_DIR}/test.sh"]
    if uid is not None:
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
    run, rewards = (_run_private if sandbox.isolates else _run_shared)(sandbox, task, shlex.join(command), uid)
    if run is None:
        return grade.model_copy(update={"error": "no_tests_ran", "error_detail": rewards})
    grade.exit_code = run.exit_code
    if run.timed_out:
        return grade.model_copy(update={"error": "timeout",
                                        "error_detail": f"test.sh ran over {spec.verifier_timeout_s:g} s"})
    try:
        named, from_json = parse_rewards(rewards)
        value = score_of(named, score)
    except RewardMissing as exc:
        return grade.model_copy(update={"score": 0.0, "error_detail": f"{exc}; exit code {run.exit_code}; log "
                                                                       f"tail:\n{run.output[-2000:]}"})
    return grade.model_copy(update={"score": value, "resolved": value >= threshold,
                                    "rewards": named if from_json else {}})


def user_uid(sandbox: Sandbox, user: str) -> int:
    """The uid of a task.toml user: root, a uid, or a name the image knows (LookupError where it knows none)."""
    if user in ("root", "0"):
        return 0
    if user.isdigit():
        return int(user)
    found = sandbox.exec(["id", "-u", user], timeout=30)
    if not found.ok or not found.output.strip().isdigit():
        raise LookupError(f"{user!r} is not a user of the task's image: {found.output.strip()[-300:]}")
    return int(found.output.strip())


def _verifier_uid(sandbox: Sandbox, user: str) -> int | None | str:
    """The verifier user's uid (None: root), or why it has none in this sandbox."""
    try:
        return user_uid(sandbox, user) or None
    except LookupError as exc:
        return f"[verifier].user {exc}"


# test.sh's output and the reward files, read from the directory the verifier was given (descriptor 4), not by its
# path: a path the agent's processes renamed or relinked meanwhile can only lose the reward, never replace it. The
# reward files go back through the side channel (descriptor 3), which test.sh does not get.
_PRIVATE_SCRIPT = f"""
tar -xzf {TESTS_DIR}/{{archive}} -C {TESTS_DIR} --no-same-owner && rm -f {TESTS_DIR}/{{archive}} \
  && chmod +x {TESTS_DIR}/test.sh || {{{{ echo 'patchgym: could not unpack tests/'; exit 97; }}}}
mkdir -p /logs/agent
{{command}} > /proc/self/fd/4/test-stdout.txt 2>&1 3>&- 4>&-
code=$?
for name in reward.txt reward.json; do
  file=/proc/self/fd/4/$name
  [ -f "$file" ] || continue
  size=$(head -c {REWARD_LIMIT} "$file" | wc -c)
  printf '%s %s\n' "$name" "$size" >&3
  head -c "$size" "$file" >&3
done
tail -c 65536 /proc/self/fd/4/test-stdout.txt
exit $code
"""
def _run_private(sandbox: Sandbox, task: Task, command: str, uid: int | None):
    """test.sh in a mount namespace of its own, with /tests and /logs/verifier empty tmpfs directories only it sees:
    nothing the agent left running can plant or overwrite its tests or its reward. (run, the reward files)."""
    spec = task.harbor
    private = [{"path": TESTS_DIR, "files": {_ARCHIVE_NAME: spec.tests}},
               {"path": VERIFIER_LOGS, "uid": uid, "fd": 4}]
    script = _PRIVATE_SCRIPT.format(archive=_ARCHIVE_NAME, command=command)
    run = sandbox.exec(["bash", "-c", script], cwd=task.workdir, timeout=spec.verifier_timeout_s,
                       env=spec.verifier_env, output_limit=LOG_LIMIT, private=private,
                       side_channel=2 * REWARD_LIMIT + 64)
    if run.exit_code == 97 and "could not unpack tests/" in run.output:
        return None, f"uploading tests/: {run.output[-2000:]}"
    return run, split_rewards(run.side_channel)


def split_rewards(channel: str) -> dict[str, str]:
    """{file name: text} from the side channel's `NAME SIZE\nBYTES` records."""
    found, rest = {}, channel
    while rest:
        head, _, rest = rest.partition("\n")
        name, _, size = head.partition(" ")
        if name not in ("reward.txt", "reward.json") or not size.isdigit():
            break
        found[name], rest = rest[:int(size)], rest[int(size):]
    return found


def _run_shared(sandbox: Sandbox, task: Task, command: str, uid: int | None):
    """test.sh with /tests and /logs/verifier emptied in the sandbox's own filesystem (a backend that cannot give a
    command private directories): what the agent left running as root could still write there."""
    spec = task.harbor
    sandbox.write_file(ARCHIVE, base64.b64decode(spec.tests))
    setup = (f"rm -rf {TESTS_DIR} {VERIFIER_LOGS} && mkdir -p {TESTS_DIR} {VERIFIER_LOGS} /logs/agent && "
             f"tar -xzf {ARCHIVE} -C {TESTS_DIR} --no-same-owner && rm -f {ARCHIVE} && chmod +x {TESTS_DIR}/test.sh"
             + ("" if uid is None else f" && chown {uid} {VERIFIER_LOGS}"))
    result = sandbox.exec(setup, timeout=300)
    if not result.ok:
        return None, f"uploading tests/: {result.output[-2000:]}"
    run = sandbox.exec(f"{command} > {VERIFIER_LOGS}/test-stdout.txt 2>&1; code=$?; "
                       f"tail -c 65536 {VERIFIER_LOGS}/test-stdout.txt; exit $code",
                       cwd=task.workdir, timeout=spec.verifier_timeout_s, env=spec.verifier_env,
                       output_limit=LOG_LIMIT)
    files = {name: text for name in ("reward.txt", "reward.json")
             if (text := _read(sandbox, f"{VERIFIER_LOGS}/{name}")) is not None}
    return run, files


SCORES = ("auto", "mean", "min", "max", "sum")


def score_of(named: dict[str, float], rule: str = "auto") -> float:
    """The reward training sees, from a verifier's named rewards (rollout.harbor_score): `auto`, its "reward" where
    it wrote one, else its only one, else the mean of them all; `mean`, `min`, `max` or `sum` of them all; any other
    word, the reward of that name (RewardMissing where the verifier wrote none of that name)."""
    values = list(named.values())
    if rule == "auto":
        return named["reward"] if "reward" in named else sum(values) / len(values)
    if rule in SCORES:
        return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "sum": sum(values)}[rule]
    if rule not in named:
        raise RewardMissing(f"the verifier wrote no reward named {rule!r} (rollout.harbor_score), only "
                            f"{', '.join(sorted(named))}")
    return named[rule]


class RewardMissing(Exception):
    """The verifier wrote no reward, or one that is not a number."""


def parse_rewards(files: dict[str, str]) -> tuple[dict[str, float], bool]:
    """(every named reward, whether they came from reward.json) from the reward files the verifier wrote; a
    reward.txt's one number is named "reward", as Harbor names it."""
    if "reward.txt" in files:
        return {"reward": parse_reward_txt(files["reward.txt"])}, False
    if "reward.json" in files:
        return parse_reward_json(files["reward.json"]), True
    raise RewardMissing(f"the verifier wrote neither {VERIFIER_LOGS}/reward.txt nor reward.json")


def parse_reward_txt(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise RewardMissing(f"reward.txt holds {text.strip()[:80]!r}, not a number") from None
    if not math.isfinite(value):
        raise RewardMissing(f"reward.txt holds {value}, not a finite number")
    return value


def parse_reward_json(text: str) -> dict[str, float]:
    """reward.json: a flat, non-empty object of named numbers."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RewardMissing(f"reward.json is not JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise RewardMissing("reward.json must be a non-empty object of named numbers")
    named = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RewardMissing(f"reward.json: {key!r} is {value!r}, not a finite number")
        named[str(key)] = float(value)
    return named


def _read(sandbox: Sandbox, path: str) -> str | None:
    try:
        return sandbox.read_file(path).decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return None
