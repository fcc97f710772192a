"""The bench/ scripts still run against the pack's current interfaces: each in its smoke mode, against
the session's shared vLLM CPU server. bench/datagen_vs_vllm_bench.py broke silently once, when the
phases began returning a PhaseSummary (issue 22)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(600)]


def test_datagen_client_vs_vllm_bench_smoke(vllm_server, tmp_path):
    out = tmp_path / "datagen-bench.json"
    res = subprocess.run([sys.executable, str(REPO / "bench" / "datagen_vs_vllm_bench.py"), "--smoke",
                          "--base-url", vllm_server.base_url, "--json", str(out)],
                         capture_output=True, text=True, timeout=500, cwd=REPO,
                         env={**os.environ, "OPENAI_API_KEY": vllm_server.key})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    [row] = data["rounds"]
    # the same work on both sides: 8 prompts x 16 tokens (greedy, ignore_eos)
    assert row["ours"]["tokens"] == row["vllm_bench"]["tokens"] == 8 * 16
    assert row["ours"]["output_tok_s"] > 0 and row["vllm_bench"]["output_tok_s"] > 0 and data["ratio"] > 0
    assert "ratio" in res.stdout and "recorded in" not in res.stdout  # smoke mode records nothing
