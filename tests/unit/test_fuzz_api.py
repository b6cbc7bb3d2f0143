"""Fuzz the HTTP API from its schema: no input may produce a 500, lose an
episode's state or crash the service."""

import http.client
import json

from hypothesis import HealthCheck, given, settings, strategies as st

from camg_client import Client, ServiceError

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
            conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
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
