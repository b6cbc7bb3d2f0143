"""``--policy openai``: any OpenAI-compatible chat endpoint drives the episode
(``CAMG_POLICY_URL``, ``CAMG_POLICY_MODEL``, ``CAMG_POLICY_KEY`` from the
environment).

Native tool calls where the endpoint has them: the request carries
``tools=`` (the service's ``/schema`` "tools", generated from its action
schema), the model's first tool call becomes the action by the service's
own inverse (camg_client/tool_calls.py), and the next observation goes back
as that call's tool result. An endpoint that answers that it does not do
tools (vLLM without ``--enable-auto-tool-choice``, many gateways: a 400 or
404 whose message names tools) switches this policy to the text protocol
for good: the system message carries the action schema, each user message
an observation as JSON, and the reply must hold one JSON action (its first
``{…}`` block). A reply without a tool call in tool mode is read the same
way, so a model that answers in text still plays.
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from typing import TYPE_CHECKING, Any, cast

from camg_client.tool_calls import ToolCallError, ToolCalls

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam

_TEXT_SYSTEM = (
    "You act in an environment. Reply with exactly one JSON object, the "
    "next action, matching this JSON Schema:\n"
)
_TOOLS_SYSTEM = (
    "You act in an environment. Each turn, call exactly one of the tools: "
    "it is your next action, and its result is what you observe next."
)
# The statuses with which endpoints refuse a tools= request they cannot serve.
_REFUSED = (400, 404, 422, 501)


def refuses_tools(exc: Exception) -> bool:
    """Whether an endpoint's error answer says it does not do tool calls
    (not a bad request of another kind, which stays an error)."""
    status = getattr(exc, "status_code", None)
    return status in _REFUSED and "tool" in str(exc).lower()


def first_json_object(text: str) -> dict:
    match = re.search(r"\{.*\}", text, re.S)
    if not match:
        raise ToolCallError(f"policy reply holds no JSON action: {text[:200]!r}")
    try:
        return json.loads(match.group(0))
    except ValueError as exc:
        raise ToolCallError(f"policy reply holds no JSON action: {exc}") from None


class OpenAIPolicy:
    def __init__(self, schema: dict, tools: list[dict] | None = None) -> None:
        from openai import AsyncOpenAI

        missing = [v for v in ("CAMG_POLICY_URL", "CAMG_POLICY_MODEL") if not os.environ.get(v)]
        if missing:
            raise SystemExit(f"camg_client: --policy openai needs {', '.join(missing)}")
        self.model = os.environ["CAMG_POLICY_MODEL"]
        self.client = AsyncOpenAI(
            base_url=os.environ["CAMG_POLICY_URL"],
            api_key=os.environ.get("CAMG_POLICY_KEY") or "none",
            timeout=300,
            max_retries=2,
        )
        self.text_system = _TEXT_SYSTEM + json.dumps(schema)
        self.calls = ToolCalls({"action": schema, "tools": tools or []})
        #: native tool calls until the endpoint says it has none
        self.native = bool(self.calls.tools)
        #: per episode: the first observation, then (reply, observation) per turn
        self.turns: dict[str, list] = {}

    def fork(self, parent: str, child: str) -> None:
        """A fork's child goes on from the parent's conversation (rollout_fork.py)."""
        if parent in self.turns:
            self.turns[child] = list(self.turns[parent])

    def messages(self, episode_id: str) -> list[dict]:
        """The conversation so far in the protocol in force (rebuilt each
        turn, so a switch to text mid-episode replays it as text)."""
        first, *turns = self.turns[episode_id]
        native = self.native
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _TOOLS_SYSTEM if native else self.text_system},
            {"role": "user", "content": json.dumps(first)},
        ]
        for reply, observation in turns:
            if native and reply["call"] is not None:
                call = reply["call"]
                messages += [
                    {
                        "role": "assistant",
                        "content": reply["text"] or None,
                        "tool_calls": [
                            {
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["name"], "arguments": call["arguments"]},
                            }
                        ],
                    },
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": json.dumps(observation),
                    },
                ]
            else:
                text = reply["text"] or (json.dumps(reply["action"]) if reply["action"] else "")
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": json.dumps(observation)},
                ]
        return messages

    async def complete(self, episode_id: str):
        options: dict[str, Any] = {"model": self.model, "temperature": 0.0}
        if self.native:
            try:
                return await self.client.chat.completions.create(
                    messages=cast("list[ChatCompletionMessageParam]", self.messages(episode_id)),
                    tools=cast("list[ChatCompletionToolUnionParam]", self.calls.tools),
                    **options,
                )
            except Exception as exc:  # the SDK's APIStatusError, by duck type
                if not refuses_tools(exc):
                    raise
                self.native = False
                print(
                    f"camg_client: the policy endpoint refuses tools ({exc}); "
                    "using the text protocol",
                    file=sys.stderr,
                )
        return await self.client.chat.completions.create(
            messages=cast("list[ChatCompletionMessageParam]", self.messages(episode_id)), **options
        )

    async def act(self, client, episode_id: str, observation: Any) -> dict | None:
        turns = self.turns.setdefault(episode_id, [])
        if turns:
            turns[-1] = (turns[-1], observation)
        else:
            turns.append(observation)
        reply = (await self.complete(episode_id)).choices[0].message
        text = reply.content or ""
        calls = getattr(reply, "tool_calls", None) or []
        if self.native and calls:
            # One action a turn: only the first call is played (and kept).
            call = calls[0]
            record = {
                "text": text,
                "action": None,
                "call": {
                    "id": call.id or "call_" + uuid.uuid4().hex[:12],
                    "name": call.function.name,
                    "arguments": call.function.arguments or "",
                },
            }
            action = self.calls.action(call.function.name, call.function.arguments)
        else:
            record = {"text": text, "action": None, "call": None}
            action = first_json_object(text)
        record["action"] = action
        turns.append(record)
        return action
