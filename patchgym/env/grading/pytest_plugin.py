"""A pytest plugin that writes one JSON line per test report, the collected test ids and a closing line to
_TARGET, as each happens.

Standard library only, and syntax any Python >= 3.6 accepts: it runs under whatever interpreter the tested project
uses. Loaded with `-p NAME` before any conftest or test module is imported, it takes its descriptor then and keeps
it from the processes the tests start.

The code under test shares this process. The closing line says what it could see of that code changing how tests
run or report: the functions pytest runs and reports tests with replaced, report hooks added by anything but a
conftest, collected tests never reported, and tests whose code as run is not the code on disk (compiled again from the
file: the same code under --assert=plain, what it refers to under assertion rewriting) or, with _STRICT, comes from
anywhere but a test file.
"""

import json
import os
import stat

import pytest

_TARGET = 3  # set when installed: a descriptor to write to (a pipe), or a file path
_STRICT = False  # set when installed: True when every collected test must run code from its own test files
_state = {"lines": 0, "collected": None, "seen": set(), "hooks": None, "hookexec": None, "stopped": False,
          "code": None}
_OWN = {}  # this module's functions as loaded, so rebinding one of them shows
# The hooks whose implementations decide a test's report or whether its code runs: only conftests may add to them
# once the session starts.
_REPORT_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_logreport",
                 "pytest_report_teststatus", "pytest_runtest_call", "pytest_pyfunc_call",
                 "pytest_collection_modifyitems")
