"""hidden_states.mode: the offline estimate, the free disk, and what `auto` chooses (no processes)."""

from __future__ import annotations

import hashlib
import json

import pytest

from eagle3.phases import hs_mode
from eagle3.errors import ConfigError
from eagle3.doctor import FAIL, PASS, check_disk
from eagle3.phases.extract_disk import HEADER_BYTES, exact_estimate
from eagle3.layout import RunLayout
from eagle3.prompts import TEMPLATE_TOKENS

GIB = 2**30


def gpu_cfg(make_config, **hs):
    return make_config({"gpus": [0, 1, 2, 3, 4, 5, 6, 7], "hidden_states": hs}, check_files=False)


def online_sets(**extra):
    return {"server_gpus": [0, 1, 2, 3], "train_gpus": [4, 5, 6, 7], **extra}


def test_plenty_of_disk_chooses_offline(make_config):
    cfg = gpu_cfg(make_config, **online_sets())
    d = hs_mode.decide(cfg, exact_estimate(rows=1000, tokens=10**6, per_token=1032), free=100 * GIB)
    assert d.mode == "offline" and d.requested == "auto" and "it fits" in d.reason
    assert d.offline_bytes == 10**6 * 1032 + 1000 * HEADER_BYTES


def test_too_little_disk_chooses_online_with_a_bounded_cache(make_config):
    cfg = gpu_cfg(make_config, **online_sets())
    est = exact_estimate(rows=50_000, tokens=50_000 * 8192, per_token=4 * 4096 * 2 + 8)  # ~13 TB
    largest = 8192 * (4 * 4096 * 2 + 8) + HEADER_BYTES  # a full 8K-token Llama-8B sample, ~268 MB
    d = hs_mode.decide(cfg, est, free=2 * 2**40, largest_sample_bytes=largest)
    assert d.mode == "online" and "offline does not fit" in d.reason
    # 4 trainer ranks x (train + val loader) x 12 workers, 4x slack
    assert d.cache_bound == 4 * (4 * 2 * 12) * largest
    assert d.cache_bound < d.usable_bytes


def test_the_margin_decides_near_the_edge(make_config):
    cfg = gpu_cfg(make_config, **online_sets(disk_margin=0.2))
    est = exact_estimate(rows=1, tokens=85 * 2**20, per_token=1024)  # 85 GiB + a header
    assert hs_mode.decide(cfg, est, free=100 * GIB).mode == "online"   # 85 GiB > 80 % of 100 GiB
    assert hs_mode.decide(cfg, est, free=110 * GIB).mode == "offline"  # 85 GiB <= 80 % of 110 GiB


def test_margin_boundary_exactly(make_config):
    cfg = gpu_cfg(make_config, **online_sets(disk_margin=0.2))
    est = exact_estimate(rows=0, tokens=80 * 2**20, per_token=1024)  # exactly 80 GiB
    assert hs_mode.decide(cfg, est, free=100 * GIB).mode == "offline"
    assert hs_mode.decide(cfg, est, free=100 * GIB - 8).mode == "online"


def test_too_little_of_both_fails_with_both_numbers(make_config):
    cfg = gpu_cfg(make_config)  # no GPU sets: online cannot run
    est = exact_estimate(rows=1000, tokens=10**9, per_token=1032)
    with pytest.raises(hs_mode.NoModeFits) as err:
        hs_mode.decide(cfg, est, free=500 * GIB)
    msg = str(err.value)
    assert isinstance(err.value, ConfigError)
    assert f"offline needs {est.bytes} bytes" in msg and f"{500 * GIB} bytes" in msg
    assert "hidden_states.server_gpus" in msg and "two GPU sets" in msg


def test_online_cache_that_does_not_fit_either_fails(make_config):
    cfg = gpu_cfg(make_config, **online_sets(cache_max_bytes=10 * GIB))
    with pytest.raises(hs_mode.NoModeFits, match="online cache bound"):
        hs_mode.decide(cfg, exact_estimate(rows=1, tokens=10**9, per_token=1032), free=5 * GIB)


def test_forced_modes(make_config):
    est_big = exact_estimate(rows=1, tokens=10**9, per_token=1032)
    off = hs_mode.decide(gpu_cfg(make_config, mode="offline"), est_big, free=GIB)
    assert off.mode == "offline" and off.reason.startswith("forced, though")
    on = hs_mode.decide(gpu_cfg(make_config, mode="online", **online_sets()), exact_estimate(1, 10, 1032), free=100 * GIB)
    assert on.mode == "online" and on.reason.startswith("forced")


