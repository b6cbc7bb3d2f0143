"""Leak check: does anything the agent can read carry the clean version of a file the task changed?

A task's workspace holds the buggy version of some files; the image it
runs on was often built (and byte-compiled, installed, cached) at the
clean commit. Anything of that build still visible to the agent gives the
fix away: a ``__pycache__/*.pyc`` of the clean module, unmarshalled and
compared with ``compile()`` of the visible source, names the function the
bug is in and holds its fixed bytecode; a ``build/lib`` or site-packages
copy, a wheel or egg, or a git object of the clean blob holds its text.

``PROBE`` runs inside the agent's view (a helper sandbox or a General task
container, as the agent uid, with the image's own interpreter so the
bytecode magic matches) and reports every such artefact:

* ``bytecode`` — a pyc (any name beside or under the roots whose module
  stem is a changed file's) holding a code object of the clean source
  that the visible source does not have (the fixed function);
* ``text`` — a file (or a member of a zip/tar archive) holding a block of
  lines the clean file has and the visible one does not;
* ``git_object`` — the workspace's repository holds the clean blob.

``findings(run, clean)`` sends the clean sources on stdin and
parses the answer; ``run(command, stdin) -> (exit_code, output)`` wraps the
helper's Exec or a container's. Preparation's ``--validate`` refuses a task
whose agent view leaks (environments.coding.validate); Coding's canary suite
calls ``sandbox_findings`` (environments.coding.checks.canaries.view_leaks), General's
``environments.general.demo.code_tasks.container_leaks``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shlex
import zlib
from collections.abc import Callable, Mapping

from camg.errors import InfraFailure
from environments.coding import mirrors

# Stdlib only, Python >= 3.8 (whatever the image ships). Reads a JSON
# payload on stdin, prints one JSON line.
PROBE = r"""
import difflib, hashlib, importlib.util, io, json, marshal, os, site, subprocess, sys, tarfile, zipfile
req = json.loads(sys.stdin.buffer.read())
workdir = req["workdir"]
MAGIC = importlib.util.MAGIC_NUMBER
SKIP_DIRS = {"/proc", "/sys", "/dev", "/run"}
MAX_TEXT = 8 << 20

def fp(code):
    consts = tuple(fp(c) if hasattr(c, "co_code") else (type(c).__name__, repr(sorted(map(repr, c))
                   if isinstance(c, frozenset) else c)) for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars,
            code.co_cellvars, code.co_argcount, code.co_kwonlyargcount, code.co_flags)

def walk_code(code, prefix=""):
    name = prefix + getattr(code, "co_qualname", code.co_name)
    yield name, fp(code)
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from walk_code(c, name + ">" if not hasattr(c, "co_qualname") else "")

def compiled(text, filename):
    try:
        return dict(walk_code(compile(text, filename, "exec", dont_inherit=True)))
    except (SyntaxError, ValueError):
        return {}

targets = []
for rel, clean in req["files"].items():
    path = os.path.join(workdir, rel)
    try:
        visible = open(path, encoding="utf-8", errors="surrogateescape").read()
    except OSError:
        visible = ""
    stem = os.path.basename(rel).rsplit(".", 1)[0]
    fixed = {}
    if rel.endswith(".py"):
        seen = set(compiled(visible, path).items())
        fixed = {n: f for n, f in compiled(clean, path).items() if (n, f) not in seen}
    a, b = clean.splitlines(), visible.splitlines()
    blocks = []
    for op, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        # With a line of context each side: a fixed line alone may be short.
        block = "\n".join(a[max(i1 - 1, 0):i2 + 1])
        if op in ("replace", "delete") and len("".join(block.split())) >= 16:
            blocks.append(block.encode("utf-8", "surrogateescape"))
    raw = clean.encode("utf-8", "surrogateescape")
    blob = hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()
    targets.append({"rel": rel, "path": path, "stem": stem, "fixed": fixed, "blocks": blocks,
                    "blob": blob})
