"""What a kill storm needs of the booted guest (tests/system's nspawn
machine): HTTP on its loopback as a trainer would send it, unit properties,
process children, file lines; and how each environment's episodes are
driven to a kill point (the drive its plugin names)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
from typing import Callable

from camg import plugins

POINTS = ("reset", "step", "grading", "idle")

# The trainer's side of the loopback, run inside the guest (its python3,
# stdlib only), with the token install.sh gave root; a refused or dropped
# connection is an answer too.
GUEST_HTTP = r"""
import json, os, sys, urllib.request, urllib.error
method, url, body, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
headers = {"Content-Type": "application/json"}
try:
    with open(os.path.expanduser("~/.config/camg/token")) as handle:
        headers["Authorization"] = "Bearer " + handle.read().strip()
except FileNotFoundError:
    pass
req = urllib.request.Request(url, data=body.encode() if body else None, method=method,
                             headers=headers)
try:
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out = {"status": resp.status, "body": resp.read().decode()}
except urllib.error.HTTPError as exc:
    out = {"status": exc.code, "body": exc.read().decode()}
except Exception as exc:
    out = {"status": None, "body": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


@dataclasses.dataclass
class Answer:
    status: int | None  # None: no HTTP answer (connection refused or dropped)
    body: dict | str

    @property
    def json(self) -> dict:
        return self.body if isinstance(self.body, dict) else {}


class Guest:
    """What a storm needs of the booted machine: ``run(argv, timeout=,
    check=)`` inside it, and ``census()`` of everything a sandbox holds
    (empty dict when nothing)."""

    def __init__(self, run: Callable[..., subprocess.CompletedProcess],
                 census: Callable[[], dict]) -> None:
        self.run = run
        self.census = census

    def http(self, port: int, method: str, path: str, body: dict | None = None,
             timeout: float = 600.0) -> Answer:
        result = self.run(["python3", "-c", GUEST_HTTP, method, f"http://127.0.0.1:{port}{path}",
                           json.dumps(body) if body is not None else "", str(timeout)],
                          timeout=timeout + 60, check=True)
        reply = json.loads(result.stdout)
        try:
            return Answer(reply["status"], json.loads(reply["body"]))
        except ValueError:
            return Answer(reply["status"], reply["body"])

    def show(self, unit: str, *props: str) -> dict[str, str]:
        argv = ["systemctl", "show", unit] + [a for p in props for a in ("-p", p)]
        out = self.run(argv, timeout=60, check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def children(self, pid: str) -> set[str]:
        if pid in ("", "0"):
            return set()
        return set(self.run(["ps", "--ppid", pid, "-o", "pid="], timeout=60,
                            check=False).stdout.split())

    def sandbox_inits(self, helper: str) -> set[str]:
        """The helper's children that are sandbox inits (its other children,
        e.g. a mount(8) it runs, come and go within milliseconds)."""
        if helper in ("", "0"):
            return set()
        out = self.run(["ps", "--ppid", helper, "-o", "pid=,comm="], timeout=60, check=False).stdout
        return {line.split()[0] for line in out.splitlines()
                if len(line.split()) == 2 and line.split()[1].startswith("camg-sbxinit")}

    def lines(self, path: str) -> list[str]:
        out = self.run(["sh", "-c", f"cat {path} 2>/dev/null || true"], timeout=60, check=True)
        return [line for line in out.stdout.split("\n") if line]

    def containers(self, *labels: str) -> set[str]:
        """Full ids of the guest dockerd's containers with every label
        (empty where no dockerd runs)."""
        argv = ["docker", "ps", "-aq", "--no-trunc"] + [a for label in labels
                                                         for a in ("--filter", f"label={label}")]
        got = self.run(argv, timeout=60, check=False)
        return set(got.stdout.split()) if got.returncode == 0 else set()

    def images(self, *labels: str) -> set[str]:
        """Ids of the guest dockerd's images with every label (empty where
        no dockerd runs)."""
        argv = ["docker", "images", "-q", "--no-trunc"] + [a for label in labels
                                                            for a in ("--filter", f"label={label}")]
        got = self.run(argv, timeout=60, check=False)
        return set(got.stdout.split()) if got.returncode == 0 else set()

    def container_pid(self, cid: str) -> str:
        """The host-side pid of a running container's init ("" when gone)."""
        got = self.run(["docker", "inspect", "-f", "{{.State.Pid}}", cid], timeout=60, check=False)
        pid = got.stdout.strip()
        return pid if got.returncode == 0 and pid not in ("", "0") else ""

    def users_processes(self, user: str) -> set[str]:
        got = self.run(["ps", "-u", user, "-o", "pid="], timeout=60, check=False)
        return set(got.stdout.split())


# What an environment's grading runs in, i.e. what "kill its grader" kills:
#   sandbox   — the helper sandbox its finish starts (Coding's grader, Visual's
#               renderer): the helper's new child; the service lives on;
#   process   — a standing process of its own uid (AutoResearch's private
#               grader): its death stops the service and systemd restarts both;
#   container — the episode's task container, where the verifier runs during
#               the finish (General): its init, seen from the host.
GRADERS = {"sandbox": "grader sandbox", "process": "private grader",
           "container": "task container (verifier running)"}


@dataclasses.dataclass
class Env:
    """How a storm drives one environment's episodes."""
    name: str
    port: int
    create: dict                       # POST /episodes body (without episode_id)
    slow_step: dict | None = None      # an action that takes a while
    to_grading: list[dict] = dataclasses.field(default_factory=list)  # then finish
    finish: dict | None = None         # the action whose answer grades
    sandboxes: bool = False            # its episodes hold helper sandboxes
    containers: bool = False           # its episodes hold a task container
    grader: str = ""                   # a key of GRADERS, "" for none to kill
    grader_what: str = ""              # the row's name for it, if not GRADERS'
    grader_user: str = ""              # grader "process": its processes' user
    reference: bool = False            # to_grading: the deployment's reference
    reset_s: float = 1.0               # measured by Storm.settle(): where to aim
    step_s: float = 1.0
    grade_s: float = 1.0
    graded: float | None = None        # the reward to_grading + finish earns
    unit: str = ""                     # its systemd unit ("": its plugin's)

    def __post_init__(self) -> None:
        if not self.unit:
            self.unit = plugins.get(self.name).unit

    @property
    def grader_name(self) -> str:
        return self.grader_what or GRADERS.get(self.grader, "")

    @property
    def points(self) -> tuple[str, ...]:
        return tuple(p for p in POINTS if (p != "step" or self.slow_step)
                     and (p != "grading" or self.finish))


SLEEP = {"operation": "shell", "command": "sleep 3; echo slept"}
FINISH = {"operation": "finish"}


def describe(guest: Guest, name: str, port: int) -> Env:
    """How a storm drives ``name``'s episodes: what its plugin says (unit,
    substrate), completed by the drive its plugin's ``storm`` names; one
    without gets reset and idle."""
    plugin = plugins.get(name)
    base = Env(name, port, {}, sandboxes=plugin.substrate == "sandbox",
               containers=plugin.substrate == "container", unit=plugin.unit)
    if plugin.storm is None:
        return base
    return plugins.resolve(plugin.storm)(guest, base)


# -- the drives the plugins name (camg.plugins: ``storm``) -------------------------

def first_task(guest: Guest, env: Env) -> dict:
    return json.loads(guest.run(["cat", f"/srv/camg/data/{env.name}/manifest.json"],
                                check=True).stdout)["tasks"][0]


class Background(threading.Thread):
    """One HTTP request outstanding while the kill happens."""

    def __init__(self, guest: Guest, port: int, method: str, path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.args = (port, method, path, body)
        self.guest = guest
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.answer = self.guest.http(*self.args, timeout=600)
        except BaseException as exc:  # reported by the storm, never lost in a thread
            self.error = exc

    def result(self, timeout: float) -> Answer:
        self.join(timeout)
        if self.is_alive():
            return Answer(None, f"no answer in {timeout}s")
        if self.error is not None:
            return Answer(None, f"{type(self.error).__name__}: {self.error}")
        return self.answer
