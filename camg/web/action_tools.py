"""An environment's action schema as OpenAI function-calling tools, and back.

``/schema`` publishes ``tools(env.action_schema, name=env.name)`` beside the
action schema it is made from, so an LLM policy gets one tool per action
without a hand-written copy that could drift. An action schema is an
object, or a ``oneOf``/``anyOf`` of objects; where the objects carry a
discriminator (a required property whose ``const``/``enum`` are strings,
such as ``operation``) each of its values becomes a tool of that name, whose
parameters are the object's other properties, required as the object (and
an ``if``/``then`` on that value) requires them. A value several branches
share becomes one tool taking what any of them takes. Without a
discriminator the object is a single tool called ``name``, unless it names
the forms of its one string property as tools (``"x-camg-tools"``: Shop's
``search[…]`` and ``click[…]`` are tools ``search`` and ``click``, each
taking the text in the brackets).

``action(schema, tool_name, arguments)`` is the inverse: a model's tool call
becomes the action body ``POST /episodes/{id}/step`` takes, validated
against the action schema itself (the tools' parameters only describe it),
so what it returns is what the service would accept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import fastjsonschema

from camg.errors import ConfigError, InvalidAction
from camg_client.tool_calls import FORMS as _FORMS_KEY

# The pure mapping lives in the trainer client, so a trainer maps a call
# exactly as the service does without this library (the services' venv and
# wheel carry camg_client: pyproject.toml maps clients/python in).
from camg_client.tool_calls import ToolCallError, action_of
from camg_client.tool_calls import branches as _branches
from camg_client.tool_calls import discriminator as _discriminator
from camg_client.tool_calls import forms as _forms
from camg_client.tool_calls import values as _values

# OpenAI's rule for a function name.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ActionTools:
    """The tools of one action schema, and the way back from a call."""

    def __init__(self, action_schema: Mapping[str, Any], *, name: str) -> None:
        self.schema = dict(action_schema)
        self.forms = _forms(self.schema)
        self._validate = fastjsonschema.compile(self.schema)
        self.key: str | None = None
        if self.forms is not None:
            self.tools = _form_tools(self.schema, self.forms)
            return
        branches = _branches(self.schema)
        keys = {_discriminator(b) for b in branches}
        if len(keys) != 1:
            raise ConfigError(
                "action schema: every branch needs the same discriminator "
                f"to become tools, found {sorted(map(str, keys))}"
            )
        self.key = keys.pop()
        if self.key is None:
            if len(branches) != 1:
                raise ConfigError(
                    "action schema: branches without a discriminator cannot be told apart as tools"
                )
            parts = {name: [_parameters(branches[0], None, None)]}
            notes = {name: _describe(branches[0], self.schema, None)}
        else:
            parts, notes = {}, {}
            for branch in branches:
                for value in _values(branch["properties"][self.key]):
                    parts.setdefault(value, []).append(_parameters(branch, self.key, value))
                    notes.setdefault(value, []).extend(_describe(branch, self.schema, self.key))
        bad = [n for n in parts if not _TOOL_NAME.fullmatch(n)]
        if bad:
            raise ConfigError(
                f"action schema: {bad} cannot be tool names (OpenAI allows [A-Za-z0-9_-]{{1,64}})"
            )
        self.tools = [
            {
                "type": "function",
                "function": {
                    "name": tool,
                    "description": " ".join(dict.fromkeys(notes[tool])) or f"One {name} action.",
                    "parameters": _merge(parts[tool]),
                },
            }
            for tool in parts
        ]

    def action(self, tool_name: str, arguments: str | bytes | Mapping[str, Any] | None) -> dict:
        """The action a tool call stands for; InvalidAction when the call is
        not one the service would accept (unknown tool, arguments that are
        not a JSON object, an action outside the schema)."""
        names = [t["function"]["name"] for t in self.tools]
        try:
            action = action_of(tool_name, arguments, key=self.key, names=names, forms=self.forms)
        except ToolCallError as exc:
            raise InvalidAction(str(exc)) from None
        try:
            self._validate(action)
        except fastjsonschema.JsonSchemaValueException as exc:  # what a fast-fail validator raises
            raise InvalidAction(
                f"{tool_name}: " + exc.message.replace("data", "action", 1)
            ) from None
        return action


def tools(action_schema: Mapping[str, Any], *, name: str) -> list[dict]:
    """The OpenAI tools of ``action_schema``; ``name`` names the only tool of
    a schema without a discriminator."""
    return ActionTools(action_schema, name=name).tools


def action(action_schema: Mapping[str, Any], tool_name: str, arguments: Any, *, name: str) -> dict:
    """The validated action body of one tool call (see ``ActionTools.action``)."""
    return ActionTools(action_schema, name=name).action(tool_name, arguments)


def _form_tools(schema: Mapping[str, Any], forms: Mapping[str, Any]) -> list[dict]:
    """One tool per form of the string property ``forms`` names, taking the
    text its template's ``{}`` stands for."""
    prop = forms.get("property")
    if (schema.get("properties") or {}).get(prop, {}).get("type") != "string" or schema.get(
        "required"
    ) != [prop]:
        raise ConfigError(
            f"action schema: {_FORMS_KEY} needs the schema's one required "
            f"string property, not {prop!r}"
        )
    tools = []
    for tool, form in (forms.get("tools") or {}).items():
        template, parameter = form.get("template"), form.get("parameter")
        if (
            not isinstance(template, str)
            or template.count("{}") != 1
            or not isinstance(parameter, str)
            or not form.get("description")
        ):
            raise ConfigError(
                f"action schema: {_FORMS_KEY} {tool!r} needs a template with "
                "one {}, a parameter and a description"
            )
        if not _TOOL_NAME.fullmatch(tool):
            raise ConfigError(
                f"action schema: {tool!r} cannot be a tool name "
                "(OpenAI allows [A-Za-z0-9_-]{1,64})"
            )
        argument = {"type": "string", "minLength": 1}
        if form.get("parameter_description"):
            argument["description"] = form["parameter_description"]
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": tool,
                    "description": form["description"],
                    "parameters": {
                        "type": "object",
                        "properties": {parameter: argument},
                        "required": [parameter],
                        "additionalProperties": False,
                    },
                },
            }
        )
    if not tools:
        raise ConfigError(f"action schema: {_FORMS_KEY} names no tools")
    return tools


