"""Procedural bug tasks for a repository whose image the image builder made.

    python -m environments.coding.build.tasks --build OUTDIR/build.json \\
        --images materialized-images.json --helper-socket SOCK \\
        --owner OWNER --package-dir DIR --output TASKS [--count N] [--seed S] [--max-f2p N]

``build.json`` is what ``python -m tools.prepare_image`` wrote for an image
built from a PyPI sdist. The tasks are made as the demo's are
(environments/coding/demo/demo_tasks.py, SWE-smith's procedural modifiers):
the sdist becomes a mirror whose base commit is the image's /testbed commit
(checked); every candidate bug (one site in a function of a ``.py`` file
under ``--package-dir``) runs the suite in a fresh helper sandbox over the
image with the test command the grader will run; a bug is kept when it
fails between 1 and ``--max-f2p`` tests that pass on the base and changes
nothing of what is collected. Writes TASKS/mirrors/<owner>__<project>.<c8>
(one branch per task: "Bug Patch", then "Remove F2P Tests"),
TASKS/tasks.jsonl and TASKS/tasks.parquet (TASKS is replaced): rows of repo
``camg-built/<owner>__<project>.<c8>`` (graded with SWE-smith's Python test
command) and image_name the built image's. TASKS/build-info.json records
the inputs: run again with the same inputs, the set is kept as it is.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from camg.config.hashing import sha256_file, sha256_json
from camg.errors import CamgError, DatasetError
from camg.oci.images import MaterializedImage
from environments.coding import images as images_mod
from environments.coding import profiles
from environments.coding.demo import bugs, demo_tasks
from environments.coding.demo.sandbox_runner import AGENT_UID, tar_checkout


def sandbox_runner(
    helper_socket: str,
    rootfs: str,
    test_cmd: str,
    *,
    timeout: float = 600,
    memory_bytes: int = 2 << 30,
) -> demo_tasks.Runner:
    """Run ``test_cmd`` on a checkout in a fresh sandbox over ``rootfs``: the
    checkout laid over the image's /testbed (its clone), /testbed the agent
    uid's (the suite may write there: coverage data, caches), run as that
    uid; {test id: status} by the profiles' parser."""
    from camg.helper_client import HelperClient

    client = HelperClient(helper_socket, owner="coding-build-tasks")

    def run(checkout: Path) -> dict[str, str]:
        sandbox = client.create_sandbox(
            [str(rootfs)], memory_bytes=memory_bytes, cpu_quota=1.0, pids_max=512
        )
        try:
            client.put_archive(sandbox, "/testbed", tar_checkout(checkout), user="root")
            owned = client.exec(sandbox, f"chown -R {AGENT_UID}:{AGENT_UID} /testbed", user="root")
            if owned.exit_code != 0:
                raise DatasetError(f"chown /testbed in the builder's sandbox: {owned.output}")
            result = client.exec(
                sandbox,
                test_cmd,
                user="agent",
                cwd="/testbed",
                timeout=timeout,
                output_limit=1 << 20,
            )
        finally:
            client.destroy(sandbox)
        if result.truncated or result.timed_out:
            raise DatasetError(
                f"suite run unusable (truncated={result.truncated}, timed_out={result.timed_out})"
            )
        status = profiles.parse_pytest_verbose(result.output)
        if not status:
            raise DatasetError(
                f"suite run reported no test (exit {result.exit_code}): {result.output[-3000:]}"
            )
        return status

    return run


def inputs_key(record: dict, image_hash: str, **options: object) -> str:
    """What a task set is made from: the image, the sdist, the options and
    the builder's sources (its modifiers and its procedure)."""
    here = Path(__file__).resolve()
    sources = [
        sha256_file(path)
        for path in (here, Path(bugs.__file__).resolve(), Path(demo_tasks.__file__).resolve())
    ]
    return sha256_json(
        {
            "image": image_hash,
            "digest": record["digest"],
            "sdist": record["sdist_sha256"],
            "options": options,
            "sources": sources,
        }
    )


