"""Helper lifecycle: probes gate creation, crash recovery by sweep, CLI modes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from camg import errors

import conftest as pc


@pytest.fixture
def private_base():
    base = Path(tempfile.mkdtemp(prefix="camg-helper-test-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _cgroup_dirs(cfg: dict) -> list[str]:
    out = []
    for parent in cfg["cgroup_parents"].values():
        if os.path.isdir(parent):
            out += [os.path.join(parent, d) for d in os.listdir(parent)
                    if os.path.isdir(os.path.join(parent, d))]
    return out


def _run_helper(cfg_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
    return subprocess.run([sys.executable, "-m", "helper", "--config", str(cfg_path), *args],
                          cwd=pc.ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_probe_verb_reports_every_probe(client):
    result = client.probe()
    assert result["ok"], result
    names = {r["name"] for r in result["results"]}
    assert {"agent_identity", "mount_denied", "pid_namespace", "loopback_only", "host_invisible",
            "lowers_readonly", "memory_oom", "fork_bomb", "timeout_kills_tree",
            "sockets_unreachable", "kernel_interfaces_readonly", "setuid_gains_nothing"} <= names


@pytest.fixture
def empty_lower(lower_root):
    """A lower without bash or anything else: every probe must fail on it."""
    path = lower_root / f"empty-{os.getpid()}"
    path.mkdir()
    yield path
    path.rmdir()


def test_cgroup_parents_it_created_are_removed_at_stop(private_base, lower_root, rootfs):
    cfg = pc.helper_config(private_base, lower_root, rootfs)
    parents = list(cfg["cgroup_parents"].values())
    assert not any(os.path.exists(p) for p in parents)
    (private_base / "helper.json").write_text(json.dumps(cfg))
    # A sweep reclaims; it does not create the parents it would sweep.
    assert _run_helper(private_base / "helper.json", "--sweep").returncode == 0
    assert not any(os.path.exists(p) for p in parents)
    helper = pc.start_helper(private_base, cfg)
    try:
        assert all(os.path.isdir(p) for p in parents)
        client = helper.client()
        client.destroy(client.create_sandbox([str(rootfs)], memory_bytes=64 << 20,
                                             cpu_quota=1.0, pids_max=32))
        client.close()
        helper.proc.send_signal(signal.SIGTERM)
        assert helper.proc.wait(30) == 0
        assert not any(os.path.exists(p) for p in parents)
    finally:
        pc.stop_helper(helper)


def test_failing_probes_refuse_sandboxes(private_base, lower_root, rootfs, empty_lower):
    cfg = pc.helper_config(private_base, lower_root, rootfs, probe_lowers=[str(empty_lower)])
    helper = pc.start_helper(private_base, cfg, wait_probes=False)
    try:
        client = helper.client()
        assert client.ping()["probes_ok"] is False
        with pytest.raises(errors.Unavailable) as info:
            client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32)
        assert info.value.details["helper_error"] == "probes_failed"
        assert client.probe()["ok"] is False
        client.close()
    finally:
        pc.stop_helper(helper)


def test_create_during_start_up_probes_waits_for_them(private_base, lower_root, rootfs):
    # Socket activation delivers a daemon's first request while the helper is
    # still probing: it must wait for the verdict, not fail the episode.
    helper = pc.start_helper(private_base, pc.helper_config(private_base, lower_root, rootfs),
                             wait_probes=False)
    try:
        client = helper.client()
        probing = client.ping()["probes_ok"] is False
        sandbox = client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0,
                                        pids_max=32)
        assert client.exec(sandbox, "echo ok").output.strip() == "ok"
        client.destroy(sandbox)
        client.close()
        assert probing, "the probes had finished before the create: the test proved nothing"
    finally:
        pc.stop_helper(helper)


def test_probe_cli_exit_code(private_base, lower_root, rootfs, empty_lower):
    # No probe_lowers: the probes run on a root built from the host's binaries.
    cfg = pc.helper_config(private_base, lower_root, rootfs)
    del cfg["probe_lowers"]
    path = private_base / "good.json"
    path.write_text(json.dumps(cfg))
    good = _run_helper(path, "--probe")
    assert good.returncode == 0 and json.loads(good.stdout)["ok"], good.stderr
    cfg["probe_lowers"] = [str(empty_lower)]
    path.write_text(json.dumps(cfg))
    bad = _run_helper(path, "--probe")
    assert bad.returncode == 1 and not json.loads(bad.stdout)["ok"]
    pc.remove_parents(cfg)


def test_sweep_reclaims_after_helper_is_killed(private_base, lower_root, rootfs):
    # Probes are covered above; skipping them keeps this test quick.
    cfg = pc.helper_config(private_base, lower_root, rootfs, probe_on_start=False)
    helper = pc.start_helper(private_base, cfg)
    try:
        client = helper.client()
        ids = [client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0,
                                     pids_max=32, upper=upper) for upper in ("tmpfs", "disk", "disk")]
        client.exec(ids[1], "setsid sleep 1000 & disown; echo x > /root/file", user="root")
        client.close()
        inits = helper.sandbox_inits()
        assert len(inits) == 3
        helper.proc.send_signal(signal.SIGKILL)
        helper.proc.wait()
        # The inits see EOF on their control sockets and take their
        # namespaces down; cgroups, uppers and ledger remain for the sweep.
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") for p in inits) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_cgroup_dirs(cfg)) == 12
        # Two disk uppers, each a mount point and its filesystem image.
        assert sorted(os.listdir(cfg["upper_root"]))[1::2] == \
            [n + ".img" for n in sorted(os.listdir(cfg["upper_root"]))[::2]]
        assert len(os.listdir(cfg["upper_root"])) == 4
        assert len(os.listdir(Path(cfg["state_dir"]) / "ledger")) == 3
        swept = _run_helper(private_base / "helper.json", "--sweep")
        assert swept.returncode == 0, swept.stderr
        assert swept.stderr.count("swept sandbox") == 3
        assert _cgroup_dirs(cfg) == []
        assert os.listdir(cfg["upper_root"]) == []
        assert os.listdir(Path(cfg["state_dir"]) / "ledger") == []
        # Twice is fine.
        assert _run_helper(private_base / "helper.json", "--sweep").returncode == 0
    finally:
        pc.stop_helper(helper)


def test_sweep_kills_processes_still_in_cgroups(private_base, lower_root, rootfs):
    """A ledger whose sandbox still runs (e.g. init wedged) is killed via the freezer."""
    cfg = pc.helper_config(private_base, lower_root, rootfs)
    parents = cfg["cgroup_parents"]
    cg = {c: os.path.join(p, "sb-feedfacefeedface") for c, p in parents.items()}
    for path in cg.values():
        os.makedirs(path)
    sleeper = subprocess.Popen(["sleep", "1000"])
    pc.allow_process(sleeper.pid)
    for path in cg.values():
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
    ledger = Path(cfg["state_dir"]) / "ledger"
    ledger.mkdir(parents=True)
    (ledger / "feedfacefeedface.json").write_text(json.dumps({
        "sandbox_id": "feedfacefeedface", "uid": 0, "owner": "t", "created_at": 0.0,
        "cgroups": cg, "upper_dir": "", "lowers": []}))
    path = private_base / "helper.json"
    path.write_text(json.dumps(cfg))
    try:
        swept = _run_helper(path, "--sweep")
        assert swept.returncode == 0, swept.stderr
        assert sleeper.wait(5) == -signal.SIGKILL
        assert _cgroup_dirs(cfg) == []
    finally:
        pc.WATCH.forget_process(sleeper.pid)
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        pc.remove_parents(cfg)


def test_sigterm_destroys_everything(private_base, lower_root, rootfs):
    cfg = pc.helper_config(private_base, lower_root, rootfs, probe_on_start=False)
    helper = pc.start_helper(private_base, cfg)
    client = helper.client()
    for _ in range(3):
        client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32,
                              upper="disk")
    client.close()
    pc.stop_helper(helper)
    assert helper.proc.returncode == 0
    assert not os.path.exists(cfg["socket"])
    assert os.listdir(cfg["upper_root"]) == []
    assert os.listdir(Path(cfg["state_dir"]) / "ledger") == []
    assert "destroyed 3 sandbox(es)" in (private_base / "helper.log").read_text()


def test_list_verbs():
    out = subprocess.run([sys.executable, "-m", "helper", "--list-verbs"], cwd=pc.ROOT,
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(pc.ROOT)))
    verbs = {v["verb"]: v for v in json.loads(out.stdout)}
    assert "io.camg.helper.Exec" in verbs
    fields = {f["name"]: f for f in verbs["io.camg.helper.Exec"]["params"]}
    assert fields["timeout"]["default"] == 60.0 and fields["sandbox_id"]["required"]


def test_bad_config_is_refused_before_serving(private_base):
    path = private_base / "bad.json"
    path.write_text(json.dumps({"socket": "relative.sock"}))
    r = _run_helper(path)
    assert r.returncode == 2 and "must be an absolute path" in r.stderr
    assert r.stderr.startswith("<2>")
    path.write_text(json.dumps({"ceilings": {"timeout": "60"}}))
    r = _run_helper(path)
    assert r.returncode == 2 and "ceilings.timeout" in r.stderr


def test_socket_activation_and_ready_notification(private_base, lower_root, rootfs):
    """LISTEN_FDS as systemd passes it, and READY=1 only after the probes passed."""
    import socket as so
    cfg = pc.helper_config(private_base, lower_root, rootfs)
    cfg["socket"] = str(private_base / "configured-but-unused.sock")
    path = private_base / "helper.json"
    path.write_text(json.dumps(cfg))
    activated = private_base / "activated.sock"
    notify = so.socket(so.AF_UNIX, so.SOCK_DGRAM)
    notify.bind(str(private_base / "notify.sock"))
    notify.settimeout(60)
    env = dict(os.environ, PYTHONPATH=str(pc.ROOT), NOTIFY_SOCKET=str(private_base / "notify.sock"))
    # systemd-socket-activate passes on only the variables named with -E.
    proc = subprocess.Popen(["systemd-socket-activate", "-l", str(activated), "-E", "NOTIFY_SOCKET",
                             "-E", "PYTHONPATH", sys.executable, "-m",
                             "helper", "--config", str(path)], cwd=pc.ROOT, env=env,
                            stderr=open(private_base / "helper.log", "wb"), start_new_session=True)
    pc.allow_process(proc.pid)
    try:
        # systemd-socket-activate execs the helper on the first connection.
        deadline = time.monotonic() + 30
        while not activated.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        from camg.helper_client import HelperClient
        client = HelperClient(str(activated), owner="t")
        client.ping()
        messages = []
        while not any("READY=1" in m for m in messages):
            messages.append(notify.recv(4096).decode())
        assert client.ping()["probes_ok"] is True
        sid = client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32)
        assert client.exec(sid, "echo via-activation").output == "via-activation\n"
        client.destroy(sid)
        client.close()
        assert not os.path.exists(cfg["socket"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        pc.WATCH.forget_process(proc.pid)
        notify.close()
        pc.remove_parents(cfg)


def test_capacity_ceilings(private_base, lower_root, rootfs):
    cfg = pc.helper_config(private_base, lower_root, rootfs, probe_on_start=False,
                           ceilings={"sandboxes_per_peer": 2, "sandboxes_total": 3})
    helper = pc.start_helper(private_base, cfg)
    try:
        a, b = helper.client(owner="a"), helper.client(owner="b")
        spec = dict(memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32)
        a.create_sandbox([str(rootfs)], **spec)
        a.create_sandbox([str(rootfs)], **spec)
        with pytest.raises(errors.AtCapacity):
            a.create_sandbox([str(rootfs)], **spec)
        b.create_sandbox([str(rootfs)], **spec)
        with pytest.raises(errors.AtCapacity):
            b.create_sandbox([str(rootfs)], **spec)
        assert a.release_all() == 2
        b.create_sandbox([str(rootfs)], **spec)
        assert b.release_all() == 2
        a.close()
        b.close()
    finally:
        pc.stop_helper(helper)


def test_release_all_cli_for_exec_stop_post(helper, rootfs):
    owner = f"cli-{os.getpid()}"
    client = helper.client(owner=owner)
    for _ in range(2):
        client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32)
    env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
    out = subprocess.run([sys.executable, "-m", "camg.helper_client", "release-all", "--socket",
                          helper.socket, "--owner", owner], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr
    assert client.list_sandboxes() == []
    # With the helper gone there is nothing to release: still success.
    gone = subprocess.run([sys.executable, "-m", "camg.helper_client", "release-all", "--socket",
                           "/nonexistent.sock"], env=env, capture_output=True, text=True)
    assert gone.returncode == 0
    client.close()
