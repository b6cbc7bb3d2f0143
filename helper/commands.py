"""A command on either substrate: the ceilings it is checked against before it
runs, and how its reply reads (Exec on a sandbox, ContainerExec on a
container, and the environment ContainerCreate gives a container).

One copy for both, so a sandbox and a container refuse the same request
with the same name, against the same configured ceilings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from camg.helper_wire import TIMEOUT_MARKER, TRUNCATION_MARKER, ExecOptions, WireError
from helper.config import Ceilings

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_VALUE_BYTES = 65536


def check_env(env: Mapping[str, str], ceilings: Ceilings) -> None:
    if len(env) > ceilings.env_entries:
        raise WireError("limit_exceeded", f"env: at most {ceilings.env_entries} entries")
    for k, v in env.items():
        if not _ENV_NAME.match(k) or "\0" in v or len(v) > _ENV_VALUE_BYTES:
            raise WireError("bad_request", f"env: invalid entry {k[:64]!r}")


def check_exec(command: str, p: ExecOptions, ceilings: Ceilings) -> None:
    """Everything of an Exec or ContainerExec but its path and target."""
    c = ceilings
    if "\0" in command or len(command.encode()) > c.command_bytes:
        raise WireError(
            "limit_exceeded" if "\0" not in command else "bad_request",
            f"command: must be at most {c.command_bytes} bytes without NUL",
        )
    if not 0 < p.timeout <= c.timeout:
        raise WireError("limit_exceeded", f"timeout: must be within (0, {c.timeout}]")
    # At least one byte: the tail kept is the final output_limit bytes, and
    # a zero limit once meant "keep everything" to the ring's trimming.
    if not 1 <= p.output_limit <= c.output_bytes:
        raise WireError("limit_exceeded", f"output_limit: must be within [1, {c.output_bytes}]")
    check_env(p.env, c)


def exec_reply(
    exit_code: int, output: bytes, total: int, timed_out: bool, duration: float, output_limit: int
) -> dict:
    """The result of Exec and ContainerExec: the kept tail, marked when cut or timed out."""
    text = output.decode("utf-8", "replace")
    truncated = total > output_limit
    if truncated:
        text = TRUNCATION_MARKER.format(limit=output_limit) + text
    if timed_out:
        text += TIMEOUT_MARKER
    return {
        "exit_code": exit_code,
        "output": text,
        "truncated": truncated,
        "timed_out": timed_out,
        "duration": round(duration, 6),
    }
