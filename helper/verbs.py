"""The helper's closed set of verbs: typed parameters and one handler each.

Parameters are frozen dataclasses parsed strictly (unknown or mistyped
fields are a bad_request naming the field); every value is checked against
the configured ceilings before anything is created or run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

from camg.helper_wire import PREFIX, TIMEOUT_MARKER, TRUNCATION_MARKER, WireError, parse
from helper import container_verbs, paths
from helper.sandbox_table import Peer, Registry, SandboxSpec

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# File transfers are bounded by their own deadline, not the agent's.
_ARCHIVE_TIMEOUT = 300.0


class BadParams(WireError):
    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


@dataclasses.dataclass(frozen=True)
class NoParams:
    pass


CreateSandboxParams = SandboxSpec


@dataclasses.dataclass(frozen=True)
class ExecParams:
    sandbox_id: str
    command: str
    user: Literal["agent", "root"] = "agent"
    cwd: str = "/"
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    timeout: float = 60.0
    output_limit: int = 12000


@dataclasses.dataclass(frozen=True)
class PutArchiveParams:
    sandbox_id: str
    dest_dir: str
    user: Literal["agent", "root"] = "root"


@dataclasses.dataclass(frozen=True)
class GetArchiveParams:
    sandbox_id: str
    path: str


@dataclasses.dataclass(frozen=True)
class SandboxParams:
    sandbox_id: str


Result = tuple[dict, bytes]


@dataclasses.dataclass(frozen=True)
class Verb:
    name: str
    params: type
    handler: Callable[..., Result]
    doc: str
    blob_in: str = ""
    blob_out: str = ""


class Context:
    """What handlers reach: the registry and the probe runner."""

    def __init__(self, registry: Registry, run_probes: Callable[[], dict]) -> None:
        self.registry = registry
        self.run_probes = run_probes


def _identity(ctx: Context, user: str) -> tuple[int, int, dict[str, str]]:
    cfg = ctx.registry.config
    if user == "agent":
        name, home = cfg.agent_user, cfg.agent_home
        return cfg.agent_uid, cfg.agent_gid, {"HOME": home, "USER": name, "LOGNAME": name}
    return 0, 0, {"HOME": "/root", "USER": "root", "LOGNAME": "root"}


def _check_env(ctx: Context, env: Mapping[str, str]) -> None:
    if len(env) > ctx.registry.config.ceilings.env_entries:
        raise WireError("limit_exceeded", f"env: at most {ctx.registry.config.ceilings.env_entries} entries")
    for k, v in env.items():
        if not _ENV_NAME.match(k) or "\0" in v or len(v) > 65536:
            raise WireError("bad_request", f"env: invalid entry {k[:64]!r}")


def ping(ctx: Context, peer: Peer, p: NoParams, blob: bytes) -> Result:
    failure = ctx.registry.probe_failure
    return {"uid": peer.uid, "owner": peer.owner, "probes_ok": failure is None,
            "probe_failure": failure, "instance": container_verbs.INSTANCE}, b""


def probe(ctx: Context, peer: Peer, p: NoParams, blob: bytes) -> Result:
    return ctx.run_probes(), b""


def create_sandbox(ctx: Context, peer: Peer, p: CreateSandboxParams, blob: bytes) -> Result:
    sandbox = ctx.registry.create(peer, p)
    return {"sandbox_id": sandbox.id}, b""


def exec_(ctx: Context, peer: Peer, p: ExecParams, blob: bytes) -> Result:
    c = ctx.registry.config.ceilings
    if "\0" in p.command or len(p.command.encode()) > c.command_bytes:
        raise WireError("limit_exceeded" if "\0" not in p.command else "bad_request",
                        f"command: must be at most {c.command_bytes} bytes without NUL")
    if not 0 < p.timeout <= c.timeout:
        raise WireError("limit_exceeded", f"timeout: must be within (0, {c.timeout}]")
    # At least one byte: the tail kept is the final output_limit bytes, and
    # a zero limit once meant "keep everything" to the ring's trimming.
    if not 1 <= p.output_limit <= c.output_bytes:
        raise WireError("limit_exceeded", f"output_limit: must be within [1, {c.output_bytes}]")
    cwd = paths.sandbox_path(p.cwd, "cwd")
    _check_env(ctx, p.env)
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    uid, gid, ident = _identity(ctx, p.user)
    env = {"PATH": PATH, **ident, **p.env}
    r = sandbox.run(["/bin/bash", "-c", p.command], uid=uid, gid=gid, cwd=cwd, env=env,
                    stdin=blob, timeout=p.timeout, output_limit=p.output_limit)
    text = r.output.decode("utf-8", "replace")
    truncated = r.total > p.output_limit
    if truncated:
        text = TRUNCATION_MARKER.format(limit=p.output_limit) + text
    if r.timed_out:
        text += TIMEOUT_MARKER
    return {"exit_code": r.exit_code, "output": text, "truncated": truncated,
            "timed_out": r.timed_out, "duration": round(r.duration, 6)}, b""


def put_archive(ctx: Context, peer: Peer, p: PutArchiveParams, blob: bytes) -> Result:
    dest = paths.sandbox_path(p.dest_dir, "dest_dir")
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    uid, gid, ident = _identity(ctx, p.user)
    # tar runs inside the sandbox's own root: no member or symlink in the
    # stream can reach anything outside it.
    script = 'mkdir -p -- "$1" && exec tar -x -f - -C "$1"'
    r = sandbox.run(["/bin/sh", "-c", script, "sh", dest], uid=uid, gid=gid, cwd="/",
                    env={"PATH": PATH, **ident}, stdin=blob, timeout=_ARCHIVE_TIMEOUT,
                    output_limit=4096)
    if r.exit_code != 0:
        raise WireError("bad_request", f"extracting into {dest} failed: "
                        f"{r.output.decode(errors='replace').strip()}")
    return {"bytes": len(blob)}, b""


def get_archive(ctx: Context, peer: Peer, p: GetArchiveParams, blob: bytes) -> Result:
    path = paths.sandbox_path(p.path, "path")
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    parent, name = os.path.split(path) if path != "/" else ("/", ".")
    r = sandbox.run(["tar", "-c", "-f", "-", "-C", parent, "--", name], uid=0, gid=0, cwd="/",
                    env={"PATH": PATH, "HOME": "/root"}, stdin=b"", timeout=_ARCHIVE_TIMEOUT,
                    output_limit=4096, capture_limit=ctx.registry.config.ceilings.archive_bytes)
    if r.exit_code != 0:
        message = r.output.decode(errors="replace").strip()
        kind = "not_found" if "No such file" in message or "Cannot stat" in message else "bad_request"
        raise WireError(kind, f"archiving {path} failed: {message}")
    return {"bytes": len(r.stdout)}, r.stdout


def destroy_sandbox(ctx: Context, peer: Peer, p: SandboxParams, blob: bytes) -> Result:
    try:
        sandbox = ctx.registry.get(peer, p.sandbox_id)
    except WireError as exc:
        if exc.name == "not_found":
            return {"destroyed": False}, b""  # idempotent: already gone
        raise
    return {"destroyed": ctx.registry.destroy(sandbox)}, b""


def release_all(ctx: Context, peer: Peer, p: NoParams, blob: bytes) -> Result:
    n = sum(ctx.registry.destroy(s) for s in ctx.registry.mine(peer))
    return {"released": n, "containers": container_verbs.release_for(ctx, peer)}, b""


def list_sandboxes(ctx: Context, peer: Peer, p: NoParams, blob: bytes) -> Result:
    out = [{"sandbox_id": s.id, "created_at": s.record.created_at, "alive": s.alive(),
            "lowers": s.record.lowers, "upper": "disk" if s.record.upper_dir else "tmpfs"}
           for s in ctx.registry.mine(peer)]
    return {"sandboxes": out}, b""


VERBS: dict[str, Verb] = {v.name: v for v in (
    Verb(PREFIX + "Ping", NoParams, ping, "Liveness, the caller's identity, probe state."),
    Verb(PREFIX + "Probe", NoParams, probe, "Run the isolation probes now; creation is refused while any fails."),
    Verb(PREFIX + "CreateSandbox", CreateSandboxParams, create_sandbox,
         "New sandbox over lowers (bottom-first) -> sandbox_id."),
    Verb(PREFIX + "Exec", ExecParams, exec_, "Run a bash command -> exit_code, output, truncated, "
         "timed_out, duration.", blob_in="stdin"),
    Verb(PREFIX + "PutArchive", PutArchiveParams, put_archive, "Extract a tar stream into dest_dir.",
         blob_in="tar"),
    Verb(PREFIX + "GetArchive", GetArchiveParams, get_archive, "A tar stream of path.", blob_out="tar"),
    Verb(PREFIX + "DestroySandbox", SandboxParams, destroy_sandbox, "Kill and remove (idempotent)."),
    Verb(PREFIX + "ReleaseAll", NoParams, release_all, "Destroy every sandbox of the caller."),
    Verb(PREFIX + "ListSandboxes", NoParams, list_sandboxes, "The caller's sandboxes."),
)}
# The container mediator's verbs (helper/container_verbs.py).
VERBS.update({PREFIX + n: Verb(PREFIX + n, NoParams if prm == "NoParams" else prm, h, doc, bi, bo)
              for n, prm, h, doc, bi, bo in container_verbs.TABLE})


def dispatch(ctx: Context, peer: Peer, verb: object, params: object, blob: bytes) -> Result:
    if not isinstance(verb, str) or verb not in VERBS:
        raise WireError("unknown_verb", f"unknown verb {str(verb)[:100]!r}")
    spec = VERBS[verb]
    if blob and not spec.blob_in:
        raise WireError("bad_request", f"{verb} takes no blob")
    parsed = parse(spec.params, {} if params is None else params, "params", BadParams)
    return spec.handler(ctx, peer, parsed, blob)


def describe() -> list[dict]:
    """The interface, for ``camg-helper --list-verbs``."""
    out = []
    for verb in VERBS.values():
        hints = typing.get_type_hints(verb.params)
        fields = []
        for f in dataclasses.fields(verb.params):
            entry = {"name": f.name, "type": _type_name(hints[f.name])}
            if f.default is not dataclasses.MISSING:
                entry["default"] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                entry["default"] = dict(f.default_factory())
            else:
                entry["required"] = True
            fields.append(entry)
        out.append({"verb": verb.name, "doc": verb.doc, "params": fields,
                    "blob_in": verb.blob_in or None, "blob_out": verb.blob_out or None})
    return out


def _type_name(tp: object) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))
