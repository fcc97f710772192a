"""Where a server start's time went, read from the engine's own log lines (as the H200 runs printed
them: bench/results/smollm2-h200-20261204/run-files.tar.gz for vLLM 0.25,
bench/results/sglang-h200-20261202-run2/hang-server.log for SGLang)."""

from __future__ import annotations

import time

from eagle3.engines.sglang import ENGINE as SGLANG
from eagle3.engines.vllm import ENGINE as VLLM

VLLM_GPU_START = """\
(EngineCore pid=1733) INFO 12-04 06:00:08 [default_loader.py:430] Loading weights took 0.12 seconds
(EngineCore pid=1733) INFO 12-04 06:00:09 [model_runner.py:302] Model loading took 0.26 GiB and 2.503932 seconds
(EngineCore pid=1733) INFO 12-04 06:00:34 [monitor.py:53] torch.compile took 23.95 s in total
(EngineCore pid=1733) INFO 12-04 06:00:42 [model_runner.py:722] Graph capturing finished in 6 secs, took 0.39 GiB
(EngineCore pid=1733) INFO 12-04 06:00:59 [core.py:337] init engine (profile, create kv cache, warmup model) took 49.91 s (compilation: 23.95 s)
(EngineCore pid=1733) INFO 12-04 06:01:01 [default_loader.py:430] Loading weights took 0.03 seconds
"""
SGLANG_GPU_START = """\
[2026-12-02 19:53:50] Load weight end. elapsed=0.18 s, type=LlamaForCausalLM, avail mem=139.09 GB, mem usage=0.00 GB.
[2026-12-02 19:53:50] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2], avail mem=110.46 GB
[2026-12-02 19:53:56] Capture target decode CUDA graph end. Time elapsed: 5.12 s. mem usage=0.41 GB. avail mem=110.05 GB.
"""


def test_vllm_steps_the_first_load_being_the_targets():
    assert VLLM.start_breakdown(VLLM_GPU_START) == {"weights_s": 0.12, "model_load_s": 2.503932, "compile_s": 23.95,
                                                    "graphs_s": 6.0, "engine_init_s": 49.91}


# A speculative server's start (bench/results/smollm2-h200-20261204-run3, the k=3 server of round 1): the
# drafter's compile is logged apart, and the engine's total counts both.
VLLM_SPEC_START = """\
(EngineCore pid=4639) INFO 12-04 15:08:54 [monitor.py:53] torch.compile took 21.67 s in total
(EngineCore pid=4639) INFO 12-04 15:09:08 [monitor.py:53] torch.compile took 13.03 s in total
(EngineCore pid=4639) INFO 12-04 15:09:35 [core.py:337] init engine (profile, create kv cache, warmup model) took 62.86 s (compilation: 34.70 s)
"""


def test_vllm_compile_is_the_engines_total_with_the_drafters_and_falls_back_to_the_first_compile():
    assert VLLM.start_breakdown(VLLM_SPEC_START) == {"compile_s": 34.70, "engine_init_s": 62.86}
    assert VLLM.start_breakdown(VLLM_SPEC_START.splitlines(keepends=True)[0]) == {"compile_s": 21.67}


def test_sglang_steps():
    assert SGLANG.start_breakdown(SGLANG_GPU_START) == {"weights_s": 0.18, "graphs_s": 5.12}


def test_a_log_without_those_lines_gives_no_steps():
    assert VLLM.start_breakdown("INFO: Application startup complete.\n") == {}


# The repeated baseline start of that run: launched at 15:10:45, the API server's first line 25 s later,
# its engine core's first 17 s after that (bench/results/smollm2-h200-20261204-run3, bench server log).
VLLM_REPEATED_START = """\
(APIServer pid=5266) INFO 12-04 15:11:10 [api_utils.py:339]  version 0.25.0
(APIServer pid=5266) INFO 12-04 15:11:10 [model.py:619] Resolved architecture: LlamaForCausalLM
(EngineCore pid=5411) INFO 12-04 15:11:27 [core.py:114] Initializing a V1 LLM engine (v0.25.0) with config: ...
(EngineCore pid=5411) INFO 12-04 15:11:38 [core.py:337] init engine (profile, create kv cache, warmup model) took 7.74 s (compilation: 4.20 s)
"""


def _local(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def test_vllm_imports_and_engine_spawn_come_from_the_logs_timestamps_and_the_launch_time():
    steps = VLLM.start_breakdown(VLLM_REPEATED_START, _local("2026-12-04 15:10:45"))
    assert steps == {"compile_s": 4.20, "engine_init_s": 7.74, "api_imports_s": 25.0, "model_inspect_s": 0.0,
                     "engine_spawn_s": 17.0}
    assert "api_imports_s" not in VLLM.start_breakdown(VLLM_REPEATED_START)  # no launch time, no such steps
    # A log without the architecture line (another version's wording): its time goes to the engine's spawn.
    without = "".join(line for line in VLLM_REPEATED_START.splitlines(keepends=True) if "Resolved" not in line)
    assert VLLM.start_breakdown(without, _local("2026-12-04 15:10:45"))["engine_spawn_s"] == 17.0


# A forked engine core on the H100 (2026-12-05, bench/results/h100-20261205-measure, the A/A probe's server A):
# model inspection 22 s (no cached answer), the engine core's first line in the same second.
VLLM_FORKED_START = """(APIServer pid=2760) INFO 12-05 10:15:50 [api_utils.py:273] non-default args: {...}
(APIServer pid=2760) INFO 12-05 10:16:12 [model.py:619] Resolved architecture: LlamaForCausalLM
(EngineCore pid=2989) INFO 12-05 10:16:12 [core.py:114] Initializing a V1 LLM engine (v0.25.0) with config: ...
"""


def test_vllm_model_inspection_and_the_engine_cores_start_are_apart():
    steps = VLLM.start_breakdown(VLLM_FORKED_START, _local("2026-12-05 10:15:26"))
    assert steps == {"api_imports_s": 24.0, "model_inspect_s": 22.0, "engine_spawn_s": 0.0}
    # A log that stops before the engine core's line (a start that died) gives what it has.
    assert VLLM.start_breakdown(VLLM_REPEATED_START.splitlines()[0], _local("2026-12-04 15:10:45")) == {
        "api_imports_s": 25.0}


def test_sglang_imports_from_its_first_timestamped_line():
    steps = SGLANG.start_breakdown(SGLANG_GPU_START, _local("2026-12-02 19:53:21"))
    assert steps == {"weights_s": 0.18, "graphs_s": 5.12, "imports_s": 29.0}
