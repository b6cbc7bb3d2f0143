"""The Docker Engine API calls the container mediator makes (docker SDK, low level).

Only helper/containers.py calls this, after its checks: everything here
trusts its arguments. Docker's failures become the helper's closed error
names: a missing object not_found, a refused request bad_request, an
unreachable or failing daemon docker_unavailable / internal.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator

from camg.helper_wire import WireError
from helper import container_disk
from helper.container_config import ContainerConfig

# Capabilities Docker grants by default that no task needs: raw packets,
# device nodes, audit records.
CAP_DROP = ["NET_RAW", "MKNOD", "AUDIT_WRITE"]
_LOG_MAX = "1m"


def pid_exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited."""
    r, _, _ = select.select([pidfd], [], [], 0)
    return bool(r)


@contextlib.contextmanager
def mapped(what: str) -> Iterator[None]:
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.NotFound as exc:
        raise WireError("not_found", f"{what}: {exc.explanation or exc}") from None
    except docker.errors.APIError as exc:
        code = exc.status_code or 500
        name = "bad_request" if 400 <= code < 500 else "internal"
        raise WireError(name, f"{what}: docker answered {code}: {exc.explanation or exc}") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise WireError("docker_unavailable", f"{what}: {type(exc).__name__}: {exc}") from None


