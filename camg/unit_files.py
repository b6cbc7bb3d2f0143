"""An environment's systemd unit, made from its descriptor (camg.plugins).

Every environment unit has one frame: its name decides ``CAMG_ENV``, HOME
(its state directory), ``StateDirectory=`` and ``SyslogIdentifier=``; the
settings all share (Type=notify, User=camg, hardening, loopback only, the
ExecStopPost= release) are units/camg-environment.conf, installed as each
unit's drop-in 10-environment.conf. What an environment needs beyond that
is its plugin's: ``unit_service`` lines and ``unit_dropins``. So a new
environment package gets a unit without a file outside its package.

    python -m camg.unit_files --unitdir DIR --shared units/camg-environment.conf [NAME ...]

writes each named (default: every registered) environment's unit and its
drop-ins under DIR (install.sh does, into /usr/local/lib/systemd/system).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from camg import plugins
from camg.atomic import write_text
from camg.errors import ConfigError

SHARED_DROPIN = "10-environment.conf"


def unit_text(plugin: plugins.EnvironmentPlugin) -> str:
    name, unit = plugin.name, plugin.unit
    lines = [
        f"# camg {name} environment on 127.0.0.1:{plugin.port}, made from its plugin",
        "# (camg.unit_files). Shared settings (Type=notify, User=camg, hardening,",
        "# loopback-only, ExecStopPost release) come from camg-environment.conf,",
        f"# installed as {unit}.d/{SHARED_DROPIN}.",
        "[Unit]",
        f"Description=camg {name} environment: {plugin.title or name}",
        "",
        "[Service]",
        "# HOME is the state directory: libraries that cache under ~ get a writable one.",
        f"Environment=CAMG_ENV={name} HOME=/var/lib/camg/{name}",
        f"StateDirectory=camg/{name}",
        f"SyslogIdentifier={unit.removesuffix('.service')}",
        *plugin.unit_service,
        "",
        "[Install]",
        "WantedBy=camg.target",
    ]
    return "\n".join(lines) + "\n"


def dropins(plugin: plugins.EnvironmentPlugin) -> dict[str, str]:
    """Its own drop-ins: file name -> text (the shared one is not among them)."""
    return {
        name: text if text.endswith("\n") else text + "\n" for name, text in plugin.unit_dropins
    }


def write(plugin: plugins.EnvironmentPlugin, unitdir: Path, shared: Path) -> list[Path]:
    """The unit, the shared drop-in and its own ones under ``unitdir``, each
    0644; drop-ins of an earlier install that the plugin no longer names go."""
    unit = unitdir / plugin.unit
    write_text(unit, unit_text(plugin), mode=0o644)
    conf = unitdir / f"{plugin.unit}.d"
    conf.mkdir(mode=0o755, exist_ok=True)
    written = [unit, conf / SHARED_DROPIN]
    shutil.copyfile(shared, written[-1])
    os.chmod(written[-1], 0o644)
    own = dropins(plugin)
    for name, text in own.items():
        written.append(conf / name)
        write_text(written[-1], text, mode=0o644)
    for stale in conf.glob("[0-9][0-9]-*.conf"):
        if stale.name != SHARED_DROPIN and stale.name not in own:
            stale.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m camg.unit_files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--unitdir", required=True, type=Path)
    parser.add_argument(
        "--shared",
        required=True,
        type=Path,
        help="the shared drop-in (units/camg-environment.conf)",
    )
    parser.add_argument("names", nargs="*", help="environments (default: every registered one)")
    args = parser.parse_args(argv)
    try:
        registered = plugins.all_plugins()
        unknown = sorted(set(args.names) - set(registered))
        if unknown:
            raise ConfigError(f"not registered: {', '.join(unknown)}")
        if not args.shared.is_file():
            raise ConfigError(f"{args.shared}: the shared drop-in is missing")
        for name in args.names or list(registered):
            write(registered[name], args.unitdir, args.shared)
    except (ConfigError, OSError) as exc:
        print(f"camg.unit_files: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
