"""The registry of environments: one descriptor per environment package.

camg/ knows no environment by name. Each environment package (environments/<env>)
declares an ``EnvironmentPlugin`` and registers it as a Python entry point
in the ``camg.environments`` group (pyproject.toml)::

    [project.entry-points."camg.environments"]
    coding = "environments.coding.plugin:PLUGIN"

Everything that lists environments — ports, factories, ``camg.configure``'s
refusal hints, ``python -m camg.prepare --environment NAME``, routes,
install.sh and run-foreground.sh (units, substrates), ``camg status``,
packaging/prepare_demo.py (the demo's preparers and deployment entries),
devtools.reliability (recipes, budgets, kill-storm drives), devtools.canaries
(canary suites), bench/environment_bench.py (benchmarks), the tests of the
list — reads them from here: every fact about an environment is said once,
in its descriptor. Entry points are read from installed distribution
metadata, so a new package is seen after ``pip install -e .`` (or any
install that writes its entry points).

Loading a descriptor imports only the package's small ``plugin`` module:
its factory, settings type, preparation entry point and the tools' hooks
(demo preparer, reliability recipe, storm drive, canary suite, benchmark)
are ``module:attr`` strings resolved on use (``HOOKS``), so listing
environments never imports an environment's stack (pyserini, docker,
swebench ...).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from camg.errors import ConfigError
from camg.helper_wire import SANDBOXES_PER_PEER

GROUP = "camg.environments"
SUBSTRATES = ("sandbox", "container", "process")
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_DIRECTIVE = re.compile(r"[A-Z][A-Za-z]+=.*")
_DROPIN = re.compile(r"[0-9]{2}-[a-z0-9-]+\.conf")
#: The descriptor's ``module:attr`` fields: what the service and the tools
#: import from the environment's package, each resolved on use
HOOKS = (
    "factory",
    "prepare",
    "settings",
    "demo_prepare",
    "reliability",
    "storm",
    "canaries",
    "bench",
)


@dataclasses.dataclass(frozen=True)
class EnvironmentPlugin:
    """What the suite needs to know about one environment package."""

    #: configs, routes, logs (CAMG_ENV), the default unit's name
    name: str
    #: loopback port the service listens on by default
    port: int
    #: ``module:Class`` of its camg.environment.Environment subclass
    factory: str
    #: ``module:function`` taking argv (list[str]) and returning an exit
    #: status: what ``python -m camg.prepare --environment NAME`` runs
    prepare: str
    #: the command an operator runs to prepare it (configure's refusal hint)
    prepare_hint: str
    #: ``module:Class`` of its typed settings (the deployment's ``settings``)
    settings: str
    #: one line for listings (camg status, the README table)
    title: str = ""
    #: its systemd unit's name (the unit is made by camg.unit_files and
    #: installed by install.sh; camg status and the kill storm read it);
    #: "" is camg-<name>.service
    unit: str = ""
    #: what its episodes run in: "sandbox" (helper sandboxes), "container"
    #: (task containers through the helper's mediator: needs a Docker
    #: engine) or "process" (in the service's own process, no helper)
    substrate: str = "sandbox"
    #: helper sandboxes one episode holds at its peak (Coding: its own plus a
    #: fresh one while grading): decides the default capacity
    #: (default_capacity); None is 0 for substrate "process", else 1
    sandboxes_per_episode: int | None = None
    #: measured peak memory of one live episode, in bytes (its sandbox's or
    #: container's cgroup, or what it adds to the service for "process"):
    #: bounds the default capacity by the host's memory (default_capacity);
    #: None: not measured, no memory bound
    episode_peak_bytes: int | None = None
    #: its entry in the demo deployment (packaging/prepare_demo.py writes
    #: it: manifest, capacity, references, limits, settings); None: no demo
    demo: Mapping[str, Any] | None = None
    #: ``module:function`` (data, cache, helper socket) -> manifest path:
    #: how prepare_demo.py prepares the demo data (with ``demo``)
    demo_prepare: str | None = None
    #: where prepare_demo.py prepares it and the demo deployment lists it
    #: (ascending, then by name)
    demo_rank: int = 100
    #: substrate "container": the file under the demo's DATA its preparer
    #: writes ({"images": [ref@digest ...]}): what the demo helper's
    #: container mediator allows
    demo_images: str | None = None
    #: the directory under DATA its preparer writes the agent environment
    #: to (the mediator's ``agent_env_source``; one environment's at most)
    demo_agent_env: str | None = None
    #: ``module:attr`` of its devtools.reliability.targets.Target (how the
    #: reliability suites prepare, serve and size it); None: listed missing
    reliability: str | None = None
    #: ``module:function`` (devtools.reliability.killstorm_guest Guest, Env of
    #: this plugin's unit and substrate) -> that Env completed: how a kill
    #: storm drives its episodes; None: reset and idle only
    storm: str | None = None
    #: ``module:function`` taking argv (list[str]) and returning an exit
    #: status: its canary suite's command line (the ways an agent could earn
    #: a reward without the work, played against what argv names, each row
    #: printed in devtools.canary_table's table; non-zero on any win): what
    #: ``python -m devtools.canaries NAME`` runs; None: listed as having none
    canaries: str | None = None
    #: ``module:function`` taking argv (list[str]) and returning an exit
    #: status: its benchmark's command line, which writes its results as one
    #: JSON object to ``--json PATH``: what ``bench/environment_bench.py NAME``
    #: runs (bench/results/NAME.json by default); None: listed as having none
    bench: str | None = None
    #: its unit's own [Service] lines (comments kept), after the frame every
    #: environment unit has (camg.unit_files)
    unit_service: tuple[str, ...] = ("MemoryDenyWriteExecute=yes", "ProcSubset=pid")
    #: its unit's own drop-ins, (file name, text), installed after the
    #: shared 10-environment.conf
    unit_dropins: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ConfigError(f"environment plugin name {self.name!r} is invalid")
        if not 1024 <= self.port <= 65535:
            raise ConfigError(f"environment plugin {self.name}: port {self.port} out of range")
        for field in HOOKS:
            value = getattr(self, field)
            if value is not None and not _SPEC.fullmatch(value):
                raise ConfigError(
                    f"environment plugin {self.name}: {field} must look like "
                    f"'package.module:attr', not {value!r}"
                )
        if self.episode_peak_bytes is not None and self.episode_peak_bytes <= 0:
            raise ConfigError(
                f"environment plugin {self.name}: episode_peak_bytes must be positive"
            )
        if self.substrate not in SUBSTRATES:
            raise ConfigError(
                f"environment plugin {self.name}: substrate {self.substrate!r} "
                f"is none of {', '.join(SUBSTRATES)}"
            )
        if (self.demo is None) != (self.demo_prepare is None):
            raise ConfigError(f"environment plugin {self.name}: demo and demo_prepare go together")
        if (self.demo_images or self.demo_agent_env) and self.substrate != "container":
            raise ConfigError(
                f"environment plugin {self.name}: demo_images and "
                "demo_agent_env are for substrate 'container'"
            )
        for line in self.unit_service:
            if "\n" in line or not (line.startswith("#") or _DIRECTIVE.fullmatch(line)):
                raise ConfigError(
                    f"environment plugin {self.name}: unit_service line {line!r} is "
                    "neither a comment nor one Key=value"
                )
        for dropin, _ in self.unit_dropins:
            if not _DROPIN.fullmatch(dropin) or dropin.startswith("10-"):
                raise ConfigError(
                    f"environment plugin {self.name}: unit drop-in {dropin!r} must look "
                    "like 20-name.conf (10- is the shared one)"
                )
        # Derived defaults, set once here so every reader sees one value.
        if not self.unit:
            object.__setattr__(self, "unit", default_unit(self.name))
        if self.sandboxes_per_episode is None:
            object.__setattr__(
                self, "sandboxes_per_episode", 0 if self.substrate == "process" else 1
            )
        if self.substrate == "process" and self.sandboxes_per_episode:
            raise ConfigError(
                f"environment plugin {self.name}: substrate 'process' holds no helper sandbox"
            )

    def load_factory(self) -> type:
        return resolve(self.factory)

    def load_settings_type(self) -> type:
        return resolve(self.settings)

    def run_prepare(self, argv: list[str]) -> int:
        return int(resolve(self.prepare)(argv) or 0)


def default_unit(name: str) -> str:
    """The unit of an environment whose plugin names none."""
    return f"camg-{name}.service"


#: The most concurrent episodes a service of sandboxes or containers takes
#: by default: what the load suite (python -m devtools.reliability --full)
#: shows holding with 0 errors.
MAX_DEFAULT_CAPACITY = 256
#: Live episodes per core: an episode mostly idles while the model thinks
#: (the load suite holds 256 on this 2-core host)
EPISODES_PER_CORE = 128
#: The share of the host's memory one service's episodes may hold at their
#: peaks; the rest is the kernel, page cache and the other services
MEMORY_SHARE = 0.5
#: The most concurrent episodes any service takes (a deployment's
#: ``capacity`` included), and the default of an environment whose episodes
#: are sessions in the service's own process (substrate "process"): such a
#: session is kilobytes and no helper object, and bench/bench_sessions.py
#: holds this many on a 2-core host with no error
MAX_CAPACITY = 4096
#: In-process sessions per core (substrate "process"): an idle session costs
#: no CPU, so the bound is what one core serves as their steps arrive
PROCESS_SESSIONS_PER_CORE = 2048


@dataclasses.dataclass(frozen=True)
class Host:
    """What the default capacity is derived from."""

    cores: int
    memory_bytes: int

    @classmethod
    def detect(cls) -> Host:
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
        return cls(
            cores=max(1, cores),
            memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        )


def default_capacity(plugin: EnvironmentPlugin | None, host: Host | None = None) -> int:
    """Episodes a service takes when its deployment names no ``capacity``.
    Episodes in helper sandboxes or containers::

        min(256, SANDBOXES_PER_PEER // sandboxes_per_episode,
            cores * EPISODES_PER_CORE,
            memory * MEMORY_SHARE // episode_peak_bytes)   (at least 1)

    the helper's per-peer sandbox ceiling (camg.helper_wire.SANDBOXES_PER_PEER)
    over the sandboxes an episode holds at its peak; the host's cores; and
    its memory over the episode's measured peak (no bound where the plugin
    has none measured). Sessions in the service's own process (substrate
    "process") hold no helper object::

        min(MAX_CAPACITY, cores * PROCESS_SESSIONS_PER_CORE,
            memory * MEMORY_SHARE // episode_peak_bytes)

    ``host``: this machine's, unless given.
    """
    host = host or Host.detect()
    if plugin is not None and plugin.substrate == "process":
        bounds = [MAX_CAPACITY, host.cores * PROCESS_SESSIONS_PER_CORE]
    else:
        per = plugin.sandboxes_per_episode if plugin is not None else 1
        assert per is not None  # __post_init__ fills in a plugin's default
        bounds = [
            MAX_DEFAULT_CAPACITY,
            SANDBOXES_PER_PEER // max(1, per),
            host.cores * EPISODES_PER_CORE,
        ]
    if plugin is not None and plugin.episode_peak_bytes:
        bounds.append(int(host.memory_bytes * MEMORY_SHARE) // plugin.episode_peak_bytes)
    return max(1, min(bounds))


def resolve(spec: str) -> Any:
    """Import ``module:attr``; a ConfigError names what failed."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{spec!r} must look like 'package.module:attr'")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {spec!r}: {exc}") from None
    return target


