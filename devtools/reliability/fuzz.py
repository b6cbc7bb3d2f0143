"""Fuzz: every input boundary, fed malformed data, answers with a typed error.

* HTTP: schemathesis (stateful, following the episode links) against an
  OpenAPI document built from the service's own ``GET /schema``; no 5xx,
  and afterwards the service is healthy, every listed episode answers and
  every outcome line parses.
* The helper socket: random bytes, torn frames, mutated valid frames
  (bit flips, wrong lengths, swapped types) — every reply is a named error
  of the closed set, and the helper keeps serving.
* Files: mutated manifests (camg.config.task_manifest.load), task rows
  (environments.coding.rows.validate) and OCI layer blobs (the materializer's
  own layer path) — only camg's typed errors, never a traceback.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

from camg import helper_wire as wire
from camg.errors import CamgError
from devtools.reliability.rig import TMP_PREFIX, Helper
from devtools.reliability.table import Row

# -- HTTP -------------------------------------------------------------------------

def openapi(schema: dict) -> dict:
    """The service's contract as OpenAPI 3.0, episode links included."""
    eid = {"name": "episode_id", "in": "path", "required": True, "schema": {"type": "string"}}
    links = {op: {"operationId": op, "parameters": {"episode_id": "$response.body#/episode_id"}}
             for op in ("getEpisode", "stepEpisode", "deleteEpisode")}
    json_body = lambda s: {"required": True, "content": {"application/json": {"schema": s}}}
    answers = {str(c): {"description": str(c)} for c in (400, 404, 409, 413, 422, 429, 503)}
    return {
        "openapi": "3.0.3", "info": {"title": "camg environment", "version": "1"},
        "paths": {
            "/health": {"get": {"operationId": "health", "responses": {
                "200": {"description": "ok"}, "503": {"description": "degraded"}}}},
            "/metadata": {"get": {"operationId": "metadata", "responses": {"200": {"description": "ok"}}}},
            "/schema": {"get": {"operationId": "schema", "responses": {"200": {"description": "ok"}}}},
            "/episodes": {
                "get": {"operationId": "listEpisodes", "responses": {"200": {"description": "ok"}}},
                "post": {"operationId": "createEpisode",
                         "requestBody": json_body(schema["create_episode"]),
                         "responses": {"201": {"description": "created", "links": links}, **answers}}},
            "/episodes/{episode_id}": {
                "parameters": [eid],
                "get": {"operationId": "getEpisode", "responses": {"200": {"description": "ok"}, **answers}},
                "delete": {"operationId": "deleteEpisode",
                           "responses": {"200": {"description": "ok"}, **answers}}},
            "/episodes/{episode_id}/step": {
                "parameters": [eid],
                "post": {"operationId": "stepEpisode",
                         "requestBody": json_body(schema["step_request"]),
                         "responses": {"200": {"description": "ok"}, **answers}}},
        },
    }


