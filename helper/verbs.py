"""The helper's closed set of verbs: one table row and one handler each.

Every verb's parameters are the frozen dataclass camg.helper_wire.PARAMS
names, parsed strictly (unknown or mistyped fields are a bad_request naming
the field); every value is checked against the configured ceilings before
anything is created or run. The sandbox handlers are here, the container
mediator's in helper/container_verbs.py; both register in VERBS below.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable
from typing import Any, Literal

from camg import helper_wire as wire
from camg.helper_wire import WireError, parse
from helper import commands, paths, usage
from helper import container_verbs as cv
from helper.commands import PATH
from helper.sandbox_table import Peer, Registry

# File transfers are bounded by their own deadline, not the agent's.
_ARCHIVE_TIMEOUT = 300.0


class BadParams(WireError):
    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


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


def ping(ctx: Context, peer: Peer, p: wire.NoParams, blob: bytes) -> Result:
    failure = ctx.registry.probe_failure
    return {
        "uid": peer.uid,
        "owner": peer.owner,
        "probes_ok": failure is None,
        "probe_failure": failure,
        "instance": cv.INSTANCE,
        "warm_uppers": ctx.registry.warm_uppers.status(),
        "container_starts": cv.start_status(ctx),
    }, b""


def probe(ctx: Context, peer: Peer, p: wire.NoParams, blob: bytes) -> Result:
    return ctx.run_probes(), b""


def create_sandbox(ctx: Context, peer: Peer, p: wire.CreateSandboxParams, blob: bytes) -> Result:
    sandbox = ctx.registry.create(peer, p)
    return {"sandbox_id": sandbox.id}, b""


def exec_(ctx: Context, peer: Peer, p: wire.ExecParams, blob: bytes) -> Result:
    commands.check_exec(p.command, p, ctx.registry.config.ceilings)
    cwd = paths.sandbox_path(p.cwd, "cwd")
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    uid, gid, ident = _identity(ctx, p.user)
    env = {"PATH": PATH, **ident, **p.env}
    r = sandbox.run(
        ["/bin/bash", "-c", p.command],
        uid=uid,
        gid=gid,
        cwd=cwd,
        env=env,
        stdin=blob,
        timeout=p.timeout,
        output_limit=p.output_limit,
    )
    return commands.exec_reply(
        r.exit_code, r.output, r.total, r.timed_out, r.duration, p.output_limit
    ), b""


def put_archive(ctx: Context, peer: Peer, p: wire.PutArchiveParams, blob: bytes) -> Result:
    dest = paths.sandbox_path(p.dest_dir, "dest_dir")
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    uid, gid, ident = _identity(ctx, p.user)
    # tar runs inside the sandbox's own root: no member or symlink in the
    # stream can reach anything outside it.
    script = 'mkdir -p -- "$1" && exec tar -x -f - -C "$1"'
    r = sandbox.run(
        ["/bin/sh", "-c", script, "sh", dest],
        uid=uid,
        gid=gid,
        cwd="/",
        env={"PATH": PATH, **ident},
        stdin=blob,
        timeout=_ARCHIVE_TIMEOUT,
        output_limit=4096,
    )
    if r.exit_code != 0:
        raise WireError(
            "bad_request",
            f"extracting into {dest} failed: {r.output.decode(errors='replace').strip()}",
        )
    return {"bytes": len(blob)}, b""


def get_archive(ctx: Context, peer: Peer, p: wire.GetArchiveParams, blob: bytes) -> Result:
    path = paths.sandbox_path(p.path, "path")
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    parent, name = os.path.split(path) if path != "/" else ("/", ".")
    r = sandbox.run(
        ["tar", "-c", "-f", "-", "-C", parent, "--", name],
        uid=0,
        gid=0,
        cwd="/",
        env={"PATH": PATH, "HOME": "/root"},
        stdin=b"",
        timeout=_ARCHIVE_TIMEOUT,
        output_limit=4096,
        capture_limit=ctx.registry.config.ceilings.archive_bytes,
    )
    if r.exit_code != 0:
        message = r.output.decode(errors="replace").strip()
        kind = (
            "not_found" if "No such file" in message or "Cannot stat" in message else "bad_request"
        )
        raise WireError(kind, f"archiving {path} failed: {message}")
    return {"bytes": len(r.stdout)}, r.stdout


def destroy_sandbox(ctx: Context, peer: Peer, p: wire.SandboxParams, blob: bytes) -> Result:
    try:
        sandbox = ctx.registry.get(peer, p.sandbox_id)
    except WireError as exc:
        if exc.name == "not_found":
            return {"destroyed": False}, b""  # idempotent: already gone
        raise
    return {"destroyed": ctx.registry.destroy(sandbox)}, b""


def release_all(ctx: Context, peer: Peer, p: wire.NoParams, blob: bytes) -> Result:
    n = sum(ctx.registry.destroy(s) for s in ctx.registry.mine(peer))
    return {"released": n, "containers": cv.release_for(ctx, peer)}, b""


def list_sandboxes(ctx: Context, peer: Peer, p: wire.NoParams, blob: bytes) -> Result:
    out = [
        {
            "sandbox_id": s.id,
            "created_at": s.record.created_at,
            "alive": s.alive(),
            "lowers": s.record.lowers,
            "upper": "disk" if s.record.upper_dir else "tmpfs",
        }
        for s in ctx.registry.mine(peer)
    ]
    return {"sandboxes": out}, b""


def sandbox_usage(ctx: Context, peer: Peer, p: wire.SandboxParams, blob: bytes) -> Result:
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    return usage.sandbox_usage(sandbox.record.cgroups, sandbox.record.upper_dir), b""


def fork_sandbox(ctx: Context, peer: Peer, p: wire.ForkSandboxParams, blob: bytes) -> Result:
    # Someone else's sandbox is not_found, as for every verb.
    parent = ctx.registry.get(peer, p.sandbox_id)
    _child, reply = ctx.registry.fork(peer, parent)
    return reply, b""


def kill_commands(ctx: Context, peer: Peer, p: wire.SandboxParams, blob: bytes) -> Result:
    sandbox = ctx.registry.get(peer, p.sandbox_id)
    if not sandbox.alive():
        raise WireError("sandbox_died", f"sandbox {sandbox.id} is dead")
    return {"killed": sandbox.kill_all_but_init()}, b""


def _verb(
    name: str,
    params: type,
    handler: Callable[..., Result],
    doc: str,
    *,
    blob_in: str = "",
    blob_out: str = "",
) -> Verb:
    return Verb(wire.PREFIX + name, params, handler, doc, blob_in, blob_out)


VERBS: dict[str, Verb] = {
    v.name: v
    for v in (
        _verb(
            "Ping",
            wire.NoParams,
            ping,
            "Liveness, the caller's identity, probe state, the warm-upper pool, "
            "container creates/starts in flight and waiting.",
        ),
        _verb(
            "Probe",
            wire.NoParams,
            probe,
            "Run the isolation probes now; creation is refused while any fails.",
        ),
        _verb(
            "CreateSandbox",
            wire.CreateSandboxParams,
            create_sandbox,
            "New sandbox over lowers (bottom-first) -> sandbox_id.",
        ),
        _verb(
            "Exec",
            wire.ExecParams,
            exec_,
            "Run a bash command -> exit_code, output, truncated, timed_out, duration.",
            blob_in="stdin",
        ),
        _verb(
            "PutArchive",
            wire.PutArchiveParams,
            put_archive,
            "Extract a tar stream into dest_dir.",
            blob_in="tar",
        ),
        _verb(
            "GetArchive",
            wire.GetArchiveParams,
            get_archive,
            "A tar stream of path.",
            blob_out="tar",
        ),
        _verb(
            "DestroySandbox", wire.SandboxParams, destroy_sandbox, "Kill and remove (idempotent)."
        ),
        _verb(
            "ReleaseAll",
            wire.NoParams,
            release_all,
            "Destroy every sandbox (and container) of the caller.",
        ),
        _verb("ListSandboxes", wire.NoParams, list_sandboxes, "The caller's sandboxes."),
        _verb(
            "SandboxUsage",
            wire.SandboxParams,
            sandbox_usage,
            "What the sandbox cost so far -> cpu_s, "
            "memory_peak_bytes, disk_written_bytes (its upper), pids_peak where the kernel has it.",
        ),
        _verb(
            "ForkSandbox",
            wire.ForkSandboxParams,
            fork_sandbox,
            "A new sandbox over this one's filesystem as it stands (its upper frozen as a shared "
            "read-only layer, a fresh upper each side; processes are not carried) -> sandbox_id, "
            "depth, upper_bytes.",
        ),
        _verb(
            "KillCommands",
            wire.SandboxParams,
            kill_commands,
            "Kill every process of the sandbox but its init, from outside (freezer cgroup), and "
            "wait until they are gone -> killed (idempotent: 0 when none was left).",
        ),
        # The container mediator (helper/container_verbs.py, helper/containers.py).
        _verb(
            "ContainerPull",
            wire.ContainerPullParams,
            cv.container_pull,
            "Pull a manifest image by digest -> image_id.",
        ),
        _verb(
            "ContainerCreate",
            wire.ContainerCreateParams,
            cv.container_create,
            "Create and start a container (init, no network, bounded) -> container_id.",
        ),
        _verb(
            "ContainerConnect",
            wire.ContainerConnectParams,
            cv.container_connect,
            "A TCP socket connected to 127.0.0.1:port inside the container, passed as a file "
            "descriptor (SCM_RIGHTS).",
            blob_out="fd",
        ),
        _verb(
            "ContainerExec",
            wire.ContainerExecParams,
            cv.container_exec,
            "Run a sh command -> exit_code, output, truncated, timed_out, duration.",
            blob_in="stdin",
        ),
        _verb(
            "ContainerPutArchive",
            wire.ContainerPutArchiveParams,
            cv.container_put_archive,
            "Extract a tar stream into an existing dest_dir.",
            blob_in="tar",
        ),
        _verb(
            "ContainerGetArchive",
            wire.ContainerGetArchiveParams,
            cv.container_get_archive,
            "A tar stream of path.",
            blob_out="tar",
        ),
        _verb(
            "ContainerLogs",
            wire.ContainerLogsParams,
            cv.container_logs,
            "The final tail_bytes of the container's output.",
        ),
        _verb(
            "ContainerRemove",
            wire.ContainerParams,
            cv.container_remove,
            "Kill and remove (idempotent).",
        ),
        _verb("ContainerList", wire.NoParams, cv.container_list, "The caller's containers."),
        _verb(
            "ContainerReleaseAll",
            wire.NoParams,
            cv.container_release_all,
            "Remove every container of the caller.",
        ),
        _verb(
            "ContainerUsage",
            wire.ContainerParams,
            cv.container_usage,
            "What the container cost so far -> cpu_s, memory_peak_bytes, "
            "disk_written_bytes (SizeRw).",
        ),
        _verb(
            "ContainerFork",
            wire.ContainerForkParams,
            cv.container_fork,
            "A new container from a snapshot of one of the caller's (paused meanwhile), "
            "created with its parameters -> container_id, snapshot, depth.",
        ),
        _verb(
            "ContainerReap",
            wire.ContainerParams,
            cv.container_reap,
            "Kill every agent-uid process of the container from outside (frozen meanwhile; "
            "the main process stays) -> killed, duration.",
        ),
    )
}
assert {n: v.params for n, v in VERBS.items()} == dict(wire.PARAMS), (
    "one row per wire verb, its own params"
)


def dispatch(ctx: Context, peer: Peer, verb: object, params: object, blob: bytes) -> Result:
    if not isinstance(verb, str) or verb not in VERBS:
        raise WireError("unknown_verb", f"unknown verb {str(verb)[:100]!r}")
    spec = VERBS[verb]
    if blob and not spec.blob_in:
        raise WireError("bad_request", f"{verb} takes no blob")
    parsed: object = parse(spec.params, {} if params is None else params, "params", BadParams)
    return spec.handler(ctx, peer, parsed, blob)


def describe() -> list[dict]:
    """The interface, for ``camg-helper --list-verbs``."""
    out = []
    for verb in VERBS.values():
        hints = typing.get_type_hints(verb.params)
        fields = []
        for f in dataclasses.fields(verb.params):
            entry: dict[str, Any] = {"name": f.name, "type": _type_name(hints[f.name])}
            if f.default is not dataclasses.MISSING:
                entry["default"] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                entry["default"] = dict(f.default_factory())
            else:
                entry["required"] = True
            fields.append(entry)
        # Required first: Exec's shared options (wire.ExecOptions) are declared before its ids.
        fields.sort(key=lambda e: not e.get("required"))
        out.append(
            {
                "verb": verb.name,
                "doc": verb.doc,
                "params": fields,
                "blob_in": verb.blob_in or None,
                "blob_out": verb.blob_out or None,
            }
        )
    return out


def _type_name(tp: object) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))
