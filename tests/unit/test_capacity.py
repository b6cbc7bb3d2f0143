"""Default capacities derived from the host (camg.plugins.default_capacity),
the admission line's default bound, and the demo deployment's room for a
GRPO group of 8 on every environment."""

from __future__ import annotations

import json

import pytest

from camg import helper_wire, plugins
from camg.episodes import admission
from tests.support.services import configure_counter

GiB = 1 << 30
MiB = 1 << 20
GROUP = 8


def toy(**fields) -> plugins.EnvironmentPlugin:
    return plugins.EnvironmentPlugin(name="toy", port=65000, factory="a:B", prepare="a:c",
                                     prepare_hint="-", settings="a:S", **fields)


def test_memory_bound():
    # 24 GiB, half of it for episodes of 1 GiB each: 12, though 2 cores allow 256
    host = plugins.Host(cores=2, memory_bytes=24 * GiB)
    assert plugins.default_capacity(toy(episode_peak_bytes=GiB), host) == 12
    # below one episode's worth the service still takes one
    assert plugins.default_capacity(toy(episode_peak_bytes=64 * GiB), host) == 1


def test_core_bound():
    host = plugins.Host(cores=1, memory_bytes=1 << 40)
    assert plugins.default_capacity(toy(episode_peak_bytes=MiB), host) \
        == plugins.EPISODES_PER_CORE == 128


def test_helper_and_cap_bound_and_no_memory_bound_without_a_measured_peak():
    roomy = plugins.Host(cores=64, memory_bytes=1 << 40)
    assert plugins.default_capacity(toy(), roomy) == plugins.MAX_DEFAULT_CAPACITY
    assert plugins.default_capacity(toy(sandboxes_per_episode=4), roomy) \
        == helper_wire.SANDBOXES_PER_PEER // 4
    small = plugins.Host(cores=64, memory_bytes=GiB)
    assert plugins.default_capacity(toy(), small) == plugins.MAX_DEFAULT_CAPACITY


def test_a_peak_must_be_positive():
    with pytest.raises(ValueError):
        toy(episode_peak_bytes=0)


def test_explicit_capacity_wins_and_the_queue_bound_is_recorded(tmp_path):
    config = json.loads(configure_counter(tmp_path / "a", capacity=3).read_text())
    assert config["capacity"] == 3 and config["queue_bound"] == 3 * admission.QUEUE_PER_SLOT
    derived = json.loads(configure_counter(tmp_path / "b", capacity=None).read_text())
    assert derived["capacity"] == plugins.default_capacity(None)


def test_general_and_visual_are_bounded_by_their_measured_peaks():
    host = plugins.Host(cores=2, memory_bytes=24 * GiB)
    installed = plugins.all_plugins()
    # 12 GiB over 140 MiB and 200 MiB
    assert plugins.default_capacity(installed["general"], host) == 87
    assert plugins.default_capacity(installed["visual"], host) == 61
    # Shop's sessions live in the service's process: kilobytes each
    assert plugins.default_capacity(installed["shop"], host) == plugins.MAX_CAPACITY == 4096


def test_in_process_sessions_are_bound_by_cores_memory_and_the_maximum():
    one_core = plugins.Host(cores=1, memory_bytes=1 << 40)
    assert plugins.default_capacity(toy(substrate="process"), one_core) \
        == plugins.PROCESS_SESSIONS_PER_CORE == 2048
    roomy = plugins.Host(cores=64, memory_bytes=1 << 40)
    assert plugins.default_capacity(toy(substrate="process"), roomy) == plugins.MAX_CAPACITY
    # no helper sandbox, so the helper's per-peer ceiling does not bound it
    assert plugins.MAX_CAPACITY > helper_wire.SANDBOXES_PER_PEER
    tight = plugins.Host(cores=64, memory_bytes=2 * GiB)
    assert plugins.default_capacity(toy(substrate="process", episode_peak_bytes=MiB), tight) \
        == 1024


def test_no_deployment_may_ask_more_than_the_maximum(tmp_path):
    from camg.errors import ConfigError
    from camg.config.service_config import EnvironmentDeployment
    from camg import typed

    with pytest.raises(ConfigError, match="capacity must be between 1 and 4096"):
        typed.parse(EnvironmentDeployment, {"manifest": "m", "capacity": 4097}, "e",
                    ConfigError)


@pytest.mark.parametrize("name", [n for n, p in plugins.all_plugins().items() if p.demo])
def test_the_demo_admits_a_group_of_8(name):
    """On this 2-core 24 GiB host: the demo's capacity (its plugin's demo
    entry, else the formula) plus the admission line hold a group of 8;
    where episodes are light (<= 64 MiB at their peak) all 8 run at once.
    The heavy environments queue rather than run 8 at once on 2 cores."""
    plugin = plugins.all_plugins()[name]
    host = plugins.Host(cores=2, memory_bytes=24 * GiB)
    capacity = plugin.demo.get("capacity") or plugins.default_capacity(plugin, host)
    bound = plugin.demo.get("queue_bound", admission.default_queue_bound(capacity))
    assert capacity + bound >= GROUP
    assert capacity <= plugins.default_capacity(plugin, host)
    if plugin.episode_peak_bytes is not None and plugin.episode_peak_bytes <= 64 * MiB:
        assert capacity >= GROUP


def test_an_explicit_queue_bound_is_validated(tmp_path):
    from camg.errors import ConfigError
    from camg.config.service_config import EnvironmentDeployment
    from camg import typed

    entry = typed.parse(EnvironmentDeployment, {"manifest": "m", "queue_bound": 0}, "e",
                        ConfigError)
    assert entry.queue_bound == 0
    with pytest.raises(ConfigError):
        typed.parse(EnvironmentDeployment, {"manifest": "m", "queue_bound": -1}, "e",
                    ConfigError)
