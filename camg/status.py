"""``camg status`` (also ``python -m camg.status``): one look at an installation.

    camg status [--etc /etc/camg] [--json]

One row per configured environment (``<etc>/prepared/<env>.json``): its
unit's state (under systemd; ``--json`` also names the unit, its plugin's),
READY (the unit is active, which Type=notify grants only after READY=1;
without systemd: the service answers), /health,
episodes active/capacity, the creates waiting in its admission line
(queued/bound), and whether the configuration hash the service serves is
the one on disk. Then the helper (its isolation probes' verdict)
and leftovers: ledger records, mounts, cgroups, overlay uppers and agent-uid
processes that no live sandbox explains. Exit status 0 when everything is
as it should be, 1 otherwise (each problem is named), 2 on bad usage.
Below the table, each service's episodes per minute and the failure classes
they ended with over the last minutes, from its /metrics counters
(camg.serving.activity; the samples are kept in ``--state``). Then each service's
impossible variants (camg.config.variants): the fraction it mixes in and its
canary episodes of the last hour with their cheating rate, read from its
outcome log (root, or the services' group, may read it).

Reading only: it never starts a unit (the helper is asked only when it
already runs, so socket activation is not triggered) and changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from camg.episodes import canaries
from camg.sandboxes import census
from camg.serving import activity

HELPER_DEFAULTS = {
    "socket": "/run/camg/helper.sock",
    "state_dir": "/run/camg-helper",
    "upper_root": "/var/lib/camg/uppers",
    "agent_uid": 2000,
    "cgroup_parents": {},
}
CONTROLLERS = census.CONTROLLERS
SANDBOX_PATHS = ("/var/lib/camg/", "/run/camg-helper/")


def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system")


def unit_state(unit: str) -> str | None:
    """``active``, ``inactive``, ``failed``… or None without systemd."""
    if not systemd_running():
        return None
    out = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState", "-p", "SubState"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return f"{props.get('ActiveState', '?')}/{props.get('SubState', '?')}"


def get_json(url: str, timeout: float = 3.0) -> tuple[int | None, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, None
    except (OSError, ValueError) as exc:
        return None, str(exc)


def unit_name(env: str) -> str:
    """Its plugin's unit; one configured but no longer installed: the
    default name."""
    from camg import plugins
    from camg.errors import ConfigError

    try:
        return plugins.get(env).unit
    except ConfigError:
        return plugins.default_unit(env)


def environment_row(config_path: Path) -> dict:
    config = json.loads(config_path.read_text())
    env, port = config["environment"], config["port"]
    row: dict[str, Any] = {"environment": env, "port": port, "problems": []}
    unit = unit_name(env)
    state = unit_state(unit)
    # named even where no systemd gives its state: what to ask systemctl about
    row["unit_name"] = unit
    row["unit"] = state or "-"
    base = f"http://127.0.0.1:{port}"
    status, health = get_json(base + "/health")
    row["health"] = (health.get("status") if isinstance(health, dict) else None) or "unreachable"
    row["ready"] = state.startswith("active/") if state else status is not None
    episodes = health.get("episodes", {}) if isinstance(health, dict) else {}
    row["episodes"] = (
        f"{episodes['active']}/{episodes['capacity']}"
        if episodes
        else f"-/{config.get('capacity', '?')}"
    )
    # creates waiting for a slot / the line's bound (camg.episodes.admission)
    row["queue"] = (
        f"{episodes['queued']}/{episodes['queue_bound']}" if "queued" in episodes else "-"
    )
    served = health.get("config_hash") if isinstance(health, dict) else None
    row["auth"] = (health.get("auth") if isinstance(health, dict) else None) or "-"
    row["config_hash"] = config["config_hash"][:12]
    row["config"] = (
        "-"
        if served is None
        else "matches disk"
        if served == config["config_hash"]
        else f"serves {served[:12]} (disk {config['config_hash'][:12]})"
    )
    row["canaries"] = canary_row(config)
    if state is not None and not state.startswith("active/"):
        row["problems"].append(f"{unit} is {state}")
    if row["health"] != "healthy":
        reasons = health.get("reasons") if isinstance(health, dict) else health
        row["problems"].append(f"health {row['health']}: {reasons}")
    if served is not None and served != config["config_hash"]:
        row["problems"].append(
            "the service serves another configuration than the one on "
            f"disk: restart it (systemctl restart {unit})"
        )
    return row


def canary_row(config: dict) -> dict:
    """The mix fraction and the last hour's canary episodes of one service."""
    out: dict[str, Any] = {"fraction": config.get("canary_fraction", 0.0)}
    if not config.get("state_dir"):
        return {**out, "last_hour": None, "unreadable": "the config names no state_dir"}
    log = Path(config["state_dir"]) / "outcomes.jsonl"
    try:
        out["last_hour"] = canaries.recent(log)
    except FileNotFoundError:
        out["last_hour"] = canaries.tally([])
    except OSError as exc:
        out["last_hour"] = None
        out["unreadable"] = f"{log}: {exc.strerror}"
    return out


