"""The suite's LLM-judge client: one OpenAI-compatible call, honestly failed.

General (GA_JUDGE_*) and Visual (WD_JUDGE_*) grade with a model that any
OpenAI-compatible endpoint serves. Both APIs upstream supports are spoken,
selected like upstream's ``GA_JUDGE_API``: ``chat`` (Chat Completions, what
vLLM and most gateways offer) and ``responses`` (the OpenAI Responses API).
Image content parts (a screenshot) are supported on both.

Rules this module keeps:

* Credentials come only from the process environment, under variable names
  the caller chooses (``JudgeConfig.from_env("GA_JUDGE")``). The key is
  never logged, never put in an error, a record or a ``repr``.
* Every failure -- transport, timeout, HTTP error, an answer without text,
  text the caller's parser cannot read -- raises ``camg.errors.JudgeError``
  (failure class ``judge_error``), so the episode's reward is null instead of
  a fake 0. Only "the judge answered and the work is poor" is a 0.
* Retries are bounded: ``attempts`` tries in all, with exponential backoff
  and jitter between them, and a parse failure uses up an attempt (as
  upstream's webdev judge does). A 429/5xx answer's ``Retry-After`` (or
  ``retry-after-ms``) is honoured: the wait is at least what the server
  asked, capped by ``backoff_max_s`` and the caller's deadline. Client
  errors that a retry cannot fix (400/401/403/404/422) fail at once. The
  SDK's own retries are off so the bound is ours.
* Image content parts come before the text, as upstream's webdev judge
  sends them (the screenshot first, then the rubric).

A verdict carries what an outcome record needs: raw text, parsed score,
model, URL host, API, a hash of the prompt, attempts and latency, and the
tokens the judge reported (its replies' ``usage``, summed over every
attempt that got an answer: an unparseable answer was paid for too).

An environment may pass its own prompt, parser and structured-output
schema to ``Judge.ask`` (General's rubric items:
environments/general/judge_prompt.py); the schema is sent as the
structured output format unless ``<prefix>_STRUCTURED=0``.
"""

from __future__ import annotations

import base64
import dataclasses
import email.utils
import json
import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from camg.config.hashing import sha256_bytes, sha256_json
from camg.errors import ConfigError, JudgeError

if TYPE_CHECKING:  # openai is imported only where a judge is used
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
    from openai.types.responses import Response, ResponseInputParam

log = logging.getLogger("camg.judge")

APIS = ("chat", "responses")
#: HTTP statuses a retry cannot fix: fail at once.
_FATAL_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 422})


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """Where and how to call the judge. ``key`` is excluded from repr/eq."""

    url: str
    model: str
    key: str = dataclasses.field(repr=False, compare=False)
    api: str = "chat"
    #: seconds for one HTTP call (connect + answer)
    timeout_s: float = 180.0
    #: tries in all, parse failures included
    attempts: int = 4
    #: first backoff; then doubles, each times a random factor in [0.5, 1.5]
    backoff_s: float = 2.0
    backoff_max_s: float = 60.0
    temperature: float | None = None
    max_tokens: int | None = None
    #: send a caller's reply schema as the structured output format
    structured: bool = True
    #: the environment-variable prefix it was read from (for messages only)
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "judge"
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{where}: URL must be an http(s) URL with a host")
        if not self.model.strip():
            raise ConfigError(f"{where}: model is empty")
        if not self.key:
            raise ConfigError(f"{where}: key is empty")
        if self.api not in APIS:
            raise ConfigError(f"{where}: API must be one of {', '.join(APIS)}, not {self.api!r}")
        if not 0 < self.timeout_s <= 3600:
            raise ConfigError(f"{where}: timeout_s must be in (0, 3600]")
        if not 1 <= self.attempts <= 10:
            raise ConfigError(f"{where}: attempts must be in [1, 10]")
        if not 0 <= self.backoff_s <= self.backoff_max_s <= 600:
            raise ConfigError(f"{where}: need 0 <= backoff_s <= backoff_max_s <= 600")

    @property
    def host(self) -> str:
        """The URL's host[:port]: what outcome records name, never the path."""
        parts = urlsplit(self.url)
        assert parts.hostname is not None  # __post_init__ refuses a URL without a host
        return parts.hostname + (f":{parts.port}" if parts.port else "")

    @classmethod
    def from_env(
        cls,
        prefix: str,
        environ: Mapping[str, str] | None = None,
        *,
        ensure_v1: bool = False,
        strip_openai_prefix: bool = False,
        **overrides: Any,
    ) -> JudgeConfig:
        """Read ``<prefix>_URL``, ``_MODEL``, ``_KEY`` and optional ``_API``.

        ``ensure_v1`` appends ``/v1`` to a URL whose path lacks it and
        ``strip_openai_prefix`` drops a leading ``openai/`` from the model
        (both what upstream's webdev client does). Missing variables raise
        ConfigError naming the variables, never their values.
        """
        env = os.environ if environ is None else environ
        names = {f: f"{prefix}_{f.upper()}" for f in ("url", "model", "key", "api")}
        missing = [
            names[f] for f in ("url", "model", "key") if not (env.get(names[f]) or "").strip()
        ]
        if missing:
            raise ConfigError(
                f"judge variables missing from the service environment: {', '.join(missing)}",
                missing=missing,
            )
        url = env[names["url"]].strip().rstrip("/")
        if ensure_v1 and not urlsplit(url).path.rstrip("/").endswith("/v1"):
            url += "/v1"
        model = env[names["model"]].strip()
        if strip_openai_prefix and model.startswith("openai/"):
            model = model[len("openai/") :]
        api = (env.get(names["api"]) or overrides.pop("api", "chat")).strip().lower()
        structured = (env.get(f"{prefix}_STRUCTURED") or "1").strip().lower()
        if structured not in ("0", "1", "true", "false", "yes", "no"):
            raise ConfigError(f"{prefix}_STRUCTURED must be 0 or 1")
        overrides.setdefault("structured", structured in ("1", "true", "yes"))
        return cls(url=url, model=model, key=env[names["key"]], api=api, source=prefix, **overrides)

    def describe(self) -> dict:
        """Safe facts for /metadata and logs: no key, no URL path."""
        return {
            "host": self.host,
            "model": self.model,
            "api": self.api,
            "timeout_s": self.timeout_s,
            "attempts": self.attempts,
            "structured": self.structured,
        }


