"""Test-log parsers: a test runner's printed output -> {test id: status}, chosen by name.

The pytest family follows SWE-bench's rules (harness/log_parsers/python.py) token for token, because the
FAIL_TO_PASS / PASS_TO_PASS ids of SWE-bench tasks were produced by them, quirks included.
"""

import re
from collections.abc import Callable

from patchgym.registry import Registry

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
STATUSES = (PASSED, FAILED, SKIPPED, ERROR, XFAIL)
PASSING = (PASSED, XFAIL)  # as in SWE-bench: an expected failure counts as passed

Parser = Callable[[str], dict[str, str]]
PARSERS: Registry[Parser] = Registry("log parser")
# Decorator: add a parser to PARSERS under a name (the name configs and tasks use).
register_parser = PARSERS.register


def parse_log(log: str, parser: str = "pytest") -> dict[str, str]:
    """Map each test id in `log` to PASSED, FAILED, SKIPPED, ERROR or XFAIL, using the parser named `parser`.

    A `parse_log_*` name is one of swebench 5's own parsers (SWE-bench v5 rows name them), run as swebench runs it;
    the few that read their TestSpec (some JavaScript repos) need swebench_harness.official_report instead.
    """
    if parser in PARSERS:
        return PARSERS[parser](log)
    if parser.startswith("parse_log_"):
        return swebench_parser(parser)(log, None)
    raise ValueError(f"unknown log parser {parser!r}; known parsers: {', '.join(sorted(PARSERS))} "
                     "and swebench's parse_log_* names")


def swebench_parser(name: str) -> Callable:
    """swebench 5's parser registered under `name`; a ValueError names the extra when swebench is missing."""
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY
    except ImportError:
        raise ValueError(f"log parser {name!r} is swebench's: pip install 'patchgym[swebench]'") from None
    if name not in PARSER_REGISTRY:
        raise ValueError(f"unknown log parser {name!r}: not in swebench's PARSER_REGISTRY")
    return PARSER_REGISTRY[name]


# -- pytest's `-rA` short summary ------------------------------------------------------------------

_SKIP_COUNT = re.compile(r"\[\d+\]")


def _summary_entry(line: str) -> tuple[str, str] | None:
    """(id, status) from a short-summary line `STATUS id [- message]`, or None.

    SWE-bench takes the second whitespace token as the id, so an id with a space is cut at it (the
    graders match such ids by prefix). A line that merely starts with a status word (`ERROR:root:boom it`)
    is dropped here; SWE-bench would record the junk token `ERROR:root:boom` as the status.
    """
    if not line.startswith(STATUSES):
        return None
    if line.startswith(FAILED):
        # A lone "-" token is the message separator, never the id.
        line = line.replace(" - ", " ")
    tokens = line.split()
    if len(tokens) < 2 or tokens[0] not in STATUSES:
        return None
    status, test_id = tokens[0], tokens[1]
    # `SKIPPED [2] tests/x.py:12: reason` counts skips by location; `[2]` is not a test.
    if status == SKIPPED and _SKIP_COUNT.fullmatch(test_id):
        return None
    return test_id, status


def _summary_statuses(log: str, rename: Callable[[str], str] = str) -> dict[str, str]:
    """Every short-summary line's status, the last line winning (so `ERROR` at teardown beats `PASSED`)."""
    statuses = {}
    # Only "\n" ends a line: SWE-bench's ids were cut with str.split("\n"), not splitlines().
    for line in log.split("\n"):
        entry = _summary_entry(line)
        if entry:
            statuses[rename(entry[0])] = entry[1]
    return statuses


@register_parser("pytest")
def parse_pytest(log: str) -> dict[str, str]:
    """`pytest -rA` output (SWE-bench's parse_log_pytest)."""
    return _summary_statuses(log)


_OPTION = re.compile(r"(.*?)\[(.*)\]")


def _short_path_option(test_id: str) -> str:
    """`t.py::test[/tmp/abc/file.txt]` -> `t.py::test[/file.txt]`: a tmp path in a parameter id differs per run."""
    match = _OPTION.match(test_id)
    if not match:
        return test_id
    head, option = match.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{head}[{option}]"