def build_tasks(
    record: dict,
    image: MaterializedImage,
    helper_socket: str,
    output: Path,
    *,
    owner: str,
    package_dir: str,
    count: int = 5,
    seed: int = 0,
    max_f2p: int = 60,
    per_modifier: int = 2,
) -> list[dict]:
    """The task set under ``output`` (kept when build-info.json says it was
    made from the same inputs); returns its rows."""
    if not record.get("sdist"):
        raise DatasetError("build.json: the image was not built from an sdist (source.sdist)")
    test_cmd = profiles.for_repo(f"{profiles.BUILT_OWNER}/x__y.00000000").test_cmd
    if record.get("test_cmd") != test_cmd:
        raise DatasetError(
            f"build.json: the image's test_cmd {record.get('test_cmd')!r} is not the command "
            f"rows of owner {profiles.BUILT_OWNER!r} are graded with ({test_cmd!r})"
        )
    options = {
        "owner": owner,
        "package_dir": package_dir,
        "count": count,
        "seed": seed,
        "max_f2p": max_f2p,
        "per_modifier": per_modifier,
    }
    key = inputs_key(record, image.hash, **options)
    info_path = output / "build-info.json"
    try:
        if json.loads(info_path.read_text())["key"] == key and (output / "tasks.jsonl").is_file():
            return [json.loads(line) for line in (output / "tasks.jsonl").read_text().splitlines()]
    except (OSError, ValueError, KeyError):
        pass
    sdist = Path(record["sdist"])
    if sha256_file(sdist) != record["sdist_sha256"]:
        raise DatasetError(f"{sdist}: not the sdist the image was built from")
    project, _ = _project_version(sdist)
    spec = demo_tasks.DemoSpec(
        sdist=sdist,
        owner=owner,
        project=project,
        package_dir=package_dir,
        image_name=image.name,
        count=count,
        per_modifier=per_modifier,
        max_f2p=max_f2p,
        seed=seed,
    )
    runner = sandbox_runner(helper_socket, image.rootfs, test_cmd)
    rows = demo_tasks.build(spec, output, runner)
    base = demo_tasks._git(next((output / "mirrors").iterdir()), "rev-parse", "main").strip()
    if record.get("commit") and base != record["commit"]:
        raise DatasetError(
            f"the mirror's base commit {base} is not the image's /testbed commit "
            f"{record['commit']}: the image and the tasks come from different sources"
        )
    for row in rows:
        row["repo"] = f"{profiles.BUILT_OWNER}/{row['repo'].partition('/')[2]}"
    demo_tasks.write_rows(rows, output)
    info = {
        "key": key,
        **options,
        "sdist": str(sdist),
        "image": image.name,
        "digest": record["digest"],
        "base_commit": base,
        "count_built": len(rows),
    }
    (output / "build-info.json").write_text(json.dumps(info, indent=1) + "\n")
    return rows


def _project_version(sdist: Path) -> tuple[str, str]:
    project, _, version = sdist.name.removesuffix(".tar.gz").rpartition("-")
    return project, version


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m environments.coding.build.tasks",
        description=(__doc__ or "").split("\n\n")[0],
    )
    ap.add_argument("--build", required=True, type=Path, help="build.json of tools.prepare_image")
    ap.add_argument("--images", required=True, help="materialized-images.json holding the image")
    ap.add_argument("--helper-socket", required=True, help="the camg-helper socket")
    ap.add_argument("--owner", required=True, help="the project's owner (instance ids name it)")
    ap.add_argument("--package-dir", required=True, help="where the bugs go (e.g. src, parse)")
    ap.add_argument("--output", required=True, type=Path)
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-f2p", type=int, default=60)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.count < 1:
            raise DatasetError("--count must be at least 1")
        try:
            record = json.loads(args.build.read_text())
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{args.build}: not a build.json ({exc})") from None
        image = images_mod.lookup(images_mod.load(args.images), record["name"])
        if image.digest != record["digest"]:
            raise DatasetError(
                f"{args.images}: image {image.name} is {image.digest}, build.json built "
                f"{record['digest']}"
            )
        rows = build_tasks(
            record,
            image,
            args.helper_socket,
            args.output,
            owner=args.owner,
            package_dir=args.package_dir,
            count=args.count,
            seed=args.seed,
            max_f2p=args.max_f2p,
        )
    except CamgError as exc:
        print(f"build.tasks: {exc.name}: {exc}", file=sys.stderr)
        return 2
    print(f"build.tasks: {len(rows)} task(s) in {args.output / 'tasks.jsonl'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
