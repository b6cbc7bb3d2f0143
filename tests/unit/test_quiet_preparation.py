"""A preparation prints only our lines: progress and one summary, no
third-party banner (pyjnius' "Please report..." block, faiss' INFO lines,
Java or pip warnings).

"Ours" is a line that starts with one of the project's log prefixes
(``<tool or environment>: ``, as ``camg_log`` in packaging/lib.sh, the
``camg.*`` modules and the environments' preparations write them) on
stderr, and the JSON summary a ``camg.prepare`` command prints on stdout.
"""

import json
import os
import re
import subprocess
import sys

from camg import plugins
from tests.support import shop_testing as testing

PREFIXES = ("camg", "prepare_demo", "install.sh", "demo.sh", "bootstrap.sh", "run-foreground.sh",
            *plugins.all_plugins())
OURS = re.compile(rf"^({'|'.join(re.escape(p) for p in PREFIXES)})(\.[\w.]+)?(\[\d+\])?: ")


def not_ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not OURS.match(line)]


def test_the_rule_catches_the_banners_we_had():
    assert not_ours("shop: building the Lucene index /x: 15s …\nprepare_demo: shop: done (3s)\n") == []
    banner = ("INFO:faiss.loader:Loading faiss with AVX2 support.\n"
              "[INFO   ] [Jnius      ] Using override env var JVM_PATH (/j) to load libjvm.\n"
              "    Please report your system information (os version, java\n"
              "WARNING: sun.reflect.Reflection.getCallerClass is not supported.\n")
    assert len(not_ours(banner)) == 4


def test_shop_preparation_prints_only_our_lines(tmp_path):
    out, settings = testing.prepared()
    # The cached test index, verified in place: the JVM, the searcher and the
    # manifest (the index build itself runs in a child whose output is captured).
    # Root logging at INFO, as a caller that configured logging has it: the
    # banners above are INFO records of pyjnius' and faiss' loggers.
    run = ("import logging, sys; logging.basicConfig(level=logging.INFO); "
           "from camg import prepare; sys.exit(prepare.main(sys.argv[1:]))")
    proc = subprocess.run(
        [sys.executable, "-c", run, "--environment", "shop", "--output", str(tmp_path / "p"),
         "--java-home", settings["java_home"], "--index-dir", settings["index_dir"]],
        cwd=testing.REPO, env={**os.environ, "PYTHONPATH": str(testing.REPO)},
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not_ours(proc.stderr) == []
    summary = json.loads(proc.stdout)
    assert summary["products"] == 1000 and summary["tasks"] > 0