@register_parser("pytest_options")
def parse_pytest_options(log: str) -> dict[str, str]:
    """`pytest -rA` output with absolute paths in parameter ids cut to their last part (parse_log_pytest_options)."""
    return _summary_statuses(log, rename=_short_path_option)


@register_parser("matplotlib")
def parse_matplotlib(log: str) -> dict[str, str]:
    """`pytest -rA` output whose ids print enum members differently across versions (parse_log_matplotlib)."""
    return _summary_statuses(log.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))


_COLOUR_CODE = re.compile(r"\[(\d+)m")
_CONTROL_CHARS = str.maketrans("", "", "".join(map(chr, range(1, 32))))


def _decolour(line: str) -> str:
    """Strip `[31m`-style codes, then every control character (ESC, tab, CR) -- SWE-bench's exact cleaning.

    It also eats a parameter id like `[5m` (`test_t[5m]` -> `test_t]`), and leaves `[1;31m` behind.
    """
    return _COLOUR_CODE.sub("", line).translate(_CONTROL_CHARS)


@register_parser("pytest_v2")
def parse_pytest_v2(log: str) -> dict[str, str]:
    """Coloured `pytest -rA` output, or old pytest's `id STATUS` lines (parse_log_pytest_v2)."""
    statuses = {}
    for line in map(_decolour, log.split("\n")):
        if line.startswith(STATUSES):
            if line.startswith(FAILED):
                line = line.split(" - ", 1)[0]
            tokens = line.split()
            # The id is the whole rest of the line: spaces kept, but also an ERROR/XFAIL line's " - message".
            if len(tokens) >= 2 and tokens[0] in STATUSES and not (
                    tokens[0] == SKIPPED and _SKIP_COUNT.fullmatch(tokens[1])):
                statuses[" ".join(tokens[1:])] = tokens[0]
        elif line.endswith(STATUSES):
            tokens = line.split()
            if len(tokens) >= 2 and tokens[-1] in STATUSES:
                statuses[" ".join(tokens[:-1])] = tokens[-1]
    return statuses


@register_parser("seaborn")
def parse_seaborn(log: str) -> dict[str, str]:
    """Summary `FAILED id` / `PASSED id` lines and verbose `id PASSED` lines (parse_log_seaborn)."""
    statuses = {}
    for line in log.split("\n"):
        tokens = line.split()
        if len(tokens) < 2:
            continue
        if line.startswith(FAILED):
            statuses[tokens[1]] = FAILED
        elif f" {PASSED} " in line:
            if tokens[1] == PASSED:
                statuses[tokens[0]] = PASSED
        elif line.startswith(PASSED):
            statuses[tokens[1]] = PASSED
    return statuses


# -- other runners -------------------------------------------------------------------------------

_SYMPY_FAILURE_HEADER = re.compile(r"(_*) (.*)\.py:(.*) (_*)")
_SYMPY_LINE_ENDINGS = ((" E", ERROR), (" F", FAILED), (" ok", PASSED))


@register_parser("sympy")
def parse_sympy(log: str) -> dict[str, str]:
    """sympy's bin/test: `test_x ok|F|E` lines, and `___ path.py:test_x ___` failure headers (parse_log_sympy)."""
    statuses = {f"{path}.py:{name}": FAILED for _, path, name, _ in _SYMPY_FAILURE_HEADER.findall(log)}
    for line in log.split("\n"):
        line = line.strip()
        if not line.startswith("test_"):
            continue
        for ending, status in _SYMPY_LINE_ENDINGS:
            if line.endswith(ending):
                statuses[line.split()[0]] = status
    return statuses


