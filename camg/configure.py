"""python -m camg.configure --deployment deployment.local.json --output prepared

Binds the operator's deployment to this exact installation: refuses a
dirty git checkout, records the source commit, hashes the runtime lock, the
executables and the prepared manifests (and every file they name), and
writes ``<env>.json`` per enabled service, ``routes.json`` and
``schedule.json``. It reads no environment variables, so no credential can
reach its output. First it refuses what the helper would refuse at the first
reset (camg.sandboxes.helper_roots): a layers root outside the helper's lower_roots,
two services with one helper owner name; ``--check-config`` checks only that.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import camg
from camg import atomic, plugins, typed
from camg.config import service_config as cfg
from camg.config import task_manifest as manifest_mod
from camg.config.hashing import sha256_json
from camg.episodes import admission, signing
from camg.errors import CamgError, ConfigError, PreparationMissing
from camg.sandboxes import helper_roots
from camg.web import auth

log = logging.getLogger(__name__)


def source_commit(tree: Path) -> str:
    """The commit of a clean checkout; ConfigError naming dirty paths."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tree), *args], check=True, text=True, capture_output=True
        ).stdout

    try:
        git("rev-parse", "--show-toplevel")
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise ConfigError(f"{tree} is not a git checkout; run camg.configure from one") from None
    dirty = git("status", "--porcelain", "--untracked-files=normal").splitlines()
    if dirty:
        paths = ", ".join(line[3:] for line in dirty[:20])
        more = f" and {len(dirty) - 20} more" if len(dirty) > 20 else ""
        raise ConfigError(
            f"the git checkout {tree} is not clean: {paths}{more}; commit or remove these first"
        )
    return git("rev-parse", "HEAD").strip()


def _source_tree() -> Path:
    package_root = Path(camg.__file__).resolve().parent.parent
    if (package_root / ".git").exists():
        return package_root
    return Path.cwd()


def build_service(
    name: str,
    env: cfg.EnvironmentDeployment,
    deployment: cfg.Deployment,
    base: Path,
    commit: str,
    outcome_key: dict,
) -> tuple[dict, manifest_mod.Manifest]:
    plugin = plugins.all_plugins().get(name)
    step = plugin.prepare_hint if plugin else f"prepare the {name} manifest"
    manifest_path = base / env.manifest
    manifest_file = cfg.hashed(manifest_path, step=step, what=f"{name} prepared manifest")
    manifest = manifest_mod.load(manifest_path)
    if manifest.environment != name:
        raise ConfigError(
            f"{manifest_path} is a manifest for {manifest.environment!r}, not {name!r}"
        )
    try:
        manifest.verify_files()
    except ConfigError as exc:
        raise PreparationMissing(str(exc), step=step) from None
    if env.canary_fraction > 0 and not manifest.variants:
        raise ConfigError(
            f"deployment.environments.{name}.canary_fraction is {env.canary_fraction:g} but "
            f"{manifest_path} has no impossible variants (prepare them: {step} --variants)"
        )
    executables = {**deployment.executables, **env.executables}
    # load_deployment requires the factory and port no installed plugin provides.
    provided = cast(plugins.EnvironmentPlugin, plugin)
    body = {
        "format": cfg.SERVICE_FORMAT,
        "environment": name,
        "factory": env.factory or provided.factory,
        "version": camg.__version__,
        "source_commit": commit,
        "host": cfg.LOOPBACK,
        "port": env.port or provided.port,
        "state_dir": str(Path(deployment.state_root) / name),
        "helper_socket": deployment.helper_socket,
        "capacity": env.capacity if env.capacity is not None else plugins.default_capacity(plugin),
        "limits": typed.to_json(env.limits),
        "manifest": typed.to_json(manifest_file),
        "task_selection_hash": manifest.selection_hash(),
        "runtime_lock": typed.to_json(
            cfg.hashed(
                base / deployment.runtime_lock,
                step="install the runtime lock (requirements.lock)",
                what="runtime lock",
            )
        ),
        "executables": {
            label: typed.to_json(
                cfg.hashed(
                    base / path, step=f"install the {label} executable", what=f"executable {label}"
                )
            )
            for label, path in sorted(executables.items())
        },
        "settings": typed.to_json(env.settings),
        "references": env.references,
        "canary_fraction": env.canary_fraction,
        "auth": typed.to_json(deployment.auth),
        "outcome_key": outcome_key,
    }
    body["queue_bound"] = (
        env.queue_bound
        if env.queue_bound is not None
        else admission.default_queue_bound(body["capacity"])
    )
    body["config_hash"] = sha256_json(body)
    typed.parse(cfg.ServiceConfig, body, f"{name} config", ConfigError)
    return body, manifest


def _setting(name: str, env: cfg.EnvironmentDeployment, field: str) -> object:
    """A setting as the service will see it: the deployment's value, else the
    default of the environment's settings class (None when it has none)."""
    if env.settings.get(field):
        return env.settings[field]
    plugin = plugins.all_plugins().get(name)
    if env.factory is not None and (plugin is None or plugin.factory != env.factory):
        plugin = next((p for p in plugins.all_plugins().values() if p.factory == env.factory), None)
    if plugin is None:
        return None
    fields = {f.name: f for f in dataclasses.fields(plugins.resolve(plugin.settings))}
    default = fields[field].default if field in fields else None
    return None if default is dataclasses.MISSING else default


