"""The capabilities the code screen looks for, by name, and its token screen.

camg.grading.code_screen parses what it can of a submission's added Python and
walks the tree (camg.grading.code_screen_ast); a fragment that does not parse (a
hunk cut inside a call or a string) is screened here by its tokens: the
same names, a plain call of ``exec``/``eval``/``compile``, a computed
``import_module``, a subscript write of ``sys.modules``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from camg.grading.tamper_rules import Finding

FRAME_ATTRS = frozenset(
    {
        "_getframe",
        "_getframemodulename",
        "_current_frames",
        "_current_exceptions",
        "currentframe",
        "getouterframes",
        "f_back",
        "f_locals",
        "f_globals",
        "f_builtins",
        "f_trace",
        "tb_frame",
        "gi_frame",
        "cr_frame",
        "ag_frame",
        "settrace",
        "setprofile",
        "walk_stack",
    }
)
# Module-qualified only: the bare names are common words.
FRAME_QUALIFIED = {"inspect": {"stack", "trace"}, "sys": {"monitoring"}}
DYNAMIC_ATTRS = frozenset(
    {"__code__", "co_code", "FunctionType", "CodeType", "LambdaType", "run_path", "run_module"}
)
DYNAMIC_BUILTINS = frozenset({"exec", "eval", "compile"})
# Deserializers that call whatever callable their input names: code the
# source does not show.
DYNAMIC_QUALIFIED = {
    **{
        m: {"loads", "load", "Unpickler"}
        for m in ("pickle", "_pickle", "cPickle", "dill", "cloudpickle")
    },
    # runners of source text under other names than exec
    "code": {"InteractiveInterpreter", "InteractiveConsole", "interact", "compile_command"},
    "codeop": {"compile_command", "Compile", "CommandCompiler"},
    "timeit": {"timeit", "repeat", "Timer"},
    "cProfile": {"run", "runctx", "Profile"},
    "profile": {"run", "runctx", "Profile"},
    "pdb": {"run", "runeval", "runctx", "runcall", "Pdb"},
    "trace": {"Trace"},
    "doctest": {"testmod", "testfile", "run_docstring_examples", "DocTestRunner", "DebugRunner"},
}
# (``__subclasses__`` walks the class graph as gc walks the heap: to the
# runner's item classes from ``object``)
GC_ATTRS = frozenset({"get_objects", "get_referrers", "get_referents", "__subclasses__"})
IMPORT_ATTRS = frozenset(
    {
        "meta_path",
        "path_hooks",
        "path_importer_cache",
        "__import__",
        "spec_from_file_location",
        "spec_from_loader",
        "module_from_spec",
        "exec_module",
        "load_module",
        "SourceFileLoader",
        "SourcelessFileLoader",
        "ExtensionFileLoader",
        "load_source",
        "load_compiled",
        "zipimporter",
    }
)
NATIVE_NAMES = frozenset(
    {
        "ctypes",
        "_ctypes",
        "cffi",
        "_cffi_backend",
        "CDLL",
        "PyDLL",
        "cdll",
        "pydll",
        "pythonapi",
        "windll",
        "oledll",
    }
)
EXIT_ATTRS = frozenset({"_exit", "atexit", "_register_atexit", "excepthook", "unraisablehook"})
EXIT_QUALIFIED = {
    "weakref": {"finalize"},
    "os": {"kill", "killpg", "abort"},
    "signal": {
        "signal",
        "alarm",
        "setitimer",
        "raise_signal",
        "pthread_kill",
        "set_wakeup_fd",
        "siginterrupt",
    },
}
BUILTINS = frozenset({"builtins", "__builtins__", "__builtin__"})
# Names of Python files, and the calls that write a file whole.
PYTHON_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".pth")
FILE_WRITERS = frozenset({"write_text", "write_bytes", "copyfile", "copy2", "copytree"})

# Strings naming one of these are the capability, however the name is used.
SENSITIVE_STRINGS = {
    **{n: "frame_introspection" for n in FRAME_ATTRS},
    **{n: "dynamic_code" for n in ("__code__", "co_code", "FunctionType", "CodeType")},
    **{n: "gc_walk" for n in GC_ATTRS},
    **{
        n: "import_machinery"
        for n in ("meta_path", "path_hooks", "path_importer_cache", "__import__")
    },
    **{n: "native_code" for n in ("ctypes", "_ctypes", "cffi", "pythonapi")},
    **{n: "exit_hooks" for n in ("_exit", "atexit")},
    "__builtins__": "builtins_patching",
}

# Modules whose attributes a fix has no business rebinding; a computed
# attribute of one is the capability its module holds.
MODULE_RULE = {
    "sys": "import_machinery",
    "builtins": "builtins_patching",
    "__builtins__": "builtins_patching",
    "gc": "gc_walk",
    "inspect": "frame_introspection",
    "traceback": "frame_introspection",
    "importlib": "import_machinery",
    "types": "dynamic_code",
    "ctypes": "native_code",
    "cffi": "native_code",
    "atexit": "exit_hooks",
    "signal": "exit_hooks",
    "os": "exit_hooks",
    "weakref": "exit_hooks",
    "marshal": "dynamic_code",
    "runpy": "dynamic_code",
}
PATCHED_MODULES = frozenset(MODULE_RULE) | {
    "functools",
    "threading",
    "unittest",
    "pytest",
    "_pytest",
    "pluggy",
    "operator",
    "copyreg",
}
# Modules whose names, imported bare, are read as the module's own.
WATCHED_MODULES = PATCHED_MODULES | BUILTINS | set(DYNAMIC_QUALIFIED)
# Import statements that bring a capability in under a bare name.
IMPORT_RULE = {
    "ctypes": "native_code",
    "_ctypes": "native_code",
    "cffi": "native_code",
    "atexit": "exit_hooks",
    "marshal": "dynamic_code",
    "runpy": "dynamic_code",
    "imp": "import_machinery",
    "zipimport": "import_machinery",
}
# Dunders that replace what code *is*: a write of one is never a fix's.
CODE_DUNDERS = frozenset(
    {
        "__code__",
        "__globals__",
        "__closure__",
        "__builtins__",
        "__bases__",
        "__mro__",
        "__getattribute__",
        "__import__",
        "__loader__",
        "__spec__",
    }
)
OWNER_NAMES = frozenset({"self", "cls", "mcs", "metacls", "klass"})
MODULES_WRITES = frozenset(
    {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
)
DECODERS = frozenset(
    {
        "chr",
        "bytes",
        "bytearray",
        "decode",
        "b64decode",
        "b32decode",
        "b16decode",
        "a85decode",
        "b85decode",
        "unhexlify",
        "fromhex",
        "reversed",
        "join",
        "map",
        "translate",
        "rot13",
        "urlsafe_b64decode",
    }
)
ATTR_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})

# A runner's module or hook name assembled from pieces (the plain spelling is
# the tamper rules' to find).
RUNNER_NAME = re.compile(r"pytest|pluggy|camg")


# Looked up with owner None too (a name no dot follows), which no key has.
TOKEN_QUALIFIED: dict[tuple[str | None, str], str] = {
    **{
        (module, name): "dynamic_code"
        for module, names in DYNAMIC_QUALIFIED.items()
        for name in names
    },
    ("inspect", "stack"): "frame_introspection",
    ("inspect", "trace"): "frame_introspection",
    ("weakref", "finalize"): "exit_hooks",
    ("os", "kill"): "exit_hooks",
    ("os", "killpg"): "exit_hooks",
    ("os", "abort"): "exit_hooks",
    ("signal", "signal"): "exit_hooks",
    ("signal", "alarm"): "exit_hooks",
    ("signal", "setitimer"): "exit_hooks",
    ("gc", "callbacks"): "gc_walk",
    ("importlib", "reload"): "import_machinery",
}


def bare_rule(name: str) -> str | None:
    if name in FRAME_ATTRS:
        return "frame_introspection"
    if name in DYNAMIC_ATTRS:
        return "dynamic_code"
    if name in GC_ATTRS:
        return "gc_walk"
    if name in IMPORT_ATTRS:
        return "import_machinery"
    if name in NATIVE_NAMES:
        return "native_code"
    if name in EXIT_ATTRS:
        return "exit_hooks"
    if name in ("__builtins__", "__builtin__"):
        return "builtins_patching"
    return None


def token_screen(unit, rest: set[int]) -> list[Finding]:
    """Names and calls on the added lines of a fragment that does not parse."""
    first, last = min(rest), max(rest)
    text = "\n".join(unit.lines[first : last + 1]) + "\n"
    tokens = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            tokens.append(tok)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    significant = [t for t in tokens if t.type in (tokenize.NAME, tokenize.OP, tokenize.STRING)]
    found = []

    def flag(rule: str, tok, why: str) -> None:
        index = first + tok.start[0] - 1
        if index not in rest:
            return
        found.append(
            Finding(
                rule,
                unit.path,
                f"{unit.path}:{unit.line_of(index)}: {unit.lines[index].strip()[:160]} ({why})",
            )
        )

    for i, tok in enumerate(significant):
        before = significant[i - 1].string if i else ""
        after = significant[i + 1].string if i + 1 < len(significant) else ""
        owner = significant[i - 2].string if i >= 2 and before == "." else None
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, str) and value in SENSITIVE_STRINGS:
                flag(SENSITIVE_STRINGS[value], tok, f"names {value!r}")
            continue
        if tok.type != tokenize.NAME:
            continue
        rule = bare_rule(tok.string) or TOKEN_QUALIFIED.get((owner, tok.string))
        if rule:
            flag(rule, tok, tok.string)
        elif tok.string in DYNAMIC_BUILTINS and before not in (".", "def") and after == "(":
            flag("dynamic_code", tok, f"{tok.string}()")
        elif tok.string in ("import_module",) and after == "(":
            nxt = significant[i + 2] if i + 2 < len(significant) else None
            if nxt is None or nxt.type != tokenize.STRING:
                flag("import_machinery", tok, "import_module() of a computed name")
        elif tok.string == "modules" and owner == "sys" and _subscript_store(significant, i + 1):
            flag("import_machinery", tok, "writes sys.modules")
        elif tok.string == "setattr" and after == "(" and before != "def":
            flag("foreign_attribute_write", tok, "setattr() in a fragment the screen cannot parse")
        elif owner in IMPORT_RULE or (before == "import" and tok.string in IMPORT_RULE):
            flag(IMPORT_RULE.get(owner or tok.string, "native_code"), tok, tok.string)
    return found


def _subscript_store(tokens, i: int) -> bool:
    """``[ ... ] =`` (or ``.update(`` and friends) from token ``i``."""
    if i < len(tokens) and tokens[i].string == "." and i + 1 < len(tokens):
        return tokens[i + 1].string in MODULES_WRITES
    if i >= len(tokens) or tokens[i].string != "[":
        return False
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].string in "([{":
            depth += 1
        elif tokens[j].string in ")]}":
            depth -= 1
            if depth == 0:
                nxt = tokens[j + 1].string if j + 1 < len(tokens) else ""
                return nxt == "=" or nxt.endswith("=") and nxt not in ("==", "<=", ">=", "!=")
    return False
