"""Spec-decode metrics: Prometheus parsing, deltas and the acceptance formulas (no server).

The end-to-end proof against a real server's counters is in tests/phases/test_bench.py."""

from __future__ import annotations

import pytest

from eagle3.engines import sglang, vllm
from eagle3.engines.metrics import MetricsError, SpecCounters, Traffic, acceptance, parse_prometheus

# As vLLM 0.32 (CPU build) printed it for a k=3 server after 64 drafts (labels, HELP/TYPE lines,
# the `_created` gauges that must not be counted), plus a second engine as with data parallelism.
REAL = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-llama"} 64.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny-llama"} 1.7960183030723166e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny-llama"} 192.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="tiny-llama"} 1.7960183030723789e+09
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny-llama"} 150.0
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="tiny-llama"} 1.7960183030724275e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-llama",position="0"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-llama",position="1"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-llama",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="tiny-llama",position="0"} 1.796018303072535e+09
vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 1234.0
"""


def vllm_counters(text: str, model_name: str | None = None) -> SpecCounters | None:
    return vllm.spec_counters(parse_prometheus(text), model_name)


SECOND_ENGINE = """\
vllm:spec_decode_num_drafts_total{engine="1",model_name="tiny-llama"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="tiny-llama"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="tiny-llama"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="tiny-llama",position="0"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="tiny-llama",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="tiny-llama",position="2"} 0.0
"""


def test_parse_reads_names_labels_values_and_skips_comments():
    samples = parse_prometheus(REAL + 'weird{a="x,\\"y\\"}",b="2"} 3 1700000000000\nnot a sample line\n')
    names = {s.name for s in samples}
    assert "vllm:spec_decode_num_drafts_total" in names and "vllm:prompt_tokens_total" in names
    weird = [s for s in samples if s.name == "weird"][0]
    assert weird.labels == {"a": 'x,"y"}', "b": "2"} and weird.value == 3.0  # escapes, comma, brace, timestamp


def test_counters_ignore_created_gauges():
    c = vllm_counters(REAL)
    assert c == SpecCounters(drafts=64, draft_tokens=192, accepted=150, accepted_per_pos=(60, 50, 40))


def test_counters_sum_over_engines_and_filter_by_model():
    c = vllm_counters(REAL + SECOND_ENGINE)
    assert c == SpecCounters(74, 222, 156, (64, 52, 40))
    assert vllm_counters(REAL, model_name="other") is None


def test_no_spec_counters_means_none():
    assert vllm_counters('vllm:prompt_tokens_total{engine="0"} 5.0\n') is None


def test_delta_and_formulas():
    before = SpecCounters(10, 30, 12, (6, 4, 2))
    after = vllm_counters(REAL)
    delta = after - before
    assert delta == SpecCounters(54, 162, 138, (54, 46, 38))
    a = acceptance(delta)
    assert a.acceptance_rate == pytest.approx(138 / 162)
    assert a.acceptance_length == pytest.approx(1 + 138 / 54)
    assert a.per_position == pytest.approx([54 / 54, 46 / 54, 38 / 54])
    # The per-position counts add up to the accepted total, so the rates sum to AL - 1.
    assert sum(a.per_position) == pytest.approx(a.acceptance_length - 1)


def test_perfect_drafter_gives_k_plus_one():
    k, drafts = 3, 32
    a = acceptance(SpecCounters(drafts, k * drafts, k * drafts, (drafts,) * k))
    assert a.acceptance_rate == 1.0 and a.acceptance_length == k + 1 and a.per_position == [1.0] * k


def test_empty_window_has_no_rates():
    a = acceptance(SpecCounters(5, 15, 3, (2, 1, 0)) - SpecCounters(5, 15, 3, (2, 1, 0)))
    assert a.acceptance_rate is None and a.acceptance_length is None and a.per_position == []


def test_counter_going_backwards_is_a_restart():
    with pytest.raises(MetricsError, match="restarted"):
        SpecCounters(1, 3, 0, (0, 0, 0)) - SpecCounters(64, 192, 150, (60, 50, 40))
    assert MetricsError("x").retryable  # a rerun measures again


def test_round_trip_through_json_dict():
    c = vllm_counters(REAL)
    assert SpecCounters.from_dict(c.to_dict()) == c


# SGLang 0.5.16's names and labels (metrics_collector.py, tokenizer_manager.py): counted once per
# finished request; 8 requests of 64 tokens from a k=3 server that took 160 verify steps.
SGLANG = """\
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{engine_type="unified",model_name="tiny-llama"} 8.0
sglang:num_requests_created{engine_type="unified",model_name="tiny-llama"} 1.7960183030723166e+09
sglang:prompt_tokens_total{engine_type="unified",model_name="tiny-llama"} 400.0
sglang:generation_tokens_total{engine_type="unified",model_name="tiny-llama"} 512.0
sglang:spec_verify_calls_total{engine_type="unified",model_name="tiny-llama"} 160.0
sglang:spec_accept_length{engine_type="unified",model_name="tiny-llama",tp_rank="0"} 3.2
"""


def test_sglang_counters_give_vllm_s_definitions():
    samples = parse_prometheus(SGLANG)
    c = sglang.spec_counters(samples, k=3)
    # Each request: 1 token from its prefill, then per verify step the accepted drafts + 1 bonus token.
    assert c == SpecCounters(drafts=160, draft_tokens=480, accepted=512 - 8 - 160)
    a = acceptance(c)
    assert a.acceptance_length == pytest.approx(1 + 344 / 160) and a.acceptance_rate == pytest.approx(344 / 480)
    assert a.per_position == []  # SGLang counts no position
    assert Traffic.from_samples(samples, "tiny-llama", sglang.TRAFFIC) == Traffic(requests=8, prompt_tokens=400,
                                                                           generation_tokens=512)
    assert sglang.spec_counters(samples, 3, model_name="tiny-llama") == c
    assert sglang.spec_counters(samples, 3, model_name="other") is None


def test_sglang_without_a_verify_step_has_no_spec_counters():
    no_spec = "\n".join(ln for ln in SGLANG.splitlines() if "spec_verify" not in ln)
    assert sglang.spec_counters(parse_prometheus(no_spec), k=3) is None
    assert Traffic.from_samples(parse_prometheus(no_spec), None, sglang.TRAFFIC).requests == 8
    assert Traffic.from_samples(parse_prometheus(SGLANG), None, vllm.TRAFFIC) == Traffic()  # vLLM's names are not SGLang's