def http(service, name: str, examples: int, seed: int = 0) -> Row:
    from camg_client import Client
    client = Client(service.url, timeout=600)
    doc = openapi(client.schema())
    # The document, and schemathesis's own files (it runs in here), go
    # with the run: a temporary directory per run was left in /tmp before.
    with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}fuzz-") as tmp:
        work = Path(tmp)
        (work / "openapi.json").write_text(json.dumps(doc))
        schemathesis = Path(sys.executable).parent / "schemathesis"
        out = subprocess.run([str(schemathesis), "run", str(work / "openapi.json"),
                              "--url", service.url, "--checks", "not_a_server_error",
                              "--max-examples", str(examples), "--seed", str(seed),
                              "--workers", "2", "--no-color",
                              # a reset may boot a container (General's pool
                              # empty): seconds on 2 shared cores, not 10
                              "--request-timeout", "600",
                              "--phases", "examples,coverage,fuzzing,stateful",
                              "--suppress-health-check", "all"],
                             capture_output=True, text=True, timeout=3600, cwd=work)
    summary = [l for l in out.stdout.splitlines() if "passed" in l or "failed" in l or "error" in l]
    health = client.health()
    listed = client.list()["episodes"]
    unreadable = 0
    for ep in listed:
        try:
            client.get(ep["episode_id"])
        except Exception:
            unreadable += 1
    state = Path(service.config["state_dir"]) / "outcomes.jsonl"
    torn = 0
    for line in state.read_text().splitlines() if state.exists() else []:
        try:
            json.loads(line)
        except ValueError:
            torn += 1
    ok = out.returncode == 0 and health["status"] == "healthy" and not unreadable and not torn
    counted = (f"schemathesis exit {out.returncode} ({(summary or ['no summary'])[-1].strip()[:120]}); "
               f"health {health['status']}; {len(listed)} listed, {unreadable} unreadable; "
               f"{torn} torn outcome lines")
    if out.returncode != 0:
        lines = [l.strip() for l in out.stdout.splitlines() if l.strip()]
        why = [l for l in lines if "500" in l or "Server error" in l]
        if not why:  # an error of the run itself (e.g. a timeout): its section
            heads = [i for i, l in enumerate(lines) if "ERRORS" in l or "FAILURES" in l]
            why = lines[heads[0] + 1:heads[0] + 6] if heads else lines[-5:]
        counted += "; " + " | ".join(why)[:400]
    return Row("fuzz", name, f"schemathesis stateful, {examples} examples/operation", counted, ok)


# -- the helper socket --------------------------------------------------------------

def _ask(path: str, payload: bytes) -> dict | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and hung up first
        try:
            return wire.read_frame(s, 1 << 20)[0]
        except (EOFError, ConnectionResetError):
            return None


_VALUES = [None, True, -1, 0, 2**63, 1e308, "", "x" * 300, "\u0000", "../../etc", [], {}, [1, "a"],
           {"a": {"b": []}}]


def _mutate_frame(rng: random.Random, sandbox: str) -> bytes:
    verb = rng.choice(wire.VERBS)
    params = {"sandbox_id": sandbox, "command": "true", "lowers": ["/"], "memory_bytes": 1 << 26,
              "cpu_quota": 1.0, "pids_max": 16, "path": "/tmp", "dest_dir": "/tmp",
              "timeout": 1.0, "output_limit": 100, "env": {}, "user": "agent"}
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(list(params) + ["zzz"])
        params[key] = rng.choice(_VALUES)
    frame = bytearray(wire.encode({"verb": verb, "params": params, "owner": "fuzz"},
                                  rng.randbytes(rng.choice([0, 0, 3, 600]))))
    kind = rng.randrange(5)
    if kind == 0 and frame:  # bit flips anywhere, header included
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(frame))
            frame[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # torn
        frame = frame[: rng.randrange(len(frame))]
    elif kind == 2:  # lying lengths
        frame[0:8] = struct.pack(">II", rng.randrange(0, 1 << 21), rng.randrange(0, 1 << 31))
    elif kind == 3:  # pure noise
        frame = bytearray(rng.randbytes(rng.randrange(0, 200)))
    return bytes(frame)


def helper_socket(helper: Helper, frames: int, seed: int = 0) -> Row:
    rng = random.Random(seed)
    client = helper.client(owner="fuzz")
    sandbox = client.create_sandbox([helper.config["probe_lowers"][0]], memory_bytes=64 << 20,
                                    cpu_quota=0.5, pids_max=32)
    bad, answered = [], 0
    try:
        for i in range(frames):
            reply = _ask(helper.socket, _mutate_frame(rng, sandbox))
            if reply is None:
                continue
            answered += 1
            if reply.get("ok") is not True and reply.get("error") not in wire.ERRORS - {"internal"}:
                bad.append(reply)
        alive = helper.alive() and client.ping()["probes_ok"]
    finally:
        client.release_all()
        client.close()
    ok = alive and not bad
    counted = (f"{answered} answered, {frames - answered} closed, {len(bad)} untyped/internal; "
               f"helper {'serving' if alive else 'DOWN'}")
    if bad:
        counted += f"; first: {json.dumps(bad[0])[:200]}"
    return Row("fuzz", "helper", f"{frames} random/mutated frames on the socket", counted, ok)


# -- files -----------------------------------------------------------------------

def _mutations(rng: random.Random, obj):
    """Structure-aware mutants of a JSON value: dropped keys, wrong types, noise."""
    out = copy.deepcopy(obj)
    nodes = [out]
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(nodes)
        if isinstance(target, dict) and target:
            key = rng.choice(list(target))
            action = rng.randrange(3)
            if action == 0:
                del target[key]
            elif action == 1:
                target[key] = rng.choice(_VALUES)
            else:
                nodes.append(target[key])
        elif isinstance(target, list) and target:
            target[rng.randrange(len(target))] = rng.choice(_VALUES)
    return out


def files(cases: int, seed: int = 0) -> Row:
    from camg.config import task_manifest as manifest
    rng = random.Random(seed)
    untyped: list[str] = []
    counts = {"manifest": 0, "task row": 0, "OCI layer": 0}
    work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}files-"))
    good = manifest.build("fuzz", [{"task_id": f"t{i}", "data": {"x": i}} for i in range(3)],
                          created_by="fuzz", sampling={"mode": "sequential", "seed": 0}, files={})
    row = {"instance_id": "o__r.1234abcd.func_pm__x", "repo": "o/r", "patch": "--- a\n+++ b\n",
           "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": [], "image_name": "img", "problem_statement": "x"}
    layer = _layer_bytes()
    try:
        _files(rng, cases, work, good, row, layer, counts, untyped)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    counted = ", ".join(f"{n} {k}s" for k, n in counts.items()) + f"; {len(untyped)} untyped errors"
    if untyped:
        counted += f"; first: {untyped[0][:200]}"
    return Row("fuzz", "files", "mutated manifests, task rows, OCI layers", counted, not untyped)


