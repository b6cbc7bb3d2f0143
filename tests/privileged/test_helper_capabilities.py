"""The helper unit's CapabilityBoundingSet= is exactly what the code uses.

The set is read from units/camg-helper.service. With exactly that bounding
set (setpriv; a root process's permitted set is its bounding set after
exec) the helper passes every isolation probe and serves a full sandbox
lifecycle. With any one capability dropped from it, the probes fail — so
none of them is there "just in case". The failure each drop causes is
printed; the unit file's comment must give the same reasons.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import conftest as pc

UNIT = pc.ROOT / "units" / "camg-helper.service"
# What a dropped capability breaks first (sbxinit's setup message, or the
# probe that fails): the reason the unit file gives, checked.
BREAKS = {
    "CAP_SYS_ADMIN": ("unshare",),          # namespaces, mounts, pivot_root, sethostname
    "CAP_SETPCAP": ("drop cap",),           # PR_CAPBSET_DROP for sandbox commands
    "CAP_NET_ADMIN": ("set lo up",),        # the sandbox's loopback
    "CAP_MKNOD": ("mknod",),                # the minimal /dev
    "CAP_SYS_PTRACE": ("loopback_only",),   # /proc/<non-dumpable init>/ns/net for the netns probe
    # cgroup parents under a 0555 controller root (no delegation), else capset
    "CAP_DAC_OVERRIDE": ("Permission denied", "capset"),
}
# Kept by a sandbox's root (sbxinit.c keep_caps): without one, init's capset
# fails (and the helper needs SETUID, SETGID, KILL and CHOWN on its own too).
for _cap in ("CHOWN", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE",
             "SYS_CHROOT"):
    BREAKS[f"CAP_{_cap}"] = ("capset",)


def unit_capabilities() -> list[str]:
    text = UNIT.read_text()
    [line] = [l for l in text.splitlines() if l.startswith("CapabilityBoundingSet=")]
    return line.split("=", 1)[1].split()


def keep_caps() -> set[str]:
    source = (pc.ROOT / "helper" / "sbxinit.c").read_text()
    block = re.search(r"keep_caps\[\] = \{(.*?)\};", source, re.S).group(1)
    return set(re.findall(r"CAP_[A-Z_]+", block))


def _bounded(caps: list[str]) -> list[str]:
    spec = ",".join(["-all"] + [f"+{c.removeprefix('CAP_').lower()}" for c in caps])
    return ["setpriv", f"--bounding-set={spec}", "--inh-caps=-all"]


def _probe(base: Path, lower_root: Path, rootfs: Path, caps: list[str]) -> tuple[int, str]:
    cfg = pc.helper_config(base, lower_root, rootfs)
    base.mkdir(parents=True, exist_ok=True)
    (base / "uppers").mkdir(exist_ok=True)
    (base / "helper.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
    try:
        out = subprocess.run(_bounded(caps) + [sys.executable, "-m", "helper", "--config",
                             str(base / "helper.json"), "--probe"], cwd=pc.ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    finally:
        pc.remove_parents(cfg)
    return out.returncode, out.stdout + out.stderr


@pytest.fixture
def private_base():
    base = Path(tempfile.mkdtemp(prefix="camg-helper-test-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_unit_comment_gives_a_reason_for_every_capability():
    caps = unit_capabilities()
    assert len(caps) == len(set(caps))
    assert set(caps) == set(BREAKS), "the set must be exactly what the code uses"
    assert keep_caps() <= set(caps), "a sandbox's root cannot keep what the helper lacks"
    comment = UNIT.read_text().split("CapabilityBoundingSet=")[0]
    for cap in caps:
        assert cap.removeprefix("CAP_") in comment, f"{cap}: no reason given in the unit"


def test_exactly_the_unit_set_passes_probes_and_serves(private_base, lower_root, rootfs):
    code, out = _probe(private_base / "probe", lower_root, rootfs, unit_capabilities())
    assert code == 0, out[-3000:]
    assert json.loads(out[:out.rindex("}") + 1])["ok"] is True
    # A full lifecycle on the socket under the same bounding set: disk upper,
    # agent and root commands, archives both ways, a timed-out tree killed,
    # destroy removing agent-owned files the helper cannot read by mode.
    cfg = pc.helper_config(private_base / "serve", lower_root, rootfs, probe_on_start=False)
    helper = _start_bounded(private_base / "serve", cfg, unit_capabilities())
    try:
        client = helper.client(owner="caps")
        sid = client.create_sandbox([str(rootfs)], memory_bytes=256 << 20, cpu_quota=1.0,
                                    pids_max=64, upper="disk")
        r = client.exec(sid, "mkdir -p /tmp/d/e && echo hi > /tmp/d/e/f && chmod 000 /tmp/d/e "
                        "/tmp/d && id -u")
        assert r.exit_code == 0 and r.output.strip() == "2000", r.output
        r = client.exec(sid, "chown 0 /tmp/d && chmod 4755 /tmp/d && kill -0 1", user="root")
        assert r.exit_code == 0, r.output
        client.put_archive(sid, "/tmp/x", _tar({"a.txt": b"A"}), user="agent")
        assert b"a.txt" in client.get_archive(sid, "/tmp/x")
        slow = client.exec(sid, "setsid sleep 300 & sleep 300", timeout=1)
        assert slow.timed_out
        assert client.destroy(sid)
        client.close()
    finally:
        pc.stop_helper(helper)


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _start_bounded(base: Path, cfg: dict, caps: list[str]) -> pc.HelperProcess:
    base.mkdir(parents=True, exist_ok=True)
    (base / "uppers").mkdir(exist_ok=True)
    (base / "helper.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
    proc = subprocess.Popen(_bounded(caps) + [sys.executable, "-m", "helper", "--config",
                            str(base / "helper.json")], cwd=pc.ROOT, env=env,
                            stderr=open(base / "helper.log", "ab"), start_new_session=True)
    pc.allow_process(proc.pid)
    helper = pc.HelperProcess(base, cfg, proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (base / "helper.log").read_text()[-2000:]
        if os.path.exists(cfg["socket"]):
            try:
                helper.client().ping()
                return helper
            except OSError:
                pass
        time.sleep(0.05)
    pc.stop_helper(helper)
    raise AssertionError("helper never answered")


@pytest.mark.parametrize("dropped", sorted(BREAKS))
def test_every_capability_in_the_set_is_needed(private_base, lower_root, rootfs, dropped):
    caps = [c for c in unit_capabilities() if c != dropped]
    code, out = _probe(private_base, lower_root, rootfs, caps)
    assert code != 0, f"probes pass without {dropped}: it is not needed"
    assert any(marker in out for marker in BREAKS[dropped]), out[-3000:]
    print(f"without {dropped}: {[m for m in BREAKS[dropped] if m in out][0]!r} fails")
