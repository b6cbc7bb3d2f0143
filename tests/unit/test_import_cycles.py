"""No import circle between modules of the shipped packages.

grimp reads every import statement, function-local ones included (a
circle hidden in a function body is still a circle: the two modules cannot
be read, tested or moved apart); imports under ``if TYPE_CHECKING:`` are
left out, as they never run. A circle is a strongly connected component of
more than one module; the test names each with the import lines that close
it, and fails on a circle planted in a temporary copy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("camg", "environments", "helper", "tools", "devtools", "camg_client")

# Run in a child: grimp imports nothing of the packages, but finds them on
# sys.path, and the planted copy must come before the editable install.
CHECK = r"""
import sys
import grimp

packages = sys.argv[1:]
graph = grimp.build_graph(*packages, include_external_packages=False,
                          exclude_type_checking_imports=True, cache_dir=None)
edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
index, low, stack, on_stack, circles = {}, {}, [], set(), []

def visit(root):
    # Tarjan's strongly connected components, iteratively (deep packages).
    work = [(root, iter(edges[root]))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
        node, children = work[-1]
        for child in children:
            if child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
                break
            if child in on_stack:
                low[node] = min(low[node], index[child])
        else:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))

for module in edges:
    if module not in index:
        visit(module)
for circle in circles:
    print("circle:", " ".join(circle))
    for importer in circle:
        for imported in edges[importer]:
            if imported in circle:
                lines = [d["line_number"] for d in
                         graph.get_import_details(importer=importer, imported=imported)]
                print(f"  {importer} -> {imported} (line {', '.join(map(str, lines))})")
print(f"{len(edges)} modules, {len(circles)} circles")
"""


def circles(tree: Path, *extra_path: Path) -> subprocess.CompletedProcess:
    path = ":".join(str(p) for p in (tree, *extra_path))
    return subprocess.run([sys.executable, "-c", CHECK, *PACKAGES], cwd=tree,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=300)


def test_no_import_circles():
    proc = circles(ROOT, ROOT / "clients" / "python")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith(" 0 circles"), proc.stdout[-4000:]


def test_a_function_local_circle_is_found(tmp_path):
    for package in ("camg", "environments", "helper", "tools", "devtools"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.gz", "data", "testdata"))
    shutil.copytree(ROOT / "clients" / "python" / "camg_client", tmp_path / "camg_client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # camg.errors is a leaf everything imports: one import back in a
    # function body closes a circle.
    with open(tmp_path / "camg" / "atomic.py", "a") as handle:
        handle.write("\n\ndef _planted():\n    from camg import errors  # noqa: F401\n")
    with open(tmp_path / "camg" / "errors.py", "a") as handle:
        handle.write("\n\ndef _planted():\n    from camg import atomic  # noqa: F401\n")
    proc = circles(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "circle: camg.atomic camg.errors" in proc.stdout, proc.stdout[-4000:]
    assert "camg.errors -> camg.atomic (line" in proc.stdout
