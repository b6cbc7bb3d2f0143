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

PREFIXES = ("camg", "environments", "tools", "prepare_demo", "install.sh", "demo.sh", "bootstrap.sh",
            "run-foreground.sh", *plugins.all_plugins())
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
    # A library's basicConfig format, and a label without its tool: not ours.
    assert not_ours("2026-12-02 07:37:57,241 - tools.oci - INFO - image x: reused\n"
                    "demo task set: candidate bugs tried: 6 candidates, 16s …\n") != []
    assert not_ours("tools.oci: image x: reused\ncoding: demo task set: 6 candidates, 16s …\n") == []


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


def test_a_command_logs_ours_and_a_library_cannot_reconfigure_it():
    """camg.logs.setup_command, as camg.prepare and prepare_demo.py start: our
    loggers' INFO as ``name: message``; a library's later basicConfig does
    nothing; others' INFO is dropped and their warnings stay visible."""
    run = ("import logging; from camg import logs; logs.setup_command(); "
           "logging.basicConfig(level=logging.INFO, "
           "format='%(asctime)s - %(name)s - %(levelname)s - %(message)s'); "
           "logging.getLogger('tools.oci').info('image x: reused'); "
           "logging.getLogger('faiss.loader').info('Loading faiss with AVX2 support.'); "
           "logging.getLogger('somelib').warning('careful')")
    proc = subprocess.run([sys.executable, "-c", run], cwd=testing.REPO, capture_output=True,
                          text=True, timeout=60, check=True,
                          env={**os.environ, "PYTHONPATH": str(testing.REPO)})
    assert proc.stderr.splitlines() == ["tools.oci: image x: reused", "somelib: careful"]
    assert not_ours(proc.stderr) == ["somelib: careful"]
