"""Visual's delivery: what of dist/ reaches the renderer (links resolved
inside the archive only, fifos and devices dropped) and the integrity
verdict (tampered for anything reaching outside dist/)."""

import io
import tarfile

import pytest

from daemons.visual import delivery


def docker_tar(entries) -> bytes:
    """A tar shaped like Docker's archive of /workspace/dist."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, value in [("dist", "dir", None)] + entries:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                data = value.encode()
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, value
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, value
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            elif kind == "chr":
                info.type = tarfile.CHRTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def members(tar: bytes) -> dict:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return {m.name: (t.extractfile(m).read().decode() if m.isfile() else m.type)
                for m in t.getmembers()}


def test_links_inside_dist_are_copies_and_links_out_are_tampering():
    tar, evidence = delivery.strip_top(docker_tar([
        ("dist/index.html", "file", "<!DOCTYPE html>home"),
        ("dist/css", "dir", None),
        ("dist/css/a.css", "file", "body{}"),
        ("dist/same.html", "sym", "index.html"),
        ("dist/css/b.css", "sym", "./a.css"),
        ("dist/chain.html", "sym", "same.html"),
        ("dist/hard.html", "hard", "dist/index.html"),
        ("dist/up.html", "sym", "../../srv/camg/data/visual/demo/reference/t1/index.html"),
        ("dist/etc", "sym", "/etc"),
        ("dist/dirlink", "sym", "css"),
        ("dist/pipe", "fifo", None),
        ("dist/tty", "chr", None),
        ("dist/../escape.html", "file", "x"),
    ]))
    got = members(tar)
    assert got == {"index.html": "<!DOCTYPE html>home", "css": tarfile.DIRTYPE,
                   "css/a.css": "body{}", "same.html": "<!DOCTYPE html>home",
                   "css/b.css": "body{}", "chain.html": "<!DOCTYPE html>home",
                   "hard.html": "<!DOCTYPE html>home"}
    rules = sorted(line.split(":")[0] for line in evidence)
    assert rules == ["link_dropped", "special_file", "special_file",
                     "symlink_out_of_dist", "symlink_out_of_dist"]
    assert any("dist/etc -> /etc" in line for line in evidence)
    body = delivery.verdict(evidence)
    assert body["integrity"] == "tampered" and body["integrity_evidence"] == evidence


@pytest.mark.parametrize("evidence, integrity", [
    ([], "ok"),
    (["link_dropped: dist/a -> b"], "ok"),
    (delivery.render_evidence((), ("ws://192.0.2.1/x",), ("https://192.0.2.1/a.js",)), "ok"),
    (delivery.render_evidence(("file:///etc/passwd",), ()), "tampered"),
])
def test_verdict(evidence, integrity):
    body = delivery.verdict(evidence)
    assert body["integrity"] == integrity
    assert body.get("integrity_evidence", []) == evidence


def test_a_link_loop_and_an_empty_archive():
    tar, evidence = delivery.strip_top(docker_tar([("dist/a", "sym", "b"), ("dist/b", "sym", "a")]))
    assert members(tar) == {} and [e.split(":")[0] for e in evidence] == ["link_dropped"] * 2
    assert members(delivery.strip_top(b"")[0]) == {}


def test_a_chain_out_of_dist_is_tampering_and_link_copies_count_against_the_limit():
    _, evidence = delivery.strip_top(docker_tar([("dist/a", "sym", "b"), ("dist/b", "sym", "/etc")]))
    assert [e.split(":")[0] for e in evidence] == ["symlink_out_of_dist"] * 2
    big = [("dist/big", "file", "x" * 1000)] + [(f"dist/l{i}", "sym", "big") for i in range(5)]
    assert len(members(delivery.strip_top(docker_tar(big), limit=6000)[0])) == 6
    with pytest.raises(delivery.errors.RenderError) as err:
        delivery.strip_top(docker_tar(big), limit=5999)
    assert err.value.details["reason"] == "dist_too_large"
