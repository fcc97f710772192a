"""The pack's one async client for OpenAI-compatible servers (vLLM, SGLang).

Retry policy: connection errors, timeouts and HTTP 408/409/425/429/5xx are transient and retried
with capped exponential backoff and jitter (a numeric Retry-After is honoured, within the cap).
401/403/404 mean the key, model name or URL is wrong, so every request would fail the same way:
they raise EndpointConfigError at once. Any other 4xx is a problem of this one request (prompt too
long, bad parameter): RequestRejected, never retried.

The transport is aiohttp, as in vLLM's own load generator: on the 2-core box, at concurrency 8, the
same requests through httpx got about half the output tok/s from the same server, with the client's
own CPU time under 2 % of the run (bench/datagen_client_split.py, bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp

from .errors import ConfigError, PipelineError, TransientError

RETRY_STATUSES = frozenset({408, 409, 425, 429})
CONFIG_STATUSES = frozenset({401, 403, 404})
BODY_SHOWN = 500


class RequestRejected(PipelineError):
    """The server refused this request for a reason that retrying cannot change."""

    def __init__(self, message: str, status: int, body: str = ""):
        super().__init__(message)
        self.status, self.body = status, body


class EndpointConfigError(ConfigError):
    """401/403/404: wrong API key, model name or URL; the message says which setting to check."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class RetriesExhausted(TransientError):
    """Transient failures outlasted the retry budget. `kind`: connection, timeout or http."""

    def __init__(self, message: str, kind: str, status: int | None, attempts: int):
        super().__init__(message)
        self.kind, self.status, self.attempts = kind, status, attempts


class InvalidResponse(PipelineError):
    """A 2xx reply that is not the JSON shape the endpoint promises."""


def _stream_chunk(url: str, line: bytes) -> dict:
    """One `data:` line of a streamed completion as its JSON object. A server that fails mid-stream
    still answered 200, so it says so in a chunk of its own (vLLM: {"error": {...}}, older builds
    {"object": "error", ...}): that, or a line that is not a JSON object, ends the request."""
    try:
        chunk = json.loads(line[5:])
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise InvalidResponse(f"POST {url} (streamed): a chunk that is not a JSON object: {line[:BODY_SHOWN]!r}")
    if chunk.get("error") or chunk.get("object") == "error":
        raise InvalidResponse(f"POST {url} (streamed): the server ended the stream with an error: "
                              f"{json.dumps(chunk)[:BODY_SHOWN]}")
    return chunk


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    base_s: float = 0.5
    cap_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        # Jitter keeps many workers that failed together from retrying in lockstep.
        backoff = min(self.cap_s, self.base_s * 2 ** attempt) * random.uniform(0.5, 1.0)
        return min(self.cap_s, max(backoff, retry_after or 0.0))


@dataclass
class ChatResult:
    content: str
    reasoning: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    prompt_token_ids: list[int] | None
    token_ids: list[int] | None
    model: str
    raw: dict = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class TimedChat:
    """One streamed chat completion as the benchmark counts it (vLLM's load generator's vocabulary)."""

    output_tokens: int
    prompt_tokens: int
    ttft_ms: float     # the first chunk with content
    latency_ms: float  # the stream's end
    started_at: float  # epoch seconds
    # Chunks with content. A speculative server sends each verify step's tokens in one; a server that
    # gets ahead of its client merges pending pieces too (vLLM's RequestOutputCollector), so this is
    # at most output_tokens, and one per token only while the client keeps up.
    chunks: int

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first; None for a one-token answer."""
        return (self.latency_ms - self.ttft_ms) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def parse_chat(data: object) -> ChatResult:
    """Pull what the pipeline needs out of a chat-completion reply (vLLM and SGLang field names)."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise InvalidResponse(f"reply has no choices[0].message: {json.dumps(data)[:BODY_SHOWN]}") from None
    usage = data.get("usage") or {}
    token_ids = choice.get("token_ids")
    return ChatResult(
        content=message.get("content") or "",
        # vLLM says `reasoning` (older builds and SGLang: `reasoning_content`)
        reasoning=message.get("reasoning") or message.get("reasoning_content") or "",
        finish_reason=choice.get("finish_reason") or "",
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or (len(token_ids) if token_ids else 0)),
        prompt_token_ids=data.get("prompt_token_ids"),
        token_ids=token_ids,
        model=data.get("model") or "",
        raw=data,
    )


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None  # absent, or an HTTP date: the backoff decides


