"""sd_notify protocol and journald-style logging, against real sockets."""

import logging
import os
import signal
import socket
import struct
import sys
import time

from camg import logs
from camg_client import Client


def notify_socket(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    return sock


def drain(sock, seconds, until=None):
    messages, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            messages.append((time.monotonic(), sock.recv(65536).decode()))
        except socket.timeout:
            continue
        if until and until in messages[-1][1]:
            break
    return messages


def test_ready_only_after_environment_started_then_status_watchdog_stopping(counter_service, tmp_path):
    sock = notify_socket(tmp_path / "notify")
    started = time.monotonic()
    svc = counter_service(settings={"start_delay": 1.0}, wait=False,
                          env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "300000"})
    messages = drain(sock, 30, until="READY=1")
    ready = [(t, m) for t, m in messages if "READY=1" in m]
    assert len(ready) == 1, messages
    when, text = ready[0]
    assert when - started >= 1.0          # not before the environment started
    assert "Gunicorn arbiter booted" not in "".join(m for _, m in messages)
    assert f"MAINPID={svc.proc.pid}" in text and "STATUS=0/4 episodes active" in text
    Client(svc.url).create()
    later = drain(sock, 1.5)
    assert any("STATUS=1/4 episodes active" in m for _, m in later), later
    assert sum("WATCHDOG=1" in m for _, m in later) >= 3
    svc.proc.send_signal(signal.SIGTERM)
    final = drain(sock, 20, until="STOPPING=1")
    assert any("STOPPING=1" in m for _, m in final)
    assert svc.stop() == 0


def test_journal_handler_sends_native_fields(tmp_path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "journal"))
    handler = logs.JournalHandler("coding", "camg-coding", address=str(tmp_path / "journal"))
    logger = logging.getLogger("camg.test.journal")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("two\nlines", extra=logs.episode_fields("ep-1", "task-9"))
    finally:
        logger.removeHandler(handler)
        handler.close()
    data = server.recv(65536)
    fields, rest = {}, data
    while rest:
        key, sep, rest = rest.partition(b"\n")
        if b"=" in key:
            name, _, value = key.partition(b"=")
            fields[name.decode()] = value.decode()
        else:  # binary-safe form: KEY\n<u64 length><value>\n
            (length,) = struct.unpack("<Q", rest[:8])
            fields[key.decode()] = rest[8:8 + length].decode()
            rest = rest[8 + length + 1:]
    assert fields["MESSAGE"] == "two\nlines"
    assert fields["PRIORITY"] == "4" and fields["CAMG_ENV"] == "coding"
    assert fields["EPISODE_ID"] == "ep-1" and fields["TASK_ID"] == "task-9"
    assert fields["SYSLOG_IDENTIFIER"] == "camg-coding"


def test_stderr_lines_have_priority_and_fields_no_timestamp():
    handler = logs.StderrHandler("shop")
    record = logging.LogRecord("camg.shop", logging.ERROR, __file__, 1, "bad\nthing", None, None)
    record.EPISODE_ID, record.TASK_ID = "e", "t"
    text = handler.format(record)
    assert text.splitlines() == ["<3>camg.shop: bad", "<3>thing EPISODE_ID=e TASK_ID=t"]
    assert not any(ch.isdigit() for ch in text.split(":")[0][3:])


def test_journal_detected_only_when_stderr_is_the_journal_stream(monkeypatch, tmp_path):
    st = os.fstat(sys.stderr.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    monkeypatch.setattr(logs, "JOURNAL_SOCKET", str(tmp_path / "absent"))
    assert logs._stderr_is_journal() is False
    (tmp_path / "absent").touch()
    assert logs._stderr_is_journal() is True
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    assert logs._stderr_is_journal() is False