def _entry_points() -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=GROUP))


def all_plugins() -> Mapping[str, EnvironmentPlugin]:
    """Every registered environment, by name (sorted). A registration that
    does not load, or two that claim one name or one port, is a ConfigError."""
    found: dict[str, EnvironmentPlugin] = {}
    ports: dict[int, str] = {}
    for entry in _entry_points():
        try:
            plugin = entry.load()
        except Exception as exc:  # a broken package must name itself
            raise ConfigError(
                f"environment plugin {entry.name!r} ({entry.value}) does not load: {exc}"
            ) from None
        if not isinstance(plugin, EnvironmentPlugin):
            raise ConfigError(
                f"entry point {entry.name!r} ({entry.value}) is not an EnvironmentPlugin"
            )
        if plugin.name != entry.name:
            raise ConfigError(f"entry point {entry.name!r} declares environment {plugin.name!r}")
        if plugin.name in found and found[plugin.name] != plugin:
            raise ConfigError(f"environment {plugin.name!r} is registered twice")
        if ports.get(plugin.port, plugin.name) != plugin.name:
            raise ConfigError(
                f"environments {ports[plugin.port]!r} and {plugin.name!r} share port {plugin.port}"
            )
        found[plugin.name] = plugin
        ports[plugin.port] = plugin.name
    return dict(sorted(found.items()))


