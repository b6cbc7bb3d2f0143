"""The code screen's rules over a parsed fragment (camg.grading.code_screen).

A ``Visitor`` walks one parsed window of a submission's Python and flags
what is on its added lines: names and attributes of the capabilities
(camg.grading.code_screen_names), their string spellings folded from constants,
calls that build or reach them, and writes to objects the file does not own.
"""

from __future__ import annotations

import ast
import bisect
from collections.abc import Set
from typing import cast

from camg.grading.code_screen_names import (
    ATTR_CALLS,
    BUILTINS,
    CODE_DUNDERS,
    DECODERS,
    DYNAMIC_ATTRS,
    DYNAMIC_BUILTINS,
    DYNAMIC_QUALIFIED,
    EXIT_ATTRS,
    EXIT_QUALIFIED,
    FILE_WRITERS,
    FRAME_ATTRS,
    FRAME_QUALIFIED,
    GC_ATTRS,
    IMPORT_ATTRS,
    IMPORT_RULE,
    MODULE_RULE,
    MODULES_WRITES,
    NATIVE_NAMES,
    OWNER_NAMES,
    PATCHED_MODULES,
    PYTHON_SUFFIXES,
    RUNNER_NAME,
    SENSITIVE_STRINGS,
    WATCHED_MODULES,
)
from camg.grading.tamper_rules import Finding


def _fold(node) -> str | None:
    """The string a constant expression evaluates to, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left), _fold(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                value = value.value
            part = _fold(value)
            if part is None:
                return None
            parts.append(part)
        return "".join(parts)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
    ):
        sep = _fold(node.func.value)
        items = node.args[0]
        if sep is not None and isinstance(items, (ast.List, ast.Tuple)):
            folded = [_fold(e) for e in items.elts]
            if all(p is not None for p in folded):
                return sep.join(cast("list[str]", folded))
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        sliced = _fold(node.value)
        s = node.slice
        bounds = [_literal_int(b) for b in (s.lower, s.upper, s.step)]
        if sliced is not None and all(b is not False for b in bounds):
            return sliced[slice(*bounds)]
    return None


def _literal(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _literal_int(node):
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int)
    ):
        return -node.operand.value
    return False


def _module(node) -> str | None:
    """The module an expression names: ``sys``, ``__import__("gc")``,
    ``importlib.import_module("builtins")``, ``sys.modules["builtins"]``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _module(node.value)
        return f"{inner}.{node.attr}" if inner else None
    if isinstance(node, ast.Call) and node.args:
        callee = _dotted(node.func)
        if callee in (
            "__import__",
            "importlib.import_module",
            "import_module",
            "importlib.__import__",
        ):
            return _fold(node.args[0])
    if isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.modules":
        return _fold(node.slice)
    return None


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _is_modules(node) -> bool:
    """``sys.modules``, ``vars(sys)["modules"]``, ``sys.__dict__["modules"]``,
    ``getattr(sys, "modules")``."""
    if _dotted(node) == "sys.modules":
        return True
    if isinstance(node, ast.Subscript):
        return _namespace_of(node.value) == "sys" and _fold(node.slice) == "modules"
    if isinstance(node, ast.Call) and _dotted(node.func) == "getattr" and len(node.args) >= 2:
        return _module(node.args[0]) == "sys" and _fold(node.args[1]) == "modules"
    return False


def _decoded(node) -> bool:
    """An expression that decodes or assembles a name at run time."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            callee = (
                sub.func.attr
                if isinstance(sub.func, ast.Attribute)
                else getattr(sub.func, "id", None)
            )
            if callee in DECODERS:
                return True
        if (
            isinstance(sub, ast.Subscript)
            and isinstance(sub.slice, ast.Slice)
            and sub.slice.step is not None
        ):
            return True
    return False


def _unaliased(tree):
    """``tree`` with each name an import binds spelled as what it imports:
    an alias (``import sys as _s``: ``_s.modules`` is ``sys.modules``), and
    a name imported from a module the rules watch (``from unittest import
    TestCase``: ``TestCase.run = ...`` patches ``unittest.TestCase``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update({a.asname: a.name for a in node.names if a.asname})
        elif isinstance(node, ast.ImportFrom):
            watched = not node.level and (node.module or "").split(".")[0] in WATCHED_MODULES
            for alias in node.names:
                if watched:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif alias.asname:
                    names[alias.asname] = alias.name
    if not names:
        return tree

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name):
            if node.id not in names or not isinstance(node.ctx, ast.Load):
                return node
            first, *rest = names[node.id].split(".")
            expr: ast.expr = ast.copy_location(ast.Name(id=first, ctx=ast.Load()), node)
            for attr in rest:
                expr = ast.copy_location(ast.Attribute(value=expr, attr=attr, ctx=ast.Load()), node)
            return expr

    return Rename().visit(tree)


