"""Retry policy of the pack's HTTP client, over real sockets.

vLLM cannot be made to answer 429 or 503 on demand, so a small scripted HTTP server on 127.0.0.1
plays those replies; the client code under test is the production path, unchanged. Its behaviour
against a real vLLM server is covered in tests/phases/test_datagen.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eagle3.openai_client import (EndpointConfigError, InvalidResponse, OpenAIClient, RequestRejected, RetriesExhausted, RetryPolicy, parse_chat)

CHAT_OK = {"model": "m", "choices": [{"message": {"role": "assistant", "content": "hi", "reasoning_content": "think"},
                                      "finish_reason": "stop", "token_ids": [5, 6]}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "prompt_token_ids": [1, 2, 3]}
FAST = RetryPolicy(max_retries=3, base_s=0.01, cap_s=0.05)


class Scripted:
    """Answers requests with the scripted (status, body, headers, delay) in order; the last repeats."""

    def __init__(self, script):
        self.script, self.seen = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("content-length", 0))
                outer.seen.append(json.loads(self.rfile.read(length) or b"null"))
                status, body, headers, delay = outer.script[min(len(outer.seen), len(outer.script)) - 1]
                time.sleep(delay)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()  # bytes: sent as they are
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def chat(url, **kw):
    async def go():
        async with OpenAIClient(url, **{"retry": FAST, **kw}) as client:
            return await client.chat({"model": "m", "messages": []}), client.retries
    return asyncio.run(go())


def test_transient_statuses_are_retried_then_succeed():
    script = [(503, {"error": "busy"}, {}, 0), (429, {}, {"Retry-After": "0"}, 0), (408, {}, {}, 0),
              (200, CHAT_OK, {}, 0)]
    with Scripted(script) as srv:
        result, retries = chat(srv.url)
    assert len(srv.seen) == 4 and retries == 3
    assert (result.content, result.reasoning, result.finish_reason) == ("hi", "think", "stop")
    assert result.prompt_token_ids == [1, 2, 3] and result.token_ids == [5, 6]
    assert (result.prompt_tokens, result.completion_tokens) == (3, 2)


@pytest.mark.parametrize("status", [400, 413, 422])
def test_request_errors_fail_fast(status):
    with Scripted([(status, {"error": "prompt too long"}, {}, 0)]) as srv:
        with pytest.raises(RequestRejected, match=f"HTTP {status}.*prompt too long") as err:
            chat(srv.url)
    assert len(srv.seen) == 1 and err.value.status == status and not err.value.retryable


@pytest.mark.parametrize("status,hint", [(401, "api_key"), (404, "served_name")])
def test_config_errors_fail_fast_with_a_hint(status, hint):
    with Scripted([(status, {}, {}, 0)]) as srv:
        with pytest.raises(EndpointConfigError, match=hint):
            chat(srv.url)
    assert len(srv.seen) == 1


def test_exhausted_http_retries_are_retryable():
    with Scripted([(502, {}, {}, 0)]) as srv:
        with pytest.raises(RetriesExhausted) as err:
            chat(srv.url)
    assert len(srv.seen) == FAST.max_retries + 1
    assert (err.value.kind, err.value.status, err.value.attempts, err.value.retryable) == ("http", 502, 4, True)


def test_connection_refused_is_a_connection_failure():
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(RetriesExhausted) as err:
            chat(url)
    assert err.value.kind == "connection" and err.value.retryable


def test_read_timeout_is_per_socket_and_retried():
    with Scripted([(200, CHAT_OK, {}, 1.0), (200, CHAT_OK, {}, 0)]) as srv:
        result, retries = chat(srv.url, read_timeout_s=0.3)
    assert retries == 1 and result.content == "hi"


def test_vllm_reasoning_field_preferred():
    data = {"choices": [{"message": {"content": None, "reasoning": "r1"}, "finish_reason": "length"}]}
    r = parse_chat(data)
    assert (r.content, r.reasoning, r.token_ids, r.completion_tokens) == ("", "r1", None, 0)


@pytest.mark.parametrize("status,error,retryable", [(401, EndpointConfigError, False), (400, RequestRejected, False),
                                                    (503, RetriesExhausted, True), (429, RetriesExhausted, True)])
def test_a_timed_streamed_request_is_never_retried_and_says_what_its_refusal_means(status, error, retryable):
    """The benchmark's streamed request (chat_timed): a wrong key or model stays a config error, a bad
    request a rejection, a busy or failing server a retryable one; one attempt each."""
    async def go():
        async with OpenAIClient(srv.url, retry=FAST) as client:
            return await client.chat_timed({"model": "m", "messages": []})

    with Scripted([(status, {"error": "no"}, {}, 0)]) as srv:
        with pytest.raises(error) as err:
            asyncio.run(go())
    assert len(srv.seen) == 1 and srv.seen[0]["stream"] is True and err.value.retryable is retryable


def _sse(*chunks) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


CONTENT = {"choices": [{"delta": {"content": "a"}}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


@pytest.mark.parametrize("bad,shown", [({"error": {"message": "engine dead", "code": 500}}, "engine dead"),
                                       ({"object": "error", "message": "engine dead"}, "engine dead"),
                                       (b"{not json", "not a JSON object"), (b"[1, 2]", "not a JSON object")])
def test_a_timed_stream_that_fails_mid_way_is_an_invalid_response_naming_what_came(bad, shown):
    """A server that fails after its 200 can only say so in the stream: an error chunk, or garbage, is
    a failed request that names what came, never a JSON traceback or a request counted as done."""
    async def go():
        async with OpenAIClient(srv.url, retry=FAST) as client:
            return await client.chat_timed({"model": "m", "messages": []})

    with Scripted([(200, _sse(CONTENT, bad, USAGE, b"[DONE]"), {"content-type": "text/event-stream"}, 0)]) as srv:
        with pytest.raises(InvalidResponse, match=shown):
            asyncio.run(go())
    assert len(srv.seen) == 1


ROLE = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}
FINISH = {"choices": [{"delta": {}, "finish_reason": "length"}]}


def test_a_timed_stream_counts_its_content_chunks_and_tokens_from_usage():
    """vLLM's stream shape: a role chunk with empty content first, a finish chunk, the usage chunk; only
    the chunks with content count."""
    async def go():
        async with OpenAIClient(srv.url, retry=FAST) as client:
            return await client.chat_timed({"model": "m", "messages": []})

    stream = _sse(ROLE, CONTENT, CONTENT, FINISH, USAGE, b"[DONE]")
    with Scripted([(200, stream, {"content-type": "text/event-stream"}, 0)]) as srv:
        timed = asyncio.run(go())
    assert (timed.output_tokens, timed.prompt_tokens, timed.chunks) == (2, 3, 2)
    assert 0 <= timed.ttft_ms <= timed.latency_ms
