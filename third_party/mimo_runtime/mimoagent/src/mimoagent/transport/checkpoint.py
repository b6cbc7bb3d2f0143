"""What a forked container's transport needs to continue its parent's episode.

A container serves one episode, and its transport keeps part of that
episode in memory: the step count, the general transport's integrity
findings (every attempt on the grade the agent made so far), the software
verifier's base ref and setup snapshot, the tool listing. The General
service forks an episode by snapshotting its container (the helper's
ContainerFork): files are carried, processes are not, so the child starts a
new transport on the parent's filesystem. These records let it continue
instead of preparing a fresh episode over the agent's work:

* ``setup.json`` -- written once, when the episode is prepared: what the
  verifier needs at finish that setup computed;
* ``episode.json`` -- written at reset and after every step, before the
  reply: the step count and findings so far.

A transport that starts where ``episode.json`` exists resumes from them
(no prewarm, no setup); its findings include the parent's, so a fork cannot
launder an attempt made before it. The directory is root-only (0700): the
agent uid can neither read nor plant them. In-process tests pass no
directory (nothing is written, nothing resumed).
"""

from __future__ import annotations

import json
import os

STATE_DIR = "/var/lib/mimo-transport"


class Checkpoint:
    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def save(self, name: str, data: dict) -> None:
        if self.directory is None:
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)
        tmp = self._path(name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(tmp, self._path(name))

    def load(self, name: str) -> dict | None:
        if self.directory is None:
            return None
        try:
            with open(self._path(name), encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return None
        if not isinstance(data, dict):
            raise ValueError(f"checkpoint {name} is not an object")
        return data

    def resuming(self) -> bool:
        """This filesystem is a fork of a reset episode."""
        return self.directory is not None and os.path.exists(self._path("episode.json"))

    def resumed(self) -> tuple[dict, dict] | None:
        """(setup, episode) records of the parent, or None for a fresh container.
        A partial pair is an error: the episode cannot be continued honestly."""
        episode = self.load("episode.json")
        if episode is None:
            return None
        setup = self.load("setup.json")
        if setup is None:
            raise RuntimeError("episode.json without setup.json: the parent was never set up")
        return setup, episode