class Docker:
    def __init__(self, cfg: ContainerConfig, timeout: float | None = None) -> None:
        self.cfg = cfg
        self.timeout = timeout or cfg.api_timeout
        self._api = None
        self._lock = threading.Lock()

    @property
    def api(self):
        with self._lock:
            if self._api is None:
                import docker

                with mapped("connecting to dockerd"):
                    self._api = docker.APIClient(
                        base_url="unix://" + self.cfg.docker_socket,
                        timeout=self.timeout,
                        max_pool_size=64,
                    )
            return self._api

    # -- lifecycle --------------------------------------------------------

    def pull(self, image: str) -> str:
        import docker

        with mapped(f"pulling {image}"):
            api = docker.APIClient(
                base_url="unix://" + self.cfg.docker_socket, timeout=self.cfg.pull_timeout
            )
            try:
                # A digest names exactly one image: when dockerd holds it
                # already, nothing needs the registry (the demo's loopback
                # registry is gone once the images were pulled).
                with contextlib.suppress(docker.errors.ImageNotFound):
                    return api.inspect_image(image)["Id"]
                for line in api.pull(image, stream=True, decode=True):
                    if isinstance(line, dict) and line.get("error"):
                        raise WireError("not_found", f"pulling {image}: {line['error']}")
                return api.inspect_image(image)["Id"]
            finally:
                api.close()

    def run(self, **spec) -> tuple[str, int]:
        """Create (bounded) and start; (container id, host pid of its init)."""
        cid, _ = self.create(**spec)
        return cid, self.start(cid)

    def create(
        self,
        *,
        name: str,
        image: str,
        command: list[str],
        env: dict[str, str],
        workdir: str,
        user: str,
        labels: dict[str, str],
        cpu: float,
        memory: int,
        pids: int,
        binds: dict,
    ) -> tuple[str, str | None]:
        """Create, its writable layer bounded (container_disk), not started;
        (container id, its overlay2 layer directory or None)."""
        from docker.types import LogConfig

        api = self.api
        with mapped(f"creating a container of {image}"):
            host = api.create_host_config(
                init=True,
                network_mode="none",
                privileged=False,
                cap_drop=CAP_DROP,
                security_opt=["no-new-privileges"],
                nano_cpus=int(cpu * 1e9),
                mem_limit=memory,
                memswap_limit=memory,
                pids_limit=pids,
                binds=binds or None,
                ipc_mode="private",
                # replaces Docker's own /dev/shm (bounded in bytes only)
                tmpfs={
                    "/dev/shm": f"rw,nosuid,nodev,noexec,size={self.cfg.shm_bytes},"
                    f"nr_inodes={self.cfg.shm_inodes}"
                },
                log_config=LogConfig(
                    type="json-file", config={"max-size": _LOG_MAX, "max-file": "1"}
                ),
            )
            created = api.create_container(
                image=image,
                command=command or None,
                environment=env or None,
                working_dir=workdir or None,
                user=user or None,
                labels=labels,
                host_config=host,
                name=name,
                detach=True,
            )
        cid = created["Id"]
        try:
            with mapped(f"bounding container {cid[:12]}'s writable layer"):
                layer = container_disk.layer_dir(api.inspect_container(cid))
                if layer:
                    container_disk.bound(
                        layer, self.cfg.upper_root, cid, self.cfg.upper_bytes, self.cfg.upper_inodes
                    )
        except BaseException:
            self.remove(cid)
            raise
        return cid, layer

    def start(self, cid: str) -> int:
        """Start a created container; the host pid of its init (removed if it does not run)."""
        api = self.api
        try:
            with mapped(f"starting container {cid[:12]}"):
                api.start(cid)
                state = api.inspect_container(cid)["State"]
            if not state.get("Running") or not state.get("Pid"):
                raise WireError(
                    "sandbox_died",
                    f"the container exited at start (code {state.get('ExitCode')}): "
                    f"{self.logs(cid, 2000).decode(errors='replace')}",
                )
        except BaseException:
            self.remove(cid)
            raise
        return int(state["Pid"])

    def layer(self, cid: str) -> str | None:
        """The container's overlay2 layer directory (None for another storage driver)."""
        with mapped(f"inspecting container {cid[:12]}"):
            return container_disk.layer_dir(self.api.inspect_container(cid))

    def pause(self, cid: str) -> None:
        """Freeze every process of the container (freezer cgroup), as a commit does."""
        with mapped(f"pausing container {cid[:12]}"):
            self.api.pause(cid)

    def unpause(self, cid: str) -> None:
        with mapped(f"unpausing container {cid[:12]}"):
            self.api.unpause(cid)

    def remove(self, cid: str) -> bool:
        """Kill and remove with its anonymous volumes; False if already gone."""
        import docker.errors

        with mapped(f"removing container {cid[:12]}"):
            try:
                layer = container_disk.layer_dir(self.api.inspect_container(cid))
            except docker.errors.NotFound:
                layer = None
            # Before dockerd's removal, which cannot rmdir a mount point.
            container_disk.release(layer, self.cfg.upper_root, cid)
            for attempt in range(50):
                try:
                    self.api.remove_container(cid, force=True, v=True)
                    return True
                except docker.errors.NotFound:
                    return False
                except docker.errors.APIError as exc:
                    # "removal already in progress": another caller is on it.
                    if exc.status_code == 409:
                        time.sleep(0.1)
                        continue
                    # dockerd gave up waiting for the killed container's exit
                    # (a loaded host; a layer whose inodes the agent filled):
                    # it exits later, and a later removal takes it
                    if "did not receive an exit event" not in str(exc) or attempt == 49:
                        raise
                    time.sleep(1.0)
            return True

    def remove_labelled(self, labels: dict[str, str]) -> int:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        with mapped("listing containers"):
            found = self.api.containers(all=True, filters=filters)
        return sum(self.remove(c["Id"]) for c in found)

    def list_labelled(self, labels: dict[str, str]) -> list[dict]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        with mapped("listing containers"):
            return self.api.containers(all=True, filters=filters)

    # -- snapshots (helper/container_fork.py) ---------------------------------

    def commit(self, cid: str, labels: dict[str, str]) -> str:
        """The container's filesystem as a new local image; its id (sha256:HEX).

        Docker pauses the container (freezer cgroup) for the commit, so the
        snapshot is consistent; no repository or tag: the image is reached
        by its content-addressed id only.
        """
        with mapped(f"committing container {cid[:12]}"):
            return self.api.commit(cid, pause=True, conf={"Labels": labels})["Id"]

    def images_labelled(self, labels: dict[str, str]) -> list[str]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        with mapped("listing images"):
            return [i["Id"] for i in self.api.images(all=True, filters=filters)]

    def remove_image(self, image_id: str) -> bool | None:
        """True removed, False already gone, None still in use (a container
        or a newer snapshot made from it: removed later)."""
        import docker.errors

        with mapped(f"removing image {image_id[:19]}"):
            try:
                self.api.remove_image(image_id, force=False, noprune=False)
                return True
            except docker.errors.ImageNotFound:
                return False
            except docker.errors.APIError as exc:
                if exc.status_code == 409:
                    return None
                raise

    def remove_images_labelled(self, labels: dict[str, str]) -> int:
        """Remove every image with these labels; dependants first (passes
        until nothing more goes: a snapshot of a snapshot holds its parent)."""
        n = 0
        while True:
            gone = [i for i in self.images_labelled(labels) if self.remove_image(i)]
            if not gone:
                return n
            n += len(gone)

    def sweep_scope(self, scope: str) -> int:
        n = self.remove_labelled({"camg.helper": scope})
        n += self.remove_images_labelled({"camg.helper": scope, "camg.fork": "1"})
        with mapped("listing networks"):
            for net in self.api.networks(filters={"label": [f"camg.helper={scope}"]}):
                try:
                    self.api.remove_network(net["Id"])
                    n += 1
                except Exception:  # the next sweep tries again
                    pass
        return n

    # -- inside a container -------------------------------------------------

    def exec(
        self,
        cid: str,
        *,
        cmd: list[str],
        user: str,
        workdir: str,
        env: dict[str, str],
        stdin: bytes,
        timeout: float,
        limit: int,
    ) -> tuple[int, bytes, int, bool, float]:
        """Run cmd; (exit code, final `limit` bytes of stdout+stderr, total bytes,
        timed out, seconds)."""
        api = self.api
        start = time.monotonic()
        with mapped(f"exec in {cid[:12]}"):
            eid = api.exec_create(
                cid,
                cmd,
                stdout=True,
                stderr=True,
                stdin=bool(stdin),
                user=user,
                environment=env or None,
                workdir=workdir,
            )["Id"]
        sock, rest = self._hijack(f"/exec/{eid}/start", {"Detach": False, "Tty": False})
        try:
            if stdin:
                threading.Thread(target=_feed, args=(sock, stdin), daemon=True).start()
            tail, total, timed_out = _read_frames(sock, rest, start + timeout, limit)
        finally:
            sock.close()
        if timed_out:
            self._kill_exec(eid)
        code = 124 if timed_out else self._exit_code(eid)
        return code, bytes(tail), total, timed_out, time.monotonic() - start

    def _hijack(self, path: str, body: dict) -> tuple[socket.socket, bytes]:
        """POST with Upgrade: tcp on our own connection; (socket, bytes read past the headers).

        Done by hand so no HTTP library buffers away the first frames.
        """
        data = json.dumps(body).encode()
        request = (
            f"POST /v{self.api.api_version}{path} HTTP/1.1\r\nHost: docker\r\n"
            f"Content-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode() + data
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.cfg.api_timeout)
            sock.connect(self.cfg.docker_socket)
            sock.sendall(request)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk or len(buf) > 65536:
                    raise WireError("docker_unavailable", "dockerd closed the exec stream")
                buf += chunk
            head, rest = buf.split(b"\r\n\r\n", 1)
            status = head.split(b"\r\n", 1)[0].split()
            if len(status) < 2 or status[1] not in (b"101", b"200"):
                raise WireError(
                    "not_found" if status[1:2] == [b"404"] else "internal",
                    f"exec start: {head[:200].decode(errors='replace')} "
                    f"{rest[:300].decode(errors='replace')}",
                )
            sock.settimeout(None)
            return sock, rest
        except OSError as exc:
            sock.close()
            raise WireError("docker_unavailable", f"exec start: {exc}") from None
        except BaseException:
            sock.close()
            raise

    def _exit_code(self, eid: str) -> int:
        with mapped("exec inspect"):
            for _ in range(100):
                info = self.api.exec_inspect(eid)
                if not info.get("Running") and info.get("ExitCode") is not None:
                    return int(info["ExitCode"])
                time.sleep(0.02)
        raise WireError("internal", "the exec's exit code never arrived")

    def _kill_exec(self, eid: str) -> None:
        """SIGKILL the exec's process and its descendants (as seen from the host)."""
        with mapped("exec inspect"):
            pid = int(self.api.exec_inspect(eid).get("Pid") or 0)
        if pid > 0:
            for p in [pid, *_descendants(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)

    def put_archive(self, cid: str, dest: str, data: bytes) -> None:
        with mapped(f"extracting into {dest}"):
            self.api.put_archive(cid, dest, data)

    def get_archive(self, cid: str, path: str, limit: int) -> bytes:
        api = self.api
        with mapped(f"archiving {path}"):
            res = api._get(
                api._url("/containers/{0}/archive", cid), params={"path": path}, stream=True
            )
            try:
                api._raise_for_status(res)
                out = bytearray()
                for chunk in res.iter_content(1 << 16):
                    out += chunk
                    if len(out) > limit:
                        raise WireError(
                            "limit_exceeded", f"archive of {path} exceeds {limit} bytes"
                        )
                return bytes(out)
            finally:
                res.close()

    def logs(self, cid: str, tail_bytes: int) -> bytes:
        with mapped(f"logs of {cid[:12]}"):
            data = self.api.logs(cid, stdout=True, stderr=True, stream=False)
        return data[-tail_bytes:] if tail_bytes else b""


def _feed(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the command exited or timed out before reading it all


def _read_frames(
    sock: socket.socket, rest: bytes, deadline: float, limit: int
) -> tuple[bytearray, int, bool]:
    """Docker's multiplexed stream (8-byte headers); keeps only the final `limit` bytes."""
    buf = bytearray(rest)
    tail = bytearray()
    total = 0
    while True:
        while len(buf) >= 8:
            size = int.from_bytes(buf[4:8], "big")
            if len(buf) < 8 + size:
                break
            tail += buf[8 : 8 + size]
            total += size
            del buf[: 8 + size]
            if len(tail) > limit:
                del tail[: len(tail) - limit]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return tail, total, True
        ready, _, _ = select.select([sock], [], [], remaining)
        if not ready:
            continue
        chunk = sock.recv(1 << 16)
        if not chunk:
            return tail, total, False
        buf += chunk


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out
