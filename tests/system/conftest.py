"""Fixtures of the system tests: camg installed by packaging/install.sh into
a cached Debian bookworm root, booted under real systemd in systemd-nspawn.

Costs: cold (empty $CAMG_CACHE) about two minutes of debootstrap and apt on
top of the install; warm, the root is a copy of the cached layer and pip
installs from the bound wheel cache.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import systest_rootfs as rootfs
from systest_machine import Machine
from systest_install import (GUEST_CHECKOUT, GUEST_HELPER_CONFIG, GUEST_PIP_CACHE,
                             GUEST_VENV, INSTALL_FLAGS, guest_root, host_binds, host_pip_env,
                             venv_cache)


def _require_tools() -> None:
    if os.geteuid() != 0:
        pytest.fail("tests/system need root (they boot systemd-nspawn)")
    for tool in ("systemd-nspawn", "debootstrap", "nsenter", "git"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: apt-get install the packages in packaging/apt/systemd.txt")


@pytest.fixture(scope="session")
def installed_root(tmp_path_factory):
    """A fresh copy of the cached root with camg installed by install.sh."""
    _require_tools()
    root = guest_root("root")
    try:
        pip_cache = rootfs.cache_root() / "pip"
        pip_cache.mkdir(exist_ok=True)
        # Build caches of the demo data, shared with tests/privileged (same
        # content keys): the demo image build and the demo task set.
        host_cache = rootfs.cache_root().parent
        demo_binds = []
        for host, guest in ((host_cache / "oci" / "demo", "/var/cache/camg/oci/demo"),
                            (host_cache / "coding", "/var/cache/camg/coding")):
            host.mkdir(parents=True, exist_ok=True)
            demo_binds.append(f"{host}:{guest}")
        # Installed as an operator would: on the booted machine, with systemd
        # as PID 1, so install.sh uses the real socket-activated helper. The
        # host network is needed for PyPI and Debian, so nothing listens on a
        # service port during the install.
        installer = Machine(root, tmp_path_factory.mktemp("install") / "console.log",
                            binds=[f"{pip_cache}:{GUEST_PIP_CACHE}", f"{venv_cache()}:{GUEST_VENV}",
                                   *demo_binds, *host_binds()], private_network=False,
                            # nspawn grants CAP_NET_ADMIN only with a private
                            # network; sandboxes need it to bring up their lo.
                            capabilities=("CAP_NET_ADMIN",))
        started = time.monotonic()
        try:
            installer.boot()
            result = installer.run([f"{GUEST_CHECKOUT}/packaging/install.sh",
                                    "--helper-config", GUEST_HELPER_CONFIG, *INSTALL_FLAGS],
                                   env=host_pip_env(), timeout=2400, check=False)
            if result.returncode == 0:
                # Idempotent: a second run over the first changes nothing
                # that decides a reward (same configuration hash).
                first = installer.run(["cat", "/etc/camg/prepared/schedule.json"]).stdout
                again = installer.run([f"{GUEST_CHECKOUT}/packaging/install.sh",
                                       "--helper-config", GUEST_HELPER_CONFIG, *INSTALL_FLAGS],
                                      env=host_pip_env(), timeout=2400, check=False)
                assert again.returncode == 0, f"second install.sh failed:\n{again.stderr[-4000:]}"
                second = installer.run(["cat", "/etc/camg/prepared/schedule.json"]).stdout
                assert json.loads(first)["config_hash"] == json.loads(second)["config_hash"]
        finally:
            problems = installer.shutdown()
        if result.returncode != 0:
            pytest.fail(f"install.sh failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                        f"{result.stderr[-6000:]}")
        assert not problems, "the install left things behind:\n" + "\n".join(problems)
        print(f"install.sh took {time.monotonic() - started:.0f}s")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def machine(installed_root, tmp_path_factory):
    # No Docker engine: the environments that need one (General, Visual)
    # run under systemd on test_newcomer's demo machine.
    m = Machine(installed_root, tmp_path_factory.mktemp("machine") / "console.log",
                binds=[f"{venv_cache()}:{GUEST_VENV}", *host_binds()])
    try:
        m.boot()
        yield m
    finally:
        problems = m.shutdown()
        assert not problems, "the machine left things behind:\n" + "\n".join(problems)
