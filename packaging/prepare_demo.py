#!/usr/bin/env python3
"""Prepare the demo data of the demo deployment (packaging/demo-deployment.json).

    prepare_demo.py --data /srv/camg/data --cache /var/cache/camg \\
        --helper-socket /run/camg/helper.sock [--environments coding,shop,...] \\
        [--deployment-template T --deployment-out D] [--helper-config-in H --helper-config-out O]

Run by packaging/install.sh as root, with a helper listening on
--helper-socket (the Coding demo task set is found by running apispec's
suite in real sandboxes) and, for General and Visual, a Docker engine on
/var/run/docker.sock. Every expensive step is content-keyed and cached in
the demo build cache CACHE (default /var/cache/camg; the same layout as the
tests' $CAMG_CACHE), which install.sh --uninstall never removes, so a second
install builds nothing:

  CACHE/oci       the Debian base (debootstrap) every demo image shares, the
                  image layouts, and the materialized rootfs of the Coding and
                  AutoResearch images (CACHE/oci/images/<digest>/rootfs: a
                  helper lower root)
  CACHE/helper    Visual's renderer tree (Debian + chromium-headless-shell +
                  Playwright; a helper lower root)
  CACHE/general   General's task images and task folders
  CACHE/coding    the Coding demo task set; CACHE/autoresearch its bundles

Coding: DATA/coding/{materialized-images.json,demo/,rows-swesmith.jsonl,manifest.json}
  (the SWE-smith-shaped apispec image, task rows and git mirrors; task layers
  under /var/lib/camg/task-layers/coding).
Shop: DATA/shop/{java,product_pool.sqlite,index/,manifest.json,settings.json}.
General: DATA/general/{manifest.json,agent-env,...} (environments.general.demo.assemble): three
  opensource-code tasks from the Coding demo set and the general_agent office
  tasks, one image each, published to a loopback registry and pulled into
  dockerd by digest.
Visual: DATA/visual/{manifest.json,cdn-mirror,demo,images.json}
  (environments.visual.demo.prepare_demo), its image likewise pulled into dockerd.
AutoResearch: the research image (Debian + numpy/scikit-learn/MONAI on CPU
  torch), its four tasks split over the three roots (packages
  /var/lib/camg/autoresearch-tasks, workspaces /var/lib/camg/task-layers/
  autoresearch, private answers /var/lib/camg-grader/answers, owned by
  camg-grader), DATA/autoresearch/{materialized-images.json,manifest.json}.

Which environments have demo data, in which order, and how each is
prepared, is its plugin's (camg.plugins: ``demo_prepare``, ``demo_rank``;
each preparer is its environments/<env>/demo/data.py). With
--deployment-out, the demo deployment is written there: the template's service-wide keys
(packaging/demo-deployment.json) and each prepared environment's plugin
``demo`` entry, with the settings its preparation recorded merged in (Shop's
pool and index hashes change with every index build, so no plugin can say
them). With
--helper-config-out, the helper configuration for it: --helper-config-in
plus the cache's lower roots and, when General or Visual is prepared, the
``containers`` section (allowed images DATA/container-images.json, the
agent environment).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from camg import logs
from camg.errors import CamgError
from tools import demo_data

def _demo_plugins() -> dict:
    """The registered environments with demo data (their plugin's ``demo``
    and ``demo_prepare``), in preparation order (``demo_rank``)."""
    from camg import plugins

    found = [p for p in plugins.all_plugins().values() if p.demo_prepare]
    return {p.name: p for p in sorted(found, key=lambda p: (p.demo_rank, p.name))}


def _preparer(plugin):
    from camg import plugins

    return lambda data, cache, socket: plugins.resolve(plugin.demo_prepare)(data, cache, socket)


DEMO = _demo_plugins()
# In the order they are prepared (General reuses Coding's demo set).
PREPARERS = {name: _preparer(plugin) for name, plugin in DEMO.items()}
# What needs a Docker engine (task containers through the helper's mediator).
CONTAINER_ENVIRONMENTS = tuple(n for n, p in DEMO.items() if p.substrate == "container")


def deployment(template: Path, names: list[str]) -> dict:
    """The demo deployment of ``names``: the template's service-wide keys
    (packaging/demo-deployment.json) and each environment's plugin ``demo``
    entry, in preparation order."""
    import copy

    body = json.loads(template.read_text())
    body["environments"] = {name: copy.deepcopy(dict(plugin.demo))
                            for name, plugin in DEMO.items() if name in names}
    return body


def write_deployment(template: Path, output: Path, data: Path, names: list[str]) -> None:
    body = deployment(template, names)
    for name, entry in body["environments"].items():
        recorded = data / name / "settings.json"
        if recorded.is_file():
            entry["settings"] = {**json.loads(recorded.read_text()), **entry.get("settings", {})}
    _write_json(output, body)


def _write_json(output: Path, body: dict) -> None:
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(output)


def helper_config(base: dict, data: Path, cache: Path, names: list[str]) -> dict:
    """The helper configuration the demo needs: ``base`` (units/helper.json or
    the operator's) plus the cache's lower roots (materialized images, the
    renderer tree) and, for the environments whose preparation lists task
    images (their plugin's ``demo_images``: General, Visual), the container
    mediator."""
    config = dict(base)
    lowers = list(config.get("lower_roots", []))
    for root in (cache / "oci", cache / "helper"):
        if str(root) not in lowers:
            lowers.append(str(root))
    config["lower_roots"] = lowers
    served = [p for n, p in DEMO.items() if n in names]
    refs: list[str] = []
    for plugin in served:
        if plugin.demo_images:
            refs += json.loads((data / plugin.demo_images).read_text())["images"]
    if refs:
        allowed = data / "container-images.json"
        _write_json(allowed, {"images": refs})
        allowed.chmod(0o644)
        containers = dict(config.get("containers") or {})
        containers["images_manifest"] = str(allowed)
        for plugin in served:
            if plugin.demo_agent_env:
                containers["agent_env_source"] = str(data / plugin.demo_agent_env)
        config["containers"] = containers
    return config


def untag_replaced(old: list[str], new: list[str]) -> None:
    """Every preparation pulls the images under a new loopback registry's
    name (same digests): drop the names an earlier preparation pulled, so
    dockerd holds each demo image under the one name the helper allows."""
    gone = sorted(set(old) - set(new))
    if not gone:
        return
    import docker
    import docker.errors

    api = docker.APIClient(base_url=demo_data.DOCKER_SOCKET, timeout=120)
    try:
        for ref in gone:
            try:
                api.remove_image(ref)
            except docker.errors.APIError as exc:  # in use, or already gone: keep going
                print(f"prepare_demo: kept {ref}: {exc.explanation or exc}", file=sys.stderr)
    finally:
        api.close()


def demo_names(requested: str) -> list[str]:
    """``all``: the registered environments (camg.plugins) with demo data;
    otherwise the names given. In preparation order."""
    if requested != "all":
        wanted = [n for n in requested.split(",") if n]
        return [n for n in PREPARERS if n in wanted] + [n for n in wanted if n not in PREPARERS]
    from camg import plugins

    registered = list(plugins.all_plugins())
    for name in registered:
        if name not in PREPARERS:
            print(f"prepare_demo: {name}: registered, but has no demo data yet; not served",
                  file=sys.stderr)
    return [n for n in PREPARERS if n in registered]


def main(argv: list[str] | None = None) -> int:
    logs.setup_command()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--helper-socket", required=True)
    parser.add_argument("--environments", default="all",
                        help=f"comma-separated, of: {', '.join(PREPARERS)}; 'all': every "
                             "registered environment that has demo data")
    parser.add_argument("--deployment-template", type=Path,
                        help="packaging/demo-deployment.json")
    parser.add_argument("--deployment-out", type=Path,
                        help="write the demo deployment for the prepared environments here")
    parser.add_argument("--helper-config-in", type=Path, help="units/helper.json or the operator's")
    parser.add_argument("--helper-config-out", type=Path,
                        help="write the helper configuration the prepared environments need here")
    parser.add_argument("--helper-config-only", action="store_true",
                        help="write only --helper-config-out (the cache's lower roots, no "
                             "containers section: what preparation itself needs) and exit")
    parser.add_argument("--list", action="store_true",
                        help="print the environments that would be prepared, one a line, and exit")
    args = parser.parse_args(argv)
    names = demo_names(args.environments)
    unknown = sorted(set(names) - set(PREPARERS))
    if unknown:
        parser.error(f"no demo preparation for: {', '.join(unknown)}")
    if args.list:
        print("\n".join(names))
        return 0
    if os.geteuid() != 0:
        parser.error("run as root (image rootfs and task layers are root-owned)")
    cache = args.cache.absolute()
    for root in (cache / "oci", cache / "helper"):
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
    if args.helper_config_only:
        base = json.loads(args.helper_config_in.read_text()) if args.helper_config_in else {}
        _write_json(args.helper_config_out, helper_config(base, args.data, cache, []))
        return 0
    # The builders below read $CAMG_CACHE where they take no argument
    # (AutoResearch's data generators): the demo's cache, not the tests'.
    os.environ["CAMG_CACHE"] = str(cache)
    try:
        for name in names:
            started = time.monotonic()
            print(f"prepare_demo: {name}: preparing the demo data", file=sys.stderr, flush=True)
            result = PREPARERS[name](args.data, cache, args.helper_socket)
            print(f"prepare_demo: {name}: {result} ({time.monotonic() - started:.0f}s)",
                  file=sys.stderr, flush=True)
        if args.deployment_out:
            write_deployment(args.deployment_template, args.deployment_out, args.data, names)
        if args.helper_config_out:
            base = json.loads(args.helper_config_in.read_text()) if args.helper_config_in else {}
            allowed = args.data / "container-images.json"
            old = json.loads(allowed.read_text())["images"] if allowed.is_file() else []
            _write_json(args.helper_config_out, helper_config(base, args.data, cache, names))
            new = json.loads(allowed.read_text())["images"] if allowed.is_file() else []
            untag_replaced(old, new)
    except (CamgError, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"prepare_demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
