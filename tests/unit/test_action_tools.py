"""/schema's "tools": every registered environment's action schema as
OpenAI function-calling tools, and tool calls back to the exact action."""

from __future__ import annotations

import json
import re

import fastjsonschema
import jsonschema
import pytest

from camg import plugins
from camg.web import action_tools
from camg.errors import ConfigError, InvalidAction
from camg_client.tool_calls import ToolCallError, ToolCalls
from devtools.harness.counter_env import ACTION_SCHEMA as COUNTER_SCHEMA

# A sample of every action of every environment; the test below fails when
# an environment gains an action (tool) that has no sample here.
SAMPLES = {
    "coding": [{"operation": "shell", "command": "git status"}, {"operation": "finish"}],
    "visual": [{"operation": "shell", "command": "ls dist"}, {"operation": "finish"}],
    "autoresearch": [{"operation": "shell", "command": "python train.py"},
                     {"operation": "background", "command": "python train.py"},
                     {"operation": "jobs"}, {"operation": "log", "job": 1},
                     {"operation": "submit"}],
    "general": [{"operation": "shell", "command": "ls"}, {"operation": "finish"},
                {"operation": "tool", "server": "crm", "name": "query",
                 "arguments": {"sql": "select 1"}},
                {"operation": "finish", "answer": "42"}],
    "shop": [{"action": "search[red mug]"}, {"action": "click[buy now]"}],
}


def schemas() -> dict:
    return {name: p.load_factory().action_schema for name, p in plugins.all_plugins().items()}


def split(action: dict, schema, env: str) -> tuple[str, dict]:
    """The tool call a model would make for ``action``."""
    tool = action_tools.ActionTools(schema, name=env)
    if tool.forms is not None:
        text = action[tool.forms["property"]]
        for name, form in tool.forms["tools"].items():
            before, after = form["template"].split("{}")
            if text.startswith(before) and text.endswith(after):
                return name, {form["parameter"]: text[len(before):len(text) - len(after)]}
        raise AssertionError(f"{text!r} is no form of {env}")
    if tool.key is None:
        return env, action
    return action[tool.key], {k: v for k, v in action.items() if k != tool.key}


def test_every_registered_environment_has_samples():
    assert set(schemas()) == set(SAMPLES)


@pytest.mark.parametrize("env", sorted(SAMPLES))
def test_tools_are_openai_functions_covering_every_action(env):
    schema = schemas()[env]
    tools = action_tools.tools(schema, name=env)
    names = [t["function"]["name"] for t in tools]
    assert len(set(names)) == len(names) and names
    for tool in tools:
        assert set(tool) == {"type", "function"} and tool["type"] == "function"
        function = tool["function"]
        assert set(function) == {"name", "description", "parameters"}
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", function["name"])
        assert isinstance(function["description"], str) and function["description"]
        parameters = function["parameters"]
        assert parameters["type"] == "object" and isinstance(parameters["properties"], dict)
        assert set(parameters["required"]) <= set(parameters["properties"])
        jsonschema.Draft202012Validator.check_schema(parameters)
    assert {split(a, schema, env)[0] for a in SAMPLES[env]} == set(names)


@pytest.mark.parametrize("env, sample", [(e, a) for e in sorted(SAMPLES) for a in SAMPLES[e]])
def test_a_sample_action_round_trips(env, sample):
    schema = schemas()[env]
    fastjsonschema.compile(dict(schema))(sample)  # the sample is one the service takes
    name, arguments = split(sample, schema, env)
    [tool] = [t for t in action_tools.tools(schema, name=env) if t["function"]["name"] == name]
    jsonschema.validate(arguments, tool["function"]["parameters"])
    assert action_tools.action(schema, name, json.dumps(arguments), name=env) == sample
    assert action_tools.action(schema, name, arguments, name=env) == sample


def test_an_if_then_on_the_discriminator_makes_a_parameter_required():
    [shell, finish] = action_tools.tools(schemas()["coding"], name="coding")
    assert shell["function"]["parameters"]["required"] == ["command"]
    assert finish["function"]["parameters"]["required"] == []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({}, shell["function"]["parameters"])


def test_branches_sharing_an_action_become_one_tool():
    tools = {t["function"]["name"]: t["function"] for t in
             action_tools.tools(schemas()["general"], name="general")}
    assert list(tools) == ["shell", "finish", "tool"]
    # finish takes an answer in general_agent tasks only: optional in the merge
    assert "answer" in tools["finish"]["parameters"]["properties"]
    assert tools["finish"]["parameters"]["required"] == []


