"""Signed, chained outcome records (camg.episodes.signing) and their offline check
(python -m camg.verify)."""

import base64
import json
import os
import stat

import pytest

from camg import verify
from camg.episodes import signing
from camg.errors import ConfigError
from camg.episodes.outcomes import OutcomeLog
from camg_client import Client

RECORDS = [
    {"environment": "counter", "episode_id": f"e{i}", "task_id": f"task-0{i}", "reward": r,
     "failure_class": f, "integrity": "ok", "status": "done", "config_hash": "sha256:" + "c" * 64,
     "grader_hash": "sha256:" + "g" * 64, "image": None,
     "submission": {"sha256": "sha256:" + str(i) * 64, "bytes": 3, "meta": {}}}
    for i, (r, f) in enumerate([(1.0, None), (0.0, None), (None, "infra"), (0.5, None)])]


@pytest.fixture
def signed(tmp_path):
    """A log of four signed records; (its path, the signer)."""
    key = signing.key_path(tmp_path / "state")
    signer = signing.Signer.load(key, expect=signing.fingerprint(signing.ensure_key(key)))
    log = OutcomeLog(tmp_path / "state" / "counter", signer=signer,
                     stamp={"task_selection_hash": "sha256:" + "t" * 64})
    for record in RECORDS:
        log.append(dict(record))
    log.close()
    return log.path, signer


def run_verify(path, *extra) -> tuple[int, list[str]]:
    import io
    from contextlib import redirect_stdout
    out = io.StringIO()
    with redirect_stdout(out):
        code = verify.main([str(path), *map(str, extra)])
    return code, out.getvalue().splitlines()


def edit(path, number: int, change) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[number - 1])
    change(record)
    lines[number - 1] = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    path.write_bytes(b"".join(lines))


def test_key_is_made_once_private_to_its_owner(tmp_path):
    key = signing.key_path(tmp_path)
    public = signing.ensure_key(key)
    info = os.stat(key)
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(key.with_name(signing.PUBLIC_FILE)).st_mode) == 0o644
    # Re-configuring keeps the key the records were signed with.
    assert signing.fingerprint(signing.ensure_key(key)) == signing.fingerprint(public)
    with pytest.raises(ConfigError, match="not the"):
        signing.Signer.load(key, expect="sha256:" + "0" * 64)
    os.chmod(key, 0o640)
    with pytest.raises(ConfigError, match="readable by others"):
        signing.Signer.load(key)


def test_a_fresh_log_verifies_and_carries_the_signed_fields(signed):
    path, signer = signed
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in records] == [0, 1, 2, 3] and records[0]["prev"] is None
    assert {r["task_selection_hash"] for r in records} == {"sha256:" + "t" * 64}
    assert {r["signing_key"] for r in records} == {signer.fingerprint}
    assert run_verify(path) == (0, [])  # outcomes.pub beside it
    published = path.parent / "published.b64"
    published.write_text(signing.describe(signer.public)["public_key"])
    assert run_verify(path, "--public-key", published) == (0, [])


def test_a_restarted_log_continues_the_chain(signed):
    path, signer = signed
    killed = OutcomeLog(path.parent, signer=signer)
    killed.trajectory("e9", {"event": "reset", "task_id": "task-09"})  # still running
    killed.close()
    again = OutcomeLog(path.parent, signer=signer)
    assert again.recover("counter", "sha256:" + "c" * 64) == ["e9"]
    again.append({"episode_id": "e10", "reward": 1.0})
    again.close()
    last = [json.loads(line) for line in path.read_text().splitlines()[-2:]]
    assert [(r["episode_id"], r["seq"]) for r in last] == [("e9", 4), ("e10", 5)]
    assert last[0]["recovered"] is True and last[0]["reward"] is None
    assert run_verify(path) == (0, [])


