"""Fuzz the HTTP API from its schema: no input may produce a 500, lose an
episode's state or crash the service."""

import asyncio
import http.client
import json

import websockets
from hypothesis import HealthCheck, given, settings, strategies as st

from camg.web import http_wire as wire
from camg_client import Client, ServiceError
from devtools.harness.auth import headers as auth_headers

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12),
                                                                      children, max_size=4),
    max_leaves=12)

# Actions shaped like the schema, with wrong values mixed in.
actions = st.fixed_dictionaries(
    {"operation": st.sampled_from(["guess", "finish", "fly", "", 3, None])},
    optional={"value": st.integers(-5, 200) | st.text(max_size=3) | st.none(),
              "seconds": st.floats(0, 0.01) | st.text(max_size=3),
              "extra": json_values})

step_bodies = st.fixed_dictionaries({"action": actions | json_values},
                                    optional={"request_id": st.text(max_size=300) | st.integers(),
                                              "junk": json_values})
create_bodies = st.fixed_dictionaries(
    {}, optional={"task_id": st.sampled_from(["task-00", "nope"]) | st.text(max_size=5) | st.integers(),
                  "seed": st.integers(-3, 2**64) | st.text(max_size=3),
                  "episode_id": st.text(max_size=140),
                  "x": json_values})

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _post(client, path, body):
    try:
        return client.request("POST", path, body)
    except ServiceError as exc:
        assert 400 <= exc.status < 500, (path, body, exc.body)
        assert isinstance(exc.body, dict) and exc.body["error"] and exc.body["message"]
        return exc.status, exc.body


@SETTINGS
@given(body=step_bodies)
def test_fuzz_steps(shared_counter_service, body):
    client = Client(shared_counter_service.url)
    eid = client.create()["episode_id"]
    before = client.get(eid)["step_count"]
    status, reply = _post(client, f"/episodes/{eid}/step", body)
    if status >= 400:
        assert client.get(eid)["step_count"] == before  # a refused step changes nothing
    else:
        assert reply.get("failure_class") in (None,), reply
    client.close(eid)


@SETTINGS
@given(body=create_bodies)
def test_fuzz_creates(shared_counter_service, body):
    client = Client(shared_counter_service.url)
    status, reply = _post(client, "/episodes", body)
    if status == 201:
        client.close(reply["episode_id"])


@SETTINGS
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzz_raw_bodies(shared_counter_service, raw):
    client = Client(shared_counter_service.url)
    for path in ("/episodes", "/reset", "/episodes/none/step", "/step"):
        conn_status = None
        # Raw bytes the Client would never send, so through http.client.
        conn = http.client.HTTPConnection(client.host, client.port, timeout=30)
        try:
            conn.request("POST", path, body=raw,
                         headers={"Content-Type": "application/json", **auth_headers()})
            response = conn.getresponse()
            conn_status, data = response.status, response.read()
        finally:
            conn.close()
        assert conn_status < 500, (path, raw, data)
        if conn_status >= 400:
            assert json.loads(data)["error"]
        elif path in ("/episodes", "/reset"):
            # OpenEnv's ResetResponse has no episode_id: camg names it in a header
            eid = (json.loads(data)["episode_id"] if path == "/episodes"
                   else response.getheader("X-Camg-Episode-Id"))
            client.close(eid)
    assert client.health()["status"] == "healthy"


# -- bounds: nesting ----------------------------------------------------------
# 2 KB of brackets: what answered 500 (a RecursionError) on every service
# before the depth bound (camg.web.http_wire.MAX_JSON_DEPTH).
DEEP = 990


