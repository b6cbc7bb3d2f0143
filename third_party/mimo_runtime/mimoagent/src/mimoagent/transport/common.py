"""What both transport kinds share: the agent's command runner and limits (seed 001)."""

from __future__ import annotations

import os
import subprocess

from mimoagent.environments.local import LocalEnvironment, run_bash

AGENT_UID = 2000
AGENT_HOME = "/home/arena-agent"
OUTPUT_LIMIT = 12000
COMMAND_TIMEOUT = 60
MAX_COMMAND_CHARS = 16000
MAX_STEPS = 64


class InfraError(RuntimeError):
    """The transport cannot produce an honest result; the message starts with
    a ``[failure_class]`` tag the General service maps to reward null."""

    def __init__(self, failure_class: str, message: str) -> None:
        super().__init__(f"[{failure_class}] {message}")
        self.failure_class = failure_class


def run_command(command: str, cwd: str, timeout: float, *, agent: bool, stdin=None,
                agent_uid: int = AGENT_UID, extra_env: dict | None = None) -> dict:
    """The seed's runner: a fresh bash in a new session; as the agent uid
    (HOME, USER, LOGNAME of the agent, no supplementary groups) unless
    ``agent`` is false; the final 12000 bytes with a note when cut;
    timeout -> exit 124 and a note; PYTHONPATH never leaks in.
    ``extra_env`` (the verifier's clean HOME/TMP at grading) goes on top."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if agent:
        env.update(HOME=AGENT_HOME, USER="arena-agent", LOGNAME="arena-agent")
    env.update(extra_env or {})
    result = run_bash(command, cwd, timeout, env=env, output_limit=OUTPUT_LIMIT, stdin=stdin,
                      user=agent_uid if agent else None)
    return {"output": result["output"], "returncode": result["returncode"]}


class VerifierExecution(LocalEnvironment):
    """Keep the verifier's operations in the container, bounded like the agent's.

    ``privileged=False`` (the software default, as in the seed) runs them as
    the agent uid; the general verifier runs privileged (root) because the
    tool state and the rubric are root-only."""

    def __init__(self, *, privileged: bool = False, agent_uid: int = AGENT_UID, **kwargs) -> None:
        super().__init__(**kwargs)
        self.privileged = privileged
        self.agent_uid = agent_uid
        #: set at grading (transport.verifier_guard): a HOME and TMPDIR the
        #: agent never had, user site off
        self.extra_env: dict = {}

    def get_template_vars(self) -> dict:
        return {**super().get_template_vars(), "tmp_dir": self.extra_env.get("TMPDIR", "/tmp")}

    def execute(self, command, cwd="", timeout=None):
        result = run_command(command, cwd or self.config.cwd, timeout or 120,
                             agent=not self.privileged, agent_uid=self.agent_uid,
                             extra_env=self.extra_env)
        return {**result, "reason": "timeout" if result["returncode"] == 124 else "ok"}

    def copy_to(self, src_path, dest_path, **kwargs):
        import shlex

        with open(src_path, "rb") as source:
            result = run_command("cat > " + shlex.quote(dest_path), self.config.cwd, 120,
                                 agent=not self.privileged, stdin=source, agent_uid=self.agent_uid,
                                 extra_env=self.extra_env)
        if result["returncode"] != 0:
            raise RuntimeError("Verifier file transfer failed")


def chown_tree(path: str, uid: int) -> None:
    subprocess.run(["chown", "-R", f"{uid}:{uid}", path], check=True)


def prewarmer(prepare):
    """(take, start): ``start()`` runs ``prepare`` once in the background as
    soon as the container is up; the first reset ``take()``s its result
    (waiting for it) instead of preparing again. A container serves one
    episode, so a reset never waits for the workspace and verifier setup
    when the container had time to warm. A failed prewarm is ignored: the
    reset then prepares (and reports) itself."""
    import threading

    slot: dict = {}

    def start() -> None:
        done = threading.Event()
        slot["done"] = done

        def run() -> None:
            try:
                slot["value"] = prepare()
            except BaseException as exc:  # noqa: BLE001 -- the reset retries and reports
                slot["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, name="mimo-prewarm", daemon=True).start()

    def take():
        done = slot.pop("done", None)
        if done is None:
            return None
        done.wait()
        slot.pop("error", None)
        return slot.pop("value", None)

    return take, start
