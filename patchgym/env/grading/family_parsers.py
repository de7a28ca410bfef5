"""Log parsers of the non-SWE-bench harnesses, rule for rule, registered under the names the task loaders give.

- r2egym: R2E-Gym's execution_log_parser.parse_log_pytest (the same for all its repos). It reads pytest's `-rA`
  short summary only; an id is the part after the first `::`, with `::` written `.`, cut before ` - `, colours
  removed (decolor_dict_keys), exactly the keys of the rows' expected_output_json.
- swesmith: SWE-smith's PythonProfile.log_parser (swesmith/profiles/python.py), ported because swesmith cannot be
  imported next to swebench 5 (its profiles import swebench 4's harness.dockerfiles). It reads pytest `--verbose`
  lines `<id> <STATUS>`; the task loader refuses profiles that override it.
"""

import re

from patchgym.env.grading.parsers import ERROR, FAILED, PASSED, STATUSES, register_parser

_R2E_COLOUR = re.compile(r"\x1b\[\d+m")  # decolor_dict_keys' pattern


@register_parser("r2egym")
def parse_r2egym(log: str) -> dict[str, str]:
    """R2E-Gym's pytest summary parser; nothing before `short test summary info` counts."""
    if "short test summary info" not in log:
        return {}
    statuses = {}
    for line in log.split("short test summary info")[1].strip().split("\n"):
        for status in (PASSED, FAILED, ERROR):  # its order of `elif line.startswith(...)`
            if line.startswith(status):
                name = ".".join(line.split("::")[1:])
                statuses[_R2E_COLOUR.sub("", name.split(" - ")[0])] = status
                break
    return statuses


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
