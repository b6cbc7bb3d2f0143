"""A model's tool call back to the action it stands for: the pure half of
camg/web/action_tools.py, here so a trainer (``--policy openai``, the framework
adapters) maps calls exactly as the service does without its library.

``/schema`` publishes each action as an OpenAI function tool ("tools") beside
the action schema. Where the schema's branches share a discriminator (a
required property whose ``const``/``enum`` are strings, such as
``operation``) each value is a tool of that name taking the other
properties; without one the schema is a single tool taking the action
itself, unless the schema names its tools in ``"x-camg-tools"`` (Shop: one
string whose forms ``search[…]``/``click[…]`` are the tools, each taking
the text in its brackets; see ``forms``).
``ToolCalls(schema_body).action(name, arguments)`` is the inverse;
the service (camg/web/action_tools.py) adds the action schema's own check on
top, and ``POST /step`` checks again, so nothing here needs a validator.

Standard library only: the client core imports no third-party package.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ToolCallError(ValueError):
    """A tool call that stands for no action (unknown tool, arguments that
    are not a JSON object, the discriminator passed as an argument); the
    service raises it as invalid_action."""


def branches(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    for union in ("oneOf", "anyOf"):
        if union in schema:
            return list(schema[union])
    return [schema]


def values(prop: Mapping[str, Any]) -> list[str]:
    found = [prop["const"]] if "const" in prop else list(prop.get("enum") or [])
    return found if found and all(isinstance(v, str) for v in found) else []


def discriminator(branch: Mapping[str, Any]) -> str | None:
    props = branch.get("properties") or {}
    for key in branch.get("required") or []:
        if values(props.get(key) or {}):
            return key
    return None


# The annotation by which an action schema of one string property names
# the string's forms as tools: {"property": "action", "tools": {"search":
# {"template": "search[{}]", "parameter": "query", "description": ...}}}.
FORMS = "x-camg-tools"


def forms(schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The schema's string forms as tools (``FORMS``), or None."""
    found = schema.get(FORMS)
    return found if isinstance(found, Mapping) else None


def action_of(
    tool_name: str,
    arguments: str | bytes | Mapping[str, Any] | None,
    *,
    key: str | None,
    names: list[str],
    forms: Mapping[str, Any] | None = None,
) -> dict:
    """The action body of one call to ``tool_name`` among ``names``, whose
    schema's discriminator is ``key`` (None: the single tool takes the
    action itself) or whose tools are the string ``forms`` of one property."""
    if tool_name not in names:
        raise ToolCallError(f"no tool named {tool_name!r} (tools: {', '.join(names)})")
    if isinstance(arguments, (str, bytes)):
        # Models send "" for a tool without parameters.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise ToolCallError(f"{tool_name}: arguments are not valid JSON: {exc}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise ToolCallError(
            f"{tool_name}: arguments must be a JSON object, got {type(arguments).__name__}"
        )
    if forms is not None:
        form = forms["tools"][tool_name]
        parameter = form["parameter"]
        value = arguments.get(parameter)
        if set(arguments) != {parameter} or not isinstance(value, str):
            raise ToolCallError(f"{tool_name}: takes one argument, {parameter!r}, a string")
        return {forms["property"]: form["template"].format(value)}
    if key is None:
        return dict(arguments)
    if key in arguments:
        raise ToolCallError(f"{tool_name}: {key!r} is the tool's name, not one of its arguments")
    return {key: tool_name, **arguments}


class ToolCalls:
    """The tools of one service's ``/schema`` body and the way back."""

    def __init__(self, schema_body: Mapping[str, Any]) -> None:
        self.tools: list[dict] = list(schema_body.get("tools") or [])
        self.names = [t["function"]["name"] for t in self.tools]
        schema = schema_body.get("action") or {}
        self.forms = forms(schema)
        keys = {discriminator(b) for b in branches(schema)}
        # The service refuses to publish tools for a schema whose branches
        # disagree (ConfigError at start): one key, or none.
        self.key = keys.pop() if len(keys) == 1 else None

    def action(self, tool_name: str, arguments: Any) -> dict:
        return action_of(tool_name, arguments, key=self.key, names=self.names, forms=self.forms)