visible_paths = {t["path"] for t in targets}
stems = {t["stem"] for t in targets}
# Archives are opened when they sit in the workspace or are named for a
# directory of a changed file (apispec-6.8.1-py3-none-any.whl for src/apispec/...).
names = {part.lower().replace("_", "-") for t in targets for part in t["rel"].split("/")[:-1]}
findings, stats = [], {"pyc": 0, "foreign_pyc": 0, "files": 0, "archives": 0}

def add(kind, path, t, detail):
    if len(findings) < 100:
        findings.append({"kind": kind, "path": path, "file": t["rel"], "detail": detail[:200]})

def check_pyc(path, data):
    stats["pyc"] += 1
    if data[:4] != MAGIC:
        stats["foreign_pyc"] += 1
        return
    try:
        code = marshal.loads(data[16:])
        have = set(walk_code(code))
    except Exception:
        return
    for t in targets:
        hit = sorted(n for n, f in t["fixed"].items() if (n, f) in have)
        if hit:
            add("bytecode", path, t, "clean code of " + ", ".join(hit))

def check_text(path, data):
    for t in targets:
        for block in t["blocks"]:
            if block in data:
                add("text", path, t, block.decode("utf-8", "replace").strip().splitlines()[0])
                break

def check_archive(path):
    stats["archives"] += 1
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                members = [(i.filename, lambda i=i: z.read(i)) for i in z.infolist()
                           if i.file_size < MAX_TEXT]
                scan_members(path, members)
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as tar:
                members = [(m.name, lambda m=m: tar.extractfile(m).read()) for m in tar.getmembers()
                           if m.isfile() and m.size < MAX_TEXT]
                scan_members(path, members)
    except Exception:
        pass

def scan_members(path, members):
    for name, read in members:
        base = os.path.basename(name)
        if base.endswith((".pyc", ".pyo")) and base.split(".", 1)[0] in stems:
            check_pyc(path + "!" + name, read())
        elif base.endswith(".py") or base.split(".", 1)[0] in stems:
            check_text(path + "!" + name, read())

def scan(root, everything):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git" and os.path.join(dirpath, d) not in SKIP_DIRS]
        for name in filenames:
            path = os.path.join(dirpath, name)
            if path in visible_paths or os.path.islink(path) or path in done:
                continue
            done.add(path)
            stem = name.split(".", 1)[0]
            try:
                if name.endswith((".pyc", ".pyo")):
                    if stem in stems:
                        check_pyc(path, open(path, "rb").read())
                elif name.endswith((".whl", ".egg", ".zip", ".tar", ".tar.gz", ".tgz")):
                    if everything or name.split("-")[0].lower().replace("_", "-") in names:
                        check_archive(path)
                elif everything or stem in stems:
                    if os.path.getsize(path) < MAX_TEXT:
                        stats["files"] += 1
                        check_text(path, open(path, "rb").read())
            except OSError:
                pass

done = set()
scan(workdir, True)
interpreter = sys.path + site.getsitepackages() if req.get("site", True) else []
roots = [p for p in interpreter + req.get("roots", [])
         if p and os.path.isdir(p) and not p.startswith(workdir)]
for root in dict.fromkeys(roots):
    scan(root, False)