def test_a_schema_without_discriminator_is_one_tool_named_for_the_environment():
    schema = {"type": "object", "required": ["action"], "additionalProperties": False,
              "properties": {"action": {"type": "string"}}}
    [tool] = action_tools.tools(schema, name="shop")
    assert tool["function"]["name"] == "shop"
    assert tool["function"]["parameters"]["required"] == ["action"]


def test_shops_forms_are_its_search_and_click_tools():
    schema = schemas()["shop"]
    tools = {t["function"]["name"]: t["function"] for t in action_tools.tools(schema, name="shop")}
    assert list(tools) == ["search", "click"]
    assert tools["search"]["parameters"]["required"] == ["query"]
    assert tools["click"]["parameters"]["required"] == ["text"]
    calls = ToolCalls({"action": schema, "tools": [{"type": "function", "function": f}
                                                   for f in tools.values()]})
    for call, action in [(("search", '{"query": "red mug"}'), {"action": "search[red mug]"}),
                         (("click", {"text": "< prev"}), {"action": "click[< prev]"})]:
        assert action_tools.action(schema, *call, name="shop") == calls.action(*call) == action
    for arguments in ({}, {"query": 3}, {"query": "mug", "page": 2}, {"action": "search[mug]"}):
        with pytest.raises(InvalidAction, match="takes one argument, 'query'"):
            action_tools.action(schema, "search", arguments, name="shop")
        with pytest.raises(ToolCallError):
            calls.action("search", arguments)
    with pytest.raises(InvalidAction, match="no tool named 'shop'"):
        action_tools.action(schema, "shop", {"action": "search[mug]"}, name="shop")
    # the service's own limits still hold: the action is checked against its schema
    with pytest.raises(InvalidAction, match="action.action must be shorter"):
        action_tools.action(schema, "search", {"query": "x" * 1000}, name="shop")


@pytest.mark.parametrize("forms, message", [
    ({"property": "colour", "tools": {"a": {"template": "a[{}]", "parameter": "p",
                                            "description": "d"}}}, "one required string"),
    ({"property": "action", "tools": {"a": {"template": "a[]", "parameter": "p",
                                            "description": "d"}}}, "template with one {}"),
    ({"property": "action", "tools": {"a b": {"template": "a[{}]", "parameter": "p",
                                              "description": "d"}}}, "cannot be a tool name"),
    ({"property": "action", "tools": {}}, "names no tools"),
])
def test_bad_forms_refuse_to_start(forms, message):
    schema = {"type": "object", "required": ["action"], "x-camg-tools": forms,
              "properties": {"action": {"type": "string"}}}
    with pytest.raises(ConfigError, match=re.escape(message)):
        action_tools.tools(schema, name="shop")


@pytest.mark.parametrize("name, arguments, message", [
    ("nope", "{}", "no tool named 'nope'"),
    ("guess", "{not json", "not valid JSON"),
    ("guess", "[1]", "must be a JSON object"),
    ("guess", '{"operation": "boom"}', "is the tool's name"),
    ("guess", '{"value": "seven"}', "action.value must be integer"),
    ("guess", '{"colour": 1}', "must not contain"),
    ("sleep", '{"seconds": 601}', "seconds must be smaller than or equal to 600"),
])
def test_bad_tool_calls_are_invalid_actions(name, arguments, message):
    with pytest.raises(InvalidAction, match=re.escape(message)):
        action_tools.action(COUNTER_SCHEMA, name, arguments, name="counter")


def test_empty_arguments_are_an_empty_object():
    assert action_tools.action(COUNTER_SCHEMA, "finish", "", name="counter") == \
        {"operation": "finish"}
    assert action_tools.action(COUNTER_SCHEMA, "finish", None, name="counter") == \
        {"operation": "finish"}


@pytest.mark.parametrize("schema, message", [
    ({"anyOf": [COUNTER_SCHEMA, {"type": "object", "properties": {"x": {}}}]},
     "same discriminator"),
    ({"oneOf": [{"type": "object"}, {"type": "object"}]}, "cannot be told apart"),
    ({"type": "object", "required": ["op"], "properties": {"op": {"enum": ["a b"]}}},
     "cannot be tool names"),
])
def test_schemas_that_cannot_be_tools_are_refused(schema, message):
    with pytest.raises(ConfigError, match=message):
        action_tools.tools(schema, name="x")
