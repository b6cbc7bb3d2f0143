"""``camg audit`` (also ``python -m camg.host_audit``): is what is private in
the sandbox private on the host?

    camg audit [--etc /etc/camg] [--path PATH ...] [--quiet | --json]

Lists every private path of the deployment with its owner, group and mode,
and exits 1 naming each world-readable or world-writable one (2 on bad
usage or an unreadable configuration); ``--quiet`` prints the findings
alone, or one line when there are none. The paths come from the installed
configuration, not from a list of its own:

* ``<etc>/deployment.json``: the state root (task layers, task packages,
  records, the outcome signing key);
* each ``<etc>/prepared/<env>.json``: the service's state directory, its
  outcome signing key, the prepared data beside its manifest (rows,
  mirrors, references, gold patches, oracle files) and every setting named
  ``*_root`` or ``*_dir`` that is an absolute path (task layers, packages,
  workspaces, private answers, indexes), the settings class's defaults
  included;
* ``<etc>/helper.json``: the helper's ``private_roots``;
* ``<etc>/trainers.json`` and ``<etc>/credentials`` where they exist;
* ``--path``: trees the installer made that no configuration names (the
  demo build cache).

"World" means a user who is neither the owner nor in the group: a path is
a finding when such a user can reach it (every directory above it lets
others pass, ``o+x``) and read (``o+r``; for a directory, list) or write it
(``o+w``). So a private directory closes its whole tree, and the files in
it keep whatever modes the sandbox needs (the helper mounts layers as root;
inside, the agent uid reads through the files' own "other" bits). ACLs are
not read.
"""

from __future__ import annotations

import argparse
import dataclasses
import grp
import json
import os
import pwd
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from camg.errors import ConfigError

#: How many findings the text report names before it counts the rest.
SHOWN_FINDINGS = 50
#: Settings that name a tree of an environment's data (camg.configure
#: passes them through as given; the settings classes give the defaults).
PRIVATE_SETTING_SUFFIXES = ("_root", "_dir")


@dataclasses.dataclass(frozen=True)
class Entry:
    path: str
    what: str
    owner: str = "-"
    mode: str = "-"
    verdict: str = "absent"


def _name(lookup, ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def _owner(st: os.stat_result) -> str:
    return f"{_name(pwd.getpwuid, st.st_uid)}:{_name(grp.getgrgid, st.st_gid)}"


def _load(path: Path, what: str) -> dict:
    try:
        body = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{what} {path} is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{what} {path} is not a JSON object")
    return body


def _setting_defaults(environment: str, factory: str | None) -> dict:
    """The settings class's defaults (a default layers root is not in the
    config); none when the environment is not registered here."""
    from camg import plugins

    try:
        known = plugins.all_plugins()
    except ConfigError:
        return {}
    plugin = known.get(environment)
    if factory and (plugin is None or plugin.factory != factory):
        plugin = next((p for p in known.values() if p.factory == factory), plugin)
    if plugin is None:
        return {}
    fields = dataclasses.fields(plugins.resolve(plugin.settings))
    return {f.name: f.default for f in fields if isinstance(f.default, str)}


def private_paths(etc: Path, extra: Sequence[Path] = ()) -> dict[str, str]:
    """Every private path the installation under ``etc`` names: path -> what."""
    found: dict[str, str] = {}

    def add(path: object, what: str) -> None:
        if isinstance(path, str) and os.path.isabs(path):
            found.setdefault(os.path.normpath(path), what)

    deployment = _load(etc / "deployment.json", "deployment")
    add(deployment.get("state_root"), "state root")
    prepared = etc / "prepared"
    for config in sorted(prepared.glob("*.json")) if prepared.is_dir() else ():
        body = _load(config, "service config")
        env = body.get("environment")
        if not isinstance(env, str):
            continue  # routes.json, schedule.json: no environment's
        add(body.get("state_dir"), f"{env}: state directory")
        key = (body.get("outcome_key") or {}).get("path")
        if isinstance(key, str):
            add(str(Path(key).parent), "outcome signing key's directory")
            add(key, "outcome signing key")
        manifest = (body.get("manifest") or {}).get("path")
        if isinstance(manifest, str):
            add(str(Path(manifest).parent), f"{env}: prepared data (beside its manifest)")
        settings = {**_setting_defaults(env, body.get("factory")), **(body.get("settings") or {})}
        for name, value in sorted(settings.items()):
            if name.endswith(PRIVATE_SETTING_SUFFIXES):
                add(value, f"{env}: {name}")
    helper = etc / "helper.json"
    if helper.is_file():
        for root in _load(helper, "helper config").get("private_roots") or ():
            add(root, "helper private root")
    for path, what in (
        (etc / "trainers.json", "trainers' tokens"),
        (etc / "credentials", "judge credentials"),
    ):
        if path.exists():
            add(str(path), what)
    for path in extra:
        add(str(Path(path).absolute()), "named on the command line")
    return found


def _others_pass(path: Path) -> bool:
    """Whether a user who is neither owner nor in the group can walk from /
    down to ``path``'s directory."""
    for parent in reversed(path.parents):
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _exposed(st: os.stat_result) -> str | None:
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return None  # symlinks, whiteouts, sockets: no content of their own
    mode = st.st_mode
    kinds = [k for k, bit in (("readable", stat.S_IROTH), ("writable", stat.S_IWOTH)) if mode & bit]
    return "world-" + " and ".join(kinds) if kinds else None


def _finding(path: str, st: os.stat_result, why: str) -> str:
    return f"{path} ({_owner(st)} {stat.S_IMODE(st.st_mode):04o}) is {why}"


def _walk(root: Path) -> Iterator[str]:
    """The findings in the tree at ``root`` (which others can reach): every
    entry others can read or write, below every directory they can pass."""
    st = os.stat(root)
    why = _exposed(st)
    if why:
        yield _finding(str(root), st, why)
    if not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IXOTH):
        return
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            why = _exposed(est)
            if why:
                yield _finding(entry.path, est, why)
            if stat.S_ISDIR(est.st_mode) and est.st_mode & stat.S_IXOTH:
                stack.append(entry.path)


