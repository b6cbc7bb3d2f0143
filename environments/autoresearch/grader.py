"""The private grader: ``python -m environments.autoresearch.grader`` (started by the service only).

It runs under its own uid (camg-grader), the only account that can read the
private root. Its stdin carries one JSON object and then EOF: the fresh
credential of this start, the fd number of its end of the service's
socketpair, the private root and the task ids. It loads each task's answers
and scoring parameters, says hello (with the answers' hashes, so the
service can check them against the prepared manifest), then answers grade
requests — a task id plus the submission bytes, nothing else — until the
service closes the socket; then it exits. It never reads a sandbox, a
workspace or anything the agent wrote except the bytes it was sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time

from environments.autoresearch import gradewire, metrics


def _load(private_root: str, task_id: str) -> dict:
    return load_dir(os.path.join(private_root, task_id))


def load_dir(directory: str) -> dict:
    """One task's answers and scoring as ``grade`` takes them (also the
    no-learning battery's, environments.autoresearch.battery, at validation)."""
    with open(os.path.join(directory, "answers.csv"), "rb") as f:
        answers = f.read()
    with open(os.path.join(directory, "scoring.json"), "rb") as f:
        scoring_bytes = f.read()
    scoring = json.loads(scoring_bytes)
    ids, truth = metrics.read_answers(answers)
    if scoring["metric"] not in metrics.METRICS:
        raise ValueError(f"{directory}: unknown metric {scoring['metric']!r}")
    return {
        "ids": ids,
        "truth": truth,
        "metric": scoring["metric"],
        "baseline": float(scoring["baseline_score"]),
        "reference": float(scoring["reference_score"]),
        "integer": scoring["metric"] == "accuracy",
        "sha256": "sha256:" + hashlib.sha256(answers + b"\0" + scoring_bytes).hexdigest(),
    }


def grade(task: dict, submission: bytes) -> dict:
    try:
        predicted = metrics.parse_submission(submission, task["ids"], integer=task["integer"])
    except metrics.SubmissionInvalid as exc:
        return {"valid": False, "reward": 0.0, "score": None, "detail": str(exc), "rule": exc.rule}
    value = metrics.score(task["metric"], task["truth"], predicted)
    reward = metrics.normalise(value, task["baseline"], task["reference"])
    return {"valid": True, "reward": reward, "score": value, "detail": ""}


def serve(sock: socket.socket, credential: bytes, tasks: dict[str, dict]) -> None:
    seq = 0
    gradewire.send(
        sock,
        credential,
        gradewire.FROM_GRADER,
        seq,
        {
            "hello": True,
            "uid": os.getuid(),
            "pid": os.getpid(),
            "answers": {k: t["sha256"] for k, t in tasks.items()},
        },
    )
    while True:
        seq += 1
        try:
            request, blob = gradewire.receive(sock, credential, gradewire.TO_GRADER, seq)
        except EOFError:
            return  # the service closed its end: it is stopping
        started = time.monotonic()
        task = tasks.get(request.get("task_id"))  # type: ignore[arg-type]  # any id as sent: only a known one matches
        if task is None:
            reply = {"ok": False, "error": f"unknown task {str(request.get('task_id'))[:80]!r}"}
        else:
            try:
                reply = {"ok": True, **grade(task, blob)}
            except Exception as exc:  # a grading bug is the service's grader_error
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        reply["seconds"] = round(time.monotonic() - started, 6)
        gradewire.send(sock, credential, gradewire.FROM_GRADER, seq, reply)


def main() -> int:
    os.umask(0o077)
    try:
        setup = json.loads(sys.stdin.buffer.read(1 << 20))
        credential = bytes.fromhex(setup["credential"])
        sock = socket.socket(fileno=int(setup["fd"]))
    except (ValueError, KeyError, OSError) as exc:
        print(f"<3>camg-grader: bad start-up input: {exc}", file=sys.stderr)
        return 2
    del setup["credential"]
    try:
        tasks = {t: _load(setup["private_root"], t) for t in setup["tasks"]}
    except (OSError, ValueError, KeyError) as exc:
        # Said over the socket too, so the service names the cause.
        print(f"<3>camg-grader: cannot load the private answers: {exc}", file=sys.stderr)
        gradewire.send(
            sock, credential, gradewire.FROM_GRADER, 0, {"hello": False, "error": str(exc)[:500]}
        )
        return 3
    try:
        serve(sock, credential, tasks)
    except gradewire.Tampered:
        print("<3>camg-grader: a request failed authentication; exiting", file=sys.stderr)
        return 4
    except OSError as exc:
        print(f"<3>camg-grader: socket failed: {exc}", file=sys.stderr)
        return 5
    return 0


if __name__ == "__main__":
    sys.exit(main())
