"""Strict parsing of JSON mappings into frozen dataclasses.

Used for every configuration object and wire message: unknown fields are
rejected, types are checked (no silent coercion of "5" to 5 or of true to
1), and the error names the exact path of the bad field.

A leaf: it imports nothing of camg, because the root helper uses it (through
camg.helper_wire). Callers name the error class to raise.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def parse(cls: type[T], data: Any, where: str, error: type[Exception]) -> T:
    """Build dataclass ``cls`` from ``data`` or raise ``error`` naming the field."""
    if type(data) is not dict and not isinstance(data, Mapping):  # the ABC check is the slow one
        raise error(f"{where or cls.__name__}: expected an object, got {type(data).__name__}")
    # The cache's signature wants Hashable arguments; a class is one.
    hints, fields = _shape(typing.cast(type, cls))
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise error(f"{where or cls.__name__}: unknown field(s) {', '.join(unknown)}")
    values = {}
    for name, field in fields.items():
        path = f"{where}.{name}" if where else name
        if name not in data:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise error(f"{path}: required field is missing")
            continue
        values[name] = _coerce(hints[name], data[name], path, error)
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise error(f"{where or cls.__name__}: {exc}") from None


@functools.cache
def _shape(cls: type) -> tuple[dict, dict]:
    # get_type_hints re-evaluates annotations on every call; the
    # shape of a dataclass never changes, and requests parse on a hot path.
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _origin_args(tp: Any) -> tuple[Any, tuple]:
    # get_origin/get_args walk the typing object on every call; a request's
    # fields (an action's every key and value included) ask them again each
    # time, on the hot path of every step.
    return typing.get_origin(tp), typing.get_args(tp)


def _coerce(tp: Any, value: Any, path: str, error: type[Exception]) -> Any:
    if tp is Any:
        return value
    if tp is str or tp is bool:
        if not isinstance(value, tp):
            raise error(f"{path}: expected {'a string' if tp is str else 'true or false'}")
        return value
    origin, args = _origin_args(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None) and value is None:
                return None
        problems = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, path, error)
            except error as exc:  # try the next member of the union
                problems.append(str(exc))
        raise error(problems[-1] if problems else f"{path}: must not be null")
    if origin is typing.Literal:
        if value not in args or isinstance(value, bool) != any(isinstance(a, bool) for a in args):
            raise error(f"{path}: must be one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        # tp is a type hint, so the dataclass here is the class, not an instance.
        return parse(typing.cast(type, tp), value, path, error)
    if origin in (tuple,) and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, list):
            raise error(f"{path}: expected a list")
        return tuple(_coerce(args[0], v, f"{path}[{i}]", error) for i, v in enumerate(value))
    if origin in (Mapping, dict, typing.Mapping) or tp is dict:
        if type(value) is not dict and not isinstance(value, Mapping):
            raise error(f"{path}: expected an object")
        if args:
            value = {
                _coerce(args[0], k, path, error): _coerce(args[1], v, f"{path}.{k}", error)
                for k, v in value.items()
            }
        # dict[...] stays a plain dict (wire payloads handed on as JSON);
        # Mapping[...] is frozen (configuration).
        return (
            dict(value) if (origin is dict or tp is dict) else types.MappingProxyType(dict(value))
        )
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(f"{path}: expected a number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"{path}: expected an integer")
        return value
    raise TypeError(f"camg.typed cannot parse {tp!r} at {path}")


def to_json(obj: Any) -> Any:
    """The JSON form of a parsed dataclass (inverse of ``parse``)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj
