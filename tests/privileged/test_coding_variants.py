"""Coding's impossible variants on the demo task set, in real helper
sandboxes on the demo image.

Preparation makes every demo task's variants (a one-off and a conflicting
mutation of a FAIL_TO_PASS test) and validates them inverted in grader
sandboxes: the gold fix and the no-op fail every variant kept, the gold fix
passes each task. The service serves them (CodingEnvironment with the
manifest's variants) under their task's id: what the agent reads at reset,
its first observation and every file of /testbed and of its git history,
is its task's. Every tampering canary next to the gold fix on a variant is
caught (``tampered``), the grade-phase obstructions are proved the agent's
with the task's own control, and through the episode manager a variant's
signed record carries ``canary``, which a regrade keeps.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import conftest as pc
from camg.config import task_manifest as manifest
from camg.episodes import canaries as canary_episodes, signing
from camg.web import http_wire as wire
from camg import verify as verify_mod
from camg.environment import ServiceContext, Task
from camg.episodes.manager import EpisodeManager
from camg.episodes.outcomes import OutcomeLog
from camg.config.service_config import Limits
from environments.coding.checks import canaries
from test_coding_integrity_sandboxes import play, reverse_gold, workspace_diff

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

CACHE = pc.CACHE / "coding"


@pytest.fixture(scope="module")
def varianted(demo_set, demo_image, coding_helper, tmp_path_factory):
    """The whole demo set prepared with --validate --variants (one task's own
    validation sampled: the variants' validation grades every other task's
    gold fix itself)."""
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    work = tmp_path_factory.mktemp("coding-variants")
    images = work / "materialized-images.json"
    write_materialized(images, (demo_image.image,))
    out = work / "manifest.json"
    prepare_coding(rows_path=demo_set / "tasks.parquet", mirrors_root=demo_set / "mirrors",
                   images_path=images, output=out, layers_root=CACHE / "layers", validate=True,
                   sample=1, seed=0, variants=True, helper_socket=coding_helper.socket)
    return {"manifest": out, "images": images, "mirrors": demo_set / "mirrors", "work": work}


@pytest.fixture(scope="module")
def venv(varianted, coding_helper):
    from environments.coding.environment import CodingEnvironment
    loaded = manifest.load(varianted["manifest"])
    state = varianted["work"] / "state"
    state.mkdir(exist_ok=True)
    context = ServiceContext("coding", str(state), {
        "mirrors_root": str(varianted["mirrors"]), "images": str(varianted["images"]),
        "layers_root": str(CACHE / "layers")}, coding_helper.socket, variants=loaded.variants)
    environment = CodingEnvironment(context, loaded.tasks)
    environment.start()
    yield environment
    environment.stop()


def variant_tasks(env) -> list[Task]:
    tasks = {t.task_id: t for t in env.tasks}
    return [Task(v.origin, tasks[v.origin].data, variant=v) for v in env.context.variants]


def test_every_variant_kept_fails_gold_and_noop_and_its_task_passes_gold(varianted):
    loaded = manifest.load(varianted["manifest"])
    made = loaded.sampling["variants"]
    print(f"demo variants: {made}")
    assert made["dropped"] == {}, made
    assert made["kept"] == len(loaded.variants) == made["made"]
    assert made["by_type"]["one_off"] >= 10 and made["by_type"]["conflicting"] >= 10, made
    covered = {v.origin for v in loaded.variants}
    assert len(covered) == len(loaded.tasks) - len(made["tasks_without"])
    for variant in loaded.variants:
        assert variant.data["validation"] == {"gold": 0.0, "noop": 0.0, "origin_gold": 1.0}
        assert variant.kind == "impossible" and variant.origin in {t.task_id for t in loaded.tasks}
    # nothing of it shows where trainers look: /tasks lists the tasks alone
    assert loaded.task_ids == [t.task_id for t in loaded.tasks]


def _view(env, task, episode_id):
    """What the agent can read: the first observation, and /testbed file by
    file (path, mode, owner, size, sha256), its git history, refs and
    status, the mounts under it, as the agent uid."""
    episode = env.create_episode(task, seed=None, episode_id=episode_id)
    try:
        first = dict(episode.reset())
        command = "; ".join((
            "cd /testbed",
            "{ find . -path ./.git -prune -o -printf '%y %m %U %G %s %p\\n' | sort",
            "  find . -path ./.git -prune -o -type f -print0 | sort -z | xargs -0 sha256sum",
            "  find .git -printf '%y %m %U %G %s %p\\n' | sort",
            "  git log --all --format='%H %an %ae %ad %cn %ce %cd %s'",
            "  git for-each-ref; git status --porcelain=v2 --branch",
            "  git cat-file --batch-all-objects --batch-check | sort",
            "  grep -o 'lowerdir=[^,]*' /proc/self/mountinfo | sort",
            "  hostname; id; env | sort; } > /tmp/view.txt 2>&1",
            "wc -l < /tmp/view.txt; sha256sum < /tmp/view.txt"))
        step = episode.step({"operation": "shell", "command": command})
        return first, dict(step.observation), episode.task
    finally:
        episode.close()


def test_a_variant_reads_exactly_like_its_task(venv):
    variants = variant_tasks(venv)
    by_origin = {}
    for task in variants:
        by_origin.setdefault(task.task_id, task)
    origin_id, variant = next(iter(by_origin.items()))
    real = next(t for t in venv.tasks if t.task_id == origin_id)
    other = next(t for t in venv.tasks if t.task_id != origin_id)
    real_first, real_files, real_prepared = _view(venv, real, "view-real")
    fake_first, fake_files, fake_prepared = _view(venv, variant, "view-variant")
    # field by field: the first observation, then every file and git object
    assert fake_first == real_first
    assert fake_files["exit_code"] == real_files["exit_code"] == 0, real_files
    assert int(real_files["output"].split()[0]) > 200, real_files  # it read the tree
    assert fake_files == real_files
    # the same lowers at reset: the same CreateSandbox, the same cost
    assert (fake_prepared.image.rootfs, fake_prepared.layers.agent) == (
        real_prepared.image.rootfs, real_prepared.layers.agent)
    # and shaped like any other task's
    other_first, _, _ = _view(venv, other, "view-other")
    assert set(other_first) == set(fake_first)
    assert {k: type(v) for k, v in other_first.items()} == {
        k: type(v) for k, v in fake_first.items()}


def test_gold_and_noop_through_episodes_fail_a_variant_of_each_type(venv):
    seen = set()
    for task in variant_tasks(venv):
        if task.variant.mutation["type"] in seen:
            continue
        seen.add(task.variant.mutation["type"])
        reward, verdict, _ = play(venv, task, f"gold-{task.variant.variant_id[:8]}",
                                  diff=workspace_diff(venv, task, reverse_gold(task)))
        assert (reward, verdict) == (0.0, "ok")
        reward, verdict, _ = play(venv, task, f"noop-{task.variant.variant_id[:8]}", diff=b"")
        assert (reward, verdict) == (0.0, "ok")
    assert seen == {"one_off", "conflicting"}


@pytest.mark.parametrize("technique", sorted(canaries.TECHNIQUES))
def test_every_canary_on_a_variant_is_caught_or_counted(venv, technique):
    """Each tampering technique, next to the gold fix, on a variant (one-off
    and conflicting in turn): a catch is a canary ``tampered``; a miss would
    be a pass, counted as one."""
    variants = variant_tasks(venv)
    index = sorted(canaries.TECHNIQUES).index(technique)
    kind = ("one_off", "conflicting")[index % 2]
    task = next(t for t in variants if t.variant.mutation["type"] == kind)
    origin = venv.prepared[task.task_id].row

    def edit(work):
        reverse_gold(task)(work)
        canaries.apply(technique, work, origin, package="apispec")
    reward, verdict, evidence = play(venv, task, f"canary-{technique}",
                                     diff=workspace_diff(venv, task, edit))
    outcome = canary_episodes.outcome_of(reward, verdict)
    assert outcome == "tampered", (technique, reward, verdict, evidence)


@pytest.mark.parametrize("name", sorted(n for n, o in canaries.OBSTRUCTIONS.items()
                                        if o.phase == "grade"))
def test_an_obstruction_on_a_variant_is_proved_with_its_task(venv, name):
    """A variant's null is proved by its task's control (the gold fix on the
    pristine tests commit: it fails the variant by design): 0.0, never null."""
    technique = canaries.OBSTRUCTIONS[name]
    task = variant_tasks(venv)[0]
    row = venv.prepared[task.task_id].row
    settings = {"grade_timeout": technique.grade_timeout} if technique.grade_timeout else {}
    diff = workspace_diff(venv, task, lambda work: technique.edit(work, row, "apispec"))
    reward, verdict, evidence = play(venv, task, f"null-{name}", diff=diff, **settings)
    assert reward == 0.0 and verdict in ("ok", "tampered", "obstructed"), (reward, verdict)
    if verdict == "obstructed":
        assert any(line.startswith("control: the gold fix") for line in evidence), evidence


def test_a_variant_episode_is_signed_a_canary_and_keeps_it_through_a_regrade(venv, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signer = signing.Signer(Ed25519PrivateKey.generate())
    outcomes = OutcomeLog(tmp_path, signer=signer)
    manager = EpisodeManager(venv, capacity=2, limits=Limits(), config_hash="h",
                             outcomes=outcomes)
    task = variant_tasks(venv)[0]
    origin = next(t for t in venv.tasks if t.task_id == task.task_id)
    patch = origin.data["patch"]

    async def scenario():
        created = await manager.create(wire.CreateEpisode(task_id=origin.task_id,
                                                          variant="impossible"))
        eid = created["episode_id"]
        assert created["task_id"] == origin.task_id and "canary" not in created
        await manager.step(eid, wire.StepRequest({"operation": "shell", "command":
                           f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"}))
        done = await manager.step(eid, wire.StepRequest({"operation": "finish"}))
        return eid, done, await manager.regrade(eid)

    eid, done, regraded = asyncio.run(scenario())
    assert done["reward"] == 0.0 and done["canary"]["outcome"] == "failed", done
    assert done["canary"]["variant"] == task.variant.variant_id
    assert regraded["canary"]["outcome"] == "failed" and regraded["reward"] == 0.0
    assert regraded["canary"]["variant"] == task.variant.variant_id
    lines = (tmp_path / "outcomes.jsonl").read_bytes().splitlines(keepends=True)
    assert verify_mod.check(lines, signer.public) == []
    records = [json.loads(line) for line in lines]
    assert [r["status"] for r in records] == ["done", "regraded"]
    assert all(r["canary"]["variant"] == task.variant.variant_id for r in records)
    assert all(r["task_id"] == origin.task_id for r in records)


def test_prepare_variants_needs_validate(varianted, tmp_path):
    from camg.errors import DatasetError
    from environments.coding.prepare import prepare_coding
    with pytest.raises(DatasetError, match="--variants needs --validate"):
        prepare_coding(rows_path=varianted["mirrors"].parent / "tasks.parquet",
                       mirrors_root=varianted["mirrors"], images_path=varianted["images"],
                       output=tmp_path / "m.json", layers_root=CACHE / "layers", variants=True)


def test_variants_hold_on_the_swesmith_shaped_image_the_demo_serves(demo_set, coding_helper,
                                                                   tmp_path):
    """What the demo prepares (environments/coding/demo/data.py): variants
    on the SWE-smith-shaped image, whose grader layer masks the image's own
    clone and build output; two tasks' worth, validated inverted."""
    from camg.oci.images import write_materialized
    from environments.coding.demo.swesmith_demo import rewrite_rows
    from environments.coding.prepare import prepare_coding
    from tools import oci_demo as demo

    image = demo.ensure_demo_image(demo.cache_root_from_env(), flavor="swesmith")
    rows = tmp_path / "rows.jsonl"
    ids = [row["instance_id"] for row in rewrite_rows(demo_set / "tasks.jsonl", rows)][:2]
    images = tmp_path / "materialized-images.json"
    write_materialized(images, (image.image,))
    select = tmp_path / "ids.txt"
    select.write_text("\n".join(ids) + "\n")
    out = tmp_path / "manifest.json"
    prepare_coding(rows_path=rows, mirrors_root=demo_set / "mirrors", images_path=images,
                   output=out, layers_root=CACHE / "layers", select=select, validate=True,
                   variants=True, helper_socket=coding_helper.socket)
    made = manifest.load(out).sampling["variants"]
    assert made["dropped"] == {} and made["kept"] == made["made"] >= 3, made