_DJANGO_PASS_ENDINGS = (" ... ok", " ... OK", " ...  OK")
# A migration's progress line and the test's name share a line in django__django-7188.
_DJANGO_7188_PREFIX = "Applying sites.0002_alter_domain_unique...test_no_migrations"
# Long prints that land between a test's " ... " and its "ok" (seen in SWE-bench's django logs).
_DJANGO_INTERRUPTED_PASSES = (
    re.compile(r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$", re.M),
)


def _django_pass(line: str) -> str | None:
    """The test id of a `name ... ok` line, or None."""
    for ending in _DJANGO_PASS_ENDINGS:
        if line.endswith(ending):
            if line.startswith(_DJANGO_7188_PREFIX):
                line = line.split("...", 1)[-1].strip()
            return line.rsplit(ending, 1)[0]
    return None


@register_parser("django")
def parse_django(log: str) -> dict[str, str]:
    """Django's runtests.py at verbosity 2: `name (module.Class) ... ok|FAIL|ERROR|skipped` (parse_log_django).

    Like SWE-bench, a later line starting with "ok" passes the last test that printed " ... ", whatever
    that test's own result was.
    """
    statuses = {}
    last_started = None
    for line in log.split("\n"):
        line = line.strip()
        if "--version is equivalent to version" in line:
            statuses["--version is equivalent to version"] = PASSED
        if " ... " in line:
            last_started = line.split(" ... ")[0]
        passed = _django_pass(line)
        if passed is not None:
            statuses[passed] = PASSED
            if line.startswith(_DJANGO_7188_PREFIX):
                line = line.split("...", 1)[-1].strip()
        if " ... skipped" in line:
            statuses[line.split(" ... skipped")[0]] = SKIPPED
        for ending, status in ((" ... FAIL", FAILED), (" ... ERROR", ERROR)):
            if line.endswith(ending):
                statuses[line.split(ending)[0]] = status
        for prefix, status in (("FAIL:", FAILED), ("ERROR:", ERROR)):
            # SWE-bench raises IndexError on a bare "FAIL:" line; there is no id to record.
            if line.startswith(prefix) and len(line.split()) > 1:
                statuses[line.split()[1]] = status
        if line.startswith("ok") and last_started is not None:
            statuses[last_started] = PASSED
    for pattern in _DJANGO_INTERRUPTED_PASSES:
        for match in pattern.finditer(log):
            statuses[match.group(1)] = PASSED
    return statuses


_UNITTEST_NAME = re.compile(r"(\w+) \(([\w.]+)\)")
_UNITTEST_DETAIL = re.compile(r"(FAIL|ERROR): (\w+) \(([\w.]+)\)")
# An unexpected success fails the run (TestResult.wasSuccessful), so it is not a pass.
_UNITTEST_OUTCOMES = {"ok": PASSED, "FAIL": FAILED, "ERROR": ERROR, "expected failure": XFAIL,
                      "unexpected success": FAILED}


def _unittest_id(name: str, where: str) -> str:
    """unittest's test.id(): Python >= 3.11 prints `(module.Class.name)`, older ones `(module.Class)`."""
    return where if where.endswith(f".{name}") else f"{where}.{name}"


def _unittest_outcome(text: str) -> str | None:
    text = text.strip()
    return SKIPPED if text.startswith("skipped") else _UNITTEST_OUTCOMES.get(text)


@register_parser("unittest")
def parse_unittest(log: str) -> dict[str, str]:
    """`python -m unittest -v` output: `name (module.Class) ... ok`, with ids as `module.Class.name`.

    A test's result may come lines later: after its docstring line, or after output it printed.
    """
    statuses = {}
    current = None
    for line in log.split("\n"):
        line = line.strip()
        detail = _UNITTEST_DETAIL.match(line)
        if detail:
            statuses[_unittest_id(detail[2], detail[3])] = _UNITTEST_OUTCOMES[detail[1]]
            continue
        name = _UNITTEST_NAME.match(line)
        if name:
            current = _unittest_id(name[1], name[2])
        if " ..." in line:
            outcome = _unittest_outcome(line.rpartition(" ...")[2])
        else:
            outcome = _UNITTEST_OUTCOMES.get(line) if current else None
        if outcome and current:
            statuses[current] = outcome
            current = None
    return statuses