def _nested(depth: int, leaf: object = 1) -> object:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def _raw_post(url: str, path: str, raw: bytes, headers: dict | None = None):
    client = Client(url)
    conn = http.client.HTTPConnection(client.host, client.port, timeout=30)
    try:
        conn.request("POST", path, body=raw,
                     headers={"Content-Type": "application/json", **auth_headers(),
                              **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(wire.MAX_JSON_DEPTH + 1, 4000), opener=st.sampled_from("[{"),
       where=st.sampled_from(["action", "top", "junk"]))
def test_fuzz_deep_nesting_is_a_400_on_every_json_route(shared_counter_service, depth, opener,
                                                        where):
    url = shared_counter_service.url
    client = Client(url)
    eid = client.create()["episode_id"]
    deep = (b"[" * depth + b"]" * depth) if opener == "[" else \
        (b'{"a":' * depth + b"1" + b"}" * depth)
    body = {"action": b'{"action":%s}' % deep, "top": deep,
            "junk": b'{"action":{"operation":"guess","value":1},"junk":%s}' % deep}[where]
    # the plain step route (ahead of falcon), falcon's form of it (a trailing
    # slash), every other route that parses a JSON body, OpenEnv's HTTP routes
    # and its Task API
    for path in (f"/episodes/{eid}/step", f"/episodes/{eid}/step/", "/episodes",
                 f"/episodes/{eid}/fork", f"/episodes/{eid}/regrade", "/reset", "/step",
                 "/counter/tasks"):
        status, data = _raw_post(url, path, body)
        reply = json.loads(data)
        if path == "/counter/tasks" and len(body) > 4096:  # the Task API's own body bound
            assert status == 413 and reply["error"] == "payload_too_large", reply
            continue
        assert status == 400, (path, depth, data[:200])
        assert reply["error"] == "bad_request" and "nests deeper" in reply["message"], reply
    assert client.get(eid)["step_count"] == 0  # a refused step changes nothing
    client.close(eid)
    assert client.health()["status"] == "healthy"


def test_nesting_within_the_bound_and_brackets_in_strings_are_parsed(shared_counter_service):
    client = Client(shared_counter_service.url)
    eid = client.create()["episode_id"]
    # the action itself nests to the bound (the body's own level is the first)
    deep_ok = {"action": {"operation": "guess", "value": 3,
                          "extra": _nested(wire.MAX_JSON_DEPTH - 3)}}
    brackets = {"action": {"operation": "guess", "value": 3}, "request_id": "[{" * 100}
    for body in (deep_ok, brackets):
        status, data = _raw_post(shared_counter_service.url, f"/episodes/{eid}/step",
                                 json.dumps(body).encode())
        assert "nests deeper" not in data.decode(), (status, data[:200])
    client.close(eid)


def test_deep_nesting_on_mcp_and_websocket(shared_counter_service):
    url = shared_counter_service.url
    # written out: json.dumps itself recurses once per level
    nested = "[" * DEEP + "]" * DEEP
    deep = ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"guess",'
            '"arguments":{"x":%s}}}' % nested).encode()
    for headers in ({}, {"Mcp-Session-Id": "nope"}):
        status, data = _raw_post(url, "/mcp", deep,
                                 {"Accept": "application/json, text/event-stream", **headers})
        assert status == 400, data[:200]
        reply = json.loads(data)
        assert reply["error"]["code"] == -32600 and "nests deeper" in reply["error"]["message"]

    async def over_ws():
        async with websockets.connect(url.replace("http", "ws") + "/ws", max_size=None,
                                      additional_headers=auth_headers()) as ws:
            for message in ('{"type":"step","data":{"x":%s}}' % nested,
                            '{"type":"mcp","data":{"jsonrpc":"2.0","id":1,'
                            '"method":"tools/list","params":{"x":%s}}}' % nested):
                await ws.send(message)
                reply = json.loads(await ws.recv())
                assert reply["type"] == "error", reply
                assert reply["data"]["code"] == "VALIDATION_ERROR", reply
                assert "nests deeper" in reply["data"]["message"]
            # the connection still serves
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(await ws.recv())["type"] == "observation"
    asyncio.run(over_ws())
    assert Client(url).health()["status"] == "healthy"


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=400, deadline=None, derandomize=True)
@given(value=st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\\n ab', max_size=12),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(alphabet='[{"\\', max_size=4), children, max_size=3),
    max_leaves=20), limit=st.integers(0, 6), ascii_only=st.booleans())
def test_fuzz_the_depth_bound_is_exactly_the_nesting(value, limit, ascii_only):
    # brackets, quotes and backslashes inside strings (escaped or not) are text
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert wire.json_too_deep(text.encode(), limit) == (_depth(value) > limit), text
    assert wire.json_too_deep(text, limit) == (_depth(value) > limit), text
