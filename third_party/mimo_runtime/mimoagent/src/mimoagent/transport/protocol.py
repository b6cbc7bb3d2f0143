"""The transport's action, observation and state types, on the stdlib alone.

A General container serves one episode, and its resident transport process
is most of the container's memory: with openenv's server (FastAPI, pydantic,
uvicorn) imported it held about 170 MiB for one episode. These classes keep
the shapes openenv gives the same types -- what the service reads off the
wire (openenv's ``serialize_observation``: ``{"observation": fields,
"reward", "done"}``; ``state``: ``{"episode_id", "step_count"}``) and how an
invalid action is refused (a ValueError listing pydantic-style errors:
``type``, ``loc``, ``msg``) -- without importing any of it.

An action class declares its fields as ``FIELDS = {name: Spec(...)}``;
unknown fields, wrong types, values outside a literal set and strings past
their ``max_length`` are refused at construction, as pydantic's
``extra="forbid"`` models of openenv did.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar


class ActionInvalid(ValueError):
    """An action that does not match its class; ``errors()`` as pydantic gives them."""

    def __init__(self, problems: list[dict]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems))
        self._problems = problems

    def errors(self) -> list[dict]:
        return list(self._problems)


@dataclasses.dataclass(frozen=True)
class Spec:
    kind: type  # str or dict
    default: Any = ""
    max_length: int | None = None
    choices: tuple[str, ...] | None = None  # a Literal's values; no default: required
    description: str = ""


_KIND_ERROR = {str: ("string_type", "Input should be a valid string"),
               dict: ("dict_type", "Input should be a valid dictionary")}


class Action:
    FIELDS: ClassVar[dict[str, Spec]] = {}

    def __init__(self, **values: Any) -> None:
        problems = []
        fields = {**self.FIELDS, "metadata": Spec(dict, None)}  # openenv's Action has metadata
        for name in values:
            if name not in fields:
                problems.append({"type": "extra_forbidden", "loc": [name],
                                 "msg": "Extra inputs are not permitted"})
        for name, spec in fields.items():
            if name not in values:
                if spec.choices is not None and spec.default is None:
                    problems.append({"type": "missing", "loc": [name], "msg": "Field required"})
                value = copy.copy(spec.default) if spec.default is not None else (
                    {} if spec.kind is dict else None)
                setattr(self, name, value)
                continue
            value = values[name]
            if not isinstance(value, spec.kind):
                kind, msg = _KIND_ERROR[spec.kind]
                problems.append({"type": kind, "loc": [name], "msg": msg})
            elif spec.choices is not None and value not in spec.choices:
                problems.append({"type": "literal_error", "loc": [name],
                                 "msg": "Input should be " + " or ".join(repr(c) for c in spec.choices)})
            elif spec.max_length is not None and len(value) > spec.max_length:
                problems.append({"type": "string_too_long", "loc": [name],
                                 "msg": f"String should have at most {spec.max_length} characters"})
            setattr(self, name, value)
        if problems:
            raise ActionInvalid(problems)


class Observation:
    """Declared ``FIELDS`` (name -> default) plus openenv's reward, done, metadata."""

    FIELDS: ClassVar[dict[str, Any]] = {}

    def __init__(self, *, reward: float | None = None, done: bool = False,
                 metadata: dict | None = None, **values: Any) -> None:
        unknown = set(values) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)}")
        for name, default in self.FIELDS.items():
            setattr(self, name, values.get(name, default))
        self.reward, self.done, self.metadata = reward, done, dict(metadata or {})

    def serialize(self) -> dict:
        """openenv's serialize_observation: reward, done and metadata outside."""
        return {"observation": {name: getattr(self, name) for name in self.FIELDS},
                "reward": self.reward, "done": self.done}


@dataclasses.dataclass
class State:
    episode_id: str | None = None
    step_count: int = 0

    def model_dump(self) -> dict:
        return dataclasses.asdict(self)


class Environment:
    """What the server needs of an environment: reset, step, state, close."""

    def close(self) -> None:
        pass
