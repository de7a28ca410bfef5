"""The `harbor` family: a Harbor task's own verifier, run in the agent's sandbox as the episode ends (in place, not a
patch in a fresh sandbox), as Harbor's shared mode runs it.

    empty /tests and /logs/verifier (nothing the agent left there counts: no reward, helper or report it planted)
    -> upload the task's tests/ to /tests -> `bash /tests/test.sh` from the working directory, as the verifier's
    user, under the verifier's timeout -> the reward from /logs/verifier/reward.txt (one number), else reward.json
    (an object of named numbers, every one kept in the grade's `rewards`)

The grade's `score` is the reward training sees (non-binary rewards reach training as they are): the one number of
reward.txt, or of reward.json's named ones the one `rollout.harbor_score` picks (`score_of`); `resolved` is score >=
the config's threshold. No reward file, or one that is not a number, is `no_tests_ran`; a run over the timeout is
`timeout`. The agent's processes keep running (a task may be "start this service"), so an agent that runs as root
could still race the verifier; tasks whose agent user is not root cannot write /tests or /logs/verifier at all.
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
    grade's score is `score_of(rewards, score)`; every named reward is kept in the grade."""
    spec = task.harbor
    if spec is None:
        raise ValueError(f"task {task.instance_id} is not a Harbor task: it is graded by its patch")
    as_root = spec.verifier_user in ("root", "0")
    sandbox.write_file(ARCHIVE, base64.b64decode(spec.tests))
    setup = (f"rm -rf {TESTS_DIR} {VERIFIER_LOGS} && mkdir -p {TESTS_DIR} {VERIFIER_LOGS} /logs/agent && "
             f"tar -xzf {ARCHIVE} -C {TESTS_DIR} --no-same-owner && rm -f {ARCHIVE} && chmod +x {TESTS_DIR}/test.sh"
             + ("" if as_root else f" && chown {shlex.quote(spec.verifier_user)} {VERIFIER_LOGS}"))
    result = sandbox.exec(setup, timeout=300)
    grade = Grade(instance_id=task.instance_id)
    if not result.ok:
        return grade.model_copy(update={"error": "infra", "error_detail": f"uploading tests/: {result.output[-2000:]}"})
    command = ["bash", f"{TESTS_DIR}/test.sh"]
    if not as_root:
        command = ["setpriv", f"--reuid={spec.verifier_user}", f"--regid={spec.verifier_user}", "--clear-groups",
                   *command]
    run = sandbox.exec(f"{shlex.join(command)} > {VERIFIER_LOGS}/test-stdout.txt 2>&1; code=$?; "
                       f"tail -c 65536 {VERIFIER_LOGS}/test-stdout.txt; exit $code",
                       cwd=task.workdir, timeout=spec.verifier_timeout_s, env=spec.verifier_env,
                       output_limit=LOG_LIMIT)
    grade.exit_code = run.exit_code
    if run.timed_out:
        return grade.model_copy(update={"error": "timeout",
                                        "error_detail": f"test.sh ran over {spec.verifier_timeout_s:g} s"})
    try:
        named, from_json = read_reward(sandbox)
        value = score_of(named, score)
    except RewardMissing as exc:
        return grade.model_copy(update={"error": "no_tests_ran", "error_detail": f"{exc}; exit code {run.exit_code}; "
                                                                                  f"log tail:\n{run.output[-2000:]}"})
    return grade.model_copy(update={"score": value, "resolved": value >= threshold,
                                    "rewards": named if from_json else {}})


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


def read_reward(sandbox: Sandbox) -> tuple[dict[str, float], bool]:
    """(every named reward, whether they came from reward.json) from what the verifier wrote in /logs/verifier; a
    reward.txt's one number is named "reward", as Harbor names it."""
    text = _read(sandbox, f"{VERIFIER_LOGS}/reward.txt")
    if text is not None:
        return {"reward": parse_reward_txt(text)}, False
    text = _read(sandbox, f"{VERIFIER_LOGS}/reward.json")
    if text is not None:
        return parse_reward_json(text), True
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
