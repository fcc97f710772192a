"""A real vLLM CPU server on the tiny model: starts, answers, exposes metrics, and (in the shared
fixture's teardown) stops without leaving a process, a registry entry or a listener behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import re

import httpx
import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.engine]

SERVED = "tiny-llama"


def chat(server, content: str, max_tokens: int = 16) -> dict:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, headers=server.headers, json={
        "model": SERVED, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def metric_total(text: str, name: str) -> float:
    """Sum of a Prometheus counter over its label sets (one per engine)."""
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    assert values, f"{name} not on /metrics"
    return sum(values)


def test_server_tree_is_one_supervised_group(vllm_server):
    assert vllm_server.process.poll() is None
    assert vllm_server.config.target.served_name == SERVED
    # vLLM runs the API server and EngineCore (the tests' config keeps the worker inside it; by default a third
    # process); stopping the group must reach all of them.
    members = [p for p in vllm_server.group if not p.zombie]
    assert len(members) >= 2, f"expected the engine processes in the server's group, got {members}"
    assert vllm_server.process.entry.id in {e.id for e in vllm_server.supervisor.registry.entries()}
    rss = sum(psutil.Process(p.pid).memory_info().rss for p in members if psutil.pid_exists(p.pid))
    print(f"vLLM ready in {vllm_server.startup_s:.1f} s; group {[p.comm for p in members]}; RSS {rss / 2**30:.2f} GiB")


def test_its_start_is_recorded_with_the_steps_its_log_names(vllm_server):
    """One server_starts row per start, with where the time went as vLLM's own log says it (the CPU build
    logs its weight load and engine init; a GPU start adds model load, compile and graph capture)."""
    rows = [json.loads(line) for line in vllm_server.config.layout.server_starts.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["pid"] == vllm_server.process.pid and rows[0]["engine"] == "vllm"
    steps = rows[0]["steps"]
    assert {"weights_s", "engine_init_s"} <= set(steps), steps
    assert 0 < steps["weights_s"] < rows[0]["seconds"] and 0 < steps["engine_init_s"] < rows[0]["seconds"]
    # The imports and the engine core's spawn, from the log's timestamps (1 s resolution) and the launch time.
    assert {"api_imports_s", "engine_spawn_s"} <= set(steps), steps
    assert steps["api_imports_s"] + steps["engine_spawn_s"] + steps["engine_init_s"] <= rows[0]["seconds"] + 2


def test_it_compiles_into_the_directory_its_start_record_names(vllm_server):
    """The pack's compile cache (tests/engines/test_compile_cache.py for its keys): the server's own
    environment points vLLM's, Inductor's and Triton's caches at the private directory its row names."""
    row = json.loads(vllm_server.config.layout.server_starts.read_text().splitlines()[-1])
    where = Path(row["compile_cache"]["dir"])
    environ = psutil.Process(vllm_server.process.pid).environ()
    assert (environ["VLLM_CACHE_ROOT"], environ["TORCHINDUCTOR_CACHE_DIR"], environ["TRITON_CACHE_DIR"]) == (
        str(where / "vllm"), str(where / "inductor"), str(where / "triton"))
    assert where.is_dir() and stat.S_IMODE(where.stat().st_mode) == 0o700 and where.stat().st_uid == os.getuid()
    # vLLM's model-inspection answer went into the directory every key of this vLLM version shares: the next
    # start with other flags skips the subprocess that imports torch and vLLM again to inspect the class.
    shared = Path(row["compile_cache"]["shared"]) / "modelinfos"
    assert (where / "vllm" / "modelinfos").resolve() == shared.resolve()
    assert any(p.suffix == ".json" for p in shared.iterdir()), sorted(shared.iterdir())


def test_the_server_forks_its_engine_core_unless_the_config_says_otherwise(vllm_server, make_config):
    """docs/FACTS.md §14: `vllm serve` spawns its engine core (a new interpreter, imports again) unless
    VLLM_WORKER_MULTIPROC_METHOD is set; the pack sets fork, and a value in engines.vllm.env wins. (vLLM's
    CPU platform spawns whatever it says, so what fork saves is measured on the GPU.)"""
    from eagle3.engines.serving import server_environment

    assert psutil.Process(vllm_server.process.pid).environ()["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    cfg = make_config({"engines": {"vllm": {"env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}}}, check_files=False)
    assert server_environment(cfg, "vllm")["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_models_lists_the_served_name(vllm_server):
    assert httpx.get(f"{vllm_server.base_url}/v1/models", timeout=10).status_code == 401  # the key is demanded
    r = httpx.get(f"{vllm_server.base_url}/v1/models", timeout=10, headers=vllm_server.headers)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [SERVED]


def test_chat_completion_answers_deterministically(vllm_server):
    first = chat(vllm_server, "Explain a binary search in two sentences.")
    assert first["model"] == SERVED
    reply = first["choices"][0]["message"]["content"]
    assert isinstance(reply, str) and reply.strip(), f"empty reply: {first}"
    usage = first["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # Greedy decoding of a fixed model: the same prompt gives the same text.
    assert chat(vllm_server, "Explain a binary search in two sentences.")["choices"][0]["message"]["content"] == reply


def test_metrics_count_the_requests(vllm_server):
    before = metric_total(httpx.get(f"{vllm_server.base_url}/metrics", timeout=10).text, "vllm:prompt_tokens_total")
    usage = chat(vllm_server, "Explain a hash map in two sentences.", max_tokens=4)["usage"]
    r = httpx.get(f"{vllm_server.base_url}/metrics", timeout=10)
    assert r.status_code == 200
    after = metric_total(r.text, "vllm:prompt_tokens_total")
    assert after - before == usage["prompt_tokens"]
    # No speculative config on this server, so no spec-decode counters either.
    assert "vllm:spec_decode_num_drafts" not in r.text
