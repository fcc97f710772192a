"""SGLang adapter: the launch command follows SGLang's documented flags, and readiness needs both
/health 200 and the "fired up" log line. Readiness runs against a real HTTP server process (a
stand-in for sglang.launch_server, see fake_sglang/) started through start_server."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

from eagle3.process import procfs
from eagle3.config import EngineEnv, Server, Target
from eagle3.engines import sglang
from eagle3.engines.serving import api_key, start_server
from eagle3.errors import ServiceStartTimeout
from eagle3.process.services import LAUNCH_MARKER, Supervisor, state_dir_for

from tests.ports import free_port

FAKE = Path(__file__).parent / "fake_sglang"
SPEC_FLAGS = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/drafters/d1",
              "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} should appear once in {argv}"
    return argv[argv.index(name) + 1]


def test_serve_argv_has_documented_flags_and_passes_speculative_flags_through():
    target = Target(model=Path("/models/t"), served_name="tgt", dtype="bfloat16", max_model_len=2048,
                    tensor_parallel_size=2, trust_remote_code=True)
    server = Server(port=30000, extra_args=["--mem-fraction-static", "0.8"], api_key="s3cret")
    argv = sglang.ENGINE.serve_argv(EngineEnv(python=Path("/envs/sgl/bin/python")), target, server, SPEC_FLAGS)
    # The launcher runs `-m sglang.launch_server` and appends the key from the environment after exec.
    assert argv[:2] == ["/envs/sgl/bin/python", str(sglang.LAUNCHER)]
    assert flag(argv, "--model-path") == "/models/t"
    assert flag(argv, "--served-model-name") == "tgt"
    assert (flag(argv, "--host"), flag(argv, "--port")) == ("127.0.0.1", "30000")
    assert flag(argv, "--context-length") == "2048" and flag(argv, "--tp-size") == "2"
    assert flag(argv, "--dtype") == "bfloat16" and "--trust-remote-code" in argv
    assert "--api-key" not in argv and "s3cret" not in argv
    assert sglang.ENGINE.serve_env("s3cret") == {sglang.KEY_ENV: "s3cret"}
    # Phase flags pass through verbatim, in order, and the server's own extra args come last.
    assert argv[-len(SPEC_FLAGS) - 2:] == SPEC_FLAGS + ["--mem-fraction-static", "0.8"]
    # A command prefix (conda run ...) replaces the interpreter and still runs the module.
    prefixed = sglang.ENGINE.serve_argv(EngineEnv(command_prefix=["conda", "run", "-n", "sgl"]), target, Server(port=1))
    assert prefixed[:6] == ["conda", "run", "-n", "sgl", "python", str(sglang.LAUNCHER)]


def fake_config(make_config, health_after: float, ready_after: float, timeout_s: float = 20):
    cfg = make_config({
        "engines": {"sglang": {"python": sys.executable,
                               "env": {"PYTHONPATH": str(FAKE), "FAKE_SGLANG_HEALTH_AFTER": str(health_after),
                                       "FAKE_SGLANG_READY_AFTER": str(ready_after)}}},
        "datagen": {"engine": "sglang", "server": {"port": free_port(), "startup_timeout_s": timeout_s,
                                                   "extra_args": []}},  # the tiny config's are vLLM flags
    }, check_files=False)
    return cfg, Supervisor(state_dir_for(cfg.run_dir))


@pytest.mark.parametrize("health_after, ready_after", [(0.3, 2.0), (2.0, 0.3)],
                         ids=["log-line-last", "health-last"])
def test_ready_only_when_health_is_200_and_the_log_says_so(make_config, health_after, ready_after):
    cfg, sup = fake_config(make_config, health_after, ready_after)
    t0 = time.monotonic()
    proc = start_server(sup, cfg, "datagen", "sglang", cfg.datagen.server, extra_args=SPEC_FLAGS)
    waited = time.monotonic() - t0
    try:
        assert max(health_after, ready_after) <= waited < max(health_after, ready_after) + 5
        base = f"http://127.0.0.1:{cfg.datagen.server.port}"
        assert httpx.get(f"{base}/health", timeout=2).status_code == 200
        assert sglang.READY_LINE in proc.log_tail()
        # The run's own key: demanded, and on no command line any local user can read.
        key = api_key(cfg, cfg.datagen.server, "datagen.server")
        assert httpx.get(f"{base}/v1/models", timeout=2).status_code == 401
        assert httpx.get(f"{base}/v1/models", timeout=2, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert all(key not in " ".join(procfs.cmdline(p.pid)) for p in procfs.group_members(proc.entry.pgid))
        assert key not in proc.log_tail()
    finally:
        proc.stop()
    assert procfs.group_members(proc.entry.pgid) == []
    assert sup.registry.entries() == []
    assert not procfs.listening_ports({cfg.datagen.server.port})


def test_ready_line_of_an_earlier_launch_does_not_count(make_config):
    cfg, sup = fake_config(make_config, health_after=0.2, ready_after=-1, timeout_s=3)
    log = cfg.phase_dir("datagen") / "logs" / "sglang-server.log"  # where start_server logs
    log.parent.mkdir(parents=True)
    log.write_text(f"{LAUNCH_MARKER}earlier attempt\n[ts] {sglang.READY_LINE}\n")
    with pytest.raises(ServiceStartTimeout, match="fired up"):
        start_server(sup, cfg, "datagen", "sglang", cfg.datagen.server)
    # The timed-out server was torn down: nothing listens, nothing is registered.
    assert sup.registry.entries() == []
    assert not procfs.listening_ports({cfg.datagen.server.port})


@pytest.mark.parametrize("leader_first", [True, False], ids=["adapter", "group-sigterm"])
def test_stop_signals_the_leader_alone_so_sglang_shuts_down_as_designed(make_config, monkeypatch, leader_first):
    """The pack's datagen on real SGLang (H200, 2026-12-02) stopped its server with SIGTERM to the
    whole group: the detokenizer died first, and SGLang logged it as a crash, slept five seconds
    before crash diagnostics, then killed its tree. SIGTERM to the leader alone drains and ends in
    about 4 s there. The stand-in (FAKE_SGLANG_CHILDREN) reproduces both; the adapter must take the first."""
    monkeypatch.setattr(sglang.Sglang, "stop_leader_first", leader_first)
    cfg, sup = fake_config(make_config, 0.0, 0.0)
    cfg.engines.sglang.env["FAKE_SGLANG_CHILDREN"] = "1"
    proc = start_server(sup, cfg, "datagen", "sglang", cfg.datagen.server)
    members = procfs.group_members(proc.entry.pgid)
    assert len(members) == 2, members  # the leader and its "detokenizer"
    outcome = proc.stop()
    assert outcome.clean and procfs.group_members(proc.entry.pgid) == [] and sup.registry.entries() == []
    log = proc.log_tail()
    if leader_first:
        assert outcome.seconds < 3 and "crashed" not in log and "Draining requests" in log
    else:  # what the pack did before: a crash in the log, five seconds more
        assert outcome.seconds >= 5 and "crashed with exit code -15" in log


def test_benchmark_windows_are_measured_by_sglang_s_own_counters(make_config, tmp_path):
    """SGLang's /server_info acceptance is an average since the server started, warm-up and earlier
    windows included. The adapter starts SGLang with --enable-metrics (the stand-in serves /metrics
    only then), and a window's acceptance is the difference of its counters (engines/metrics.py)."""
    from eagle3.bench.measure import _snapshot
    from eagle3.engines.loadgen import LoadSpec
    from eagle3.engines.sglang import load_argv as sglang_argv
    from eagle3.engines.metrics import SpecCounters, Traffic, acceptance
    from eagle3.errors import ConfigError
    from tests.engines.test_metrics import SGLANG

    metrics = tmp_path / "metrics.txt"
    # Before: 2 requests finished (e.g. SGLang's own warm-up) without a verify step counted.
    metrics.write_text("\n".join(ln.replace(" 8.0", " 2.0").replace(" 512.0", " 20.0") for ln in SGLANG.splitlines()
                                 if "spec_verify" not in ln) + "\n")
    cfg = make_config({
        "engines": {"sglang": {"python": sys.executable,
                               "env": {"PYTHONPATH": str(FAKE), "FAKE_SGLANG_METRICS": str(metrics)}}},
        "bench": {"engine": "sglang", "server": {"port": free_port(), "extra_args": []}},
    }, check_files=False)
    proc = start_server(Supervisor(state_dir_for(cfg.run_dir)), cfg, "bench", "sglang", cfg.bench.server)
    try:
        url = f"http://127.0.0.1:{cfg.bench.server.port}"
        assert _snapshot(cfg, url, k=0)[0] is None  # a baseline server counts no verify step, and that is no error
        before, traffic_before = _snapshot(cfg, url, k=3)  # no verify step counted yet: zeros
        assert before == SpecCounters(accepted=20 - 2) and traffic_before.requests == 2
        with pytest.raises(ConfigError, match="no spec-decode counters"):  # still none after a window
            _snapshot(cfg, url, k=3, before=False)
        metrics.write_text(SGLANG)
        after, traffic_after = _snapshot(cfg, url, k=3, before=False)
        window = acceptance(after - before)
        # Only the window's 6 requests: 492 tokens = 6 prefill tokens + 160 bonus tokens + 326 accepted.
        assert window.acceptance_length == pytest.approx(1 + 326 / 160) and window.per_position == []
        assert traffic_after - traffic_before == Traffic(6, 0, 492)
    finally:
        proc.stop()
    # The load generator asks for usage in the stream: without it bench_serving counts max_tokens per
    # request, and a window of requests ending at EOS would not match the server's token counter.
    argv = sglang_argv(cfg.engines.sglang, LoadSpec(base_url=url, served_name="m", tokenizer=Path("/t"),
                                                    dataset=Path("/d"), num_prompts=1, concurrency=1,
                                                    max_tokens=8, temperature=0.0, ignore_eos=False,
                                                    result_file=Path("/r")))
    assert '"include_usage": true' in argv[argv.index("--extra-request-body") + 1]
