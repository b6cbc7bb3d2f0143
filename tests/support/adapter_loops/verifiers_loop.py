"""verifiers 0.4's own episode loop over the camg adapter: the env comes up
with ``Env.serving()`` and each task is one ``Env.run_slot`` (what
``vf-eval`` runs in-process), the player verifiers' ``null`` chat harness in
a subprocess runtime, its model the scripted endpoint.

    CAMG_MAX_TURNS=N python verifiers_loop.py SERVICE_URL MODEL_URL TASK_ID...

``CAMG_VARIANT`` asks every episode for that kind of variant and
``CAMG_KEEP_CANARIES=1`` keeps their rewards; each line carries the
adapter's canary tally so far.
"""

import asyncio
import json
import os
import sys

import verifiers.v1 as vf

from camg_client.adapters import verifiers as adapter
from camg_client.canaries import TALLY


async def main(url: str, model_url: str, task_ids: list[str]) -> None:
    env = adapter.load_environment(
        url, task_ids=task_ids, max_turns=int(os.environ["CAMG_MAX_TURNS"]),
        variant=os.environ.get("CAMG_VARIANT") or None,
        keep_canaries=os.environ.get("CAMG_KEEP_CANARIES") == "1")
    ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(
        base_url=model_url, api_key_var="CAMG_SCRIPTED_KEY"))
    tasks = list(env.taskset)
    async with env.serving():
        for task in tasks:
            (slot,) = env.slots(task)
            episode = await env.run_slot(slot, ctx)
            rewards = {name: r.score for t in episode.traces for name, r in t.rewards.items()}
            print(json.dumps({
                "task_id": task.data.id, "ok": episode.ok,
                "errors": [f"{e.type}: {e.message}" for e in episode.errors],
                "rewards": rewards, "turns": sum(t.num_turns for t in episode.traces),
                "camg": [t.info.get("camg") for t in episode.traces],
                "tally": TALLY.report()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
