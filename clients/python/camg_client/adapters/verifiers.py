"""A camg service as a verifiers 0.4 environment (``pip install
'camg-client[verifiers]'``).

verifiers 0.4 (``verifiers.v1``) has no ``MultiTurnEnv``: an environment is
a ``vf.Taskset`` (the rows) and a ``vf.Env`` whose ``run(task, agents)``
plays one episode with its agents, the way its own OpenEnv and TextArena
environments step an engine host-side. Here:

* ``CamgTaskset`` lists the service's tasks (``GET /tasks``, manifest
  order; ``task_ids`` narrows them), one prompt-less task each: the episode
  opens the conversation.
* ``CamgEnv.run`` creates one camg episode per verifiers episode, sends its
  observations as user turns (the first with the action schema), reads one
  JSON action from each reply (the text protocol: the player's harness is
  verifiers' tool-less ``null`` chat loop), steps, and records camg's
  terminal reward as the trace's ``camg_reward``.
* A reply holding no action, or one the service refuses, is answered with
  the reason (a turn spent, nothing played). When the player stops first
  (``max_turns``, the model ends), the environment's ending action
  (``finish``/``submit``) has the work graded as it stands: stalling earns
  what doing nothing earns.
* ``reward: null`` (an infrastructure failure), a player that failed (its
  trace has errors: the model endpoint, the harness) and one that stopped
  where there is no ending action (Shop) raise ``Unrewarded`` from ``run``:
  verifiers records it on the episode's ``errors`` and leaves
  ``episode.ok`` False, its failed outcome that training drops and
  ``--resume`` re-runs; no reward is recorded, so nothing reads as 0.
* An impossible variant's episode (the terminal reply's ``canary``, which a
  deployment mixes in or ``variant`` asks for) measures how often the
  policy cheats: it is added to ``camg_client.canaries.TALLY`` (the cheating
  rate per service, with its Wilson interval) and its trace's
  ``info["camg"]["canary"]``, and is dropped from training by raising
  ``CanaryEpisode`` (an ``Unrewarded``) unless the taskset config says
  ``keep_canaries``, which records its reward as any other.

The trainer's token is the taskset config's ``token`` (kept out of every
dump of the config, and out of the tasks), else camg_client.token's search
(``CAMG_TOKEN``, ``CAMG_TOKEN_FILE``, ``~/.config/camg/token``).

verifiers finds a taskset by module name, so the id is ``camg_verifiers``
(a top-level module of this distribution re-exporting the two classes).
Classes are built on first use: importing this module imports no verifiers.
"""

from __future__ import annotations

import functools
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
    terminal_reward,
)
from camg_client.canaries import TALLY
from camg_client.client import AsyncClient, Client, InvalidAction

TASKSET_ID = "camg_verifiers"
__all__ = ["CamgEnv", "CamgTaskset"]  # noqa: F822  # both built lazily by __getattr__
_LAZY = ("CamgEnv", "CamgEnvConfig", "CamgTask", "CamgData", "CamgTaskset", "CamgTasksetConfig")


def env_config(
    url: str,
    *,
    task_ids: list[str] | None = None,
    token: str | None = None,
    keep_canaries: bool = False,
    variant: str | None = None,
    **player: Any,
):
    """The ``vf.EnvConfig`` of a camg service at ``url``; ``token``: the
    trainer's (default: camg_client.token's search); ``keep_canaries``:
    train on impossible variants' episodes too; ``variant``: ask for one in
    every episode (an evaluation of cheating); ``player`` sets the playing
    agent's fields (``max_turns``, ``timeout`` …)."""
    classes = _classes()
    taskset = classes["CamgTasksetConfig"](
        id=TASKSET_ID,
        url=url,
        task_ids=task_ids,
        token=tokens.resolve(token),
        keep_canaries=keep_canaries,
        variant=variant,
    )
    agent = classes["CamgEnvConfig"].model_fields["player"].default
    return classes["CamgEnvConfig"](taskset=taskset, player=agent.model_copy(update=player))


def load_environment(url: str, **options: Any):
    """A ``vf.Env`` playing the camg service at ``url`` (see ``env_config``)."""
    return _classes()["CamgEnv"](env_config(url, **options))


