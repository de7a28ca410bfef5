"""R2E-Gym's reading of a test log, rule for rule: the task loader splits a row's tests by the old commit's log with
it, and the grader registers it as the `r2egym` log parser (env/grading/family_parsers.py).

It is R2E-Gym's execution_log_parser.parse_log_pytest (the same for all its repos). It reads pytest's `-rA` short
summary only; an id is the part after the first `::`, with `::` written `.`, cut before ` - `, colours removed
(decolor_dict_keys), exactly the keys of the rows' expected_output_json.
"""

import re

_COLOUR = re.compile(r"\x1b\[\d+m")  # decolor_dict_keys' pattern
_STATUSES = ("PASSED", "FAILED", "ERROR")  # its order of `elif line.startswith(...)`


def decolor(name: str) -> str:
    """A test id without its colour codes, as decolor_dict_keys leaves it."""
    return _COLOUR.sub("", name)


def parse_r2egym(log: str) -> dict[str, str]:
    """R2E-Gym's pytest summary parser; nothing before `short test summary info` counts."""
    if "short test summary info" not in log:
        return {}
    statuses = {}
    for line in log.split("short test summary info")[1].strip().split("\n"):
        for status in _STATUSES:
            if line.startswith(status):
                name = ".".join(line.split("::")[1:])
                statuses[decolor(name.split(" - ")[0])] = status
                break
    return statuses
