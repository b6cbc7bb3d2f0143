"""A scriptable local judge speaking the real OpenAI HTTP protocols.

``POST /v1/chat/completions`` answers a ``chat.completion`` object and
``POST /v1/responses`` a ``response`` object, byte-compatible with what the
``openai`` SDK parses. Errors use the API's ``{"error": {...}}`` body.

Behaviour is a script: a queue of ``Reply`` objects consumed one per request,
then ``default`` for every request after. A reply can be a verdict text, an
HTTP error status, a delay (for client timeouts), a body that is not JSON, or
a dropped connection. Every request is recorded (path, headers, JSON body) so
tests can check what the client sent, including its bearer key.

    with FakeJudge() as judge:
        judge.script(Reply(status=500), Reply(text='{"score": 1}'))
        url = judge.url            # http://127.0.0.1:<port>/v1

Also runnable standalone for manual checks and the demo:
``python -m tests.support.fake_judge --port 0 --text '{"score": 1}'``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclasses.dataclass
class Reply:
    text: str = '{"score": 1.0}'
    status: int = 200
    #: seconds to wait before answering
    delay: float = 0.0
    #: raw body instead of a protocol object (e.g. b"not json")
    raw_body: bytes | None = None
    #: close the connection without an answer
    drop: bool = False
    error_type: str = "server_error"


@dataclasses.dataclass
class Request:
    path: str
    headers: dict
    body: Any


class FakeJudge:
    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 default: Reply | None = None,
                 responder: Callable[[Request], Reply] | None = None) -> None:
        self.default = default or Reply()
        #: optional function deciding the reply from the request (after the script)
        self.responder = responder
        self._queue: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- control ---------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def next_reply(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            return self.responder(request)
        return self.default

    def start(self) -> "FakeJudge":
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="fake-judge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeJudge":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def chat_completion(model: str, text: str) -> dict:
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:24], "object": "chat.completion",
        "created": int(time.time()), "model": model, "system_fingerprint": None,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": text, "refusal": None}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def response_object(model: str, text: str) -> dict:
    return {
        "id": "resp_" + uuid.uuid4().hex[:24], "object": "response",
        "created_at": int(time.time()), "model": model, "status": "completed",
        "error": None, "incomplete_details": None, "instructions": None,
        "metadata": {}, "parallel_tool_calls": True, "temperature": 1.0,
        "tool_choice": "auto", "tools": [], "top_p": 1.0,
        "output": [{"type": "message", "id": "msg_" + uuid.uuid4().hex[:24],
                    "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def _handler(judge: FakeJudge):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet tests
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length)
            try:
                body = json.loads(data or b"null")
            except ValueError:
                body = None
            path = self.path.split("?")[0]
            request = Request(path=path, headers={k.lower(): v for k, v in self.headers.items()},
                              body=body)
            if path not in ("/v1/chat/completions", "/v1/responses"):
                return self._send(404, {"error": {"message": f"no route {path}",
                                                  "type": "invalid_request_error"}})
            reply = judge.next_reply(request)
            if reply.delay:
                time.sleep(reply.delay)
            if reply.drop:
                self.close_connection = True
                self.connection.close()
                return
            if reply.raw_body is not None:
                return self._send(reply.status, reply.raw_body)
            if reply.status != 200:
                return self._send(reply.status, {"error": {
                    "message": f"scripted failure {reply.status}", "type": reply.error_type,
                    "param": None, "code": None}})
            model = (body or {}).get("model", "fake-judge")
            make = chat_completion if path.endswith("chat/completions") else response_object
            self._send(200, make(model, reply.text))

        def _send(self, status: int, payload: Any) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--text", default='{"score": 1.0}')
    args = parser.parse_args()
    judge = FakeJudge(args.host, args.port, default=Reply(text=args.text)).start()
    print(judge.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        judge.stop()


if __name__ == "__main__":
    main()
