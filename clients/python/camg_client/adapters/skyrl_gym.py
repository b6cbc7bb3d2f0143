"""A camg service as a SkyRL-Gym 0.4 environment (``pip install
'camg-client[skyrl]'``): ``CamgTextEnv``, a ``BaseTextEnv`` that
``register()`` puts in skyrl_gym's registry as ``camg``.

One env instance is one camg episode, as SkyRL's generator uses it
(``skyrl_gym.make(env_class, env_config=…, extras=row)``, ``init(prompt)``,
``step(model_output)`` until ``done``, ``close()``): ``init`` creates the
episode and appends its first observation (with the action schema) to the
prompt; ``step`` reads one JSON action from the model's text (the text
protocol, camg_client/adapters/text_protocol.py), steps, and answers the
next observation as a user message. Steps before the last carry reward 0.0
(camg rewards only the end); the last carries camg's terminal reward.

A reply holding no action, or one the service refuses, is answered with the
reason (a turn spent, nothing played). At ``max_turns`` the environment's
ending action (``finish``/``submit``) has the work graded as it stands, so
stalling earns what doing nothing earns. Where camg gives no reward
(``reward: null``, an infrastructure failure, or ``max_turns`` reached
where there is no ending action: Shop) the step is ``done`` with
``reward`` None and ``metadata["camg"]["masked"]`` True (``get_metrics``:
``camg_masked`` 1.0): the outcome to drop, never a 0. skyrl-train's
generator places no token reward for a None step, so a trainer filters
masked trajectories on that flag; ``env_config.on_unrewarded: raise``
raises ``Unrewarded`` from ``step`` instead, for a loop that cannot.

An impossible variant's episode (the terminal reply's ``canary``: a
deployment mixed it in, or ``env_config.variant`` asked for it) ends
``masked`` too, dropped like a null, with ``metadata["camg"]["canary"]``
(``get_metrics``: ``camg_canary`` 1.0, ``camg_canary_passed``), and adds
to ``camg_client.canaries.TALLY``, the cheating rate per service;
``env_config.keep_canaries`` true keeps its reward for training.

A row names its service and task: ``extras`` ``camg_url`` and ``task_id``
(or ``extra_info.task_id``), as ``dataset_rows(url)`` writes them from
``GET /tasks``; ``env_config`` may give ``url``, ``max_turns``, ``wait_s``,
``token``. The trainer's token is never in a row (rows are written to
datasets): ``env_config.token``, else camg_client.token's search
(``CAMG_TOKEN``, ``CAMG_TOKEN_FILE``, ``~/.config/camg/token``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from camg_client import token as tokens
from camg_client.adapters.text_protocol import (
    SYSTEM_PROMPT,
    CanaryEpisode,
    Unrewarded,
    ending_action,
    first_message,
    next_message,
    parse_action,
    refusal,
)
from camg_client.canaries import TALLY
from camg_client.client import Client, InvalidAction, NotFound

ENV_ID = "camg"
ENTRY_POINT = "camg_client.adapters.skyrl_gym:CamgTextEnv"
__all__ = ["CamgTextEnv", "dataset_rows", "register"]  # noqa: F822  # CamgTextEnv: from __getattr__


def register(env_id: str = ENV_ID) -> str:
    """Register ``CamgTextEnv`` in skyrl_gym's registry (once; again is a no-op)."""
    import skyrl_gym

    if env_id not in skyrl_gym.registry:
        skyrl_gym.register(id=env_id, entry_point=ENTRY_POINT)
    return env_id


def dataset_rows(
    url: str,
    *,
    env_class: str = ENV_ID,
    task_ids: list[str] | None = None,
    token: str | None = None,
) -> list[dict]:
    """One SkyRL dataset row per served task (``GET /tasks``, manifest order);
    ``token``: the trainer's (default: camg_client.token's search)."""
    wanted = None if task_ids is None else set(task_ids)
    return [
        {
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT}],
            "env_class": env_class,
            "camg_url": url,
            "task_id": row["task_id"],
        }
        for row in Client(url, token=tokens.resolve(token)).iter_tasks()
        if wanted is None or row["task_id"] in wanted
    ]


def __getattr__(name: str):
    if name == "CamgTextEnv":
        return _env_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _option(config: Any, key: str, default: Any = None) -> Any:
    # env_config is an OmegaConf DictConfig under skyrl-train, a dict elsewhere
    return config.get(key, default) if config is not None else default


