#!/usr/bin/env python3
"""AutoResearch benchmark: grading latency and the sandbox's overhead on an experiment.

    sudo .venv/bin/python -m environments.autoresearch.checks.bench \
        [--grades 200] [--experiment-s 60]
        [--rounds 2] [--paired] [--json OUT]

Real research image (environments.autoresearch.demo.image, cached under $CAMG_CACHE),
the demo tasks installed into three roots by camg.prepare's code, a private
camg-helper, and ResearchEnvironment with its private grader child under
the camg-grader uid, exactly as the service runs it.

* grading: the round trip of a reference submission to the grader process
  (authenticated frames over the socketpair, parse, metric, normalise),
  p50/p99 per task, against the same computation in this process
  (grader.grade on the loaded answers) measured in the same run; and the
  whole ``submit`` step (submission copied out of the sandbox, sandbox
  destroyed) plus grading, per episode.
* experiment: one fixed piece of research work (repeated scikit-learn fits
  on the digits task, single-threaded, calibrated on the host to take
  ``--experiment-s`` seconds) run inside an episode's sandbox as an agent
  command and on the host with the same numpy/scipy/scikit-learn releases,
  interleaved ``--rounds`` times (``--paired``: both at once, so a machine
  others load affects both sides alike): wall time inside vs outside, and
  the experiment process's own CPU seconds on each side.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.harness.helpers import start_private

EXPERIMENT = r"""
import csv, sys, time
import numpy as np
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import cross_val_score

ROOT = Path(__file__).resolve().parents[3]
task, rounds = sys.argv[1], int(sys.argv[2])
rows = list(csv.reader(open(f"{task}/train.csv")))[1:]
data = np.array([[float(v) for v in r[1:]] for r in rows])
X, y = data[:, :-1], data[:, -1]
start = time.perf_counter()
scores = [cross_val_score(RandomForestClassifier(n_estimators=40, random_state=i, n_jobs=1),
                          X, y, cv=3).mean() for i in range(rounds)]
