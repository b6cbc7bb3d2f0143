"""SkyRL-Gym 0.4's episode loop over the camg adapter, as skyrl-train's
``SkyRLGymGenerator.agent_loop`` drives a ``BaseTextEnv`` (skyrl-train
itself brings torch and vLLM): ``skyrl_gym.make(env_class, env_config,
extras=row)`` through the registry, ``init(prompt)``, the model's text to
``step`` until ``done``, ``close()``; the model is the scripted
chat-completions endpoint, asked with the chat history as the generator's
inference engine is.

    CAMG_MAX_TURNS=N python skyrl_gym_loop.py SERVICE_URL MODEL_URL TASK_ID...

``CAMG_VARIANT`` and ``CAMG_KEEP_CANARIES=1``: the env_config's ``variant``
and ``keep_canaries``; each line carries the adapter's canary tally so far.
"""

import json
import os
import sys
import urllib.request

import skyrl_gym
from omegaconf import DictConfig

from camg_client.adapters import skyrl_gym as adapter
from camg_client.canaries import TALLY


def generate(model_url: str, messages: list[dict]) -> str:
    request = urllib.request.Request(model_url + "/chat/completions", data=json.dumps(
        {"model": "scripted", "messages": messages}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)["choices"][0]["message"]["content"]


def main(url: str, model_url: str, task_ids: list[str]) -> None:
    env_class = adapter.register()
    for row in adapter.dataset_rows(url, task_ids=task_ids):
        extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
        # the generator sets it from its config the same way
        extras["max_turns"] = int(os.environ["CAMG_MAX_TURNS"])
        config = {"variant": os.environ.get("CAMG_VARIANT") or None,
                  "keep_canaries": os.environ.get("CAMG_KEEP_CANARIES") == "1"}
        env = skyrl_gym.make(row["env_class"], env_config=DictConfig(config), extras=extras)
        chat, _ = env.init(list(row["prompt"]))
        rewards, done, metadata, error = [], False, {}, None
        try:
            while not done:
                output = generate(model_url, chat)
                out = env.step(output)
                rewards.append(out["reward"])
                done, metadata = out["done"], out["metadata"]
                chat += [{"role": "assistant", "content": output}, *out["observations"]]
        except Exception as exc:  # what a generator would see
            error = f"{type(exc).__name__}: {exc}"
        finally:
            env.close()
        print(json.dumps({"task_id": row["task_id"], "rewards": rewards, "error": error,
                          "camg": metadata.get("camg"), "metrics": env.get_metrics(),
                          "tally": TALLY.report()}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