class Visitor(ast.NodeVisitor):
    def __init__(self, unit, offset: int) -> None:
        self.unit = unit
        self.offset = offset
        self.found: list[Finding] = []
        self.owned = set(unit.owned)
        self.sorted_added = sorted(unit.added)

    def run(self, tree) -> list[Finding]:
        self.writes = _writes_files(tree)
        tree = _unaliased(tree)
        self.parents = {
            child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
        }
        self.visit(tree)
        return self.found

    def visit(self, node):
        # A statement with no added line in it holds nothing to flag (most
        # of a hunk is context): skip it whole.
        if isinstance(node, ast.stmt):
            start = self._index(node.lineno)
            end = self._index(node.end_lineno or node.lineno)
            at = bisect.bisect_left(self.sorted_added, start)
            if at == len(self.sorted_added) or self.sorted_added[at] > end:
                return None
        return super().visit(node)

    # where and whether a node counts
    def _index(self, lineno: int) -> int:
        return lineno - 1 + self.offset

    def _added(self, node) -> int | None:
        start = getattr(node, "lineno", None)
        if start is None:
            return None
        end = getattr(node, "end_lineno", start) or start
        for lineno in range(start, end + 1):
            index = self._index(lineno)
            if index in self.unit.added:
                return index
        return None

    def flag(self, rule: str, node, why: str) -> None:
        index = self._added(node)
        if index is None:
            return
        text = self.unit.lines[index].strip()[:160]
        self.found.append(
            Finding(
                rule, self.unit.path, f"{self.unit.path}:{self.unit.line_of(index)}: {text} ({why})"
            )
        )

    # names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        self._name(node, node.id)
        if (
            node.id in DYNAMIC_BUILTINS
            and isinstance(node.ctx, ast.Load)
            and node.id not in self.owned
        ):
            self.flag("dynamic_code", node, f"builtin {node.id}")
        if isinstance(node.ctx, ast.Store) and node.id in ("AssertionError", "__builtins__"):
            self.flag("builtins_patching", node, f"rebinds {node.id}")

    def _name(self, node, name: str, owner: str | None = None) -> None:
        qualified = owner.split(".")[-1] if owner else None
        if name in FRAME_ATTRS or name in FRAME_QUALIFIED.get(qualified or "", ()):
            self.flag("frame_introspection", node, name)
        elif name in DYNAMIC_ATTRS or name in DYNAMIC_QUALIFIED.get(qualified or "", ()):
            if not (qualified == "doctest" and self._under_main(node)):
                # (a module's doctests run as a script are no grade's business)
                self.flag("dynamic_code", node, f"{owner + '.' if owner else ''}{name}")
        elif name in GC_ATTRS or (qualified == "gc" and name == "callbacks"):
            self.flag("gc_walk", node, name)
        elif name in IMPORT_ATTRS:
            self.flag("import_machinery", node, name)
        elif name in NATIVE_NAMES:
            self.flag("native_code", node, name)
        elif name in EXIT_ATTRS or name in EXIT_QUALIFIED.get(qualified or "", ()):
            self.flag("exit_hooks", node, f"{owner + '.' if owner else ''}{name}")
        elif name in ("__builtins__", "__builtin__"):
            self.flag("builtins_patching", node, name)
        elif qualified in BUILTINS and name in DYNAMIC_BUILTINS:
            self.flag("dynamic_code", node, f"{owner}.{name}")

    def _under_main(self, node) -> bool:
        """Inside ``if __name__ == "__main__":`` (runs as a script only)."""
        while node in self.parents:
            node = self.parents[node]
            test = getattr(node, "test", None)
            if (
                isinstance(node, ast.If)
                and isinstance(test, ast.Compare)
                and _dotted(test.left) == "__name__"
                and any(_fold(c) == "__main__" for c in test.comparators)
            ):
                return True
        return False

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._name(node, node.attr, _module(node.value))
        if (
            node.attr == "modules"
            and _dotted(node) == "sys.modules"
            and not _plain_module_read(node, self.parents)
        ):
            # Every module of the process (the runner's among them) by a
            # name the source does not spell, or all of them in turn.
            self.flag("import_machinery", node, "walks sys.modules or reads it by a computed name")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in SENSITIVE_STRINGS:
            self.flag(SENSITIVE_STRINGS[node.value], node, f"names {node.value!r}")
        elif self.writes and isinstance(node.value, str) and node.value.endswith(PYTHON_SUFFIXES):
            # Code that writes files and names Python files: source written
            # (or tests rewritten) at run time is code the diff does not show.
            self.flag("dynamic_code", node, f"writes files and names {node.value!r}")

    def _folded(self, node) -> None:
        value = _fold(node)
        if value is None:
            return
        if value in SENSITIVE_STRINGS:
            self.flag(SENSITIVE_STRINGS[value], node, f"builds the name {value!r}")
        elif not _literal(node) and RUNNER_NAME.search(value):
            self.flag("import_machinery", node, f"builds the runner's name {value!r}")

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self._folded(node)
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._folded(node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._folded(node)
        # vars(builtins)["eval"], builtins.__dict__["exec"], sys.__dict__["_getframe"]
        holder = _namespace_of(node.value)
        key = _fold(node.slice)
        if holder and key:
            self._name(node, key, holder)
        self.generic_visit(node)

    # imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in IMPORT_RULE:
                self.flag(IMPORT_RULE[top], node, f"imports {alias.name}")
            if top in ("builtins", "__builtin__") and alias.asname:
                self.flag("builtins_patching", node, f"imports builtins as {alias.asname}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        top = module.split(".")[0]
        if top in IMPORT_RULE:
            self.flag(IMPORT_RULE[top], node, f"imports from {module}")
            return
        for alias in node.names:
            self._name(node, alias.name, module or None)
            if top in BUILTINS and alias.name in DYNAMIC_BUILTINS:
                self.flag("dynamic_code", node, f"imports {alias.name} from builtins")

    # calls
    def visit_Call(self, node: ast.Call) -> None:
        self._folded(node)
        callee = _dotted(node.func)
        if callee in ("__import__", "importlib.__import__"):
            self.flag("import_machinery", node, "__import__()")
        if (
            callee in ("importlib.import_module", "import_module", "importlib.reload", "reload")
            and node.args
            and (not _literal(node.args[0]) or callee.endswith("reload"))
        ):
            # An honest import names its module; one assembled, even from
            # constants, hides which.
            self.flag("import_machinery", node, f"{callee}() of a computed name")
        name = node.func.attr if isinstance(node.func, ast.Attribute) else callee
        if name in ATTR_CALLS and len(node.args) >= 2:
            self._attr_call(node, name, node.args[0], node.args[1])
        elif name == "__setattr__" or name == "__delattr__":
            args = node.args
            if isinstance(node.func, ast.Attribute) and _dotted(node.func.value) in (
                "object",
                "type",
                "super",
            ):
                if len(args) >= 2:
                    self._attr_call(node, "setattr", args[0], args[1])
            elif isinstance(node.func, ast.Attribute):
                if args:
                    self._attr_call(node, "setattr", node.func.value, args[0])
            elif len(args) >= 2:
                # a bare name bound to object.__setattr__ (or the like): (target, name, ...)
                self._attr_call(node, "setattr", args[0], args[1])
        elif name == "attrgetter":
            for arg in node.args:
                self._folded(arg)
        # mutating sys.modules, builtins' or another namespace's dict
        if any(_is_modules(arg) for arg in node.args) and name not in (
            "len",
            "list",
            "dict",
            "sorted",
            "iter",
        ):
            # handed to something that may write it (operator.setitem, dict.update)
            self.flag("import_machinery", node, f"passes sys.modules to {name}()")
        if isinstance(node.func, ast.Attribute) and node.func.attr in MODULES_WRITES:
            target = node.func.value
            if _is_modules(target):
                self.flag("import_machinery", node, f"sys.modules.{node.func.attr}()")
            else:
                holder = _namespace_of(target)
                if holder:
                    self._write(node, holder, None, f"{holder} namespace .{node.func.attr}()")
        self.generic_visit(node)

    def _attr_call(self, node, name: str, target, key) -> None:
        value = _fold(key)
        owner = _module(target)
        if value is not None:
            self._name(node, value, owner)
        elif _decoded(key):
            self.flag("dynamic_code", node, f"{name}() of a name decoded at run time")
        elif owner and owner.split(".")[0] in MODULE_RULE:
            self.flag(
                MODULE_RULE[owner.split(".")[0]],
                node,
                f"{name}() of a computed attribute of {owner}",
            )
        if name in ("setattr", "delattr"):
            self._store(node, target, value)

    # writes
    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(node, target)
        if _is_modules(node.value):
            self.flag("import_machinery", node, "aliases sys.modules")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node, node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._target(node, node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._target(node, target)
        self.generic_visit(node)

    def _target(self, node, target) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(node, element)
        elif isinstance(target, ast.Starred):
            self._target(node, target.value)
        elif isinstance(target, ast.Attribute):
            self._store(node, target.value, target.attr)
        elif isinstance(target, ast.Subscript):
            if _is_modules(target.value):
                self.flag("import_machinery", node, "writes sys.modules")
                return
            holder = _namespace_of(target.value)
            if holder:
                self._write(node, holder, _fold(target.slice), f"{holder} namespace item")

    def _store(self, node, target, attr: str | None) -> None:
        """``target.attr = ...`` (attr None: a computed name)."""
        owner = _module(target)
        if owner and owner.split(".")[0] in BUILTINS:
            self.flag("builtins_patching", node, f"writes {owner}.{attr or '<computed>'}")
            return
        if owner in ("sys.modules",) or (attr == "modules" and owner == "sys"):
            self.flag("import_machinery", node, "writes sys.modules")
            return
        if attr and attr.startswith("assert") and not _owned(target, self.owned):
            self.flag("builtins_patching", node, f"patches an assertion ({attr})")
            return
        if attr == "AssertionError":
            self.flag("builtins_patching", node, "patches AssertionError")
            return
        self._write(node, owner, attr, None, target)

    def _write(
        self, node, owner: str | None, attr: str | None, why: str | None, target=None
    ) -> None:
        top = owner.split(".")[0] if owner else None
        if top in BUILTINS:
            self.flag("builtins_patching", node, why or f"writes {owner}")
            return
        if top in PATCHED_MODULES and (
            target is None or isinstance(target, (ast.Name, ast.Attribute))
        ):
            if not (owner == "sys" and attr in ("stdout", "stderr", "stdin")):
                self.flag(
                    "foreign_attribute_write",
                    node,
                    why or f"rebinds {owner}.{attr or '<computed>'}",
                )
            return
        if why is not None:
            # a namespace's dict written through (vars(x)[k], x.__dict__[k])
            if not _owned_holder(why, self.owned):
                self.flag("foreign_attribute_write", node, why)
            return
        if attr in CODE_DUNDERS:
            self.flag("foreign_attribute_write", node, f"sets {attr}")
        elif attr in ("__dict__", "__class__") and not _owned(target, OWNER_NAMES):
            self.flag("foreign_attribute_write", node, f"sets {attr}")
        elif (attr is None or (attr.startswith("__") and attr.endswith("__"))) and not _owned(
            target, self.owned
        ):
            self.flag(
                "foreign_attribute_write",
                node,
                f"sets {attr or 'a computed attribute'} on something the file does not own",
            )


def _plain_module_read(node, parents) -> bool:
    """``sys.modules[__name__]``, ``sys.modules["json"]``, ``.get("json")``,
    ``"json" in sys.modules``: one module the source names."""
    parent = parents.get(node)

    def named(key) -> bool:
        return _literal(key) or (isinstance(key, ast.Name) and key.id == "__name__")

    if isinstance(parent, ast.Subscript) and parent.value is node:
        return named(parent.slice)
    if isinstance(parent, ast.Attribute) and parent.attr == "get":
        call = parents.get(parent)
        return (
            isinstance(call, ast.Call)
            and call.func is parent
            and bool(call.args)
            and named(call.args[0])
        )
    if isinstance(parent, ast.Compare) and node in parent.comparators:
        return all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
    return False


def _writes_files(tree) -> bool:
    """Whether the code opens a file for writing or writes one whole."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = _dotted(node.func) or ""
        name = callee.rsplit(".", 1)[-1]
        if name in FILE_WRITERS:
            return True
        if name == "open":
            modes = node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
            if any(
                isinstance(m, ast.Constant)
                and isinstance(m.value, str)
                and set(m.value) & set("wax+")
                for m in modes
            ):
                return True
    return False


def _owned(target, owned: Set[str]) -> bool:
    """``self``/``cls`` or a name the file defines (``Code``, ``Code.__new__``)."""
    while isinstance(target, ast.Attribute):
        target = target.value
    return isinstance(target, ast.Name) and (target.id in OWNER_NAMES or target.id in owned)


def _namespace_of(node) -> str | None:
    """The object whose attribute namespace ``node`` is: ``vars(x)``,
    ``x.__dict__``, ``globals()`` (the file's own: not foreign)."""
    if isinstance(node, ast.Call) and _dotted(node.func) == "vars" and len(node.args) == 1:
        return _module(node.args[0]) or "<expr>"
    if isinstance(node, ast.Attribute) and node.attr in ("__dict__", "__globals__"):
        # (a function's __globals__ is its module's namespace)
        return _module(node.value) or "<expr>"
    return None


def _owned_holder(why: str, owned: set[str]) -> bool:
    name = why.split(" ", 1)[0]
    return name.split(".")[0] in OWNER_NAMES or name in owned
