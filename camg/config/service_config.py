"""Typed configuration: the operator's deployment and the prepared service
configs that ``camg.configure`` writes and ``camg.serve`` runs.

A prepared service config binds a service to exact bytes: the source
commit, the runtime lock, the executables, the prepared manifest and every
file the manifest names, each by sha256, plus ``config_hash`` over the
whole config. ``verify`` re-hashes all of it; any difference is a
ConfigError naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from camg import plugins, typed
from camg.config import task_manifest as manifest_mod
from camg.config import variants
from camg.config.hashing import sha256_json, sha256_path, verify_recorded
from camg.errors import ConfigError, PreparationMissing

SERVICE_FORMAT = "camg-service/1"
SCHEDULE_FORMAT = "camg-schedule/1"
LOOPBACK = "127.0.0.1"

# Settings keys that look like credentials are refused: credentials belong in
# the service's environment (e.g. GA_JUDGE_KEY), never in a generated file.
_CREDENTIAL_KEY = re.compile(r"(^|_)(key|token|secret|password|passwd|credential)s?$", re.I)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Deadlines the server enforces, whatever the environment does."""

    reset_timeout_s: float = 300.0
    action_timeout_s: float = 120.0
    episode_timeout_s: float = 4 * 3600.0
    grade_timeout_s: float = 1800.0
    idle_ttl_s: float = 900.0
    max_steps: int = 1000
    max_body_bytes: int = 1 << 20
    #: a request's head (request line and headers) must arrive within this
    #: many seconds of the connection's start, or of its first byte on a
    #: kept-alive connection; else 408 and the connection is closed
    header_timeout_s: float = 10.0
    #: a request's body must arrive whole within this many seconds of its head
    #: (max_body_bytes takes milliseconds on loopback); else the connection is closed
    body_timeout_s: float = 30.0
    #: connections open at once; a request beyond it is answered 503
    max_connections: int = 1024

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) <= 0:
                raise ValueError(f"limits.{field.name} must be positive")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not 0 < getattr(self, name) <= 3600:  # written so NaN fails too
                raise ValueError(f"limits.{name} must be between 0 and 3600 seconds")
        if not 1 <= self.max_connections <= 65536:
            raise ValueError("limits.max_connections must be between 1 and 65536")


@dataclasses.dataclass(frozen=True)
class EnvironmentDeployment:
    manifest: str
    #: concurrent episodes; None: camg.plugins.default_capacity (what the
    #: helper can hold for one service, at most 256)
    capacity: int | None = None
    #: creates that may wait for a slot at once (POST /episodes wait_s);
    #: None: camg.episodes.admission.default_queue_bound (4 per slot); 0: none wait
    queue_bound: int | None = None
    port: int | None = None
    factory: str | None = None
    enabled: bool = True
    #: serve GET /episodes/{id}/reference (the oracle of camg_client.rollout) — for
    #: an operator's end-to-end check, never for a training run
    references: bool = False
    #: the share of creates without a task_id that serve an impossible
    #: variant (camg.config.variants; the manifest must have some); 0: only on request
    canary_fraction: float = 0.0
    limits: Limits = Limits()
    executables: Mapping[str, str] = dataclasses.field(default_factory=dict)
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        variants.check_fraction(self.canary_fraction)
        if self.capacity is not None and not 1 <= self.capacity <= plugins.MAX_CAPACITY:
            raise ValueError(f"capacity must be between 1 and {plugins.MAX_CAPACITY}")
        if self.queue_bound is not None and not 0 <= self.queue_bound <= 65536:
            raise ValueError("queue_bound must be between 0 and 65536")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ValueError("port must be between 1 and 65535")


@dataclasses.dataclass(frozen=True)
class Auth:
    """Who may use the services (camg.web.auth). On unless a deployment says
    ``"required": false``, which only a single-user machine should."""

    required: bool = True
    #: the trainers file: principals, roles and token hashes (never tokens)
    trainers: str = "/etc/camg/trainers.json"

    def __post_init__(self) -> None:
        if not os.path.isabs(self.trainers):
            raise ValueError("auth.trainers must be an absolute path")