def _files(rng, cases: int, work: Path, good: dict, row: dict, layer: bytes, counts: dict,
           untyped: list[str]) -> None:
    from camg.config import task_manifest as manifest
    from environments.coding import rows as coding_rows
    from tools.oci import cache
    for i in range(cases):
        # manifests: structure mutations, and raw byte damage
        path = work / "m.json"
        body = json.dumps(_mutations(rng, good)).encode()
        if rng.random() < 0.3:
            body = bytearray(body)
            for _ in range(rng.randint(1, 4)):
                body[rng.randrange(len(body))] = rng.randrange(256)
            body = bytes(body)
        path.write_bytes(body)
        _typed(lambda: manifest.load(path), "manifest", untyped)
        counts["manifest"] += 1
        _typed(lambda: coding_rows.validate(_mutations(rng, row), i), "task row", untyped)
        counts["task row"] += 1
        blob = bytearray(layer)
        for _ in range(rng.randint(1, 6)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        if rng.random() < 0.3:
            blob = blob[: rng.randrange(len(blob))]
        blob_path = work / "layer.tar"
        blob_path.write_bytes(bytes(blob))
        image = types.SimpleNamespace(name="fuzz", layers=[("sha256:" + "0" * 64, "none", blob_path)],
                                      diff_ids=["sha256:" + hashlib.sha256(layer).hexdigest()])
        root = work / f"root{i}"
        root.mkdir()
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _typed(lambda: cache._apply_blob(fd, image, 0, cache.ApplyOptions()), "OCI layer", untyped)
        finally:
            os.close(fd)
            subprocess.run(["rm", "-rf", str(root)], check=False)
        counts["OCI layer"] += 1


def _typed(fn, what: str, untyped: list[str]) -> None:
    try:
        fn()
    except CamgError:
        pass  # the typed answer
    except Exception as exc:
        untyped.append(f"{what}: {type(exc).__name__}: {exc}")


def _layer_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind in (("etc", tarfile.DIRTYPE), ("etc/hostname", tarfile.REGTYPE),
                           ("bin", tarfile.DIRTYPE), ("bin/sh", tarfile.SYMTYPE),
                           ("etc/.wh.old", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            data = b"box\n" if kind == tarfile.REGTYPE else b""
            if kind == tarfile.SYMTYPE:
                info.linkname = "/usr/bin/dash"
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()
