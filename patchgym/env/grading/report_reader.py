"""Reading the report plugin's JSONL records (or the tape reporter's, in the same format) into test statuses, and
checking that they are the plugin's own: standard library only, and syntax any Python >= 3.6 accepts, because
besides the grader (patchgym.env.grading.report) an exported Harbor task's verifier runs it inside the task's image
(patchgym.tasks.harbor.export copies this file into the task's tests/)."""

import json

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
PASSING = (PASSED, XFAIL)


class ReportMissing(Exception):
    """The report file is absent or holds no result: no sign the suite ran, which must not grade as a pass."""


class Tampered(ReportMissing):
    """The run changed how pytest runs or reports tests, something besides the plugin wrote results, or the run
    ended before the plugin's closing check: there is no report to trust, so a caller that does not tell the two
    apart (the task factory) treats it as missing."""


def records(text):
    """The report's JSON objects (a line cut short by a killed run is skipped; statuses_of counts it)."""
    found = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("nodeid"), str):
            found.append(record)
    return found


def phase_status(record):
    """One report's status: None where the phase says nothing (a passing setup or teardown, a subtest that did not
    fail)."""
    when, outcome = record.get("when"), record.get("outcome")
    if when == "subtest":
        return FAILED if outcome == "failed" else None
    xfail_marked = record.get("wasxfail") is not None
    if when == "collect":
        return ERROR if outcome == "failed" else SKIPPED
    if outcome == "skipped":
        return XFAIL if xfail_marked else SKIPPED
    if outcome == "failed":
        # A strict xpass fails the call phase itself, so it lands here as FAILED.
        return FAILED if when == "call" else ERROR
    if outcome == "passed" and when == "call":
        return PASSED  # a non-strict xpass too (pytest marks it passed, with wasxfail set)
    return None  # passing setup/teardown, or an outcome we do not grade ("rerun")


def combine(earlier, later):
    """A test's status after another phase: a teardown ERROR spoils a pass, but a failed call (or subtest) stays
    FAILED."""
    if earlier == FAILED and later in (ERROR, PASSED, XFAIL):
        return FAILED
    return later


def parse_report(text):
    """Map each test id (pytest nodeid) in a plugin report to PASSED, FAILED, SKIPPED, ERROR or XFAIL.

    A module that failed to collect maps to ERROR under the module's own id (`tests/test_x.py`).
    """
    statuses = {}
    for record in records(text):
        status = phase_status(record)
        if status is not None:
            statuses[record["nodeid"]] = combine(statuses.get(record["nodeid"]), status)
    return statuses


def durations(text):
    """Each test's seconds in a report (its phases summed); tests without a recorded time are left out."""
    found = {}
    for record in records(text):
        seconds = record.get("duration")
        if isinstance(seconds, (int, float)) and record.get("when") in ("setup", "call", "teardown"):
            found[record["nodeid"]] = found.get(record["nodeid"], 0.0) + seconds
    return found


def check_closing(found, lines=None):
    """Raise Tampered unless the last record is the plugin's closing check, clean, after exactly its own lines, and
    the results are ones the plugin could have written: one per test and phase (a rerun plugin's reruns aside), of
    collected tests only, and nothing after the closing line. `lines`: how many lines the report had, unreadable
    ones included (None: not checked)."""
    end = found[-1] if found and found[-1].get("when") == "end" else None
    if end is None:
        if any(r.get("when") == "end" for r in found):
            raise Tampered("the report goes on after its closing line")
        raise Tampered("the tests ended before the report plugin's closing check (killed, crashed or cut short)")
    if end.get("tampered"):
        raise Tampered("; ".join(map(str, end["tampered"])))
    body = found[:-1]
    if end.get("lines") != len(body) or any(r.get("when") == "end" for r in body) or (
            lines is not None and lines != len(found)):
        raise Tampered("the report holds %d results but the plugin wrote %s" % (
            (lines - 1) if lines is not None else len(body), end.get("lines")))
    collected = [r for r in body if r.get("when") == "collected"]
    if len(collected) > 1:
        raise Tampered("the report lists the collected tests %d times" % len(collected))
    known = set(collected[0].get("nodeids") or ()) if collected else None
    seen = set()
    for record in body:
        when = record.get("when")
        if when in ("collected", "collect", "subtest"):
            continue
        key = (record["nodeid"], when)
        if known is not None and record["nodeid"] not in known:
            raise Tampered("the report has a result for %s, which was never collected" % record["nodeid"])
        if record.get("outcome") == "rerun":  # pytest-rerunfailures: a try before the result
            continue
        if key in seen:
            raise Tampered("the report has two %s results for %s" % (when, record["nodeid"]))
        seen.add(key)


def statuses_of(text, where):
    """The statuses of a whole report's `text` (read from `where`); ReportMissing when there is no sign the suite
    ran, Tampered when the run changed how pytest reports (then no result of it counts)."""
    found = records(text)
    if not [r for r in found if r.get("when") not in ("end", "collected")]:
        raise ReportMissing("the test report from %s has no test result: the suite did not run" % where)
    check_closing(found, len([line for line in text.splitlines() if line.strip()]))
    return parse_report(text)
