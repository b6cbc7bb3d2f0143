"""Every pin of the lock and of every image build is served by PyPI alone.

These machines' pip configuration adds a local wheel directory, two local
indexes and a constraint file; a user's machine has none of them. So the
check asks PyPI's own index (https://pypi.org/simple, the JSON form of
PEP 691: the same page pip reads for each project), never pip with this
machine's configuration, and requires for every pin a release file of
exactly that version (a ``+cpu`` local label is part of it), not yanked,
whose Requires-Python admits the interpreter, and that is a wheel for the
interpreter (CPython 3.11.2 or 3.12 on x86_64 glibc 2.36, Debian bookworm)
or an sdist. packaging/lock.sh installs the whole lock from PyPI alone on
both interpreters; this is the fast guard against a hand edit.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging import tags
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

CHECKOUT = Path(__file__).resolve().parents[2]
INDEX = "https://pypi.org/simple"
GLIBC = (2, 36)
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC[1], 4, -1)] + \
    ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
#: (python_full_version for Requires-Python, tag version)
CP311 = ("3.11.2", (3, 11))
CP312 = ("3.12.0", (3, 12))


def supported(version: tuple[int, int]) -> set[tags.Tag]:
    return set(tags.cpython_tags(version, platforms=PLATFORMS)) | \
        set(tags.compatible_tags(version, platforms=PLATFORMS))


def project_files(name: str) -> list[dict] | None:
    """The project's files on the index, or None when it has no such project."""
    request = urllib.request.Request(f"{INDEX}/{canonicalize_name(name)}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    for attempt in range(4):
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return json.load(reply)["files"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code < 500 or attempt == 3:
                raise
        except (urllib.error.URLError, OSError):
            # a resolver or connection hiccup (seen once among 16 parallel
            # look-ups) is not an answer about the pin: ask again
            if attempt == 3:
                raise
        time.sleep(1 + 2 * attempt)
    raise AssertionError("unreachable")


def servable(pin: str, files: list[dict] | None, pythons) -> str | None:
    """Why PyPI cannot serve ``pin`` to one of ``pythons``, or None."""
    name, _, wanted = pin.partition("==")
    if files is None:
        return f"{pin}: no project {name!r} on PyPI"
    version = Version(wanted)
    for full, tag_version in pythons:
        ok = supported(tag_version)
        found = False
        for f in files:
            if f.get("yanked"):
                continue
            filename = f["filename"]
            try:
                if filename.endswith(".whl"):
                    _, v, _, file_tags = parse_wheel_filename(filename)
                    usable = bool(file_tags & ok)
                elif filename.endswith((".tar.gz", ".zip")):
                    _, v = parse_sdist_filename(filename)
                    usable = True
                else:
                    continue
            except ValueError:
                continue
            if v != version or not usable:
                continue
            spec = f.get("requires-python")
            if spec and Version(full) not in SpecifierSet(spec):
                continue
            found = True
            break
        if not found:
            return f"{pin}: no file on PyPI for Python {full} (x86_64, glibc {GLIBC[0]}.{GLIBC[1]})"
    return None


def unservable(pins: list[str], pythons) -> list[str]:
    names = sorted({p.partition("==")[0] for p in pins})
    with ThreadPoolExecutor(16) as pool:
        files = dict(zip(names, pool.map(project_files, names)))
    return [why for why in (servable(p, files[p.partition("==")[0]], pythons) for p in pins) if why]


def lock_pins(text: str) -> list[str]:
    pins = [line.split(";")[0].strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^=\s]+", p) for p in pins), pins
    return pins


@pytest.fixture(scope="module")
def pypi():
    try:
        project_files("pip")
    except (urllib.error.URLError, OSError) as exc:
        if os.environ.get("CI") or os.environ.get("CAMG_REQUIRE_PYPI"):
            raise
        pytest.skip(f"PyPI is unreachable: {exc}")


def image_pins() -> list[str]:
    from tools import oci_demo
    from tools.oci.build import load_spec
    from environments.autoresearch.demo import image as autoresearch_image
    from environments.visual.build import renderer_rootfs
    second = load_spec(CHECKOUT / "environments/coding/demo/parse.json")
    return [*oci_demo.REQUIREMENTS, *oci_demo.BUILD_REQUIREMENTS, *renderer_rootfs.WHEELS,
            *second.pip_packages, *second.build_packages,
            *(p for p in autoresearch_image.REQUIREMENTS if not p.startswith("torch=="))]


def test_every_lock_pin_is_on_pypi_for_311_and_312(pypi):
    pins = lock_pins((CHECKOUT / "requirements.lock").read_text())
    assert len(pins) > 100
    assert unservable(pins, (CP311, CP312)) == []


def test_every_image_pin_is_on_pypi(pypi):
    # The images run Debian bookworm's python3 (3.11.2). Their torch is the
    # CPU build from the PyTorch CPU index (environments/autoresearch/demo/image.py).
    assert unservable(image_pins(), (CP311,)) == []


def test_the_client_extras_pins_are_on_pypi(pypi):
    # The trainer's own packages (ray, the adapters' frameworks) are pinned
    # only in the client distribution's extras, never the services' lock.
    import tomllib
    extras = tomllib.loads((CHECKOUT / "clients/python/pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    pins = sorted({p for deps in extras.values() for p in deps if "==" in p})
    assert any(p.startswith("ray==") for p in pins), pins
    assert unservable(lock_pins("\n".join(pins)), (CP311, CP312)) == []


def test_a_pin_only_a_local_directory_has_is_refused(pypi):
    # What the lock held before issue 23: the CPU build from /opt/wheels.
    refused = unservable(["torch==2.13.0+cpu", "torch==2.13.0", "no-such-project-camg==1.0"], (CP311,))
    assert [why.split(":")[0] for why in refused] == ["torch==2.13.0+cpu", "no-such-project-camg==1.0"]


def test_the_services_venv_has_no_dense_retrieval_stack():
    names = {p.partition("==")[0].lower() for p in lock_pins((CHECKOUT / "requirements.lock").read_text())}
    assert names.isdisjoint({"torch", "faiss-cpu", "onnxruntime", "transformers"})
    assert "pyserini" in names and "pyjnius" in names
