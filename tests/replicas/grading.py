"""What every replica of another language must show under patchgym's grader: the gold patch resolves, the empty
patch and a wrong fix do not, and the wrong fix fails exactly the FAIL_TO_PASS tests while the old ones pass."""

from patchgym.env.grading.grader import grade_patch
from patchgym.sandbox import SandboxConfig


def gold_empty_and_wrong(task, patches: dict[str, str], backend: str) -> dict:
    """patchgym's grades of `patches` ({"gold", "empty", "wrong_fix"}) on `task`, checked as the docstring says."""
    ours = {name: grade_patch(task, patch, SandboxConfig(backend=backend), timeout=300)
            for name, patch in patches.items()}
    assert {name: g.outcome for name, g in ours.items()} == {
        "gold": "resolved", "empty": "unresolved", "wrong_fix": "unresolved"}, (
        {n: g.error_detail for n, g in ours.items()})
    assert set(ours["wrong_fix"].f2p.values()) == {"FAILED"} and set(ours["wrong_fix"].p2p.values()) == {"PASSED"}
    return ours