@pytest.mark.parametrize("change, line, why", [
    (lambda r: r.update(reward=1.0), 2, "changed after signing"),
    (lambda r: r.update(grader_hash="sha256:" + "h" * 64), 3, "changed after signing"),
    (lambda r: r["submission"].update(sha256="sha256:" + "9" * 64), 4, "changed after signing"),
    (lambda r: r.pop("signature"), 1, "unsigned"),
])
def test_an_edited_record_is_named_by_its_line(signed, change, line, why):
    path, _ = signed
    edit(path, line, change)
    code, out = run_verify(path)
    assert code == 1 and len(out) == 1 + (line < 4)  # and the next line's prev
    assert out[0].startswith(f"{path}:{line}: episode e{line - 1}: ") and why in out[0]
    if line < 4:
        assert out[1].startswith(f"{path}:{line + 1}:") and "prev does not match" in out[1]


def test_a_removed_line_is_named(signed):
    path, _ = signed
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:1] + lines[2:]))
    code, out = run_verify(path)
    assert code == 1 and len(out) == 1
    assert out[0].startswith(f"{path}:2: episode e2: ") and "1 line(s) missing" in out[0]
    path.write_bytes(b"".join(lines[1:]))
    assert run_verify(path)[1] == [f"{path}:1: episode e1: the file starts at seq 1, not 0 "
                                   "(lines before it missing)"]


def test_a_removed_last_line_is_caught_against_the_trainers_receipt(signed):
    """No gap shows when the last line goes; the trainer's highest
    outcome_seq (--through) shows it."""
    path, _ = signed
    assert run_verify(path, "--through", 3) == (0, [])
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3]))
    assert run_verify(path) == (0, [])
    code, out = run_verify(path, "--through", 3)
    assert code == 1 and out == [f"{path}:4: the file ends at seq 2 but the trainer received "
                                 "seq 3: the records after it are missing"]
    path.write_bytes(b"")
    assert run_verify(path, "--through", 0)[0] == 1


def test_another_key_fails_every_line(signed, tmp_path):
    path, _ = signed
    other = tmp_path / "other" / "outcomes.key"
    signing.ensure_key(other)
    code, out = run_verify(path, "--public-key", other.with_name(signing.PUBLIC_FILE))
    assert code == 1 and len(out) == 4 and all("signed by another key" in line for line in out)
    # A record re-signed with another key (its fingerprint swapped in) fails too.
    edit(path, 2, lambda r: r.update(signing_key=signing.fingerprint(
        signing.load_public(other.with_name(signing.PUBLIC_FILE)))))
    assert any(line.startswith(f"{path}:2:") for line in run_verify(path)[1])
    assert run_verify(path, "--public-key", tmp_path / "missing.pem")[0] == 2


def test_metadata_publishes_the_key_and_the_service_signs(shared_counter_service, tmp_path):
    svc = shared_counter_service
    client = Client(svc.url)
    published = client.metadata()["outcome_signing"]
    assert published["fingerprint"] == svc.config["outcome_key"]["fingerprint"]
    assert "PRIVATE" not in json.dumps(client.metadata())
    raw = base64.b64decode(published["public_key"])
    assert signing.fingerprint(signing.Ed25519PublicKey.from_public_bytes(raw)) \
        == published["fingerprint"]
    key = os.stat(svc.config["outcome_key"]["path"])
    assert stat.S_IMODE(key.st_mode) == 0o600
    eid = client.create(task_id="task-00")["episode_id"]
    final = client.step(eid, {"operation": "guess", "value": 35})
    pem = tmp_path / "published.pem"
    pem.write_text(published["public_key_pem"])
    outcomes = os.path.join(svc.config["state_dir"], "outcomes.jsonl")
    assert run_verify(outcomes, "--public-key", pem) == (0, [])
    [record] = [r for r in svc.outcomes() if r["episode_id"] == eid]
    assert record["task_selection_hash"] == svc.config["task_selection_hash"]
    # the receipt: the terminal reply and the state name the record's seq
    assert final["done"] and final["outcome_seq"] == record["seq"]
    assert client.get(eid)["outcome_seq"] == record["seq"]
    assert run_verify(outcomes, "--public-key", pem, "--through", record["seq"]) == (0, [])
    assert run_verify(outcomes, "--public-key", pem, "--through", record["seq"] + 1)[0] == 1
