"""camg's grader-side pytest plugin (shipped root-owned in every grader layer).

The grader runs the profile's test command with ``-p camg_guard`` first on
the command line (PYTEST_ADDOPTS) and plugin autoloading off. This module is
imported by pytest before any conftest, and so before any code of the
repository under test. It:

* reports itself (``hello``) so the grader knows the runner started, with
  where pytest was imported from;
* loads the image's own pytest11 entry-point plugins itself, leaving out any
  distribution the agent's diff created or changed;
* snapshots the functions that carry a test's outcome from the call to the
  report (``_pytest.runner``, ``_pytest.reports``, pluggy's hook calling,
  ``os._exit``...) and checks at the end of the session that none was
  replaced, that no hook implementation lives in a file the diff changed,
  and that no import hook or tracer from the repository was installed;
* records every test's outcome from the raw call result (the exception the
  test raised, before any report hook ran) on its own channel: a file whose
  lines are HMAC-signed with a per-grade key it removes from the
  environment at import, and compares it with the report pytest produced.

Stdlib only and Python 3.6 compatible: it runs in whatever interpreter the
task's image ships. It does nothing unless the grader's key is set.
"""

import hashlib
import hmac
import json
import os
import sys

_ENV = dict(os.environ)
_KEY = os.environ.pop("CAMG_GUARD_KEY", "").encode()
_OUT = os.environ.pop("CAMG_GUARD_OUT", "")
_MODE = os.environ.pop("CAMG_GUARD_MODE", "run")
_CHANGED_FILE = os.environ.pop("CAMG_GUARD_CHANGED", "")
_WORKDIR = os.path.realpath(os.environ.pop("CAMG_GUARD_WORKDIR", "/testbed"))
# Children (tests that start pytest themselves) see the environment the test
# command would have had without the grader.
for _name in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTHONPATH"):
    _orig = os.environ.pop("CAMG_GUARD_ORIG_" + _name, None)
    if _orig is None:
        continue
    if _orig == "\x00unset":
        os.environ.pop(_name, None)
    else:
        os.environ[_name] = _orig