@dataclasses.dataclass(frozen=True)
class Image:
    """One image content part."""

    data: bytes
    mime: str = "image/png"

    def data_url(self) -> str:
        return f"data:{self.mime};base64," + base64.b64encode(self.data).decode("ascii")


@dataclasses.dataclass(frozen=True)
class Verdict:
    raw: str
    score: float
    model: str
    host: str
    api: str
    prompt_hash: str
    attempts: int
    latency_s: float
    #: prompt/completion/total tokens as the judge reported them; None when
    #: no reply said (then the record has no count rather than a guessed one)
    usage: Mapping[str, int] | None = None

    def record(self) -> dict:
        """The judge fields of an outcome record."""
        out = {
            "judge_host": self.host,
            "judge_model": self.model,
            "judge_api": self.api,
            "judge_prompt_hash": self.prompt_hash,
            "judge_raw": self.raw,
            "judge_score": self.score,
            "judge_attempts": self.attempts,
            "judge_latency_s": round(self.latency_s, 3),
        }
        if self.usage:
            out["judge_tokens"] = dict(self.usage)  # summed by camg.episodes.cost.judge_tokens
        return out


def reported_usage(reply: Any) -> dict[str, int]:
    """A reply's ``usage`` in Chat Completions' names: the Responses API's
    input/output tokens are its prompt/completion tokens. Only counts the
    judge sent (non-negative integers); {} when it sent none."""
    usage = getattr(reply, "usage", None)
    if usage is None:
        return {}
    names = (
        ("prompt_tokens", "input_tokens"),
        ("completion_tokens", "output_tokens"),
        ("total_tokens", "total_tokens"),
    )
    out = {}
    for name, alias in names:
        value = getattr(usage, name, None)
        if value is None:
            value = getattr(usage, alias, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[name] = value
    return out


_SCORE_KEY = re.compile(r'"?\b(?:score|reward)\b"?\s*[:=]\s*(-?\d+(?:\.\d+)?)', re.I)


def parse_score(text: str) -> float:
    """Default parser: a JSON object with ``score`` (or ``reward``), else a
    ``score: x`` line; the value must lie in [0, 1]. Raises ValueError."""
    value: Any = None
    for candidate in _json_objects(text):
        if isinstance(candidate, dict):
            for key in ("score", "reward"):
                if key in candidate:
                    value = candidate[key]
    if value is None:
        found = _SCORE_KEY.findall(text)
        if found:
            value = float(found[-1])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("no numeric score in the judge's answer")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"score {value} outside [0, 1]")
    return float(value)


