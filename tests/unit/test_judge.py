"""camg.grading.judge against a local server speaking the real OpenAI protocols."""

from __future__ import annotations

import base64
import logging

import pytest

from camg.episodes import cost
from camg.errors import ConfigError, FailureClass, JudgeError
from camg.grading.judge import Image, Judge, JudgeConfig, parse_score, prompt_hash, retry_after_s
from tests.support.fake_judge import FakeJudge, Reply
from tools.judge_stub import count_usage

KEY = "sk-test-SECRET-0123456789"


@pytest.fixture
def fake():
    with FakeJudge() as server:
        yield server


def make(fake, api="chat", **kw) -> Judge:
    env = {"GA_JUDGE_URL": fake.url, "GA_JUDGE_MODEL": "judge-m", "GA_JUDGE_KEY": KEY,
           "GA_JUDGE_API": api}
    kw.setdefault("timeout_s", 5)
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return Judge(JudgeConfig.from_env("GA_JUDGE", env, **kw))


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_verdict_through_both_apis(fake, api):
    fake.script(Reply(text='Reasoning... {"score": 0.75}'))
    verdict = make(fake, api).ask("grade this", system="you are a grader")
    assert verdict.score == 0.75
    assert verdict.raw == 'Reasoning... {"score": 0.75}'
    assert verdict.model == "judge-m" and verdict.api == api
    assert verdict.host == f"127.0.0.1:{fake.port}"
    assert verdict.attempts == 1
    assert verdict.prompt_hash == prompt_hash(api, "you are a grader", "grade this", ())
    request = fake.requests[0]
    assert request.path == ("/v1/chat/completions" if api == "chat" else "/v1/responses")
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["model"] == "judge-m"
    if api == "chat":
        assert request.body["messages"][0] == {"role": "system", "content": "you are a grader"}
    else:
        assert request.body["instructions"] == "you are a grader"
    record = verdict.record()
    assert record["judge_score"] == 0.75 and KEY not in repr(record)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_image_content_parts(fake, api):
    png = b"\x89PNG\r\n\x1a\nfake"
    make(fake, api).ask("look", images=[Image(png)])
    body = fake.requests[0].body
    parts = body["messages"][-1]["content"] if api == "chat" else body["input"][0]["content"]
    # Upstream's webdev judge: the image part first, then the text.
    url = parts[0]["image_url"]["url"] if api == "chat" else parts[0]["image_url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == png
    assert parts[1]["text"] == "look" and len(parts) == 2


def test_retries_a_500_then_succeeds(fake):
    fake.script(Reply(status=500), Reply(status=503), Reply(text='{"score": 0}'))
    verdict = make(fake).ask("q")
    assert verdict.score == 0.0 and verdict.attempts == 3 and len(fake.requests) == 3


@pytest.mark.parametrize("reply,reason", [
    (Reply(status=500), "http_500"),
    (Reply(text="I think it is quite good."), "unparseable"),
    (Reply(text='{"score": 7}'), "unparseable"),
    (Reply(raw_body=b"<html>gateway</html>"), "protocol"),
    (Reply(drop=True), "connection"),
])
def test_persistent_failures_raise_judge_error(fake, reply, reason, caplog):
    fake.default = reply
    caplog.set_level(logging.DEBUG)
    with pytest.raises(JudgeError) as info:
        make(fake, attempts=3).ask("q")
    err = info.value
    assert err.failure_class is FailureClass.JUDGE_ERROR
    assert err.details["reason"] == reason and err.details["attempts"] == 3
    assert len(fake.requests) == 3
    assert KEY not in str(err.to_dict()) and KEY not in caplog.text


def test_timeout_is_bounded(fake):
    fake.default = Reply(delay=2.0)
    judge = make(fake, timeout_s=0.3, attempts=2)
    with pytest.raises(JudgeError) as info:
        judge.ask("q")
    assert info.value.details["reason"] == "timeout"


def test_deadline_bounds_retries(fake):
    import time
    fake.default = Reply(delay=1.5)
    started = time.monotonic()
    with pytest.raises(JudgeError):
        make(fake, timeout_s=5, attempts=10).ask("q", deadline_s=0.8)
    assert time.monotonic() - started < 3


def test_auth_error_is_not_retried(fake):
    fake.default = Reply(status=401, error_type="invalid_api_key")
    with pytest.raises(JudgeError) as info:
        make(fake).ask("q")
    assert info.value.details["reason"] == "http_401"
    assert len(fake.requests) == 1


def test_backoff_grows_and_is_bounded(fake):
    fake.default = Reply(status=502)
    sleeps = []
    cfg = JudgeConfig.from_env("GA_JUDGE", {"GA_JUDGE_URL": fake.url, "GA_JUDGE_MODEL": "m",
                                            "GA_JUDGE_KEY": KEY},
                               attempts=5, backoff_s=1.0, backoff_max_s=3.0)
    with pytest.raises(JudgeError):
        Judge(cfg, sleep=sleeps.append).ask("q")
    assert len(sleeps) == 4
    assert 0.5 <= sleeps[0] <= 1.5 and all(s <= 4.5 for s in sleeps)


def test_config_from_env_and_secrecy():
    with pytest.raises(ConfigError) as info:
        JudgeConfig.from_env("WD_JUDGE", {"WD_JUDGE_URL": "http://x/v1"})
    assert "WD_JUDGE_MODEL" in str(info.value) and "WD_JUDGE_KEY" in str(info.value)
    cfg = JudgeConfig.from_env("WD_JUDGE", {"WD_JUDGE_URL": "https://h.example:8443/api/",
                                            "WD_JUDGE_MODEL": "openai/gpt-x",
                                            "WD_JUDGE_KEY": KEY},
                               ensure_v1=True, strip_openai_prefix=True)
    assert cfg.url == "https://h.example:8443/api/v1" and cfg.model == "gpt-x"
    assert cfg.host == "h.example:8443"
    assert KEY not in repr(cfg) and KEY not in str(cfg.describe())
    with pytest.raises(ConfigError):
        JudgeConfig.from_env("GA_JUDGE", {"GA_JUDGE_URL": "http://x", "GA_JUDGE_MODEL": "m",
                                          "GA_JUDGE_KEY": "k", "GA_JUDGE_API": "grpc"})
    with pytest.raises(ConfigError):
        JudgeConfig(url="file:///etc", model="m", key="k")


@pytest.mark.parametrize("text,score", [
    ('{"score": 1}', 1.0), ('blah {"reward": 0.5} end', 0.5), ("Score: 0.25", 0.25),
    ('{"a": {"b": 1}} {"score": 0}', 0.0),
])
def test_parse_score(text, score):
    assert parse_score(text) == score


@pytest.mark.parametrize("text", ["", "great work", '{"score": "high"}', '{"score": true}',
                                  '{"score": -0.1}'])
def test_parse_score_refuses(text):
    with pytest.raises(ValueError):
        parse_score(text)


def test_custom_parser_failure_uses_attempts(fake):
    fake.default = Reply(text="PASS")
    calls = []

    def parser(text):
        calls.append(text)
        if len(calls) < 2:
            raise ValueError("first try unreadable")
        return 1.0 if text == "PASS" else 0.0

    assert make(fake).ask("q", parse=parser).score == 1.0 and len(calls) == 2


@pytest.mark.parametrize("headers,at_least", [
    ({"Retry-After": "2"}, 2.0), ({"retry-after-ms": "1500"}, 1.5),
    ({"Retry-After": "120"}, 3.0),  # capped by backoff_max_s
])
def test_retry_after_is_honoured_and_bounded(fake, headers, at_least):
    fake.script(Reply(status=429, error_type="rate_limit_exceeded", headers=headers),
                Reply(status=503, headers=headers), Reply(text='{"score": 1}'))
    sleeps = []
    cfg = JudgeConfig.from_env("GA_JUDGE", {"GA_JUDGE_URL": fake.url, "GA_JUDGE_MODEL": "m",
                                            "GA_JUDGE_KEY": KEY},
                               attempts=4, backoff_s=0.01, backoff_max_s=3.0)
    verdict = Judge(cfg, sleep=sleeps.append).ask("q")
    assert verdict.attempts == 3 and len(sleeps) == 2
    assert all(at_least <= s <= 3.0 for s in sleeps), sleeps


def test_retry_after_never_outlives_the_deadline(fake):
    fake.default = Reply(status=429, headers={"Retry-After": "30"})
    sleeps = []
    cfg = JudgeConfig.from_env("GA_JUDGE", {"GA_JUDGE_URL": fake.url, "GA_JUDGE_MODEL": "m",
                                            "GA_JUDGE_KEY": KEY}, attempts=3, backoff_s=0.01)
    with pytest.raises(JudgeError) as info:
        Judge(cfg, sleep=sleeps.append).ask("q", deadline_s=5)
    assert info.value.details["reason"] == "http_429"
    assert sleeps and all(s <= 5 for s in sleeps)


def test_retry_after_header_forms():
    class Response:
        def __init__(self, headers):
            self.headers = headers
    assert retry_after_s(Response({"retry-after": "7"})) == 7.0
    assert retry_after_s(Response({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert retry_after_s(Response({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}),
                         now=lambda: 1445412500.0) == 10.0
    assert retry_after_s(Response({"retry-after": "soon"})) is None
    assert retry_after_s(Response({})) is None and retry_after_s(None) is None


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_tokens_as_the_judge_reported_them_summed_over_attempts(fake, api):
    # An unparseable answer was paid for too: its tokens count.
    fake.script(Reply(text="no verdict here", usage={"prompt_tokens": 40, "completion_tokens": 3,
                                                    "total_tokens": 43}),
                Reply(text='{"score": 1}'))
    verdict = make(fake, api, attempts=2).ask("grade this")
    counted = count_usage(fake.requests[1].body, '{"score": 1}')
    assert verdict.attempts == 2
    assert verdict.usage == {"prompt_tokens": 40 + counted["prompt_tokens"],
                             "completion_tokens": 3 + counted["completion_tokens"],
                             "total_tokens": 43 + counted["total_tokens"]}
    assert verdict.record()["judge_tokens"] == verdict.usage
    assert cost.judge_tokens([verdict.record()["judge_tokens"]] * 2) == {
        "judge_tokens": {k: 2 * v for k, v in verdict.usage.items()}}


def test_a_judge_that_reports_no_usage_records_no_count(fake):
    fake.script(Reply(text='{"score": 1}', usage=False))
    verdict = make(fake).ask("grade this")
    assert verdict.usage is None and "judge_tokens" not in verdict.record()
    assert cost.judge_tokens([verdict.record().get("judge_tokens")]) == {}
