"""camg-helper: the root-only sandbox daemon (and its --sweep / --probe modes)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import sys
import threading

from helper import cgroups, containers, initbin, verbs
from helper import config as configmod
from helper import log as logmod
from helper.config import ConfigError
from helper.ledger import Ledger, sweep

_RETRY_PROBES = 30.0


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="camg-helper", description=__doc__)
    ap.add_argument("--config", help="JSON configuration file (all fields optional)")
    ap.add_argument(
        "--socket",
        help="bind this path instead of the configured socket (ignored under socket activation)",
    )
    ap.add_argument(
        "--sweep", action="store_true", help="reclaim everything a crashed helper left, then exit"
    )
    ap.add_argument("--list-verbs", action="store_true", help="print the verb interface as JSON")
    ap.add_argument(
        "--probe",
        action="store_true",
        help="run the isolation probes once, print JSON, exit 0 if all passed",
    )
    return ap.parse_args(argv)


def _listener(path: str) -> tuple[socket.socket, str | None]:
    """The socket systemd passed (LISTEN_FDS), else our own bound ``path``."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(var, None)
        sock = socket.socket(fileno=3)
        os.set_inheritable(3, False)
        return sock, None
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # no stale socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    # A burst of clients (hundreds of episodes resetting at once) must
    # queue, not be refused: the kernel caps this at net.core.somaxconn.
    sock.listen(4096)
    return sock, path


def _secure_socket(path: str, group: str) -> None:
    from helper.server import group_id

    gid = group_id(group)
    os.chown(path, 0, gid if gid is not None else 0)
    os.chmod(path, 0o660)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    log = logmod.setup()
    if args.list_verbs:
        json.dump(verbs.describe(), sys.stdout, indent=2, default=str)
        print()
        return 0
    try:
        cfg = configmod.load(args.config)
        if os.geteuid() != 0:
            raise ConfigError("camg-helper must run as root")
        parents = configmod.resolve_cgroup_parents(cfg)
        ledger = Ledger(os.path.join(cfg.state_dir, "ledger"))
        created_parents = os.path.join(cfg.state_dir, "created-cgroup-parents")
        if not args.sweep:  # a sweep reclaims; it never creates
            cgroups.ensure_parents(parents, created_parents)
    except (ConfigError, OSError) as exc:
        log.critical("cannot start: %s", exc)
        return 2
    swept_sandboxes = sweep(ledger, parents, cfg.upper_root, log.info)
    # Containers of this helper scope from an earlier instance (helper/containers.py).
    swept_containers = containers.sweep(cfg, log.info)
    if args.sweep:
        cgroups.release_parents(created_parents)
        log.info("sweep reclaimed %d sandbox(es)", swept_sandboxes + swept_containers)
        return 0
    import prctl  # only the serving modes spawn sandboxes
    from sdnotify import SystemdNotifier

    from helper.probes import Probes
    from helper.sandbox_table import Registry
    from helper.server import Server

    # Every sandbox's pid 1 is re-parented to us, so its pid stays ours
    # until destroy() reaps it.
    prctl.set_child_subreaper(True)
    # Each sandbox holds a control socket, each request a connection and
    # each running command three pipes: systemd's soft 1024 would cap the
    # helper at a few hundred sandboxes. Raising the soft limit to the hard
    # one needs no privilege.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < min(hard, 1 << 17):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 17), hard))
    try:
        init_binary = initbin.ensure(cfg.init_binary, os.path.join(cfg.state_dir, "bin"))
    except ConfigError as exc:
        log.critical("cannot start: %s", exc)
        return 2
    registry = Registry(cfg, parents, ledger, init_binary)
    probes = Probes(registry)
    if args.probe:
        result = probes.run()
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0 if result["ok"] else 1

    notifier = SystemdNotifier()
    stop = threading.Event()

    def on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        listener, bound = _listener(args.socket or cfg.socket)
        if bound:
            _secure_socket(bound, cfg.group)
    except OSError as exc:
        log.critical("cannot listen: %s", exc)
        return 2
    metrics = _metrics(registry, swept_sandboxes, swept_containers)
    stop_metrics = _serve_metrics(metrics, cfg.metrics_port, log)
    server = Server(
        listener,
        verbs.Context(registry, probes.run),
        cfg.group,
        max_blob=cfg.ceilings.archive_bytes,
        max_connections=cfg.ceilings.connections,
        metrics=metrics,
    )
    if server.gid is None:
        log.warning("group %r does not exist: only root may use the helper", cfg.group)
    threading.Thread(
        target=_probe_loop,
        args=(probes, registry, notifier, stop, cfg.probe_on_start, log),
        daemon=True,
    ).start()
    log.info("serving on %s", bound or "the socket systemd passed")
    try:
        server.serve_forever()
    except SystemExit:
        pass
    finally:
        stop.set()
        notifier.notify("STOPPING=1")
        listener.close()
        stop_metrics()
        n = registry.destroy_all()
        containers.sweep(cfg, log.info)
        cgroups.release_parents(created_parents)
        log.info("stopped; destroyed %d sandbox(es)", n)
        if bound:
            try:
                os.unlink(bound)
            except FileNotFoundError:
                pass
    return 0


def _metrics(registry, swept_sandboxes: int, swept_containers: int):
    """The helper's series (camg.metrics.HelperMetrics), read from what it holds."""
    from camg.metrics import HelperMetrics

    metrics = HelperMetrics()
    metrics.watch(
        sandboxes=lambda: len(registry.sandboxes),
        containers=lambda: len(getattr(containers._mediator, "held", ())),
        probes_ok=lambda: registry.probe_failure is None,
    )
    metrics.swept(swept_sandboxes, swept_containers)
    return metrics


def _serve_metrics(metrics, port: int, log):
    """The metrics listener on 127.0.0.1:port (none for 0). One that cannot
    bind is logged and the helper serves on: sandboxes matter more than
    their counts."""
    if not port:
        return lambda: None
    try:
        stop = metrics.serve(port)
    except OSError as exc:
        log.error("metrics not served: cannot listen on 127.0.0.1:%d: %s", port, exc)
        return lambda: None
    log.info("metrics on http://127.0.0.1:%d/metrics", port)
    return stop


def _probe_loop(probes, registry, notifier, stop, on_start, log) -> None:
    """Probe until everything passes, then say READY=1 (once)."""
    if not on_start:
        registry.probe_failure = None
        registry.first_probes_done.set()
        notifier.notify("READY=1\nSTATUS=serving (probes skipped by configuration)")
        return
    while not stop.is_set():
        result = probes.run()
        if result["ok"]:
            log.info("isolation probes passed in %.2fs", result["duration"])
            notifier.notify("READY=1\nSTATUS=serving; isolation probes passed")
            return
        notifier.notify(f"STATUS=refusing sandboxes: {registry.probe_failure}"[:1000])
        stop.wait(_RETRY_PROBES)


if __name__ == "__main__":
    sys.exit(main())
