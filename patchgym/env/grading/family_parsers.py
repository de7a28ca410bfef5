"""Log parsers of the non-SWE-bench harnesses, rule for rule, registered under the names the task loaders give.

- r2egym: R2E-Gym's execution_log_parser.parse_log_pytest, which lives in patchgym/env/grading/r2egym_log.py because the
  task loader reads the old commit's log with it too.
- swesmith: SWE-smith's PythonProfile.log_parser (swesmith/profiles/python.py), ported because swesmith cannot be
  imported next to swebench 5 (its profiles import swebench 4's harness.dockerfiles). It reads pytest `--verbose`
  lines `<id> <STATUS>`; the task loader refuses profiles that override it.
"""

import re

from patchgym.env.grading.parsers import STATUSES, register_parser
from patchgym.env.grading.r2egym_log import parse_r2egym

register_parser("r2egym")(parse_r2egym)


# SWE-smith walks swebench 4's TestStatus in its declaration order; a later match on the same line wins.
_SMITH_ORDER = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
_SMITH_LINES = {status: re.compile(rf"^(\S+)(\s+){status}") for status in _SMITH_ORDER}
assert set(_SMITH_ORDER) == set(STATUSES)


@register_parser("swesmith")
def parse_swesmith(log: str) -> dict[str, str]:
    """`pytest --verbose` lines `tests/x.py::test_a PASSED [ 50%]`."""
    statuses = {}
    for line in log.split("\n"):
        for status in _SMITH_ORDER:
            match = _SMITH_LINES[status].match(line)
            if match:
                statuses[match.group(1)] = status
    return statuses


parse_swesmith.reads_verbose_lines = True  # what pytest's report is written as, for this parser to read back