def _rejected(what: str, status: int, text: str) -> PipelineError:
    """A refusal no retry changes: the key, model or URL (EndpointConfigError), else this request."""
    body = text[:BODY_SHOWN]
    if status in CONFIG_STATUSES:
        hint = {401: "check the server's api_key", 403: "check the api_key and server permissions",
                404: "check the model name (target.served_name) and the base URL (no /v1 suffix)"}[status]
        return EndpointConfigError(f"{what}: HTTP {status} ({hint}): {body}", status)
    return RequestRejected(f"{what}: HTTP {status}: {body}", status, body)


class OpenAIClient:
    """One connection pool to one server. `base_url` without /v1, e.g. http://127.0.0.1:8000.

    Timeouts are per socket operation (connect, each read, each write), not per request: a long
    generation that keeps the socket busy is fine, a server that stops answering is not."""

    def __init__(self, base_url: str, *, api_key: str | None = None, connect_timeout_s: float = 30.0,
                 read_timeout_s: float = 600.0, max_connections: int = 64, retry: RetryPolicy = RetryPolicy(),
                 on_retry: Callable[[int, str], None] | None = None):
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.on_retry = on_retry
        self.retries = 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
        self._max_connections = max_connections
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running event loop (aiohttp binds a session to its loop).
        if self._http is None:
            self._http = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout,
                                               connector=aiohttp.TCPConnector(limit=self._max_connections))
        return self._http

    async def __aenter__(self) -> "OpenAIClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def request_json(self, method: str, path: str, payload: dict | None = None) -> Any:
        url = f"{self.base_url}{path}"
        attempt = 0
        while True:
            retry_after = None
            try:
                async with self._session().request(method, url, json=payload) as response:
                    status, text, retry_after = response.status, await response.text(), _retry_after(response)
            except asyncio.TimeoutError as e:  # aiohttp's socket timeouts are TimeoutErrors
                kind, status, reason = "timeout", None, f"{type(e).__name__} on {method} {url}"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                kind, status, reason = "connection", None, f"{type(e).__name__} on {method} {url}: {e}"
            else:
                if status < 400:
                    try:
                        return json.loads(text)
                    except json.JSONDecodeError:
                        raise InvalidResponse(f"{method} {url}: HTTP {status} with a body that is not JSON: "
                                              f"{text[:BODY_SHOWN]!r}") from None
                body = text[:BODY_SHOWN]
                if status in CONFIG_STATUSES or (status not in RETRY_STATUSES and status < 500):
                    raise _rejected(f"{method} {url}", status, text)
                kind, reason = "http", f"HTTP {status} on {method} {url}: {body}"
            if attempt >= self.retry.max_retries:
                raise RetriesExhausted(f"gave up after {attempt + 1} attempts; last: {reason}", kind, status, attempt + 1)
            if self.on_retry:
                self.on_retry(attempt + 1, reason)
            self.retries += 1
            await asyncio.sleep(self.retry.delay(attempt, retry_after))
            attempt += 1

    async def list_models(self) -> list[dict]:
        data = await self.request_json("GET", "/v1/models")
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise InvalidResponse(f"GET {self.base_url}/v1/models: unexpected reply {json.dumps(data)[:BODY_SHOWN]}")
        return data["data"]

    async def chat(self, payload: dict) -> ChatResult:
        return parse_chat(await self.request_json("POST", "/v1/chat/completions", payload))

    async def chat_timed(self, payload: dict) -> TimedChat:
        """One chat completion, streamed and timed; its token count from the stream's usage chunk. Never
        retried: a benchmark request that fails is a failed measurement, not one to repeat unseen."""
        url = f"{self.base_url}/v1/chat/completions"
        body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
        started_at, t0 = time.time(), time.perf_counter()
        first = usage = None
        chunks = 0
        async with self._session().post(url, json=body) as response:
            if response.status >= 400:
                text = await response.text()
                if response.status in RETRY_STATUSES or response.status >= 500:  # the server's state, not the request
                    raise RetriesExhausted(f"POST {url} (streamed, not retried): HTTP {response.status}: "
                                           f"{text[:BODY_SHOWN]}", "http", response.status, 1)
                raise _rejected(f"POST {url} (streamed)", response.status, text)
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = _stream_chunk(url, line)
                usage = chunk.get("usage") or usage
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    chunks += 1
                    first = first or time.perf_counter()
        end = time.perf_counter()
        if not usage or not isinstance(usage.get("completion_tokens"), int):
            raise InvalidResponse(f"POST {url} (streamed): the stream ended without a usage chunk "
                                  "(stream_options.include_usage): the server cannot be timed this way")
        return TimedChat(usage["completion_tokens"], int(usage.get("prompt_tokens") or 0),
                         round(((first or end) - t0) * 1000, 3), round((end - t0) * 1000, 3), started_at, chunks)
