"""Procedural bugs, made the way SWE-smith's procedural modifiers make them.

Each modifier finds candidate sites inside functions with Python's ``ast``
and changes exactly one of them. The edit is spliced into the original text
by source position (rather than re-unparsing the whole function as SWE-smith
does) so comments and formatting elsewhere survive and the diff stays small.
Names follow SWE-smith's (``func_pm_op_swap`` ...), because the modifier name
is part of a task's instance_id.
"""

from __future__ import annotations

import ast
import dataclasses
import random
from collections.abc import Callable, Iterator

_FLIP = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
# Two tables, one per operator kind: a BinOp takes an ast.operator, a BoolOp an ast.boolop.
_CHANGE_OP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
_CHANGE_BOOL: dict[type[ast.boolop], type[ast.boolop]] = {
    ast.And: ast.Or,
    ast.Or: ast.And,
}


@dataclasses.dataclass(frozen=True)
class Mutation:
    modifier: str  # SWE-smith modifier name
    path: str  # file, relative to the repository
    function: str  # qualified name of the enclosing function
    line: int
    source: str  # the whole file after the change


@dataclasses.dataclass(frozen=True)
class _Edit:
    start: tuple[int, int]  # (line, col) 1-based line, 0-based col
    end: tuple[int, int]
    text: str


def mutations(path: str, source: str, rng: random.Random) -> Iterator[Mutation]:
    """Every single-site mutation of ``source``, in an ``rng``-shuffled order."""
    tree = ast.parse(source)
    found: list[tuple[str, str, int, _Edit]] = []
    for func, qualname in _functions(tree):
        for name, finder in MODIFIERS.items():
            for edit, line in finder(func, source):
                found.append((name, qualname, line, edit))
    rng.shuffle(found)
    for name, qualname, line, edit in found:
        new = _splice(source, edit)
        if new == source:
            continue
        try:
            ast.parse(new)
        except SyntaxError:
            continue
        yield Mutation(name, path, qualname, line, new)


