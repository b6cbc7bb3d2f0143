"""Scripted chat models for the tool-calling tests, served by the fake
OpenAI server (tools/judge_stub.py FakeJudge): its ``raw_body`` replies
carry what its text replies cannot, a ``chat.completion`` whose message
holds ``tool_calls``, and the error body an endpoint without tools sends.

The models play the counter environment (devtools/harness/counter_env.py): a
binary search over 0..100 read back from the conversation the client sent,
as a tool-calling model (``guess`` calls, hints as tool results) or a text
one (JSON actions in prose, hints as user messages).
"""

from __future__ import annotations

import json
import time
import uuid

from tools.judge_stub import Reply, chat_completion

#: what vLLM answers a tools= request when it was started without tool parsing
TOOLS_REFUSED = {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice '
                                      "and --tool-call-parser to be set",
                           "type": "BadRequestError", "param": None, "code": 400}}


def tool_call_reply(model: str, name: str, arguments: dict | str) -> Reply:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    body = {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "object": "chat.completion",
            "created": int(time.time()), "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                         "message": {"role": "assistant", "content": None, "refusal": None,
                                     "tool_calls": [{"id": "call_" + uuid.uuid4().hex[:12],
                                                     "type": "function", "function": {
                                                         "name": name, "arguments": args}}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    return Reply(raw_body=json.dumps(body).encode())


def text_reply(model: str, text: str) -> Reply:
    return Reply(raw_body=json.dumps(chat_completion(model, text)).encode())


def _bisect(guesses: list[int], hints: list[str]) -> int:
    lo, hi = 0, 100
    for guess, hint in zip(guesses, hints):
        lo, hi = (guess + 1, hi) if hint == "higher" else (lo, guess - 1)
    return (lo + hi) // 2


def tool_guesser(request) -> Reply:
    """A tool-calling model: its guesses are its earlier ``guess`` calls,
    the hints the tool results."""
    body = request.body
    messages = body["messages"]
    guesses = [json.loads(c["function"]["arguments"])["value"]
               for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    hints = [json.loads(m["content"])["text"] for m in messages if m["role"] == "tool"]
    return tool_call_reply(body["model"], "guess", {"value": _bisect(guesses, hints)})


def text_guesser(request) -> Reply:
    """A text model: its guesses are in its earlier replies, the hints in
    the user messages after the first."""
    body = request.body
    messages = body["messages"]
    guesses = [json.loads(m["content"].split("action: ", 1)[1])["value"]
               for m in messages if m["role"] == "assistant"]
    hints = [json.loads(m["content"]).get("text") for m in messages if m["role"] == "user"][1:]
    return text_reply(body["model"],
                      'my next action: {"operation": "guess", "value": %d}' % _bisect(guesses, hints))


def without_tools(model):
    """``model`` behind an endpoint that refuses every tools= request."""
    def respond(request) -> Reply:
        if "tools" in (request.body or {}):
            return Reply(status=400, raw_body=json.dumps(TOOLS_REFUSED).encode())
        return model(request)
    return respond