# module:attribute path of each function pytest runs and reports tests with (missing ones, in other pytest or
# pluggy versions, are skipped).
_GUARDED_PATHS = (
    "_pytest.reports:TestReport.from_item_and_call", "_pytest.reports:TestReport.__init__",
    "_pytest.reports:BaseReport.__init__", "_pytest.runner:CallInfo.from_call", "_pytest.runner:runtestprotocol",
    "_pytest.runner:call_and_report", "_pytest.runner:call_runtest_hook", "_pytest.runner:pytest_runtest_protocol",
    "_pytest.runner:pytest_runtest_makereport", "_pytest.main:pytest_runtestloop", "pluggy._hooks:HookCaller.__call__",
    "pluggy._hooks:_HookCaller.__call__", "pluggy._manager:PluginManager._hookexec",
    "_pytest.python:Function.runtest", "_pytest.python:pytest_pyfunc_call",
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


def _claim_target():
    """The descriptor to write to: _TARGET itself, a pipe, kept from the processes the tests start; or the file,
    opened (truncated: lines planted in it before the run do not count). None in a pytest the tests started."""
    if isinstance(_TARGET, int):
        try:
            if not stat.S_ISFIFO(os.fstat(_TARGET).st_mode):
                return None
        except OSError:
            return None
        os.set_inheritable(_TARGET, False)
        return _TARGET
    return os.open(_TARGET, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)


_GUARDED = _guarded()
_fd = _claim_target()  # at import, which `-p` makes the first thing of the run


def _write(record, _dumps=json.dumps, _os_write=os.write):
    if _fd is not None:
        # One write per line, so a line is never interleaved with another writer's.
        _os_write(_fd, (_dumps(record) + "\n").encode("utf-8"))
        _state["lines"] += 1


def pytest_configure(config):
    # pytest-xdist's workers are processes of their own, without the descriptor: their reports reach this one.
    _OWN.update((name, value) for name, value in globals().items()
                if callable(value) and getattr(value, "__module__", None) == __name__)
    _state["hookexec"] = getattr(config.pluginmanager, "_inner_hookexec", None)


def _hook_impls(config):
    """{(hook name, function): plugin} over _REPORT_HOOKS."""
    found = {}
    for name in _REPORT_HOOKS:
        caller = getattr(config.hook, name, None)
        for impl in caller.get_hookimpls() if caller is not None else ():
            found[(name, impl.function)] = impl.plugin
    return found


@pytest.hookimpl(trylast=True)  # after pytest's own plugins registered theirs (the fixture manager)
def pytest_sessionstart(session):
    _state["hooks"] = _hook_impls(session.config)


def pytest_collection_finish(session):
    if _fd is None:
        return
    _state["collected"] = [item.nodeid for item in session.items]
    _write({"nodeid": "", "when": "collected", "nodeids": _state["collected"]})
    _state["code"] = dict((item.nodeid, _code_of(item)) for item in session.items)
    _state["code_problems"] = _code_problems(session, _state["code"])


def pytest_keyboard_interrupt(excinfo):
    _state["stopped"] = True  # also pytest.exit(): the tests left unrun are missing from the report, not tampering


def pytest_sessionfinish(session, exitstatus):
    _state["stopped"] = _state["stopped"] or bool(session.shouldstop or session.shouldfail)  # -x, --maxfail
    _state["session"] = session


# -- the code a test runs --------------------------------------------------------------------------------------------
def _code_of(item):
    """The code object of the function `item` calls (a test function or method), or None for other items."""
    try:
        function = getattr(item, "function", None)
    except Exception:
        return None
    function = getattr(function, "__func__", function)
    return getattr(function, "__code__", None)


def _fingerprint(code):
    """What a code object computes, without where it sits: bytecode, names and constants, nested code included."""
    consts = tuple(_fingerprint(c) if hasattr(c, "co_code") else (type(c).__name__, repr(c)) for c in code.co_consts)
    return (code.co_name, code.co_code, code.co_names, code.co_varnames, code.co_freevars, consts)


def _uses(code):
    """Every name and constant a code object (nested code included) refers to, and its parameters."""
    names, constants, todo = set(), set(), [code]
    while todo:
        current = todo.pop()
        names.update(current.co_names)
        for const in current.co_consts:
            if hasattr(const, "co_code"):
                todo.append(const)
            else:
                constants.add((type(const).__name__, repr(const)))
    return names, constants, code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def _disk_codes(path, cache):
    """{(name, first line): code} of every function in the file at `path`, compiled from disk as Python imports it;
    None when it does not compile."""
    if path in cache:
        return cache[path]
    try:
        with open(path, "rb") as f:
            todo = [compile(f.read(), path, "exec", dont_inherit=True)]
    except (OSError, SyntaxError, ValueError):
        cache[path] = None
        return None
    found = {}
    while todo:
        code = todo.pop()
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                found[(const.co_name, const.co_firstlineno)] = const
                todo.append(const)
    cache[path] = found
    return found


def _from_disk(code, on_disk, exact):
    """Whether `code` comes from the function at its name and first line in `on_disk` (a compile hook, a reload, a
    planted cache or a swapped-in function does not). `exact` (pytest imported the tests plainly, --assert=plain):
    the same code. Otherwise pytest's assertion rewriting changed it, only adding to what it refers to: each name
    and parameter of the function as compiled from the file must be there."""
    plain = on_disk.get((code.co_name, code.co_firstlineno))
    if plain is None:
        return False
    if exact:
        return _fingerprint(plain) == _fingerprint(code)
    names, _, params = _uses(plain)
    run_names, _, run_params = _uses(code)
    return names <= run_names and params == run_params


def _inside(path, root):
    return os.path.abspath(path).startswith(os.path.join(os.path.abspath(root), ""))


def _code_problems(session, codes):
    """One line for each collected test whose code as run is not what its file on disk compiles to."""
    problems, cache = [], {}
    root = str(session.config.rootdir)
    exact = session.config.getoption("assertmode", None) == "plain"
    for nodeid, code in sorted(codes.items(), key=lambda pair: pair[0]):
        if code is None:
            continue
        path = code.co_filename
        if not os.path.isfile(path):
            if _STRICT or path.startswith("<"):
                problems.append("%s runs code compiled from %s, not from a file" % (nodeid, path))
            continue
        if not _inside(path, root):
            continue  # a library's wrapper (unittest.mock, a decorator of an installed package)
        name = os.path.basename(path)
        own = name.startswith(("test_", "conftest")) or name.endswith(("_test.py", "_tests.py")) or (
            "/test" in "/" + os.path.relpath(os.path.dirname(path), root))
        if not own:
            if _STRICT:
                problems.append("%s runs code from %s, which is not a test file" % (nodeid, path))
            continue
        on_disk = _disk_codes(path, cache)
        if on_disk is None or not _from_disk(code, on_disk, exact):
            problems.append("%s runs code that is not what %s holds at line %d" % (nodeid, path, code.co_firstlineno))
    return problems


# -- the closing line ------------------------------------------------------------------------------------------------
def _conftest_plugin(plugin, conftests):
    """True for a conftest module, or a module a conftest names in `pytest_plugins`."""
    if os.path.basename(getattr(plugin, "__file__", None) or "") == "conftest.py":
        return True
    return getattr(plugin, "__name__", None) in conftests


def _tampering(config):
    """What the code under test changed in how pytest runs and reports tests, each as one line."""
    found = ["{}.{} was replaced".format(getattr(owner, "__name__", owner), name)
             for owner, name, original in _GUARDED if vars(owner).get(name) is not original]
    found += ["{} was replaced".format(name) for name, value in _OWN.items() if globals().get(name) is not value]
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
    found += _state.get("code_problems") or []
    session = _state.get("session")
    if _state["code"] is not None and session is not None:
        now = dict((item.nodeid, _code_of(item)) for item in session.items)
        found += ["%s: its code was replaced while the tests ran" % nodeid for nodeid, code in sorted(now.items())
                  if code is not None and _state["code"].get(nodeid) is not None
                  and _fingerprint(code) != _fingerprint(_state["code"][nodeid])]
    return found


def pytest_unconfigure(config):
    global _fd
    if _fd is not None:
        _write({"nodeid": "", "when": "end", "lines": _state["lines"], "tampered": _tampering(config)})
        os.close(_fd)
        _fd = None


def pytest_runtest_logreport(report):
    _state["seen"].add(report.nodeid)
    # pytest 9's subtests report under their test's id, each before the test's own call report
    when = "subtest" if report.when == "call" and hasattr(report, "context") else report.when
    _write({"nodeid": report.nodeid, "when": when, "outcome": report.outcome,
            "wasxfail": getattr(report, "wasxfail", None), "duration": round(getattr(report, "duration", 0), 6)})


def pytest_collectreport(report):
    if report.failed or report.skipped:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": report.outcome})