@functools.cache
def _env_class() -> type:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

    class CamgTextEnv(BaseTextEnv):
        def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
            super().__init__()
            extras = dict(extras or {})
            info = extras.get("extra_info") or {}
            self.url = extras.get("camg_url") or _option(env_config, "url")
            self.task_id = extras.get("task_id") or info.get("task_id")
            if not self.url:
                raise ValueError(
                    "CamgTextEnv needs the service URL: extras camg_url or env_config url"
                )
            self.max_turns = int(extras.get("max_turns") or _option(env_config, "max_turns", 100))
            self.wait_s = float(_option(env_config, "wait_s", 600.0))
            self.raise_unrewarded = _option(env_config, "on_unrewarded", "mask") == "raise"
            self.keep_canaries = bool(_option(env_config, "keep_canaries", False))
            self.variant = _option(env_config, "variant")
            self.client = Client(self.url, token=tokens.resolve(_option(env_config, "token")))
            self.episode_id: str | None = None
            self.end: dict | None = None
            self.closed = False
            self.outcome: dict = {}

        def init(self, prompt):
            schema = self.client.schema()["action"]
            self.end = ending_action(schema)
            created = self.client.create(
                task_id=self.task_id, wait=self.wait_s, variant=self.variant
            )
            self.episode_id, self.task_id = created["episode_id"], created["task_id"]
            opening = {"role": "user", "content": first_message(created["observation"], schema)}
            return [*(prompt or []), opening], {
                "episode_id": self.episode_id,
                "task_id": self.task_id,
            }

        def step(self, action: str) -> BaseTextEnvStepOutput:
            assert self.episode_id is not None  # skyrl calls init(), which sets it, first
            self.turns += 1
            try:
                answer = self.client.step(self.episode_id, parse_action(action))
            except (ValueError, InvalidAction) as exc:
                # the model's mistake: nothing changed, it reads why and goes on
                answer = {"done": False, "reward": 0.0, "observation": None, "refused": exc}
            if answer["done"]:
                return self._end(
                    answer.get("reward"),
                    answer.get("failure_class"),
                    answer.get("outcome_seq"),
                    canary=answer.get("canary"),
                )
            if self.turns >= self.max_turns:
                if self.end is not None:
                    # out of turns: the work is graded as it stands
                    answer = self.client.step(self.episode_id, self.end)
                    return self._end(
                        answer.get("reward"),
                        answer.get("failure_class"),
                        answer.get("outcome_seq"),
                        canary=answer.get("canary"),
                    )
                return self._end(None, None, None, detail=f"no end after {self.max_turns} turns")
            text = (
                refusal(answer["refused"])
                if "refused" in answer
                else next_message(answer["observation"])
            )
            return BaseTextEnvStepOutput(
                observations=[{"role": "user", "content": text}],
                reward=0.0,
                done=False,
                metadata={},
            )

        def _end(
            self,
            reward,
            failure_class,
            outcome_seq,
            detail="ended with reward null (infrastructure failure)",
            canary=None,
        ):
            masked = reward is None
            self.outcome = {
                "episode_id": self.episode_id,
                "task_id": self.task_id,
                "reward": reward,
                "failure_class": failure_class,
                "outcome_seq": outcome_seq,
                "masked": masked,
            }
            if canary is not None:
                TALLY.add(self.url, canary)
                self.outcome["canary"] = canary
                if not self.keep_canaries:
                    # measured, not trained on: dropped as a null is
                    self.outcome.update(reward=None, masked=True)
                    reward, masked = None, True
                    detail = "an impossible variant's episode, left out of training"
            if masked and self.raise_unrewarded:
                self.close()
                if canary is not None and not self.keep_canaries:
                    raise CanaryEpisode(self.episode_id, canary)
                raise Unrewarded(self.episode_id, failure_class, detail)
            return BaseTextEnvStepOutput(
                observations=[], reward=reward, done=True, metadata={"camg": dict(self.outcome)}
            )

        def close(self) -> None:
            # Idempotent: the generator closes every env, finished or not.
            if self.episode_id is not None and not self.closed:
                try:
                    self.client.close(self.episode_id)
                except NotFound:
                    pass  # the service already forgot it: closed is what we wanted
                self.closed = True
                self.client.close_connection()

        def get_metrics(self) -> dict:
            metrics = {"steps": float(self.turns)}
            if self.outcome:
                metrics["camg_masked"] = float(self.outcome["masked"])
                canary = self.outcome.get("canary")
                metrics["camg_canary"] = float(canary is not None)
                metrics["camg_canary_passed"] = float(bool(canary and canary.get("passed")))
            return metrics

    return CamgTextEnv