def test_cpu_rehearsal_can_go_online_and_max_disk_bytes_caps_the_usable_space(make_config):
    cfg = make_config({"extract": {"max_disk_bytes": 10**9}}, check_files=False)
    d = hs_mode.decide(cfg, exact_estimate(rows=10, tokens=2 * 10**6, per_token=1032), free=100 * GIB)
    assert d.usable_bytes == 10**9 and d.mode == "online"


def test_loader_workers_follow_extra_args():
    assert hs_mode.loader_workers([]) == 12
    assert hs_mode.loader_workers(["--num-workers", "3"]) == 3
    assert hs_mode.loader_workers(["--num-workers=5", "--lr-x", "1"]) == 5


@pytest.mark.parametrize("hs, field, words", [
    ({"server_gpus": [0, 1], "train_gpus": [1, 2]}, "hidden_states.train_gpus", "also in hidden_states.server_gpus"),
    ({"server_gpus": [0, 9], "train_gpus": [1]}, "hidden_states.server_gpus", "not in 'gpus'"),
    ({"mode": "online"}, "hidden_states.mode", "two GPU sets"),
])
def test_gpu_sets_are_validated(make_config, hs, field, words):
    with pytest.raises(ConfigError) as err:
        make_config({"gpus": [0, 1, 2, 3], "hidden_states": hs}, check_files=False)
    assert field in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("extra_args, refused", [
    ([], "vLLM's default 90 %"),
    (["--gpu-memory-utilization", "0.9"], "leaves the trainer less than half"),
    (["--gpu-memory-utilization=abc"], "is not a number"),
    (["--gpu-memory-utilization", "0.2"], None),
    (["--gpu-memory-utilization=0.5"], None),
])
def test_one_gpu_is_shared_only_when_the_server_leaves_the_trainer_room(make_config, extra_args, refused):
    """Issue 22: online on a one-GPU machine. Refused before anything starts (exit 2 at validation),
    naming the flag that makes it fit, unless the extraction server's memory is capped."""
    raw = {"gpus": [0], "hidden_states": {"mode": "online", "server_gpus": [0], "train_gpus": [0]},
           "extract": {"server": {"port": 18999, "extra_args": extra_args}}}
    if refused is None:
        cfg = make_config(raw, check_files=False)
        assert cfg.hidden_states.server_gpus == cfg.hidden_states.train_gpus == [0]
        return
    with pytest.raises(ConfigError) as err:
        make_config(raw, check_files=False)
    msg = str(err.value)
    assert "hidden_states.train_gpus" in msg and refused in msg
    assert "add [--gpu-memory-utilization, '0.5'] (at most 0.5) to extract.server.extra_args" in msg


def test_default_hidden_states_leave_fingerprints_unchanged(make_config):
    plain = make_config(check_files=False)
    forced = make_config({"hidden_states": {"mode": "online"}}, check_files=False)
    assert plain.fingerprint("datagen") == forced.fingerprint("datagen")
    assert plain.fingerprint("extract") != forced.fingerprint("extract")
    assert plain.fingerprint("train") != forced.fingerprint("train")
    data = plain.model_dump(mode="json", exclude={"extract": {"server": {"allow_remote", "api_key_env",
                                                                           "api_key_secret_block"}}})
    target = {k: v for k, v in data["target"].items() if k != "data_parallel_size"}  # later, and in no fingerprint
    before = hashlib.sha256(json.dumps({"target": target, "extract": data["extract"]},
                                       sort_keys=True).encode()).hexdigest()[:16]
    assert plain.fingerprint("extract") == before  # what it was before the section existed


def test_online_train_phase_claims_the_extraction_port(make_config):
    auto = make_config(check_files=False)
    offline = make_config({"hidden_states": {"mode": "offline"}}, check_files=False)
    assert auto.phase_ports("train")[:1] == [auto.extract.server.port]
    assert offline.extract.server.port not in offline.phase_ports("train")


# ---- the doctor -------------------------------------------------------------------------------------

def test_doctor_prints_estimate_free_space_and_choice(make_config):
    c = check_disk(make_config())
    assert c.status == PASS and "offline (chosen by auto)" in c.reason
    assert "free under run_dir" in c.reason and "B/token" in c.reason


def test_doctor_fails_with_both_numbers_when_neither_mode_fits(make_config, monkeypatch):
    cfg = make_config({"gpus": [0], "extract": {"seq_length": 8192}})
    monkeypatch.setattr(hs_mode, "free_bytes", lambda run_dir: (4096, run_dir))
    c = check_disk(cfg)
    assert c.status == FAIL and "neither hidden-state mode fits" in c.reason
    assert "offline needs" in c.reason and "4096 bytes (0.000 GiB) free" in c.reason and "two GPU sets" in c.reason


