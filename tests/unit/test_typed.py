import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import pytest

from camg.errors import BadRequest, ConfigError
from camg.typed import parse, to_json


@dataclasses.dataclass(frozen=True)
class Inner:
    n: int = 1


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str
    ratio: float = 0.5
    mode: Literal["a", "b"] = "a"
    inner: Inner = Inner()
    tags: tuple[str, ...] = ()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    maybe: int | None = None


def test_round_trip():
    obj = parse(Outer, {"name": "x", "ratio": 2, "inner": {"n": 3}, "tags": ["a"], "extra": {"k": [1]}},
                "", ConfigError)
    assert obj.ratio == 2.0 and obj.inner.n == 3 and obj.tags == ("a",)
    assert to_json(obj)["extra"] == {"k": [1]}
    with pytest.raises(TypeError):
        obj.extra["new"] = 1  # configuration is frozen all the way down


@pytest.mark.parametrize("data, fragment", [
    ({}, "name: required"),
    ({"name": "x", "bogus": 1}, "unknown field(s) bogus"),
    ({"name": 5}, "name: expected a string"),
    ({"name": "x", "ratio": True}, "ratio: expected a number"),
    ({"name": "x", "inner": {"n": "5"}}, "inner.n: expected an integer"),
    ({"name": "x", "inner": {"n": 1, "z": 0}}, "inner: unknown field(s) z"),
    ({"name": "x", "mode": "c"}, "mode: must be one of"),
    ({"name": "x", "tags": "ab"}, "tags: expected a list"),
    ({"name": "x", "maybe": 1.5}, "maybe: expected an integer"),
    ([], "expected an object"),
])
def test_rejections_name_the_field(data, fragment):
    with pytest.raises(ConfigError) as info:
        parse(Outer, data, "", ConfigError)
    assert fragment in str(info.value)


def test_error_class_is_selectable():
    with pytest.raises(BadRequest):
        parse(Outer, {"name": 1}, "body", BadRequest)
