"""A tiny sdist with a real pytest suite, for tests and benchmarks of the
task builder and the grading procedure without the demo image.

It is a real project in every way the pipeline cares about (src layout,
tests/ directory, a conftest, parametrized tests), only small enough that
its suite runs in a fraction of a second.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

FILES = {
    "PKG-INFO": "Metadata-Version: 2.1\nName: calc\nVersion: 1.0\n",
    "pyproject.toml": '[project]\nname = "calc"\nversion = "1.0"\n\n'
    '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
    "src/calc/__init__.py": '''"""Small arithmetic helpers."""


def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def scale(values, factor):
    result = []
    for value in values:
        result.append(value * factor)
    return result


def window(values, size):
    if size <= 0:
        raise ValueError("size must be positive")
    return [values[i:i + size] for i in range(0, len(values) - size + 1)]
''',
    "tests/__init__.py": "",
    "tests/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef numbers():\n"
    "    return [1, 2, 3, 4]\n",
    "tests/test_clamp.py": """import pytest

from calc import clamp


@pytest.mark.parametrize("value,expected", [(-1, 0), (5, 5), (11, 10)])
def test_clamp(value, expected):
    assert clamp(value, 0, 10) == expected


def test_clamp_edges():
    assert clamp(0, 0, 10) == 0
    assert clamp(10, 0, 10) == 10
""",
    "tests/test_stats.py": """from calc import mean, scale


def test_mean(numbers):
    assert mean(numbers) == 2.5


def test_scale(numbers):
    assert scale(numbers, 2) == [2, 4, 6, 8]


def test_scale_empty():
    assert scale([], 3) == []
""",
    "tests/test_window.py": """import pytest

from calc import window


def test_window(numbers):
    assert window(numbers, 2) == [[1, 2], [2, 3], [3, 4]]


def test_window_rejects_zero():
    with pytest.raises(ValueError):
        window([1], 0)
""",
}


def write_sdist(directory: str | Path, name: str = "calc-1.0") -> Path:
    """Write ``<name>.tar.gz`` (top-level directory ``name``) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(FILES.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return path


def cache_root() -> Path:
    import os

    return Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test")) / "coding"


def task_set(python: str, count: int = 4) -> Path:
    """Build (cached by inputs) a synthetic task set; returns its directory
    holding ``mirrors/``, ``tasks.jsonl`` and ``tasks.parquet``."""
    import hashlib
    import json
    import os
    import shutil
    import tempfile

    from environments.coding.demo import bugs, demo_tasks

    sources = Path(bugs.__file__).read_text() + Path(demo_tasks.__file__).read_text()
    key = hashlib.sha256(json.dumps([FILES, sources, python, count]).encode()).hexdigest()[:16]
    final = cache_root() / f"synthetic-{key}"
    if (final / "tasks.jsonl").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".synthetic.", dir=final.parent))
    try:
        sdist = write_sdist(tmp / "sdist")
        spec = demo_tasks.DemoSpec(
            sdist=sdist,
            owner="acme",
            project="calc",
            image_name="camg/demo-apispec-6.8.1",
            count=count,
            per_modifier=1,
        )
        rows = demo_tasks.build(spec, tmp / "set", demo_tasks.local_runner(python))
        demo_tasks.write_rows(rows, tmp / "set")
        try:
            os.rename(tmp / "set", final)
        except OSError:
            if not (final / "tasks.jsonl").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