def _json_objects(text: str):
    decoder = json.JSONDecoder()
    index = text.find("{")
    while index != -1:
        try:
            obj, _ = decoder.raw_decode(text, index)
            yield obj
        except ValueError:
            pass
        index = text.find("{", index + 1)


def prompt_hash(api: str, system: str | None, prompt: str, images: Sequence[Image]) -> str:
    """Identifies the question asked, independent of judge model and host."""
    return sha256_json(
        {
            "api": api,
            "system": system,
            "prompt": prompt,
            "images": [sha256_bytes(i.data) for i in images],
        }
    )


class Judge:
    """A configured judge. Thread-safe: one SDK client, no per-call state."""

    #: ``observer(ok, seconds, attempts)`` after every request: the service's
    #: metrics (camg.metrics.observe_judge); None outside a service
    observer: Callable[[bool, float, int], None] | None = None

    def __init__(
        self,
        config: JudgeConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        import openai  # heavy import, only where a judge is used

        self.config = config
        self._openai = openai
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._client = openai.OpenAI(
            base_url=config.url, api_key=config.key, timeout=config.timeout_s, max_retries=0
        )

    def close(self) -> None:
        self._client.close()

    def ask(
        self,
        prompt: str,
        *,
        system: str | None = None,
        images: Sequence[Image] = (),
        parse: Callable[[str], float] = parse_score,
        deadline_s: float | None = None,
        schema: Mapping | None = None,
    ) -> Verdict:
        """Ask once (with bounded retries); return the parsed verdict.

        ``deadline_s`` bounds the whole call including retries and backoff.
        ``schema`` (a JSON schema of the reply) is sent as the structured
        output format when the config allows (the parser still checks).
        """
        cfg = self.config
        images = tuple(images)
        phash = prompt_hash(cfg.api, system, prompt, images)
        started = time.monotonic()
        last: tuple[str, str] = ("none", "no attempt made")
        usage: dict[str, int] = {}
        for attempt in range(1, cfg.attempts + 1):
            remaining = None if deadline_s is None else deadline_s - (time.monotonic() - started)
            if remaining is not None and remaining <= 0:
                last = ("deadline", "judge deadline exceeded")
                break
            try:
                raw = self._call(
                    prompt,
                    system,
                    images,
                    timeout=min(cfg.timeout_s, remaining) if remaining else cfg.timeout_s,
                    schema=schema if cfg.structured else None,
                    usage=usage,
                )
                score = parse(raw)
                verdict = Verdict(
                    raw=raw,
                    score=float(score),
                    model=cfg.model,
                    host=cfg.host,
                    api=cfg.api,
                    prompt_hash=phash,
                    attempts=attempt,
                    latency_s=time.monotonic() - started,
                    usage=usage or None,
                )
                self._observe(True, verdict.latency_s, attempt)
                return verdict
            except _Fatal as exc:
                last = (exc.reason, exc.message)
                break
            except _Retryable as exc:
                last = (exc.reason, exc.message)
                retry_after = exc.retry_after
            except (ValueError, TypeError) as exc:
                last = ("unparseable", f"judge answer not parseable: {self._scrub(str(exc))}")
                retry_after = None
            log.warning(
                "judge %s attempt %d/%d failed: %s", cfg.host, attempt, cfg.attempts, last[1]
            )
            if attempt < cfg.attempts:
                delay = min(cfg.backoff_max_s, cfg.backoff_s * 2 ** (attempt - 1))
                delay *= self._rng.uniform(0.5, 1.5)
                if retry_after is not None:  # the server said when: never sooner
                    delay = min(cfg.backoff_max_s, max(delay, retry_after))
                if deadline_s is not None:
                    delay = min(delay, max(0.0, deadline_s - (time.monotonic() - started)))
                self._sleep(delay)
        self._observe(False, time.monotonic() - started, attempt)
        raise JudgeError(
            f"judge failed ({last[0]}): {last[1]}",
            reason=last[0],
            host=cfg.host,
            model=cfg.model,
            api=cfg.api,
            prompt_hash=phash,
            attempts=attempt,
        )

    def _observe(self, ok: bool, seconds: float, attempts: int) -> None:
        if self.observer is not None:
            try:
                self.observer(ok, seconds, attempts)
            except Exception:  # a metric must never cost a verdict
                log.exception("the judge observer failed")

    # -- one HTTP call -------------------------------------------------------
    def _call(
        self,
        prompt: str,
        system: str | None,
        images: Sequence[Image],
        *,
        timeout: float,
        schema: Mapping | None = None,
        usage: dict[str, int] | None = None,
    ) -> str:
        """The reply's text; its reported tokens are added into ``usage``."""
        cfg, oa = self.config, self._openai
        extra: dict[str, Any] = {}
        if cfg.temperature is not None:
            extra["temperature"] = cfg.temperature
        if schema is not None:
            if cfg.api == "chat":
                extra["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "verdict", "strict": True, "schema": dict(schema)},
                }
            else:
                extra["text"] = {
                    "format": {
                        "type": "json_schema",
                        "name": "verdict",
                        "strict": True,
                        "schema": dict(schema),
                    }
                }
        reply: ChatCompletion | Response
        try:
            if cfg.api == "chat":
                if cfg.max_tokens is not None:
                    extra["max_tokens"] = cfg.max_tokens
                reply = self._client.chat.completions.create(
                    model=cfg.model,
                    messages=_chat_messages(system, prompt, images),
                    timeout=timeout,
                    **extra,
                )
                choices = getattr(reply, "choices", None) or []
                text = choices[0].message.content if choices else None
            else:
                if cfg.max_tokens is not None:
                    extra["max_output_tokens"] = cfg.max_tokens
                if system is not None:
                    extra["instructions"] = system
                reply = self._client.responses.create(
                    model=cfg.model,
                    input=_responses_input(prompt, images),
                    timeout=timeout,
                    **extra,
                )
                text = _responses_text(reply)
        except oa.APITimeoutError as exc:
            raise _Retryable("timeout", f"no answer within {timeout:.0f} s") from exc
        except oa.APIConnectionError as exc:
            raise _Retryable("connection", f"cannot reach {cfg.host}") from exc
        except oa.APIStatusError as exc:
            status = exc.status_code
            detail = f"HTTP {status} from {cfg.host}: {self._scrub(_short(exc.message))}"
            if status in _FATAL_STATUSES:
                raise _Fatal(f"http_{status}", detail) from exc
            raise _Retryable(
                f"http_{status}", detail, retry_after=retry_after_s(getattr(exc, "response", None))
            ) from exc
        except (oa.OpenAIError, ValueError) as exc:  # a body that is not the protocol
            raise _Retryable(
                "protocol", "malformed answer: " + self._scrub(_short(str(exc)))
            ) from exc
        if usage is not None:
            for name, value in reported_usage(reply).items():
                usage[name] = usage.get(name, 0) + value
        if not isinstance(text, str) or not text.strip():
            raise _Retryable("empty", "the judge's answer has no text")
        return text

    def _scrub(self, text: str) -> str:
        key = self.config.key
        return text.replace(key, "[redacted]") if key else text


class _Retryable(Exception):
    def __init__(self, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_after = reason, message, retry_after


def retry_after_s(response: Any, now: Callable[[], float] = time.time) -> float | None:
    """Seconds an HTTP answer asks the client to wait: ``retry-after-ms``
    (OpenAI's), else ``Retry-After`` as seconds or an HTTP date; None when
    absent or unreadable (then plain backoff applies)."""
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        value = headers.get("retry-after-ms")
        if value is not None:
            return max(0.0, float(value) / 1000.0)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - now())
    except (TypeError, ValueError, OverflowError):
        return None


class _Fatal(_Retryable):
    pass


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _chat_messages(
    system: str | None, prompt: str, images: Sequence[Image]
) -> list[ChatCompletionMessageParam]:
    messages: list[ChatCompletionMessageParam] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    if images:
        content: Any = [
            {"type": "image_url", "image_url": {"url": i.data_url()}} for i in images
        ] + [{"type": "text", "text": prompt}]
    else:
        content = prompt
    messages.append({"role": "user", "content": content})
    return messages


def _responses_input(prompt: str, images: Sequence[Image]) -> ResponseInputParam:
    content = [{"type": "input_image", "image_url": i.data_url()} for i in images] + [
        {"type": "input_text", "text": prompt}
    ]
    # The SDK's type requires an image's "detail"; the API defaults it, and
    # the request leaves it out.
    return cast("ResponseInputParam", [{"role": "user", "content": content}])


def _responses_text(reply: Any) -> str | None:
    text = getattr(reply, "output_text", None)
    if isinstance(text, str) and text:
        return text
    parts = []
    for item in getattr(reply, "output", None) or []:
        for part in getattr(item, "content", None) or []:
            if getattr(part, "type", None) == "output_text":
                parts.append(getattr(part, "text", "") or "")
    return "".join(parts) or None