def _parameters(branch: Mapping[str, Any], key: str | None, value: str | None) -> dict:
    props = {k: v for k, v in (branch.get("properties") or {}).items() if k != key}
    required = [r for r in branch.get("required") or [] if r != key]
    conditions = [branch, *(branch.get("allOf") or [])]
    for cond in (c for c in conditions if "if" in c and key is not None):
        # Only an if on the discriminator alone is decided by the tool's name;
        # any other stays to the schema's own check in ActionTools.action.
        tested = (cond["if"].get("properties") or {}) if isinstance(cond["if"], Mapping) else {}
        if set(tested) != {key} or set(cond["if"]) - {"properties", "required"}:
            continue
        clause = cond.get("then") if value in _values(tested[key]) else cond.get("else")
        required += (clause or {}).get("required") or []
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": props,
        "required": list(dict.fromkeys(r for r in required if r in props)),
    }
    if branch.get("additionalProperties") is False:
        parameters["additionalProperties"] = False
    return parameters


def _merge(parts: list[dict]) -> dict:
    """One tool's parameters from the branches sharing its name: what any of
    them takes, and required only what all of them require."""
    if len(parts) == 1:
        return parts[0]
    options: dict[str, dict] = {}
    for part in parts:
        for prop, sub in part["properties"].items():
            # Subschemas that differ only in their description are one
            # (General's command starts in the repository or the workspace).
            shape = {k: v for k, v in sub.items() if k != "description"}
            known = options.setdefault(prop, {})
            texts = known.setdefault(json.dumps(shape, sort_keys=True), (shape, []))[1]
            if sub.get("description") and sub["description"] not in texts:
                texts.append(sub["description"])
    props = {}
    for prop, known in options.items():
        subs = [
            {**shape, "description": " / ".join(texts)} if texts else shape
            for shape, texts in known.values()
        ]
        props[prop] = subs[0] if len(subs) == 1 else {"anyOf": subs}
    required = [r for r in parts[0]["required"] if all(r in p["required"] for p in parts)]
    merged: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if all(p.get("additionalProperties") is False for p in parts):
        merged["additionalProperties"] = False
    return merged


def _describe(branch: Mapping[str, Any], schema: Mapping[str, Any], key: str | None) -> list[str]:
    """The texts a tool's description is made of, most specific first."""
    texts = [(branch["properties"][key].get("description") or "") if key else ""]
    for where in (branch, schema) if branch is not schema else (schema,):
        texts += [str(where.get("title") or ""), str(where.get("description") or "")]
    return [t.strip() for t in texts if t and t.strip()]
