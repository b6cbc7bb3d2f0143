"""kill -9 of a service's gunicorn worker: the master replaces the worker
without the unit stopping, so the unit's ExecStopPost= release-all never
runs. camg.serve's pre_fork hook releases the owner's sandboxes before each
replacement worker (never before the first)."""

from __future__ import annotations

import socket
import threading
import types

from camg import helper_wire, serve


def _fake_helper(path: str, seen: list[dict]) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()

    def serve_forever() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while True:
                    try:
                        request, _blob = helper_wire.read_frame(conn, 1 << 20)
                    except Exception:
                        break
                    seen.append(request)
                    helper_wire.send_frame(conn, {"ok": True, "result": {"released": 1}})

    threading.Thread(target=serve_forever, daemon=True).start()
    return server


def test_the_master_releases_the_dead_workers_sandboxes_before_a_replacement(tmp_path):
    seen: list[dict] = []
    path = str(tmp_path / "helper.sock")
    server = _fake_helper(path, seen)
    try:
        config = types.SimpleNamespace(settings={}, environment="coding", helper_socket=path)
        hook = serve.gunicorn_options(types.SimpleNamespace(
            **vars(config), port=65134, config_hash="h"))["pre_fork"]
        hook(None, "first worker")
        assert seen == []  # ExecStopPost= left nothing: no helper call at start
        hook(None, "replacement")
        assert [(r["verb"], r["owner"]) for r in seen] == \
            [(helper_wire.PREFIX + "ReleaseAll", "coding")]
        custom = serve._release_before_respawn(types.SimpleNamespace(
            settings={"helper_owner": "coding-a"}, environment="coding", helper_socket=path))
        custom(None, 1)
        custom(None, 2)
        assert seen[-1]["owner"] == "coding-a"
    finally:
        server.close()


def test_an_unreachable_helper_does_not_stop_the_replacement(tmp_path):
    hook = serve._release_before_respawn(types.SimpleNamespace(
        settings={}, environment="coding", helper_socket=str(tmp_path / "absent.sock")))
    hook(None, 1)
    hook(None, 2)  # logs a warning; the helper's own sweep is the backstop