def describe_canaries(entry: dict | None) -> str:
    if not entry:
        return "-"
    head = f"fraction {entry['fraction']:g}; "
    if entry.get("last_hour") is None:
        return head + f"outcome log not readable ({entry.get('unreadable')})"
    return head + canaries.describe(entry["last_hour"])


def helper_config(etc: Path) -> dict:
    try:
        return {**HELPER_DEFAULTS, **json.loads((etc / "helper.json").read_text())}
    except (OSError, ValueError):
        return dict(HELPER_DEFAULTS)


def helper_row(config: dict) -> dict:
    state = unit_state("camg-helper.service")
    row: dict[str, Any] = {"unit": state or "-", "problems": []}
    running = (
        state.startswith("active/") or state.startswith("activating/")
        if state
        else os.path.exists(config["socket"])
    )
    row["running"] = bool(running)
    if not running:
        row["probes"] = "not running"
        return row
    try:
        from camg.helper_client import HelperClient

        ping = HelperClient(config["socket"]).ping()
        row["probes"] = "passed" if ping.get("probes_ok") else f"failing: {ping}"
        if not ping.get("probes_ok"):
            row["problems"].append(f"helper isolation probes failing: {ping}")
    except Exception as exc:  # reported, whatever it is
        row["probes"] = f"unreachable: {exc}"
        row["problems"].append(f"helper unreachable on {config['socket']}: {exc}")
    return row


def helper_cgroup_dirs(config: dict) -> list[Path]:
    parents = config.get("cgroup_parents") or {}
    dirs = []
    for c in CONTROLLERS:
        if c in parents:
            dirs.append(Path(parents[c]))
        else:
            dirs += [
                Path(f"/sys/fs/cgroup/{c}/camg"),
                Path(f"/sys/fs/cgroup/{c}/system.slice/camg-helper.service"),
            ]
    return dirs


def leftovers(config: dict, helper_running: bool) -> dict[str, list[str]]:
    """What sandboxes left: everything when the helper is down; agent
    processes and uppers beyond the ledger's records when it runs."""
    found: dict[str, list[str]] = {}
    held = census.holdings(config, helper_cgroup_dirs(config), SANDBOX_PATHS)
    ledger, uppers = held["ledger records"], held["uppers"]
    agent = subprocess.run(
        ["ps", "-u", str(config["agent_uid"]), "-o", "pid=,args="], capture_output=True, text=True
    ).stdout.split("\n")
    agent = [line.strip() for line in agent if line.strip()]
    mounts, cgroups = held["mounts"], held["cgroups"]
    if helper_running:
        if len(uppers) > len(ledger):
            found["uppers beyond the ledger"] = uppers
        if agent and not ledger:
            found["agent processes without a sandbox"] = agent
    else:
        for name, items in (
            ("ledger records", ledger),
            ("uppers", uppers),
            ("agent processes", agent),
            ("mounts", mounts),
            ("cgroups", cgroups),
        ):
            if items:
                found[name] = items
    return found


