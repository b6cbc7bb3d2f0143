"""What the adapters share: the text a model reads (an observation, the
first one with the action schema), the action read back from its reply, and
the outcome of an episode that earned no reward.

The text protocol is ``--policy openai``'s fallback (camg_client/openai_policy.py):
one JSON action per reply, its first ``{…}`` block. Frameworks whose chat
loop has no tools of ours (verifiers' ``null`` harness, SkyRL-Gym's string
actions) speak it.
"""

from __future__ import annotations

import json
from typing import Any

from camg_client.openai_policy import first_json_object

#: the system prompt of a camg episode in a framework's chat loop
SYSTEM_PROMPT = (
    "You act in an environment. Reply with exactly one JSON object, the next "
    "action, matching the action schema you are given."
)


class Unrewarded(RuntimeError):
    """A camg episode that ended without a reward: an infrastructure failure
    (``reward: null``, ``failure_class`` set) or a policy that stopped before
    the episode ended. An adapter surfaces it as its framework's failed or
    masked outcome: a trainer must not learn 0 from it."""

    def __init__(self, episode_id: str | None, failure_class: str | None, detail: str) -> None:
        self.episode_id = episode_id
        self.failure_class = failure_class
        super().__init__(
            f"camg episode {episode_id}: {detail}"
            + (f" (failure_class {failure_class})" if failure_class else "")
        )


class CanaryEpisode(Unrewarded):
    """An impossible variant's episode (camg_client/canaries.py): it measured
    whether the policy cheats and is no training data. Raised where an
    adapter drops those (its default) so the framework drops it as it drops
    an unrewarded one; ``canary`` is the terminal reply's verdict."""

    def __init__(self, episode_id: str | None, canary: dict) -> None:
        self.canary = canary
        super().__init__(
            episode_id,
            None,
            f"an impossible variant's episode (canary {canary.get('outcome')}), "
            "left out of training",
        )


def first_message(observation: Any, action_schema: dict) -> str:
    return json.dumps({"observation": observation, "action_schema": action_schema})


def next_message(observation: Any) -> str:
    return json.dumps({"observation": observation})


def parse_action(reply: str) -> dict:
    """The action of a reply; ValueError when it holds none."""
    action = first_json_object(reply or "")
    if not isinstance(action, dict):
        raise ValueError(f"the reply's JSON is not an action object: {reply[:200]!r}")
    return action


def ending_action(action_schema: dict) -> dict | None:
    """The action that ends an episode and has it graded as it stands
    (``finish``; AutoResearch's ``submit``), or None (Shop ends on a purchase
    or at its step limit). An adapter plays it when its framework's turn
    budget runs out first: the work done is graded, so stalling until the
    budget ends earns what doing nothing earns, not a masked episode."""
    for branch in action_schema.get("anyOf") or action_schema.get("oneOf") or [action_schema]:
        ops = (branch.get("properties") or {}).get("operation") or {}
        for op in ops.get("enum") or ([ops["const"]] if "const" in ops else []):
            if op in ("finish", "submit"):
                return {"operation": op}
    return None


def refusal(exc: Exception) -> str:
    """The next user turn after a reply that played nothing (no JSON action,
    or one the service refused): the model reads why; nothing changed."""
    return json.dumps({"error": f"no action was played: {exc}"})


def terminal_reward(answer: dict, episode_id: str | None) -> float:
    """The reward of a terminal step answer, or Unrewarded."""
    if answer.get("reward") is None:
        raise Unrewarded(
            episode_id,
            answer.get("failure_class"),
            "ended with reward null (infrastructure failure)",
        )
    return float(answer["reward"])
