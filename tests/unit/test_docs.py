"""The documentation stays a set of short how-to documents that point at
each other and at the code, never at something that is not there.

* README.md is at most 15 KB; packaging/README.md and each environment's
  README at most 16 KB (a reference grows into a lab notebook one
  paragraph at a time; the limit makes moving history out the easy path).
* Every relative link of every Markdown file (third_party/ and virtualenvs
  aside) names a file or directory of the repository, and its #anchor, if
  any, a heading of the Markdown file it names.
* A README paragraph that states a measurement links the bench/results/
  file it comes from, and each figure in it is a value of that file.
* What ships (the wheel's packages, packaging/ and units/, which install.sh
  installs) names no design document or shared directory the repository
  does not have.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: directories whose Markdown is not ours or not the repository's
SKIPPED_DIRS = {"third_party", "node_modules", "__pycache__", "build", "prepared"}
#: what the wheel and install.sh ship (pyproject.toml packages, packaging/, units/)
SHIPPED = ("camg", "environments", "helper", "tools", "packaging", "units", "clients/python")

LIMITS = {"README.md": 15_000, "packaging/README.md": 16_000}


def markdown_files() -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        found += [Path(root) / f for f in sorted(files) if f.endswith(".md")]
    return found


def environment_readmes() -> list[Path]:
    return sorted((REPO / "environments").glob("*/README.md"))


def test_the_documents_are_found():
    names = {p.relative_to(REPO).as_posix() for p in markdown_files()}
    assert {"README.md", "packaging/README.md", "docs/operators.md", "CHANGELOG.md"} <= names
    assert not any(n.startswith(("third_party/", ".venv")) for n in names)
    assert len(environment_readmes()) >= 5


@pytest.mark.parametrize(
    "path",
    [*LIMITS, *(p.relative_to(REPO).as_posix() for p in environment_readmes())],
)
def test_readme_is_short(path):
    limit = LIMITS.get(path, 16_000)
    size = len((REPO / path).read_bytes())
    assert size <= limit, f"{path} is {size} bytes, more than {limit}: move history to CHANGELOG.md"


# --- links ---------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose(text: str) -> str:
    """The text without code: fenced blocks, indented blocks, inline code."""
    text = _FENCE.sub("", text)
    text = "\n".join("" if line.startswith(("    ", "\t")) else line for line in text.split("\n"))
    return _INLINE_CODE.sub("", text)


def links(text: str) -> list[str]:
    body = prose(text)
    return _INLINE_LINK.findall(body) + _REFERENCE.findall(body)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation
    gone, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path.read_text()):
        if _SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if file_part.startswith("/"):
            broken.append(f"{target}: an absolute path")
        elif REPO not in (dest, *dest.parents):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return broken


def test_the_link_check_sees_broken_links(tmp_path, monkeypatch):
    # The check can fail: a missing file, an escape, a missing heading.
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "there.md").write_text("# A `code` heading: yes\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](there.md#a-code-heading-yes) [ok](there.md#twice-1) [ok](https://x.invalid/y)\n"
        "`[in code](gone.md)`\n\n    [indented code](gone.md)\n\n"
        "[gone](gone.md) [out](../elsewhere.md) [anchor](there.md#nope) [self](#nope)\n"
        "[ref]: missing/ref.md\n"
    )
    assert broken_links(doc) == [
        "gone.md: no such file",
        "../elsewhere.md: outside the repository",
        "there.md#nope: no heading #nope in there.md",
        "#nope: no heading #nope in doc.md",
        "missing/ref.md: no such file",
    ]


def test_every_relative_link_resolves():
    broken = {p.relative_to(REPO).as_posix(): broken_links(p) for p in markdown_files()}
    broken = {path: found for path, found in broken.items() if found}
    assert not broken, broken


# --- measurements in the README ------------------------------------------

_PARAGRAPH = re.compile(r"\n\s*\n")
_MEASURE = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s?(ms|µs|us|KB|KiB|MB|MiB|GB|GiB|%)(?!\w)")
_RESULTS = re.compile(r"bench/results/(\w+\.json)")


def leaves(value) -> list[float]:
    if isinstance(value, dict):
        return [x for inner in value.values() for x in leaves(inner)]
    if isinstance(value, list):
        return [x for inner in value for x in leaves(inner)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []


def sourced(shown: str, values: list[float]) -> bool:
    """Whether ``shown`` (as the README prints it) is one of ``values`` at
    the precision shown, or a byte count of them in KB/KiB/MB."""
    number = float(shown.replace(",", ""))
    places = len(shown.partition(".")[2])
    scales = (1, 1000, 1024, 1000**2, 1024**2)
    return any(round(v / s, places) == number for v in values for s in scales)


def unsourced(text: str) -> list[str]:
    problems = []
    for paragraph in _PARAGRAPH.split(prose(text)):
        figures = _MEASURE.findall(paragraph)
        if not figures:
            continue
        files = _RESULTS.findall(paragraph)
        if not files:
            problems.append(f"no bench/results/ link beside {figures[0][0]} {figures[0][1]}")
            continue
        values = [
            x
            for name in files
            for x in leaves(json.loads((REPO / "bench" / "results" / name).read_text()))
        ]
        problems += [f"{n} {u} is in none of {files}" for n, u in figures if not sourced(n, values)]
    return problems


def test_the_readme_measurements_come_from_results_files():
    assert unsourced((REPO / "README.md").read_text()) == []


def test_an_unsourced_measurement_is_found():
    results = sorted((REPO / "bench" / "results").glob("*.json"))
    assert results, "bench/results/ is empty"
    name = results[0].name
    assert unsourced("A step takes 0.2 ms.\n") == ["no bench/results/ link beside 0.2 ms"]
    assert unsourced(f"A step takes 123456.789 ms ([r](bench/results/{name})).\n") == [
        f"123456.789 ms is in none of ['{name}']"
    ]


# --- what ships ------------------------------------------------------------

FORBIDDEN = ("DESIGN.md", "../shared/")


def shipped_files() -> list[Path]:
    out = []
    for top in SHIPPED:
        for root, dirs, files in os.walk(REPO / top):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            out += [Path(root) / f for f in files if not f.endswith((".pyc", ".gz", ".sqlite"))]
    return out


def mentions(words: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in shipped_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits = [w for w in words if w in text]
        if hits:
            found[path.relative_to(REPO).as_posix()] = hits
    return found


def test_shipped_files_name_no_document_outside_the_repository():
    assert len(shipped_files()) > 100
    assert mentions(FORBIDDEN) == {}


def test_shipped_files_cite_no_notes_outside_the_repository():
    assert mentions(("/work/notes/",)) == {}
