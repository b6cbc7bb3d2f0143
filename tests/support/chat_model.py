"""A scripted chat model behind the OpenAI chat-completions protocol, streamed
or not, for the framework adapters' tests: the framework's own loop calls it
as it would call vLLM, and a policy (a function of the request's messages)
writes each reply. tools/judge_stub.py answers whole bodies only; verifiers'
chat harness asks for ``stream: true`` (server-sent events).

The policies play camg episodes through the text protocol
(camg_client/adapters/text_protocol.py): ``oracle`` answers the service's
reference action for its one running episode (the deployment enables
references; one episode at a time), ``noop`` the rollout CLI's no-op
action, ``crash`` the counter's infrastructure failure.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from camg_client import Client
from camg_client.rollout import Noop

Policy = Callable[[list[dict]], str]


class ScriptedModel:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedModel":
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         name="scripted-model", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _chunk(ident: str, model: str, delta: dict, finish: str | None) -> dict:
    return {"id": ident, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                         "logprobs": None}]}


def _handler(owner: ScriptedModel):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            owner.requests.append(body)
            if not self.path.endswith("/chat/completions"):
                return self._send(404, "application/json",
                                  json.dumps({"error": {"message": f"no route {self.path}"}}))
            text = owner.policy(body["messages"])
            ident, model = "chatcmpl-" + uuid.uuid4().hex[:24], body.get("model", "scripted")
            usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
            if not body.get("stream"):
                return self._send(200, "application/json", json.dumps({
                    "id": ident, "object": "chat.completion", "created": int(time.time()),
                    "model": model, "usage": usage, "choices": [{
                        "index": 0, "finish_reason": "stop", "logprobs": None,
                        "message": {"role": "assistant", "content": text}}]}))
            events = [_chunk(ident, model, {"role": "assistant", "content": ""}, None),
                      _chunk(ident, model, {"content": text}, None),
                      _chunk(ident, model, {}, "stop")]
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append({**_chunk(ident, model, {}, None), "choices": [], "usage": usage})
            self._send(200, "text/event-stream", "".join(
                f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")

        def _send(self, status: int, kind: str, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def oracle(url: str) -> Policy:
    """The service's reference action for its one running episode."""
    client = Client(url)

    def act(messages: list[dict]) -> str:
        (episode,) = [e for e in client.list()["episodes"] if e["status"] == "running"]
        return "my next action: " + json.dumps(client.reference(episode["episode_id"])["action"])
    return act


def noop(url: str) -> Policy:
    action = Noop(Client(url).schema()["action"]).action
    return lambda messages: json.dumps(action)


def crash(messages: list[dict]) -> str:
    return json.dumps({"operation": "crash"})


def stall(messages: list[dict]) -> str:
    """A model that never acts (no JSON in its replies): it must not escape
    its grade by running out the framework's turns."""
    return "I would rather not say."


def per_task(url: str, policies: dict[str, Policy]) -> Policy:
    """``policies[task_id]`` for the service's one running episode, so one
    framework run can play an oracle, a no-op and a failure in turn."""
    client = Client(url)

    def act(messages: list[dict]) -> str:
        (episode,) = [e for e in client.list()["episodes"] if e["status"] == "running"]
        return policies[episode["task_id"]](messages)
    return act
