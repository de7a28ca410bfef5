"""pytest plugin `patchgym_report`: one JSON line per test report and per failed or skipped collection.

Copied into the sandbox and loaded with `-p patchgym_report --patchgym-report=PATH`, so grading reads
results from pytest's own reports instead of printed text that a test could fake. Standard library only,
and syntax any Python >= 3.6 accepts: it runs under whatever interpreter the task's repository uses.
"""

import json
import os

_fd = None


def pytest_addoption(parser):
    parser.addoption("--patchgym-report", action="store", default=None, metavar="PATH",
                     help="write one JSON line per test report to PATH (patchgym's grader)")


def pytest_configure(config):
    global _fd
    path = config.getoption("--patchgym-report")
    # Under pytest-xdist the workers' reports reach the controller, which alone writes the file
    # (xdist before 2.0 called its workers "slaves").
    if not path or hasattr(config, "workerinput") or hasattr(config, "slaveinput"):
        return
    # Truncate: lines planted in the file before the run must not count.
    _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)


def pytest_unconfigure(config):
    global _fd
    if _fd is not None:
        os.close(_fd)
        _fd = None


def _write(record):
    if _fd is not None:
        # One write per line, so a line is never interleaved with another writer's.
        os.write(_fd, (json.dumps(record) + "\n").encode("utf-8"))


def pytest_runtest_logreport(report):
    _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "wasxfail": getattr(report, "wasxfail", None)})


def pytest_collectreport(report):
    if report.failed or report.skipped:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": report.outcome})