print(f"{time.perf_counter() - start:.3f} {np.mean(scores):.4f} {time.process_time():.3f}")
"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def setup(base: Path):
    from camg.oci.images import write_materialized
    from environments.autoresearch.demo import demo_tasks, image
    from environments.autoresearch.prepare import prepare
    from tools import oci_demo

    try:
        import pwd

        pwd.getpwnam("camg-grader")
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "camg-grader",
            ],
            check=True,
        )
    research = image.ensure_image(oci_demo.cache_root_from_env())
    demo_tasks.build(base / "bundles")
    images = base / "images.json"
    write_materialized(images, (research.image,))
    prepare(
        source=base / "bundles",
        packages_root=base / "packages",
        workspaces_root=base / "workspaces",
        private_root=base / "private",
        images=images,
        image_name="camg/demo-autoresearch",
        output=base / "manifest.json",
    )
    return research, images


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grades", type=int, default=200)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--experiment-s", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--paired", action="store_true", help="run each round inside and outside at the same time"
    )
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root (helper, grader uid)")
    from camg.config import task_manifest as manifest
    from camg.environment import ServiceContext
    from environments.autoresearch import grader as grader_mod
    from environments.autoresearch import runstate
    from environments.autoresearch.environment import ResearchEnvironment
    from tools import oci_demo

    base = Path(tempfile.mkdtemp(prefix="camg-ar-bench-"))
    base.chmod(0o711)
    research, images = setup(base)
    helper = start_private(
        "ar-bench",
        [str(oci_demo.cache_root_from_env()), str(base / "workspaces")],
        [str(research.rootfs)],
    )
    env = None
    results: dict = {"host": os.uname().nodename, "loadavg_start": os.getloadavg()}
    try:
        state = base / "state"
        assert runstate.check_clean(str(state), helper_socket=helper.socket, owner="autoresearch")[
            0
        ]
        settings = {
            "packages_root": str(base / "packages"),
            "workspaces_root": str(base / "workspaces"),
            "private_root": str(base / "private"),
            "images": str(images),
            "memory_bytes": 2 << 30,
            "cpu_quota": 1.0,
            "disk_bytes": 1 << 30,
            "command_minutes": 60,
            "episode_minutes": 120,
        }
        env = ResearchEnvironment(
            ServiceContext("autoresearch", str(state), settings, helper.socket),
            manifest.load(base / "manifest.json").tasks,
        )
        env.start()

        # -- grading latency ------------------------------------------------
        grading = {}
        for task in env.tasks:
            sub = base / f"{task.task_id}.csv"
            subprocess.run(
                [
                    sys.executable,
                    str(base / "packages" / task.task_id / "reference" / "solve.py"),
                    str(base / "workspaces" / task.task_id / "task"),
                    str(sub),
                ],
                check=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            data = sub.read_bytes()
            private = base / "bundles" / task.task_id
            loaded = grader_mod._load(str(private), "private")
            remote, local = [], []
            for _ in range(args.grades):
                t0 = time.perf_counter()
                reply = env.grader.grade(task.task_id, data)
                t1 = time.perf_counter()
                grader_mod.grade(loaded, data)
                t2 = time.perf_counter()
                remote.append((t1 - t0) * 1000)
                local.append((t2 - t1) * 1000)
            assert reply["reward"] >= 0.9, reply
            grading[task.task_id] = {
                "bytes": len(data),
                "grader_p50_ms": round(statistics.median(remote), 3),
                "grader_p99_ms": round(pct(remote, 0.99), 3),
                "in_process_p50_ms": round(statistics.median(local), 3),
                "overhead_p50_ms": round(statistics.median(remote) - statistics.median(local), 3),
                "ratio_p50": round(statistics.median(remote) / statistics.median(local), 2),
            }
        results["grading"] = grading

        # -- the submit step + grade of whole episodes ------------------------
        task = env.tasks[0]
        data = (base / f"{task.task_id}.csv").read_text()
        submit_ms, grade_ms, reset_ms = [], [], []
        for i in range(args.episodes):
            episode = env.create_episode(task, seed=None, episode_id=f"b{i}")
            t0 = time.perf_counter()
            episode.reset()
            reset_ms.append((time.perf_counter() - t0) * 1000)
            episode.step(
                {
                    "operation": "shell",
                    "command": f"cat > /workspace/submission.csv <<'EOF'\n{data}EOF",
                }
            )
            t0 = time.perf_counter()
            episode.step({"operation": "submit"})
            t1 = time.perf_counter()
            reward = episode.grade()
            t2 = time.perf_counter()
            episode.close()
            assert reward >= 0.9
            submit_ms.append((t1 - t0) * 1000)
            grade_ms.append((t2 - t1) * 1000)
        results["episode"] = {
            "reset_p50_ms": round(statistics.median(reset_ms), 2),
            "submit_step_p50_ms": round(statistics.median(submit_ms), 2),
            "grade_p50_ms": round(statistics.median(grade_ms), 2),
        }

        # -- experiment wall time inside vs outside ----------------------------
        script = base / "experiment.py"
        script.write_text(EXPERIMENT)
        host_task = base / "workspaces" / "digits" / "task"
        host_env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

        def host_run(rounds: int) -> float:
            t0 = time.perf_counter()
            done = subprocess.run(
                [sys.executable, str(script), str(host_task), str(rounds)],
                check=True,
                env=host_env,
                capture_output=True,
                text=True,
            )
            outside_cpu.append(float(done.stdout.split()[-1]))
            return time.perf_counter() - t0

        def sandbox_run(rounds: int) -> float:
            episode = env.create_episode(digits, seed=None, episode_id=f"x{len(inside)}")
            try:
                episode.reset()
                episode.step(
                    {
                        "operation": "shell",
                        "command": f"cat > /workspace/experiment.py <<'EOF'\n{EXPERIMENT}\nEOF",
                    }
                )
                t0 = time.perf_counter()
                obs = episode.step(
                    {
                        "operation": "shell",
                        "command": f"python /workspace/experiment.py /task {rounds}",
                    }
                ).observation
                elapsed = time.perf_counter() - t0
                assert obs["exit_code"] == 0, obs
                inside_cpu.append(float(obs["output"].split()[-1]))
                return elapsed
            finally:
                episode.close()

        # Per-round cost without the interpreter's and scikit-learn's start-up.
        outside_cpu: list[float] = []
        inside_cpu: list[float] = []
        per_round = max(0.01, (host_run(6) - host_run(2)) / 4)
        outside_cpu.clear()
        rounds = max(1, int(args.experiment_s / per_round))
        digits = next(t for t in env.tasks if t.task_id == "digits")
        inside, outside = [], []
        for _ in range(args.rounds):
            if args.paired:
                # Both at once: on a machine others load too, the two sides
                # then see the same contention (sequential rounds do not).
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    host = pool.submit(host_run, rounds)
                    boxed = pool.submit(sandbox_run, rounds)
                    outside.append(host.result())
                    inside.append(boxed.result())
            else:
                outside.append(host_run(rounds))
                inside.append(sandbox_run(rounds))
        results["experiment"] = {
            "rounds_of_work": rounds,
            "paired": args.paired,
            "outside_s": [round(v, 2) for v in outside],
            "inside_s": [round(v, 2) for v in inside],
            "ratio_median": round(statistics.median(inside) / statistics.median(outside), 3),
            # CPU seconds of the experiment process itself: what the sandbox
            # costs the computation, whatever else the machine runs.
            "outside_cpu_s": outside_cpu,
            "inside_cpu_s": inside_cpu,
            "cpu_ratio_median": round(
                statistics.median(inside_cpu) / statistics.median(outside_cpu), 3
            ),
        }
        results["loadavg_end"] = os.getloadavg()
    finally:
        if env is not None:
            env.stop()
        helper.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