def get(name: str) -> EnvironmentPlugin:
    plugins = all_plugins()
    try:
        return plugins[name]
    except KeyError:
        known = ", ".join(plugins) or "none"
        raise ConfigError(f"no environment named {name!r} is installed (known: {known})") from None


def markdown_table(plugins: Mapping[str, EnvironmentPlugin]) -> str:
    """The README's table of environments, by port: what ``--table`` prints
    and tests/unit/test_plugins.py holds the README to."""
    rows = [
        "| environment | port | what it serves | code |",
        "|---|---|---|---|",
    ]
    for name, plugin in sorted(plugins.items(), key=lambda item: item[1].port):
        package = "/".join(plugin.factory.split(":")[0].split(".")[:-1])
        rows.append(
            f"| `{name}` | {plugin.port} | {plugin.title or name} | "
            f"[{package}]({package}/README.md) |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m camg.plugins [--names | --field F | --table]``: list the registered
    environments (install.sh, run-foreground.sh and the system tests read
    this); JSON of every descriptor without an option."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m camg.plugins", description=main.__doc__)
    parser.add_argument("--names", action="store_true", help="one name a line")
    parser.add_argument(
        "--field",
        choices=("unit", "substrate", "port"),
        help="'NAME VALUE' a line (install.sh: units, run-foreground.sh: substrates)",
    )
    parser.add_argument("--table", action="store_true", help="the README's Markdown table")
    args = parser.parse_args(argv)
    try:
        plugins = all_plugins()
    except ConfigError as exc:
        print(f"camg.plugins: {exc}", file=sys.stderr)
        return 2
    if args.names:
        for name in plugins:
            print(name)
    elif args.field:
        for name, plugin in plugins.items():
            print(name, getattr(plugin, args.field))
    elif args.table:
        print(markdown_table(plugins), end="")
    else:
        print(json.dumps({n: dataclasses.asdict(p) for n, p in plugins.items()}, indent=1))
    return 0


if __name__ == "__main__":
    # Through the importable module, so isinstance sees one EnvironmentPlugin
    # class (run as __main__, this file's classes would be a second copy).
    from camg.plugins import main as _main

    raise SystemExit(_main())
