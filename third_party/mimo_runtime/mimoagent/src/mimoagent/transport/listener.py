"""Where the transport listens: a Unix socket only root can reach.

The transport is root and drives the episode (resets, steps, the
verifier); the agent's shell runs as uid 2000 in the same container. A TCP
listener on the container's loopback is open to every uid there, so the
agent could open a session of its own whenever the mediator's was not
open. Instead the transport listens on a Unix socket in a directory of its
own that only root may search (0700), and the camg helper connects to it
as root from the host, inside the container's mount namespace
(helper/containers.py, ``ENDPOINT_SOCKET``: the same path). Nothing of the
transport listens on TCP.

Second line: every accepted connection's peer credentials (SO_PEERCRED,
taken by the kernel when the peer connected) must name ``peer_uid`` (root),
else the connection is closed before a byte is read.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

#: the listening socket inside the container; its directory is made afresh, 0700 root
SOCKET_PATH = "/run/mimo-transport/transport.sock"
_UCRED = struct.Struct("3i")  # pid, uid, gid


def listen(path: str = SOCKET_PATH, backlog: int = 16) -> socket.socket:
    """A listening Unix socket at ``path`` in a fresh directory only its owner may search.

    A forked container's filesystem carries its parent's directory with the
    socket inode of a transport that no longer runs: that directory is
    replaced. A directory holding anything else is refused, never removed.
    Its parent must be writable by root alone for the 0700 to mean anything
    (``/run`` in the task images)."""
    directory, name = os.path.split(path)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(info.st_mode):
            raise FileExistsError(f"{directory} is not a directory")
        if set(os.listdir(directory)) - {name}:
            raise FileExistsError(f"{directory} holds more than the transport's socket")
        if os.path.lexists(path):
            os.unlink(path)
        os.rmdir(directory)
    os.makedirs(os.path.dirname(directory), mode=0o755, exist_ok=True)
    os.mkdir(directory, 0o700)
    os.chmod(directory, 0o700)  # (whatever the umask)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(backlog)
    except BaseException:
        listener.close()
        raise
    return listener


def peer_uid(sock: socket.socket) -> int:
    """The uid the peer had when it connected (SO_PEERCRED); -1 if unknown."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return -1
    return _UCRED.unpack(raw)[1]