def audit(paths: dict[str, str]) -> tuple[list[Entry], list[str]]:
    """One entry per private path and the findings (each named once)."""
    entries, findings, seen = [], [], set()
    for raw, what in paths.items():
        path = Path(raw)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            entries.append(Entry(raw, what))
            continue
        except OSError as exc:
            entries.append(Entry(raw, what, verdict=f"unreadable: {exc.strerror}"))
            continue
        real = Path(os.path.realpath(path))
        found = [f for f in _walk(real) if f not in seen] if _others_pass(real) else []
        seen.update(found)
        findings += found
        entries.append(
            Entry(
                raw,
                what,
                _owner(st),
                f"{stat.S_IMODE(st.st_mode):04o}",
                f"{len(found)} finding(s)" if found else "private",
            )
        )
    return entries, findings


def render(entries: list[Entry], findings: list[str], quiet: bool = False) -> str:
    width = max([len(e.path) for e in entries] + [4])
    lines = [] if quiet else [f"{'PATH':{width}}  {'OWNER':17}  MODE  {'VERDICT':12}  WHAT"]
    lines += (
        []
        if quiet
        else [
            f"{e.path:{width}}  {e.owner:17}  {e.mode:4}  {e.verdict:12}  {e.what}" for e in entries
        ]
    )
    if not findings:
        return "\n".join(
            lines
            + [f"camg audit: {len(entries)} private paths, no world-readable or world-writable one"]
        )
    lines.append(f"findings ({len(findings)}):")
    lines += [f"  - {f}" for f in findings[:SHOWN_FINDINGS]]
    if len(findings) > SHOWN_FINDINGS:
        lines.append(f"  ... and {len(findings) - SHOWN_FINDINGS} more")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="camg audit", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--etc",
        type=Path,
        default=Path("/etc/camg"),
        help="the installation's configuration directory",
    )
    parser.add_argument(
        "--path",
        type=Path,
        action="append",
        default=[],
        help="one more private tree (repeatable), e.g. the demo build cache",
    )
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="the report as JSON")
    shown.add_argument("--quiet", action="store_true", help="the findings only")
    args = parser.parse_args(argv)
    try:
        entries, findings = audit(private_paths(args.etc, args.path))
    except ConfigError as exc:
        print(f"camg audit: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {"paths": [dataclasses.asdict(e) for e in entries], "findings": findings}, indent=1
            )
        )
    else:
        print(render(entries, findings, args.quiet))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
