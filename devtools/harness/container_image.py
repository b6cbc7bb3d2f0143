"""A small Docker test image and a helper with the container mediator, for root tests.

The image is the cached Debian minbase rootfs (devtools.harness.helpers.minbase)
without docs, apt and dpkg state: bash, coreutils, tar and perl (perl's
IO::Socket serves TCP for ContainerConnect tests). It is imported into dockerd, pushed to a loopback registry, its local tag removed, so the
helper's ContainerPull fetches it back by digest like a real task image.

    ref = publish_test_image(api, rootfs, registry.address)   # REPO@sha256:HEX
    manifest = write_manifest(tmp / "images.json", [ref])
    cfg = helper_config(base, lower_root, rootfs, probe_on_start=False,
                        containers=containers_config(manifest, scope=scope_for("x")))

Scopes carry this process's pid (test-PID-name) so parallel runs' leak
checks and sweeps never see each other's containers.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

TEST_LABEL = "camg.test"
_EXCLUDE = ("usr/share", "var/cache", "var/lib/apt", "var/lib/dpkg", "var/log")
# A TCP server for connect tests: one line per connection, PORT from argv.
PERL_SERVER = ("use IO::Socket::INET; $|=1; my $s=IO::Socket::INET->new(LocalAddr=>'127.0.0.1',"
               "LocalPort=>$ARGV[0],Listen=>16,ReuseAddr=>1) or die $!; while(my $c=$s->accept)"
               "{my $l=<$c>; print $c \"echo:$l\"; close $c}")


def scope_for(name: str) -> str:
    return f"test-{os.getpid()}-{name}"


def docker_api():
    import docker
    return docker.APIClient(base_url="unix:///var/run/docker.sock", timeout=120)


def rootfs_tar(rootfs: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def keep(info: tarfile.TarInfo):
            name = info.name.lstrip("./")
            return None if any(name == e or name.startswith(e + "/") for e in _EXCLUDE) else info
        for entry in sorted(os.listdir(rootfs)):
            tar.add(rootfs / entry, arcname=entry, recursive=True, filter=keep)
    return buf.getvalue()


def publish_test_image(api, rootfs: Path, registry_address: str,
                       repository: str = "camg-test/containers") -> str:
    """Import, push, drop the local copy; the pushed REPO@sha256:HEX."""
    repo = f"{registry_address}/{repository}"
    tag = f"t{os.getpid()}"
    api.import_image_from_data(rootfs_tar(rootfs), repository=repo, tag=tag,
                               changes=[f"LABEL {TEST_LABEL}=containers", 'CMD ["sleep", "infinity"]',
                                        # Each container gets an anonymous volume, so tests see
                                        # that removal and sweeps take volumes too.
                                        'VOLUME ["/data"]'])
    digest = None
    for line in api.push(repo, tag=tag, stream=True, decode=True):
        if line.get("error"):
            raise RuntimeError(f"push failed: {line['error']}")
        digest = (line.get("aux") or {}).get("Digest", digest)
    if not digest:
        raise RuntimeError("the registry answered no digest")
    api.remove_image(f"{repo}:{tag}", force=True)
    return f"{repo}@{digest}"


def remove_image(api, ref: str) -> None:
    import docker.errors
    try:
        api.remove_image(ref, force=True)
    except docker.errors.NotFound:
        pass  # never pulled


def write_manifest(path: Path, images: list[str]) -> Path:
    path.write_text(json.dumps({"images": images}))
    return path


def containers_config(manifest: Path, scope: str, **extra) -> dict:
    return {"images_manifest": str(manifest), "scope": scope, **extra}
