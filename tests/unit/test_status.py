"""camg status: a table of the configured environments, the helper and
leftovers; exit 0 only when all is well (without systemd here)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from camg import status


class _Fake(http.server.BaseHTTPRequestHandler):
    config_hash = "a" * 64

    def do_GET(self):  # noqa: N802 - http.server's name
        # /health carries what camg status reads (/metadata needs a token)
        body = {"/health": {"status": "healthy", "reasons": [],
                            "episodes": {"active": 1, "capacity": 4, "finished": 0},
                            "config_hash": self.config_hash, "auth": "tokens"}}.get(self.path)
        data = json.dumps(body).encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def etc(tmp_path, service, monkeypatch):
    monkeypatch.setattr(status, "systemd_running", lambda: False)
    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / "coding.json").write_text(json.dumps(
        {"environment": "coding", "port": service, "capacity": 4, "config_hash": "a" * 64}))
    (tmp_path / "prepared" / "routes.json").write_text("{}")
    parents = {c: str(tmp_path / "cg" / c) for c in status.CONTROLLERS}
    for path in parents.values():
        (tmp_path / "cg").joinpath(path).mkdir(parents=True)
    (tmp_path / "helper.json").write_text(json.dumps(
        {"socket": str(tmp_path / "helper.sock"), "state_dir": str(tmp_path / "state"),
         "upper_root": str(tmp_path / "uppers"), "cgroup_parents": parents,
         # A uid nobody uses here, so no process of this machine counts.
         "agent_uid": 54321}))
    return tmp_path


def test_all_well_exits_zero_and_shows_the_table(etc, capsys):
    assert status.main(["--etc", str(etc)]) == 0
    out = capsys.readouterr().out
    assert "coding" in out and "healthy" in out and "1/4" in out and "matches disk" in out
    assert "all well" in out
    assert "routes" not in out


def test_a_configuration_the_service_does_not_serve_is_a_problem(etc, capsys, monkeypatch):
    monkeypatch.setattr(_Fake, "config_hash", "b" * 64)
    assert status.main(["--etc", str(etc)]) == 1
    assert "serves another configuration" in capsys.readouterr().out


def test_an_unreachable_service_is_a_problem(etc, capsys):
    config = json.loads((etc / "prepared" / "coding.json").read_text())
    config["port"] = 1
    (etc / "prepared" / "coding.json").write_text(json.dumps(config))
    assert status.main(["--etc", str(etc), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["environments"][0]["ready"] is False
    assert any("unreachable" in p for p in report["problems"])


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="leftovers are checked as root")
def test_leftovers_with_no_helper_running_are_named(etc, capsys):
    (etc / "state" / "ledger").mkdir(parents=True)
    (etc / "state" / "ledger" / "sbx-1").write_text("{}")
    (etc / "cg" / "memory" / "sbx-1").mkdir()
    assert status.main(["--etc", str(etc)]) == 1
    out = capsys.readouterr().out
    assert "leftover ledger records: sbx-1" in out
    assert "leftover cgroups" in out


def test_no_configuration_is_a_problem(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(status, "systemd_running", lambda: False)
    assert status.main(["--etc", str(tmp_path)]) == 1
    assert "no configured environment" in capsys.readouterr().out


def test_the_console_script_knows_only_status(capsys):
    assert status.cli(["bogus"]) == 2
    assert status.cli([]) == 2
