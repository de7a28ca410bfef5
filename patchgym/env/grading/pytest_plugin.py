"""pytest plugin `patchgym_report`: one JSON line per test report and per failed or skipped collection, then a
closing line that says whether the code under test changed how pytest runs or reports tests.

Copied into the sandbox and loaded with `-p patchgym_report --patchgym-report=PATH`, so grading reads
results from pytest's own reports instead of printed text that a test could fake. Standard library only,
and syntax any Python >= 3.6 accepts: it runs under whatever interpreter the task's repository uses.

The code under test runs in this process and could rewrite pytest's reporting. `-p` loads this plugin before
any conftest or test module is imported, so the functions pytest reports and runs tests with are kept here
then; the closing line names any that were replaced, any report hook registered since by anything but a
conftest, and any collected test whose reports this plugin never saw.
"""

import json
import os

_fd = None
_state = {"lines": 0, "collected": None, "seen": set(), "hooks": None, "hookexec": None, "stopped": False}
_OWN = {}  # this module's functions as loaded, so rebinding one of them shows
# The hooks whose implementations decide a test's report: only conftests may add to them once collection starts.
_REPORT_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_logreport",
                 "pytest_report_teststatus")


# module:attribute path of each function pytest runs and reports tests with (missing ones, in other pytest or
# pluggy versions, are skipped).
_GUARDED_PATHS = (
    "_pytest.reports:TestReport.from_item_and_call", "_pytest.reports:TestReport.__init__",
    "_pytest.reports:BaseReport.__init__", "_pytest.runner:CallInfo.from_call", "_pytest.runner:runtestprotocol",
    "_pytest.runner:call_and_report", "_pytest.runner:call_runtest_hook", "_pytest.runner:pytest_runtest_protocol",
    "_pytest.runner:pytest_runtest_makereport", "_pytest.main:pytest_runtestloop", "pluggy._hooks:HookCaller.__call__",
    "pluggy._hooks:_HookCaller.__call__", "pluggy._manager:PluginManager._hookexec",
)


def _guarded():
    """(owner, attribute name, object) for each of _GUARDED_PATHS, as loaded now."""
    import importlib

    found = []
    for path in _GUARDED_PATHS:
        module, _, dotted = path.partition(":")
        parts = dotted.split(".")
        try:
            owner = importlib.import_module(module)
            for part in parts[:-1]:
                owner = getattr(owner, part)
        except (ImportError, AttributeError):
            continue
        if parts[-1] in vars(owner):
            found.append((owner, parts[-1], vars(owner)[parts[-1]]))
    return found


_GUARDED = _guarded()


def _write(record, _dumps=json.dumps, _os_write=os.write):
    if _fd is not None:
        # One write per line, so a line is never interleaved with another writer's.
        _os_write(_fd, (_dumps(record) + "\n").encode("utf-8"))
        _state["lines"] += 1


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
    _OWN.update((name, value) for name, value in globals().items()
                if callable(value) and getattr(value, "__module__", None) == __name__)
    _state["hookexec"] = getattr(config.pluginmanager, "_inner_hookexec", None)


def _hook_impls(config):
    """{(hook name, function): plugin} over _REPORT_HOOKS."""
    return {(name, impl.function): impl.plugin for name in _REPORT_HOOKS
            for impl in getattr(config.hook, name).get_hookimpls()}


def pytest_sessionstart(session):
    _state["hooks"] = _hook_impls(session.config)


def pytest_collection_finish(session):
    _state["collected"] = [item.nodeid for item in session.items]


def pytest_keyboard_interrupt(excinfo):
    _state["stopped"] = True  # also pytest.exit(): the tests left unrun are missing from the report, not tampering


def pytest_sessionfinish(session, exitstatus):
    _state["stopped"] = _state["stopped"] or bool(session.shouldstop or session.shouldfail)  # -x, --maxfail


def _conftest_plugin(plugin, conftests):
    """True for a conftest module, or a module a conftest names in `pytest_plugins`."""
    if os.path.basename(getattr(plugin, "__file__", None) or "") == "conftest.py":
        return True
    return getattr(plugin, "__name__", None) in conftests


def _tampering(config):
    """What the code under test changed in how pytest runs and reports tests, each as one line."""
    found = ["{}.{} was replaced".format(getattr(owner, "__name__", owner), name)
             for owner, name, original in _GUARDED if vars(owner).get(name) is not original]
    found += ["patchgym_report.{} was replaced".format(name) for name, value in _OWN.items()
              if globals().get(name) is not value]
    if getattr(config.pluginmanager, "_inner_hookexec", None) is not _state["hookexec"]:
        found.append("pluggy's hook caller was replaced")
    if _state["hooks"] is not None:
        conftests = set()
        for plugin in config.pluginmanager.get_plugins():
            if _conftest_plugin(plugin, ()):
                named = getattr(plugin, "pytest_plugins", ())
                conftests.update([named] if isinstance(named, str) else named)
        for key, plugin in _hook_impls(config).items():
            if key not in _state["hooks"] and not _conftest_plugin(plugin, conftests):
                found.append("{} was given an implementation by {!r}".format(key[0], plugin))
    if _state["collected"] is not None and not _state["stopped"]:
        unseen = [nodeid for nodeid in _state["collected"] if nodeid not in _state["seen"]]
        if unseen:
            found.append("{} collected tests were never reported, e.g. {}".format(len(unseen), unseen[0]))
    return found


def pytest_unconfigure(config):
    global _fd
    if _fd is not None:
        _write({"nodeid": "", "when": "end", "lines": _state["lines"], "tampered": _tampering(config)})
        os.close(_fd)
        _fd = None


def pytest_runtest_logreport(report):
    _state["seen"].add(report.nodeid)
    _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "wasxfail": getattr(report, "wasxfail", None)})


def pytest_collectreport(report):
    if report.failed or report.skipped:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": report.outcome})