if os.path.isdir(os.path.join(workdir, ".git")):
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    for t in targets:
        try:
            r = subprocess.run(["git", "-c", "safe.directory=*", "-C", workdir, "cat-file", "-e",
                                t["blob"]], capture_output=True, env=env, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            add("git_object", os.path.join(workdir, ".git"), t, "clean blob " + t["blob"])
print("CAMG-LEAKS " + json.dumps({"findings": findings, "stats": stats}))
"""  # noqa: E501  # the probe runs in the sandbox as written; rewrapping grows its payload


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str  # bytecode | text | git_object
    path: str  # where, in the agent's view ("archive!member" inside archives)
    file: str  # the changed file (workspace-relative) whose clean version leaked
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.path} ({self.file}: {self.detail})"


Runner = Callable[[str, bytes], tuple[int, str]]


# The interpreter the task's tests run with (its bytecode magic is the one
# that matters): the SWE-smith environment, the demo venv, else python3.
AUTO_PYTHON = ""
_CANDIDATES = ("/opt/miniconda3/envs/testbed/bin/python", "/opt/testbed-venv/bin/python")


def command(python: str = AUTO_PYTHON) -> str:
    if python:
        return f"{shlex.quote(python)} -I -c {shlex.quote(PROBE)}"
    probe = " ".join(shlex.quote(p) for p in _CANDIDATES)
    return (
        f'py=python3; for p in {probe}; do if [ -x "$p" ]; then py=$p; break; fi; done; '
        f'"$py" -I -c {shlex.quote(PROBE)}'
    )


# Besides the workspace and the interpreter's sys.path/site-packages: where
# an image keeps environments, caches and copies (stem-matched files only).
ROOTS = ("/opt", "/usr/local/lib", "/tmp", "/var/tmp", "/home", "/root", "/srv")


def payload(
    clean: Mapping[str, str],
    workdir: str = "/testbed",
    roots: tuple[str, ...] = ROOTS,
    site: bool = True,
) -> bytes:
    """``site``: also the interpreter's sys.path and site-packages."""
    return json.dumps(
        {"workdir": workdir, "files": dict(clean), "roots": list(roots), "site": site}
    ).encode()


def shell_command(
    clean: Mapping[str, str], python: str = AUTO_PYTHON, workdir: str = "/testbed"
) -> str:
    """The probe as one shell command with its payload inline (for a shell
    action where no stdin can be given; mind the action's length limit)."""
    data = base64.b64encode(zlib.compress(payload(clean, workdir), 9)).decode()
    unzip = (
        "python3 -c 'import sys,zlib;"
        "sys.stdout.buffer.write(zlib.decompress(sys.stdin.buffer.read()))'"
    )
    return f"echo {data} | base64 -d | {unzip} | {{ {command(python)}; }}"


def parse(output: str) -> tuple[list[Finding], dict]:
    match = re.search(r"^CAMG-LEAKS (\{.*\})$", output, re.M)
    if match is None:
        raise InfraFailure(f"leak probe gave no answer: {output[-600:]}")
    body = json.loads(match.group(1))
    return [Finding(**f) for f in body["findings"]], body["stats"]


def findings(
    run: Runner,
    clean: Mapping[str, str],
    python: str = AUTO_PYTHON,
    workdir: str = "/testbed",
    roots: tuple[str, ...] = ROOTS,
    site: bool = True,
) -> tuple[list[Finding], dict]:
    """Run the probe through ``run`` and return (findings, stats)."""
    if not clean:
        raise ValueError("no changed files to look for")
    code, output = run(command(python), payload(clean, workdir, roots, site))
    if code != 0:
        raise InfraFailure(f"leak probe exited {code}: {output[-600:]}")
    return parse(output)


def changed_paths(patch: str) -> list[str]:
    """Files a git diff touches (either side), in order."""
    paths = []
    for line in patch.splitlines():
        match = re.match(r"^diff --git a/(.+) b/(.+)$", line)
        if match:
            for path in match.groups():
                if path not in paths:
                    paths.append(path)
    return paths


def clean_from_mirror(mirror: str, commit: str, paths: list[str]) -> dict[str, str]:
    """The clean versions (at ``commit``) of ``paths`` that exist there."""
    out = {}
    for path in paths:
        try:
            out[path] = mirrors.git(mirror, "show", f"{commit}:{path}")
        except Exception:  # a file the bug added has no clean version
            continue
    return out


def prepared_clean_sources(prepared) -> dict[str, str]:
    """For a prepared Coding task (episode.Prepared): the clean versions (the
    bug commit's parent) of the files its bug patch changes."""
    return clean_from_mirror(
        prepared.ref.mirror, f"{prepared.ref.tests}~1", changed_paths(prepared.row.patch)
    )


def sandbox_findings(
    helper,
    sandbox_id: str,
    clean: Mapping[str, str],
    python: str = AUTO_PYTHON,
    workdir: str = "/testbed",
) -> tuple[list[Finding], dict]:
    """In a helper sandbox, as the agent."""

    def run(cmd: str, stdin: bytes) -> tuple[int, str]:
        r = helper.exec(
            sandbox_id, cmd, user="agent", cwd=workdir, stdin=stdin, timeout=120, output_limit=65536
        )
        return r.exit_code, r.output

    return findings(run, clean, python, workdir)