def test_before_datagen_a_sample_is_its_prompt_bytes_the_template_and_max_tokens_at_most(make_config, tmp_path):
    """Before phase 1: each row is its conversation's UTF-8 bytes + the template's tokens + max_tokens,
    capped at seq_length, one row per assistant turn (the final answer included)."""
    rows = [{"id": "short", "messages": [{"role": "user", "content": "é" * 5}]},  # 10 bytes
            {"id": "turns", "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "goodbye"},
                                         {"role": "user", "content": "why"}]},
            {"id": "long", "messages": [{"role": "user", "content": "x" * 5000}]}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = make_config({"datagen": {"prompts": str(prompts), "sampling": {"max_tokens": 100}},
                       "extract": {"seq_length": 2048}}, check_files=False)
    t = TEMPLATE_TOKENS
    est = hs_mode.offline_estimate(cfg)
    assert est.rows == 1 + 2 + 1 and not est.exact and est.upper_bound_rows == 0
    assert est.tokens == (10 + t + 100) + 2 * (15 + t + 100) + 2048
    assert "estimated from prompts and datagen.sampling.max_tokens" in est.describe()
    # a longer answer is capped at seq_length like the long prompt
    longer = make_config({"datagen": {"prompts": str(prompts), "sampling": {"max_tokens": 4000}},
                          "extract": {"seq_length": 2048}}, check_files=False)
    assert hs_mode.offline_estimate(longer).tokens == 4 * 2048
    # prompts the target writes itself: each at most its max_tokens, the template and the answer
    writing = make_config({"datagen": {"prompts": str(prompts), "sampling": {"max_tokens": 100},
                                       "self_prompts": {"count": 5, "max_tokens": 64}},
                           "extract": {"seq_length": 2048}}, check_files=False)
    also = hs_mode.offline_estimate(writing)
    assert (also.rows, also.tokens) == (est.rows + 5, est.tokens + 5 * (64 + t + 100))


def test_the_preflight_passes_a_run_that_fits_only_by_its_answers_length(make_config, monkeypatch):
    """The 2026-12-05 refusal: short prompts and 256-token answers, on a disk that holds them but not
    every sample at seq_length. The doctor chooses offline; with room for neither, it still fails."""
    cfg = make_config({"gpus": [0], "datagen": {"sampling": {"max_tokens": 256}}, "extract": {"seq_length": 8192}})
    est = hs_mode.offline_estimate(cfg)
    full = est.rows * 8192 * est.bytes_per_token
    assert est.bytes * 4 < full  # what the old estimate would have needed
    monkeypatch.setattr(hs_mode, "free_bytes", lambda run_dir: (2 * est.bytes, run_dir))
    ok = check_disk(cfg)
    assert ok.status == PASS and "offline (chosen by auto)" in ok.reason
    monkeypatch.setattr(hs_mode, "free_bytes", lambda run_dir: (est.bytes // 2, run_dir))
    assert check_disk(cfg).status == FAIL


# ---- the online cache guard (no server: files as the extraction server writes them) ------------------

def test_cache_guard_stops_the_step_past_its_bound_and_removes_only_unlocked_orphans(tmp_path):
    import fcntl
    import os
    import time

    from eagle3.phases.train_online import CacheGuard

    cache = tmp_path / "hs-cache"
    cache.mkdir()
    old = time.time() - 3600
    orphan = cache / "req-1.safetensors"
    orphan.write_bytes(b"x" * 1000)
    os.utime(orphan, (old, old))
    writing = cache / "req-2.safetensors"  # as old, but the server still holds its lock: kept
    writing.write_bytes(b"y" * 700)
    os.utime(writing, (old, old))
    lock_fd = os.open(str(writing) + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    stopped = []
    try:
        guard = CacheGuard(cache, bound=500, on_exceeded=lambda: stopped.append(1), orphan_age_s=60)
        guard.scan()
    finally:
        os.close(lock_fd)
    assert not orphan.exists() and writing.exists() and guard.stats.orphans_removed == 1
    assert stopped == [1] and "above its bound of 500 bytes" in guard.stats.exceeded
    assert guard.stats.sampled_peak_bytes == 700 and guard.stats.sampled_peak_files == 1
    guard.scan()
    assert stopped == [1]  # stopped once


def test_handoff_purges_the_online_cache(tmp_path):
    from eagle3.config import Handoff
    from eagle3.handoff.core import run_handoff

    cache = RunLayout(tmp_path / "run").hs_cache
    cache.mkdir(parents=True)
    (cache / "req-9.safetensors").write_bytes(b"z" * 1234)
    report = run_handoff(tmp_path / "run", Handoff(shm_dir=tmp_path / "shm"), gpus=[], label="t")
    assert report.ok and report.scratch_bytes_removed == {str(cache): 1234} and not cache.exists()