def __getattr__(name: str):
    if name in _LAZY:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _classes() -> dict[str, type[Any]]:
    import verifiers.v1 as vf
    from pydantic import Field

    class CamgTasksetConfig(vf.TasksetConfig):
        url: str = ""
        """The camg service's base URL (``http://127.0.0.1:PORT``, from routes.json)."""
        task_ids: list[str] | None = None
        """The tasks to play, in the service's order (None: every served task)."""
        wait_s: float = 600.0
        """How long a create may wait in the service's line for capacity."""
        keep_canaries: bool = False
        """Record impossible variants' rewards as any other (default: drop them)."""
        variant: str | None = None
        """Ask every create for this kind of variant ("impossible"): an evaluation."""
        # a secret: never in a dump of the config (verifiers writes them
        # beside results) nor in its repr
        token: str | None = Field(default=None, exclude=True, repr=False)
        """The trainer's token (None: camg_client.token's search)."""

    class CamgData(vf.TaskData):
        url: str
        wait_s: float

    class CamgTask(vf.Task[CamgData]):
        pass

    class CamgTaskset(vf.Taskset[CamgTask, CamgTasksetConfig]):
        def load(self):
            config = self.config
            wanted = None if config.task_ids is None else set(config.task_ids)
            for row in Client(config.url, token=tokens.resolve(config.token)).iter_tasks():
                if wanted is None or row["task_id"] in wanted:
                    yield CamgTask(
                        CamgData(
                            id=row["task_id"],
                            name=row["task_id"],
                            prompt=None,
                            system_prompt=SYSTEM_PROMPT,
                            url=config.url,
                            wait_s=config.wait_s,
                        ),
                        config.task,
                    )

    class CamgEnvConfig(vf.EnvConfig):
        # verifiers' tool-less chat loop, on this host: the model only
        # answers, the camg service does the work.
        player: vf.AgentConfig = vf.AgentConfig(
            harness={"id": "null"}, runtime=vf.SubprocessConfig()
        )

    class CamgEnv(vf.Env[CamgEnvConfig]):
        async def run(self, task, agents):
            data = task.data
            token = tokens.resolve(self.config.taskset.token)
            async with AsyncClient(data.url, token=token) as client:
                schema = (await client.schema())["action"]
                created = await client.create(
                    task_id=data.id, wait=data.wait_s, variant=self.config.taskset.variant
                )
                episode_id = created["episode_id"]
                answer: dict = {"done": False}
                try:
                    async with agents.player.interaction(task) as interaction:
                        segment = await interaction.turn(
                            first_message(created["observation"], schema)
                        )
                        while not segment.terminated:
                            try:
                                answer = await client.step(
                                    episode_id, parse_action(segment.last_reply)
                                )
                            except (ValueError, InvalidAction) as exc:
                                # the model's mistake, not the episode's end
                                segment = await interaction.turn(refusal(exc))
                                continue
                            if answer["done"]:
                                break
                            segment = await interaction.turn(next_message(answer["observation"]))
                    trace = interaction.trace
                    end = ending_action(schema)
                    if not answer["done"] and not trace.errors and end is not None:
                        # the turn budget ran out (or the model stopped): grade the work
                        answer = await client.step(episode_id, end)
                finally:
                    await client.close(episode_id)
            trace.info["camg"] = {
                "episode_id": episode_id,
                "task_id": created["task_id"],
                "failure_class": answer.get("failure_class"),
                "outcome_seq": answer.get("outcome_seq"),
            }
            canary = answer.get("canary")
            if canary is not None:
                trace.info["camg"]["canary"] = canary
                TALLY.add(data.url, canary)
                if not self.config.taskset.keep_canaries:
                    raise CanaryEpisode(episode_id, canary)
            if not answer["done"]:
                why = (
                    "the player failed"
                    if trace.errors
                    else "the player stopped before the episode ended, which has no ending action"
                )
                raise Unrewarded(episode_id, None, why)
            trace.record_reward("camg_reward", terminal_reward(answer, episode_id))

    return {
        cls.__name__: cls
        for cls in (CamgTasksetConfig, CamgData, CamgTask, CamgTaskset, CamgEnvConfig, CamgEnv)
    }
