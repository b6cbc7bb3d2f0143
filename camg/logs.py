"""Journald-style logging with structured episode fields.

Under systemd (JOURNAL_STREAM names our stderr) records go to the journal's
native socket, so CAMG_ENV, EPISODE_ID and TASK_ID become real journal
fields: ``journalctl CAMG_ENV=coding EPISODE_ID=…`` finds one episode.
Elsewhere records go to stderr as ``<N>message key=value…`` lines: the
``<N>`` prefix is syslog priority, which journald also understands, and
there are no timestamps because the journal (or the terminal) adds them.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys

FIELDS = ("EPISODE_ID", "TASK_ID")
JOURNAL_SOCKET = "/run/systemd/journal/socket"

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def priority(levelno: int) -> int:
    for level in sorted(_PRIORITY, reverse=True):
        if levelno >= level:
            return _PRIORITY[level]
    return 7


class StderrHandler(logging.StreamHandler):
    """``<6>coding: message EPISODE_ID=… TASK_ID=…``"""

    def __init__(self, environment: str) -> None:
        super().__init__(sys.stderr)
        self.environment = environment

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        fields = " ".join(f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None))
        line = f"{record.name}: {text}" + (f" {fields}" if fields else "")
        # Continuation lines keep the prefix so journald keeps their priority.
        return "\n".join(f"<{priority(record.levelno)}>{part}" for part in line.split("\n"))


class JournalHandler(logging.Handler):
    """Native journal protocol (systemd.journal-fields(7)); no libsystemd."""

    def __init__(self, environment: str, identifier: str, address: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self.address = address
        self.environment = environment
        self.identifier = identifier
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            fields = {
                "MESSAGE": text,
                "PRIORITY": str(priority(record.levelno)),
                "SYSLOG_IDENTIFIER": self.identifier,
                "CAMG_ENV": self.environment,
                "LOGGER": record.name,
                "CODE_FILE": record.pathname,
                "CODE_LINE": str(record.lineno),
                "CODE_FUNC": record.funcName,
            }
            for key in FIELDS:
                value = getattr(record, key, None)
                if value:
                    fields[key] = str(value)
            self.sock.sendto(encode_fields(fields), self.address)
        except OSError:
            self.handleError(record)

    def close(self) -> None:
        self.sock.close()
        super().close()


def encode_fields(fields: dict[str, str]) -> bytes:
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            # Multi-line values use the length-prefixed binary form.
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def _stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream or not os.path.exists(JOURNAL_SOCKET):
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def setup(environment: str, level: int = logging.INFO) -> logging.Logger:
    """Configure the root logger once for a service process."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if _stderr_is_journal():
        root.addHandler(JournalHandler(environment, f"camg-{environment}"))
    else:
        root.addHandler(StderrHandler(environment))
    root.setLevel(level)
    # Libraries that announce routine start-up at INFO (faiss's CPU feature
    # probing, pyjnius's JVM discovery) would drown the service's own lines.
    for noisy in ("faiss", "faiss.loader", "kivy", "jnius"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(f"camg.{environment}")


def setup_command() -> None:
    """Logging of a preparation command (camg.prepare, prepare_demo.py): the
    project's INFO lines (camg, environments, tools, devtools) as ``logger: message`` on
    stderr, everyone else's from WARNING on. Installed first, so a library
    that configures logging while it works (``basicConfig``, which then
    does nothing) cannot print its timestamped INFO lines (quiet
    preparation, issue 23)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for ours in ("camg", "environments", "tools", "devtools"):
        logging.getLogger(ours).setLevel(logging.INFO)


def episode_fields(episode_id: str, task_id: str) -> dict:
    return {"EPISODE_ID": episode_id, "TASK_ID": task_id}