def _functions(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[ast.AST, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child, prefix + child.name
                yield from walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")

    yield from walk(tree, "")


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """Nodes of ``func`` without descending into nested functions/classes."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _end_line(node: ast.expr | ast.stmt) -> int:
    """The last line of a parsed node."""
    assert node.end_lineno is not None  # ast.parse sets it on every expr and stmt
    return node.end_lineno


def _expr_edit(node: ast.expr, replacement: ast.expr) -> _Edit:
    assert node.end_col_offset is not None  # a parsed node: ast.parse sets it
    text = ast.unparse(replacement)
    if node.lineno != node.end_lineno:
        text = f"({text})"
    return _Edit((node.lineno, node.col_offset), (_end_line(node), node.end_col_offset), text)


def _op_swap(func, source):
    for node in _own_nodes(func):
        if isinstance(node, ast.BinOp) and ast.dump(node.left) != ast.dump(node.right):
            yield _expr_edit(node, ast.BinOp(node.right, node.op, node.left)), node.lineno
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Lt, ast.Gt, ast.LtE, ast.GtE))
        ):
            yield (
                _expr_edit(node, ast.Compare(node.comparators[0], node.ops, [node.left])),
                node.lineno,
            )


def _op_change(func, source):
    for node in _own_nodes(func):
        if isinstance(node, ast.BinOp) and type(node.op) in _CHANGE_OP:
            new = ast.BinOp(node.left, _CHANGE_OP[type(node.op)](), node.right)
            yield _expr_edit(node, new), node.lineno
        elif isinstance(node, ast.BoolOp) and type(node.op) in _CHANGE_BOOL:
            yield (
                _expr_edit(node, ast.BoolOp(_CHANGE_BOOL[type(node.op)](), node.values)),
                node.lineno,
            )


def _op_flip(func, source):
    for node in _own_nodes(func):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            new = ast.Compare(node.left, [_FLIP[type(node.ops[0])]()], node.comparators)
            yield _expr_edit(node, new), node.lineno


def _change_const(func, source):
    for node in _own_nodes(func):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            yield _expr_edit(node, ast.Constant(node.value + 1)), node.lineno
            if node.value > 0:
                yield _expr_edit(node, ast.Constant(node.value - 1)), node.lineno


def _statement_blocks(func) -> Iterator[list[ast.stmt]]:
    yield func.body
    for node in _own_nodes(func):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _lines(source: str) -> list[str]:
    return source.splitlines(keepends=True)


def _remove_cond(func, source):
    lines = _lines(source)
    for block in _statement_blocks(func):
        for stmt in block:
            if (
                isinstance(stmt, ast.If)
                and not stmt.orelse
                and len(block) > 1
                and _whole_lines(stmt, lines)
            ):
                yield _Edit((stmt.lineno, 0), (_end_line(stmt) + 1, 0), ""), stmt.lineno


def _remove_assign(func, source):
    lines = _lines(source)
    for block in _statement_blocks(func):
        for stmt in block:
            if (
                isinstance(stmt, (ast.Assign, ast.AugAssign))
                and len(block) > 1
                and _whole_lines(stmt, lines)
            ):
                yield _Edit((stmt.lineno, 0), (_end_line(stmt) + 1, 0), ""), stmt.lineno


def _ctrl_shuffle(func, source):
    """Swap two adjacent statements of one block (SWE-smith shuffles a block)."""
    lines = _lines(source)
    for block in _statement_blocks(func):
        for first, second in zip(block, block[1:], strict=False):
            if not (_whole_lines(first, lines) and _whole_lines(second, lines)):
                continue
            if (
                second.lineno != _end_line(first) + 1
                or isinstance(first, ast.Return)
                or isinstance(second, ast.Return)
            ):
                continue
            a = "".join(lines[first.lineno - 1 : first.end_lineno])
            b = "".join(lines[second.lineno - 1 : second.end_lineno])
            if a.strip() == b.strip():
                continue
            yield _Edit((first.lineno, 0), (_end_line(second) + 1, 0), b + a), first.lineno


def _invert_if(func, source):
    lines = _lines(source)
    for node in _own_nodes(func):
        if (
            isinstance(node, ast.If)
            and node.orelse
            and not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If))
            and _whole_lines(node, lines)
        ):
            new = ast.If(ast.UnaryOp(ast.Not(), node.test), node.body, node.orelse)
            # Keep the bodies' text: only the test is negated.
            yield _expr_edit(node.test, new.test), node.lineno


def _whole_lines(stmt: ast.stmt, lines: list[str]) -> bool:
    """The statement owns its lines alone (no `a; b`, no trailing code)."""
    first = lines[stmt.lineno - 1]
    last = lines[_end_line(stmt) - 1]
    return first[: stmt.col_offset].strip() == "" and last[stmt.end_col_offset :].strip() in (
        "",
        "\\",
    )


def _splice(source: str, edit: _Edit) -> str:
    lines = _lines(source)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    offsets.append(offsets[-1])

    def pos(line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets.
        text = lines[line - 1] if line - 1 < len(lines) else ""
        return offsets[line - 1] + len(text.encode()[:col].decode("utf-8", "replace"))

    start, end = pos(*edit.start), pos(*edit.end)
    return source[:start] + edit.text + source[end:]


MODIFIERS: dict[str, Callable] = {
    "func_pm_op_swap": _op_swap,
    "func_pm_op_change": _op_change,
    "func_pm_op_flip": _op_flip,
    "func_pm_op_change_const": _change_const,
    "func_pm_remove_cond": _remove_cond,
    "func_pm_remove_assign": _remove_assign,
    "func_pm_ctrl_shuffle": _ctrl_shuffle,
    "func_pm_ctrl_invert_if": _invert_if,
}