def helper_owner(name: str, env: cfg.EnvironmentDeployment) -> str:
    """The owner name the service will give the helper: its setting, else its
    settings class's default, else (an empty default) the environment name,
    which the unit's ExecStopPost= releases by."""
    return str(_setting(name, env, "helper_owner") or name)


def check_helper_settings(
    deployment: cfg.Deployment, helper_config: str | os.PathLike | None = None
) -> None:
    """Refuse now what the helper would refuse at the first reset: a layer
    root outside its lower roots, two services with one owner name."""
    roots = helper_roots.load(helper_config)
    owners = {}
    for name, env in sorted(deployment.environments.items()):
        if not env.enabled:
            continue
        owners[name] = helper_owner(name, env)
        if owners[name] != name:
            log.warning(
                "environments.%s.settings.helper_owner %r: the unit's ExecStopPost= "
                "releases the sandboxes of owner %r only",
                name,
                owners[name],
                name,
            )
        layers_root = _setting(name, env, "layers_root")
        if isinstance(layers_root, str):
            helper_roots.check_lower(
                layers_root, f"environments.{name}.settings.layers_root", roots
            )
    helper_roots.check_owners(owners, deployment.helper_socket)


def configure(
    deployment_path: Path,
    output: Path,
    source_tree: Path | None = None,
    key_owner: str | None = None,
    helper_config: str | os.PathLike | None = None,
) -> dict:
    """``key_owner``: the user the outcome signing key is made for (install.sh:
    camg); the key is made only if it is missing. ``helper_config``: the
    helper's config file (default /etc/camg/helper.json)."""
    deployment = cfg.load_deployment(deployment_path)
    check_helper_settings(deployment, helper_config)
    commit = source_commit(source_tree or _source_tree())
    base = deployment_path.resolve().parent
    key = signing.key_path(deployment.state_root)
    outcome_key = {"path": str(key), **signing.describe(signing.ensure_key(key, key_owner))}
    services, schedule_envs = {}, {}
    for name, env in sorted(deployment.environments.items()):
        if not env.enabled:
            continue
        body, manifest = build_service(name, env, deployment, base, commit, outcome_key)
        services[name] = body
        schedule_envs[name] = {
            "config_hash": body["config_hash"],
            "route": f"http://{cfg.LOOPBACK}:{body['port']}",
            "task_selection_hash": body["task_selection_hash"],
            "sampling": dict(manifest.sampling),
            "task_ids": manifest.task_ids,
        }
    if not services:
        raise ConfigError(f"{deployment_path}: no enabled environment")
    ports = [s["port"] for s in services.values()]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"{deployment_path}: two environments share a port")
    schedule = {
        "format": cfg.SCHEDULE_FORMAT,
        "source_commit": commit,
        "config_hash": sha256_json({n: e["config_hash"] for n, e in sorted(schedule_envs.items())}),
        "environments": schedule_envs,
    }
    routes = {name: entry["route"] for name, entry in schedule_envs.items()}
    output.mkdir(parents=True, exist_ok=True)
    for name, body in services.items():
        _write(output / f"{name}.json", body)
    _write(output / "routes.json", routes)
    _write(output / "schedule.json", schedule)
    return schedule


def _write(path: Path, body: object) -> None:
    atomic.write_json(path, body, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m camg.configure", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--deployment", required=True, type=Path)
    parser.add_argument("--output", type=Path, help="required unless --check-config")
    parser.add_argument(
        "--key-owner", metavar="USER", help="owner of the outcome signing key if it is made now"
    )
    parser.add_argument(
        "--helper-config",
        metavar="PATH",
        default=helper_roots.DEFAULT_HELPER_CONFIG,
        help="the helper's config file, whose lower_roots the prepared layers "
        "must be below (default %(default)s)",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="only check the deployment against the helper's config and exit",
    )
    args = parser.parse_args(argv)
    if args.output is None and not args.check_config:
        parser.error("--output is required")
    try:
        if args.check_config:
            deployment = cfg.load_deployment(args.deployment)
            check_helper_settings(deployment, args.helper_config)
            print(f"camg.configure: {args.deployment} agrees with {args.helper_config}")
            print(
                f"camg.configure: authentication "
                f"{auth.describe(deployment.auth.required, deployment.auth.trainers)}"
            )
            return 0
        schedule = configure(
            args.deployment, args.output, key_owner=args.key_owner, helper_config=args.helper_config
        )
    except CamgError as exc:
        print(f"camg.configure: {exc}", file=sys.stderr)
        return 2
    print(
        f"camg.configure: wrote {', '.join(sorted(schedule['environments']))} to {args.output} "
        f"(config hash {schedule['config_hash']}, commit {schedule['source_commit'][:12]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
