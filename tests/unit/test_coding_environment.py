"""CodingEnvironment's configuration and schemas (no helper needed)."""

import jsonschema
import pytest

from camg.environment import ServiceContext
from camg.errors import ConfigError, Unavailable
from environments.coding.environment import ACTION_SCHEMA, INSTRUCTIONS, CodingEnvironment, Settings
from camg import typed

GOOD = {"mirrors_root": "/srv/mirrors", "images": "/srv/materialized-images.json"}


def test_settings_parse_strictly():
    s = typed.parse(Settings, GOOD, "coding.settings", ConfigError)
    assert s.command_timeout == 60.0 and s.output_bytes == 12000 and s.max_steps == 64
    assert s.max_command_chars == 16000
    for bad, message in (({**GOOD, "surprise": 1}, "unknown field"),
                         ({**GOOD, "mirrors_root": "rel"}, "absolute"),
                         ({**GOOD, "command_timeout": 0}, "positive"),
                         ({**GOOD, "max_steps": "64"}, "integer"),
                         ({"images": "/x"}, "mirrors_root: required")):
        with pytest.raises(ConfigError, match=message):
            typed.parse(Settings, bad, "coding.settings", ConfigError)


def test_constructor_rejects_bad_settings():
    with pytest.raises(ConfigError, match="coding.settings"):
        CodingEnvironment(ServiceContext("coding", "/tmp", {"nope": 1}), [])


def test_create_episode_before_start_is_refused():
    env = CodingEnvironment(ServiceContext("coding", "/tmp", GOOD), [])
    assert env.health() == ["not started"]
    with pytest.raises(Unavailable, match="not started"):
        env.create_episode(None, seed=None, episode_id="x")


@pytest.mark.parametrize("action,ok", [
    ({"operation": "shell", "command": "ls"}, True),
    ({"operation": "finish"}, True),
    ({"operation": "shell"}, False),
    ({"operation": "shell", "command": "x" * 16001}, False),
    ({"operation": "shell", "command": 3}, False),
    ({"operation": "rm"}, False),
    ({"operation": "finish", "extra": 1}, False),
])
def test_action_schema(action, ok):
    errors = list(jsonschema.Draft202012Validator(ACTION_SCHEMA).iter_errors(action))
    assert (not errors) is ok


def test_instructions_state_the_rules():
    text = INSTRUCTIONS.format(timeout=60.0, output=12000, steps=64)
    assert '{"operation":"finish"}' in text and "60 seconds" in text
    assert "12000 bytes" in text and "64 steps" in text and "/testbed" in text