_write = os.write
_exit = os._exit
_getpid = os.getpid
_dumps = json.dumps
_new_hmac = hmac.new
_sha256 = hashlib.sha256
_ACTIVE = bool(_KEY and _OUT)
_PID = _getpid()
_fd = os.open(_OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if _ACTIVE else -1


def _emit(record):
    if not _ACTIVE or _getpid() != _PID:
        return
    line = _dumps(record, sort_keys=True, separators=(",", ":"))
    mac = _new_hmac(_KEY, line.encode("utf-8"), _sha256).hexdigest()[:32]
    _write(_fd, ("camg-guard " + mac + " " + line + "\n").encode("utf-8"))


def _under_workdir(path):
    if not path:
        return False
    real = os.path.realpath(path)
    return real == _WORKDIR or real.startswith(_WORKDIR + os.sep)


def _read_changed():
    changed = set()
    if _CHANGED_FILE:
        try:
            with open(_CHANGED_FILE, "rb") as handle:
                data = handle.read()
        except OSError:
            data = b""
        for rel in data.split(b"\0"):
            if rel:
                changed.add(os.path.realpath(os.path.join(_WORKDIR, rel.decode("utf-8", "replace"))))
    return changed


_CHANGED = _read_changed()

import pytest  # noqa: E402

_emit({"t": "hello", "pid": _PID, "mode": _MODE, "python": sys.executable,
       "version": sys.version.split()[0], "pytest": getattr(pytest, "__version__", "?"),
       "pytest_file": getattr(pytest, "__file__", "")})
if _MODE == "probe":
    # Only proves that the interpreter and the runner start.
    _exit(0)


# --- what must stay intact --------------------------------------------------

_WATCHED = (
    ("_pytest.runner", ("call_and_report", "runtestprotocol", "call_runtest_hook",
                        "CallInfo.from_call", "pytest_runtest_makereport",
                        "pytest_runtest_protocol", "pytest_runtest_call",
                        "pytest_runtest_setup", "pytest_runtest_teardown",
                        "pytest_report_teststatus", "check_interactive_exception")),
    ("_pytest.reports", ("TestReport.from_item_and_call", "TestReport.__init__",
                         "BaseReport.passed", "BaseReport.failed", "BaseReport.skipped",
                         "BaseReport.__getattr__")),
    ("_pytest.python", ("Function.runtest", "pytest_pyfunc_call", "Function.setup")),
    ("_pytest.main", ("pytest_runtestloop", "wrap_session", "Session.perform_collect")),
    ("_pytest.skipping", ("pytest_runtest_makereport", "pytest_runtest_setup",
                          "pytest_runtest_call")),
    ("_pytest.terminal", ("TerminalReporter.pytest_runtest_logreport",
                          "TerminalReporter.pytest_runtest_logfinish",
                          "TerminalReporter.write_ensure_prefix",
                          "TerminalReporter.summary_stats", "pytest_report_teststatus")),
    ("_pytest.outcomes", ("fail", "skip", "xfail", "exit", "OutcomeException.__init__")),
    ("_pytest.config", ("main",)),
    ("pluggy._callers", ("_multicall",)),
    ("pluggy._hooks", ("HookCaller.__call__", "_HookCaller.__call__", "HookImpl.__init__")),
    ("pluggy._manager", ("PluginManager._hookexec", "PluginManager.register")),
    ("pluggy.callers", ("_multicall",)),
    ("pluggy.hooks", ("_HookCaller.__call__",)),
    ("os", ("_exit", "write", "kill", "abort")),
    ("sys", ("exit",)),
)


def _resolve(module, dotted):
    obj = sys.modules.get(module)
    if obj is None:
        try:
            obj = __import__(module, fromlist=["_"])
        except Exception:  # noqa: BLE001 - absent in this pytest/pluggy version
            return None
    for part in dotted.split("."):
        if isinstance(obj, type) and part in obj.__dict__:
            obj = obj.__dict__[part]
            continue
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _fingerprint(obj):
    fn = getattr(obj, "__func__", obj)
    if isinstance(fn, property):
        fn = fn.fget
    return (id(obj), id(getattr(fn, "__code__", None)))


def _snapshot():
    taken = {}
    for module, names in _WATCHED:
        for name in names:
            obj = _resolve(module, name)
            if obj is not None:
                taken[module + ":" + name] = (obj, _fingerprint(obj))
    return taken


_SNAPSHOT = _snapshot()
_META_PATH = [id(entry) for entry in sys.meta_path]
_PATH_HOOKS = [id(entry) for entry in sys.path_hooks]
_evidence = []
_seen_evidence = set()


def _flag(rule, detail):
    key = (rule, detail)
    if key not in _seen_evidence and len(_evidence) < 50:
        _seen_evidence.add(key)
        _evidence.append({"rule": rule, "detail": str(detail)[:300]})
        # Now, not only at the session's end: code that later stops the
        # session (os._exit, a patched sessionfinish) cannot take it back.
        _emit({"t": "finding", "rule": rule, "detail": str(detail)[:300]})


if _under_workdir(getattr(pytest, "__file__", "")):
    _flag("runner_shadowed", pytest.__file__)


def _code_file(fn):
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        call = getattr(type(fn), "__call__", None)
        code = getattr(getattr(call, "__func__", call), "__code__", None)
    return getattr(code, "co_filename", "") if code is not None else ""


def _agent_file(path):
    """A file the agent's diff created or changed (or one that is not a file
    of the image or the pristine repository: code made up at run time)."""
    if not path:
        return False
    if path.startswith("<") and path not in ("<frozen importlib._bootstrap>",):
        return not path.startswith("<frozen")
    return os.path.realpath(path) in _CHANGED


def _check_integrity(manager):
    for key, (obj, fingerprint) in _SNAPSHOT.items():
        module, name = key.split(":", 1)
        now = _resolve(module, name)
        if now is None or now is not obj or _fingerprint(now) != fingerprint:
            _flag("runner_patched", key)
    for label, entries, before in (("sys.meta_path", sys.meta_path, _META_PATH),
                                   ("sys.path_hooks", sys.path_hooks, _PATH_HOOKS)):
        for entry in entries:
            if id(entry) in before:
                continue
            home = getattr(sys.modules.get(type(entry).__module__), "__file__", "")
            if _under_workdir(home) or _agent_file(_code_file(entry)):
                _flag("import_hook", label + ": " + repr(type(entry)))
    for getter in (getattr(sys, "gettrace", None), getattr(sys, "getprofile", None)):
        tracer = getter() if getter else None
        if tracer is not None and _agent_file(_code_file(tracer)):
            _flag("tracer", _code_file(tracer))
    if manager is None:
        return
    for plugin in list(manager.get_plugins()):
        home = getattr(plugin, "__file__", None) or getattr(
            sys.modules.get(getattr(type(plugin), "__module__", "")), "__file__", "")
        if home and os.path.realpath(home) in _CHANGED:
            _flag("plugin_from_changed_code", home)
    hooks = getattr(manager, "hook", None)
    for name in dir(hooks):
        if not name.startswith("pytest_"):
            continue
        caller = getattr(hooks, name, None)
        getter = getattr(caller, "get_hookimpls", None)
        if getter is None:
            continue
        for impl in getter():
            where = _code_file(getattr(impl, "function", None))
            if _agent_file(where):
                _flag("hook_from_changed_code", name + " in " + where)


# --- plugins and outcomes -------------------------------------------------

def _pytest11():
    """(metadata location, entry point name, loader) of every pytest11 plugin
    installed: importlib.metadata (3.8+), its backport, else pkg_resources."""
    metadata = None
    try:
        from importlib import metadata
    except ImportError:
        try:
            import importlib_metadata as metadata
        except ImportError:
            metadata = None
    if metadata is not None:
        for dist in metadata.distributions():
            try:
                eps = [ep for ep in dist.entry_points if ep.group == "pytest11"]
            except Exception:  # noqa: BLE001 - broken metadata: not a plugin we load
                continue
            for ep in eps:
                yield str(getattr(dist, "_path", "") or ""), ep.name, ep.load
        return
    try:
        import pkg_resources
    except ImportError:
        return
    for ep in pkg_resources.iter_entry_points("pytest11"):
        yield str(getattr(ep.dist, "location", "") or ""), ep.name, ep.load


def pytest_addhooks(pluginmanager):
    """Load the image's pytest11 plugins (autoloading is off)."""
    loaded = []
    for where, name, load in _pytest11():
        real = os.path.realpath(where) if where else ""
        if real and _under_workdir(real) and (real in _CHANGED or any(
                c.startswith(real + os.sep) for c in _CHANGED)):
            _flag("package_metadata", where)
            continue
        if pluginmanager.get_plugin(name) is not None or pluginmanager.is_blocked(name):
            continue
        try:
            pluginmanager.register(load(), name=name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - pytest would fail the same way
            _emit({"t": "plugin_error", "name": name, "error": repr(exc)[:300]})
    _emit({"t": "plugins", "loaded": sorted(loaded)})


_phases = {}


def _skip_types():
    """What pytest reports as skipped: its Skipped and unittest's SkipTest
    (as _pytest/unittest.py does), twisted's when loaded."""
    from _pytest.outcomes import Skipped
    found = [Skipped]
    import unittest
    found.append(unittest.SkipTest)
    trial = sys.modules.get("twisted.trial.unittest")
    if isinstance(getattr(trial, "SkipTest", None), type):
        found.append(trial.SkipTest)
    return tuple(found)


def _raised_from_changed(item, excinfo):
    """The agent-changed file a skip or xfail was raised through, if any.
    A test, its markers or its fixtures may skip; the code under test may
    not (the test would no longer say anything). The test's own module is
    left out: a test the agent wrote may skip itself (required tests are
    reset to the base before the run)."""
    own = os.path.realpath(str(getattr(item, "fspath", "") or ""))
    tb = getattr(excinfo, "tb", None)
    while tb is not None:
        where = tb.tb_frame.f_code.co_filename
        if where.startswith("<doctest"):
            where = ""
        if where and _agent_file(where) and os.path.realpath(where) != own:
            return where
        tb = tb.tb_next
    return None


def _raw(item, call):
    excinfo = call.excinfo
    if excinfo is None:
        return "ok"
    try:
        from _pytest.outcomes import XFailed
    except ImportError:  # very old pytest
        XFailed = ()
    value = excinfo.value
    skipped = isinstance(value, _skip_types())
    if skipped or (XFailed and isinstance(value, XFailed)):
        where = _raised_from_changed(item, excinfo)
        if where:
            _flag("outcome_from_changed_code", item.nodeid + " " + call.when + " from " + where)
            return "error"
    if XFailed and isinstance(value, XFailed):
        return "xfail"
    if skipped:
        return "skip"
    if call.when == "call" and item.get_closest_marker("xfail") is not None:
        return "xfail"
    return "error"


# The hooks below take the module's helpers as default arguments (pluggy
# passes only hook arguments, never defaulted ones): rebinding the module's
# globals from code under test does not reach them.

@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call, _raw=_raw, _flag=_flag, _phases=_phases):
    raw = _raw(item, call)
    outcome = yield
    report = outcome.get_result()
    claimed = getattr(report, "outcome", "?")
    if raw in ("error", "skip") and claimed == "passed":
        _flag("report_rewritten", item.nodeid + " " + call.when)
    _phases.setdefault(item.nodeid, {})[call.when] = raw


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location, _emit=_emit, _phases=_phases):
    phases = _phases.pop(nodeid, {})
    values = [phases.get(w) for w in ("setup", "call", "teardown")]
    if "error" in values:
        outcome = "failed"
    elif "xfail" in values:
        outcome = "xfailed"
    elif "skip" in values or phases.get("call") is None:
        outcome = "skipped"
    else:
        outcome = "passed"
    _emit({"t": "test", "id": nodeid, "outcome": outcome})


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session, _emit=_emit):
    _emit({"t": "collected", "ids": [item.nodeid for item in session.items]})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus, _emit=_emit, _check=_check_integrity,
                         _evidence=_evidence):
    yield
    _check(session.config.pluginmanager)
    _emit({"t": "end", "exitstatus": int(getattr(session, "exitstatus", exitstatus) or 0),
           "evidence": _evidence})
