"""OpenEnv 0.10.0's own Task API client (openenv.harbor.client.HarborEnv)
over a camg service, run in the openenv-tasks scratch venv: the splits, each
split's count and whole range, one task by index, a range past the end, and
the status of a bad split, printed as one JSON object. The trainer's token
is CAMG_TOKEN's (the test session's, inherited)."""

from __future__ import annotations

import json
import os
import sys

import httpx
from openenv.harbor.client import HarborEnv


def main(url: str) -> None:
    token = {"Authorization": f"Bearer {os.environ['CAMG_TOKEN']}"}
    env = HarborEnv(base_url=url, headers=token)  # its /ws (run_rollout) sends them
    # 0.10.0's Task API calls go through an httpx client made without them
    env._http.headers.update(token)
    try:
        splits = env.splits()
        names = [split["name"] for split in splits]
        out = {
            "splits": splits,
            "num_tasks": {name: env.num_tasks(name) for name in names},
            "default_num_tasks": env.num_tasks(),
            "ranges": {name: [t.model_dump() for t in env.get_task_range(name, 0, 1000)]
                       for name in names},
            "second": env.get_task(names[0], 1).model_dump(),
            "past_the_end": [t.model_dump() for t in env.get_task_range(names[0], 50, 60)],
        }
        try:
            env.get_task_range("no-such-split")
            out["bad_split"] = None
        except httpx.HTTPStatusError as exc:
            out["bad_split"] = exc.response.status_code
    finally:
        env.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