def collect(etc: Path, state: Path | None = None, sample_s: float = activity.SAMPLE_S) -> dict:
    prepared = etc / "prepared"
    configs = sorted(p for p in prepared.glob("*.json") if p.stem not in ("routes", "schedule"))
    envs = [environment_row(p) for p in configs]
    rates = activity.collect(
        {r["environment"]: r["port"] for r in envs}, state or activity.default_state(), sample_s
    )
    for row in envs:
        row["activity"] = rates.get(row["environment"])
    hconf = helper_config(etc)
    helper = helper_row(hconf)
    left = leftovers(hconf, helper["running"]) if os.geteuid() == 0 else {}
    problems = [f"{r['environment']}: {p}" for r in envs for p in r["problems"]]
    problems += [f"helper: {p}" for p in helper["problems"]]
    problems += [
        f"leftover {kind}: {', '.join(items[:5])}" + (" …" if len(items) > 5 else "")
        for kind, items in left.items()
    ]
    if not configs:
        problems.append(f"no configured environment in {prepared} (run packaging/install.sh)")
    return {
        "systemd": systemd_running(),
        "environments": envs,
        "helper": helper,
        "leftovers": left,
        "leftovers_checked": os.geteuid() == 0,
        "problems": problems,
    }


def render(report: dict) -> str:
    cols = ("environment", "port", "unit", "ready", "health", "episodes", "queue", "auth", "config")
    rows = [
        [str(r[c] if c != "ready" else ("yes" if r["ready"] else "no")) for c in cols]
        for r in report["environments"]
    ]
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)
    ]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("")
    lines.append("last minutes (from each service's /metrics):")
    lines += [
        f"  {r['environment']}: {activity.describe(r.get('activity'))}"
        for r in report["environments"]
    ]
    lines.append("")
    lines.append("impossible variants, last hour (from each service's outcome log):")
    lines += [
        f"  {r['environment']}: {describe_canaries(r.get('canaries'))}"
        for r in report["environments"]
    ]
    h = report["helper"]
    lines.append("")
    lines.append(f"helper: unit {h['unit']}, isolation probes {h['probes']}")
    if not report["leftovers_checked"]:
        lines.append("leftovers: not checked (run as root)")
    else:
        lines.append(
            "leftovers: "
            + (
                "none"
                if not report["leftovers"]
                else "; ".join(f"{k}: {len(v)}" for k, v in report["leftovers"].items())
            )
        )
    if not report["systemd"]:
        lines.append("(systemd is not PID 1: READY means the service answers)")
    lines.append("")
    lines += (
        (["problems:"] + [f"  - {p}" for p in report["problems"]])
        if report["problems"]
        else ["all well"]
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="camg status", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--etc",
        type=Path,
        default=Path("/etc/camg"),
        help="the installation's configuration directory",
    )
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument(
        "--state",
        type=Path,
        default=None,
        help="the samples kept between runs for the per-minute rates "
        f"(default ${activity.STATE_VARIABLE} or "
        "~/.local/state/camg/status-samples.json)",
    )
    parser.add_argument(
        "--sample-s",
        type=float,
        default=activity.SAMPLE_S,
        help="without an earlier sample, scrape again after this many seconds (0: show no rate)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.sample_s <= 60:
        parser.error("--sample-s must be within [0, 60]")
    report = collect(args.etc, args.state, args.sample_s)
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 1 if report["problems"] else 0


def cli(argv: list[str] | None = None) -> int:
    """The ``camg`` console script: ``camg status ...``, ``camg audit ...``
    (camg.host_audit: the host's modes of what is private) and ``camg
    trainer ...`` (camg.trainers_cli: who may use the services)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: camg status [--etc DIR] [--json] [--state FILE] [--sample-s S]\n"
            "       camg audit [--etc DIR] [--path PATH ...] [--quiet | --json]\n"
            "       camg trainer add|list|revoke ..."
        )
        return 0 if argv else 2
    if argv[0] == "audit":
        from camg import host_audit

        return host_audit.main(argv[1:])
    if argv[0] == "trainer":
        from camg import trainers_cli

        return trainers_cli.main(argv[1:])
    if argv[0] != "status":
        print(f"camg: unknown command {argv[0]!r} (known: status, audit, trainer)", file=sys.stderr)
        return 2
    return main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