@dataclasses.dataclass(frozen=True)
class Deployment:
    environments: Mapping[str, EnvironmentDeployment]
    auth: Auth = Auth()
    runtime_lock: str = "requirements.lock"
    state_root: str = "/var/lib/camg"
    helper_socket: str = "/run/camg/helper.sock"
    executables: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HashedFile:
    path: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class OutcomeKey:
    """The deployment's outcome signing key (camg.episodes.signing): where the private
    half is, and the public half it must have."""

    path: str
    algorithm: str
    public_key: str
    fingerprint: str
    public_key_pem: str


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """One prepared service configuration (``prepared/<env>.json``)."""

    format: str
    environment: str
    factory: str
    version: str
    source_commit: str
    host: str
    port: int
    state_dir: str
    helper_socket: str
    capacity: int
    limits: Limits
    manifest: HashedFile
    task_selection_hash: str
    runtime_lock: HashedFile
    executables: Mapping[str, HashedFile]
    settings: Mapping[str, Any]
    outcome_key: OutcomeKey
    config_hash: str
    references: bool = False
    #: None (a config written before the admission line): 4 per slot
    queue_bound: int | None = None
    auth: Auth = Auth()
    #: camg.config.variants: the share of unnamed creates that serve a variant
    canary_fraction: float = 0.0

    def __post_init__(self) -> None:
        variants.check_fraction(self.canary_fraction)
        if self.format != SERVICE_FORMAT:
            raise ValueError(f"format must be {SERVICE_FORMAT}")
        if self.host != LOOPBACK:
            raise ValueError("services listen on 127.0.0.1 only")

    def body_without_hash(self) -> dict:
        body = typed.to_json(self)
        body.pop("config_hash")
        return body


def load_json(path: str | os.PathLike, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what} {path} is not valid JSON: {exc}") from None


def load_deployment(path: str | os.PathLike) -> Deployment:
    deployment = typed.parse(Deployment, load_json(path, "deployment"), "deployment", ConfigError)
    installed = plugins.all_plugins()
    for name, env in deployment.environments.items():
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
            raise ConfigError(f"deployment.environments: invalid environment name {name!r}")
        known = name in installed
        if not known and env.factory is None and env.enabled:
            raise ConfigError(
                f"deployment.environments.{name}: no installed environment has "
                f"this name (installed: {', '.join(installed) or 'none'}); "
                "name its factory"
            )
        if env.port is None and not known:
            raise ConfigError(f"deployment.environments.{name}: port is required")
        _refuse_credentials(env.settings, f"deployment.environments.{name}.settings")
    return deployment


def _refuse_credentials(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if _CREDENTIAL_KEY.search(str(key)):
                raise ConfigError(
                    f"{where}.{key}: credentials are never written to a "
                    "configuration; pass them in the service's environment"
                )
            _refuse_credentials(inner, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, inner in enumerate(value):
            _refuse_credentials(inner, f"{where}[{index}]")


def hashed(path: str | os.PathLike, *, step: str, what: str) -> HashedFile:
    if not os.path.exists(path):
        raise PreparationMissing(f"{what} is missing: {path}", step=step)
    return HashedFile(path=str(Path(path).resolve()), sha256=sha256_path(path))


def load_service_config(path: str | os.PathLike) -> ServiceConfig:
    return typed.parse(ServiceConfig, load_json(path, "service config"), "config", ConfigError)


def verify(config: ServiceConfig, config_path: str | os.PathLike) -> manifest_mod.Manifest:
    """Re-verify every hash a service config records; return its manifest.

    Raises ConfigError naming the first file that differs.
    """
    if sha256_json(config.body_without_hash()) != config.config_hash:
        raise ConfigError(
            f"{config_path}: config_hash does not match its content "
            "(edited by hand? re-run camg.configure)"
        )
    files = [("runtime lock", config.runtime_lock), ("manifest", config.manifest)]
    files += [(f"executable {name}", entry) for name, entry in config.executables.items()]
    for what, entry in files:
        verify_recorded(what, entry.path, entry.sha256, since="camg.configure")
    manifest = manifest_mod.load(config.manifest.path)
    if manifest.selection_hash() != config.task_selection_hash:
        raise ConfigError(f"task selection in {config.manifest.path} differs from the config")
    manifest.verify_files()
    _verify_schedule(config, Path(config_path).parent / "schedule.json")
    return manifest


def _verify_schedule(config: ServiceConfig, schedule_path: Path) -> None:
    schedule = load_json(schedule_path, "schedule")
    entry = (
        (schedule.get("environments") or {}).get(config.environment)
        if isinstance(schedule, dict)
        else None
    )
    if not entry or entry.get("config_hash") != config.config_hash:
        raise ConfigError(
            f"{schedule_path}: does not carry this service's configuration hash "
            f"{config.config_hash} (re-run camg.configure)"
        )
    combined = sha256_json(
        {env: e.get("config_hash") for env, e in sorted(schedule["environments"].items())}
    )
    if schedule.get("config_hash") != combined:
        raise ConfigError(f"{schedule_path}: config_hash does not match its environments")
