"""bench.schedule alternating: the servers of a round take turns request by request within each window slot
(eagle3/bench/alternate.py). On the toy engine (tests/engines/toy_engine.py, real processes started by the
pack, with streaming and spec counters) end to end through the phase, and the pack's streamed, timed request
on the shared real vLLM CPU server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from eagle3.bench import alternate
from eagle3 import engine_registry
from eagle3.openai_client import OpenAIClient, TimedChat
from eagle3.phase_runner import run_phase, supervisor
from tests.conftest import write_tiny_config

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "eagle3-tiny"
TOY = {"toy": "tests.engines.toy_engine:ENGINE"}
K, MAX_TOKENS, PROMPTS = 3, 12, 4


def test_turns_rotate_the_first_server():
    assert [alternate.turn_order(3, t) for t in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert alternate.turn_order(1, 5) == [0]


def test_a_servers_share_of_a_slot_is_a_window_in_the_load_generators_vocabulary(tmp_path):
    requests = [TimedChat(10, 5, 20.0, 110.0, 1.0, 10), TimedChat(10, 5, 30.0, 120.0, 2.0, 10),
                TimedChat(1, 5, 40.0, 40.0, 3.0, 1)]
    load = alternate.load_result(requests, 0.5, tmp_path / "w.json")
    assert (load.completed, load.failed, load.total_output_tokens, load.total_input_tokens) == (3, 0, 21, 15)
    assert load.output_throughput == 42.0 and load.duration_s == 0.5
    assert load.mean_tpot_ms == 10.0  # (110 - 20) / 9 and (120 - 30) / 9; a one-token answer has none
    assert load.mean_ttft_ms == 30.0 and load.median_ttft_ms == 30.0 and load.p99_ttft_ms == 40.0
    # the pieces after the first, as vLLM's load generator counts them: a one-token answer has none
    assert [r["chunks"] for r in load.requests] == [9, 9, 0]
    assert json.loads((tmp_path / "w.json").read_text())["requests"] == load.requests


def _toy_config(tmp_path: Path):
    server = {"extra_args": [], "startup_timeout_s": 60}
    return write_tiny_config(tmp_path, {
        "target": {"model": str(FIXTURES / "target")},
        "engines": {"toy": {"python": sys.executable}},
        "bench": {"engine": "toy", "drafter": str(FIXTURES / "drafter-trained"), "drafter_trained": True,
                  "num_speculative_tokens": [K], "concurrency": [1, 2], "num_prompts": PROMPTS, "warmup_prompts": 1,
                  "max_tokens": MAX_TOKENS, "server": server, "schedule": "alternating", "windows": 2,
                  "aa_twin": True}}, port_offsets=(0, 1, 2))


def test_the_alternating_schedule_sends_each_prompt_to_every_server_in_turn_and_pairs_the_slots(tmp_path):
    """Three toy servers (baseline, k=3, the baseline's twin) at once: in every slot each gets every prompt,
    request by request at concurrency 1 and two at a time at 2, the first server rotating from turn to turn
    and from slot to slot; each server's share of a slot is one window, checked against its own counters;
    the speedups are paired slot by slot, and every server is gone at the end."""
    with engine_registry.using(TOY):
        cfg = _toy_config(tmp_path)
        sup = supervisor(cfg)
        run_phase(cfg, "bench", sup)
        assert not sup.registry.entries(), "a toy server or client is still registered"
    results = json.loads((cfg.phase_dir("bench") / "results.json").read_text())
    assert results["schedule"] == "alternating"
    servers = results["servers"]
    assert [s["label"] for s in servers] == ["baseline", f"k={K}", "baseline (twin)"]
    steps = -(-MAX_TOKENS // (K + 1))
    for s in servers:
        assert [(w["slot"], w["concurrency"]) for w in s["windows"]] == [
            ("r1w1", 1), ("r1w1", 2), ("r1w2", 1), ("r1w2", 2)]
        for w in s["windows"]:
            load = w["load"]
            assert load["completed"] == PROMPTS and load["total_output_tokens"] == PROMPTS * MAX_TOKENS
            assert w["traffic_delta"]["requests"] == PROMPTS and w["attempt"] == 1
            assert Path(load["raw_file"]).is_file() and len(load["requests"]) == PROMPTS
            # the streamed chunks after the first: the toy sends one per step, k + 1 tokens each with the
            # drafter, one token each without
            assert {r["chunks"] for r in load["requests"]} == ({steps - 1} if s["k"] else {MAX_TOKENS - 1})
            if s["k"]:
                assert w["delta"]["drafts"] == PROMPTS * steps and w["acceptance"]["acceptance_length"] == K + 1

    def sent(slot: str, c: int) -> list[str]:
        reqs = [(r["started_at"], s["label"]) for s in servers for w in s["windows"]
                if (w["slot"], w["concurrency"]) == (slot, c) for r in w["load"]["requests"]]
        return [label for _, label in sorted(reqs)]

    b, k, t = "baseline", f"k={K}", "baseline (twin)"
    assert sent("r1w1", 1) == [b, k, t, k, t, b, t, b, k, b, k, t]
    assert sent("r1w1", 2) == [b, b, k, k, t, t, k, k, t, t, b, b]
    assert sent("r1w2", 1) == [k, t, b, t, b, k, b, k, t, k, t, b]  # the slot starts one server on
    [row] = [r for r in results["table"] if r["k"] == K and r["concurrency"] == 1]
    assert row["speedup_method"] == "paired over 2 window slots" and row["windows"] == 2
    report = (cfg.phase_dir("bench") / "report.md").read_text()
    assert "schedule alternating" in report
    # the pack's client keeps each request's chunks, whatever the engine's load generator records: the
    # watch's per-request acceptance interval has them
    acc = results["watch"]["figures"][f"k{K}-c1"]["acceptance_length"]
    assert acc["method"] == f"bootstrap over {2 * PROMPTS} requests (output tokens per streamed chunk)"


@pytest.mark.slow
@pytest.mark.engine
def test_a_timed_streamed_request_on_real_vllm(vllm_server):
    """The pack's streamed request against vLLM's CPU server: its token count from the usage chunk
    (ignore_eos: exactly max_tokens), the first token before the last. Only chunks with content count
    (not the role, finish or usage chunks); vLLM merges pieces its client has not yet read, so under
    load there may be fewer chunks than tokens, never more."""
    body = {"model": vllm_server.config.target.served_name, "messages": [{"role": "user", "content": "Count."}],
            "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}

    async def go() -> TimedChat:
        async with OpenAIClient(vllm_server.base_url, api_key=vllm_server.key) as client:
            return await client.chat_timed(body)

    r = asyncio.run(go())
    assert r.output_tokens == 8 and r.prompt_tokens > 0
    assert 0 < r.ttft_ms < r.latency_ms and r.tpot_ms > 0
    assert 1 <= r.chunks <= 8


def test_a_server_that_stops_sending_fails_the_slot_within_its_hang_timeout():
    """A stream that starts and then goes silent: the slot fails after hang_timeout_s of silence
    instead of waiting on the socket (the client's default read timeout is 10 minutes)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release = threading.Event()

    class Silent(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n')
            self.wfile.flush()
            release.wait(30)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    t0 = time.monotonic()
    try:
        with pytest.raises(asyncio.TimeoutError):
            asyncio.run(alternate.run_slot([url], None, [{"model": "m", "messages": []}], 1, hang_timeout_s=0.5))
        assert time.monotonic() - t0 < 10
    finally:
        release.set()
        server.shutdown()
        server.server_close()
