"""python -m camg.serve --config prepared/<env>.json [--check-config]

Verifies the prepared configuration (every recorded hash, the schedule's
configuration hash), then serves the environment under gunicorn (worker
class: camg.serving.http_worker) on 127.0.0.1 only. One worker: episodes live in process memory,
and a second worker would be a second, inconsistent episode table.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

from gunicorn.app.base import BaseApplication

from camg import logs, plugins
from camg.config import service_config as cfg
from camg.environment import ServiceContext
from camg.errors import CamgError
from camg.serving import http_worker, notify
from camg.web import auth

log = logging.getLogger("camg.serve")


def build_service(config: cfg.ServiceConfig, manifest):
    """The Service for a config ``cfg.verify`` has just checked (environment
    constructed, not started)."""
    from camg.serving.service import Service

    env_class = plugins.resolve(config.factory)
    context = ServiceContext(
        environment=config.environment,
        state_dir=config.state_dir,
        settings=config.settings,
        helper_socket=config.helper_socket,
        verified_files=manifest.files,
        variants=manifest.variants,
    )
    environment = env_class(context, list(manifest.tasks))
    if environment.name != config.environment:
        raise cfg.ConfigError(
            f"factory {config.factory} implements {environment.name!r}, not {config.environment!r}"
        )
    return Service(config, environment)


class GunicornService(BaseApplication):
    def __init__(self, config: cfg.ServiceConfig, manifest, options: dict) -> None:
        self.config_obj = config
        self.manifest = manifest
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self):
        # Runs in the worker after fork: the environment (JVM, sockets,
        # threads) must be created here, not in the arbiter.
        from camg.web.app import create_app

        logs.setup(self.config_obj.environment)
        return create_app(build_service(self.config_obj, self.manifest))


def gunicorn_options(config: cfg.ServiceConfig, worker: str = http_worker.DEFAULT) -> dict:
    return {
        "bind": [f"{cfg.LOOPBACK}:{config.port}"],
        "workers": 1,
        **http_worker.options(worker),
        # gunicorn's worker heartbeat does not run during ASGI lifespan
        # start-up, where the environment starts (a JVM and an index can
        # take minutes on a loaded host), so its timeout must cover that.
        # A wedged event loop is caught by systemd's watchdog instead: the
        # loop itself sends WATCHDOG=1.
        "timeout": 900,
        # Shutdown closes every active episode; give teardown time (units
        # set TimeoutStopSec above this).
        "graceful_timeout": 90,
        # gunicorn's graceful stop waits for idle keep-alive connections
        # too, so keep them short: a trainer's client simply reconnects.
        "keepalive": 5,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
        "proc_name": f"camg-{config.environment}",
        "max_requests": 0,
        "reuse_port": False,
        "worker_connections": 1000,
        "pre_fork": _release_before_respawn(config),
    }


def _release_before_respawn(config: cfg.ServiceConfig):
    """gunicorn's pre_fork hook (in the master): before it replaces a worker
    that died (kill -9, a crash), release the dead worker's sandboxes, as the
    unit's ExecStopPost= would; the unit itself never stopped. With one
    worker nothing of a live worker can be released here."""
    forks = []

    def pre_fork(server, worker) -> None:
        forks.append(worker)
        if len(forks) == 1:
            return  # the first worker: ExecStopPost= left nothing behind
        from camg.helper_client import HelperClient

        owner = str(config.settings.get("helper_owner") or config.environment)
        try:
            released = HelperClient(config.helper_socket, owner=owner).release_all()
        except Exception as exc:  # the helper's own sweep is the backstop
            log.warning("releasing the dead worker's sandboxes failed: %s", exc)
            return
        log.warning("worker replaced: released %d sandbox(es) of the dead one", released)

    return pre_fork


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m camg.serve", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", required=True, help="prepared/<env>.json")
    parser.add_argument(
        "--check-config", action="store_true", help="verify every recorded hash and exit"
    )
    parser.add_argument(
        "--check-clean",
        action="store_true",
        help="check that nothing of a previous run of this service remains, "
        "release what its ledger names, mark the state directory clean "
        "(the environment decides what that means) and exit",
    )
    args = parser.parse_args(argv)
    try:
        config = cfg.load_service_config(args.config)
        logs.setup(config.environment)
        manifest = cfg.verify(config, args.config)
        worker = http_worker.selected()
    except CamgError as exc:
        print(f"<3>camg.serve: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        # An environment may check what only the service's environment holds
        # (General/Visual: the judge variables) with a ``check_config(config)``
        # classmethod raising a CamgError.
        check = getattr(plugins.resolve(config.factory), "check_config", None)
        if check is not None:
            try:
                check(config)
            except CamgError as exc:
                print(f"<3>camg.serve: {exc}", file=sys.stderr)
                return 2
        print(
            f"camg.serve: {args.config} verified ({config.environment}, "
            f"config hash {config.config_hash}, {len(manifest.tasks)} tasks)"
        )
        print(
            f"camg.serve: authentication "
            f"{auth.describe(config.auth.required, config.auth.trainers)}"
        )
        return 0
    if args.check_clean:
        return check_clean(config)
    os.makedirs(config.state_dir, exist_ok=True)
    notify.stash_notify_socket()
    # Environments that must stop the whole service (a supervised child
    # died) signal the master by this pid and leave STOP_FAILED with the
    # reason; the service then exits non-zero so systemd restarts it.
    os.environ["CAMG_SERVE_PID"] = str(os.getpid())
    os.environ["CAMG_SERVE_CONFIG"] = os.path.abspath(args.config)
    stop_failed = os.path.join(config.state_dir, STOP_FAILED)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(stop_failed)  # a previous run's, already reported
    master = os.getpid()
    try:
        GunicornService(config, manifest, gunicorn_options(config, worker)).run()
    except SystemExit as exc:
        # A forked worker ends through here too: only the master reports.
        if exc.code not in (0, None) or os.getpid() != master:
            raise
    if os.path.exists(stop_failed):
        with open(stop_failed, encoding="utf-8", errors="replace") as f:
            print(f"<3>camg.serve: stopped as failed: {f.read().strip()}", file=sys.stderr)
        return 1
    return 0


STOP_FAILED = "stop-failed"


def check_clean(config: cfg.ServiceConfig) -> int:
    """``--check-clean``: the environment class's ``check_clean(config)``
    returns (clean, notes); environments without one have nothing to check."""
    env_class = plugins.resolve(config.factory)
    check = getattr(env_class, "check_clean", None)
    if check is None:
        print(f"camg.serve: {config.environment} keeps no per-run state; nothing to check")
        return 0
    try:
        clean, notes = check(config)
    except CamgError as exc:
        print(f"<3>camg.serve: --check-clean failed: {exc}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"camg.serve: {note}", file=sys.stderr if not clean else sys.stdout)
    if not clean:
        print(
            f"<3>camg.serve: {config.state_dir} is NOT clean; the service will not start on it",
            file=sys.stderr,
        )
        return 1
    print(f"camg.serve: {config.state_dir} checked and marked clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
