"""Phase 1 (data generation) against a real vLLM CPU server on the tiny model.

Client-level tests share the session's `vllm_server`; the server-kill test starts its own (through
the phase itself), because it has to kill it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eagle3.progress import counts, subscribed
from eagle3.errors import ConfigError, GateError
from eagle3.phases import phase_lock
from eagle3.phases.datagen import DatagenPaths, run_datagen
from eagle3.prompts import load_prompts
from tests.conftest import SHARED_SERVER_KEY, _merge


def _merged(base: dict, over: dict) -> dict:
    _merge(base, over)
    return base

REPO = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"


@pytest.fixture
def make_config(make_config):
    """The tiny config, keyed for the session's shared server (these tests use it as an external
    server, --base-url, whose key the config names like a user's would)."""

    def _make(overrides: dict | None = None, *args, **kwargs):
        keyed = {"datagen": {"server": {"api_key": SHARED_SERVER_KEY}}}
        return make_config(_merged(keyed, overrides or {}), *args, **kwargs)

    return _make


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def count_rows(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_rows(path: Path, at_least: int, timeout_s: float, alive=lambda: True) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        n = count_rows(path)
        if n >= at_least:
            return n
        time.sleep(0.02)
    raise AssertionError(f"{path}: fewer than {at_least} rows after {timeout_s} s")


def expected_ids(cfg) -> list[str]:
    return load_prompts(cfg.datagen.prompts, cfg.datagen.max_samples).ids


def assert_exactly_once(cfg, path: Path) -> list[dict]:
    got = [r["id"] for r in rows(path)]
    want = expected_ids(cfg)
    assert len(got) == len(set(got)), f"duplicated ids: {sorted({i for i in got if got.count(i) > 1})}"
    assert sorted(got) == sorted(want), f"lost: {sorted(set(want) - set(got))}, extra: {sorted(set(got) - set(want))}"
    return rows(path)


# ---- no server needed --------------------------------------------------------------------------

def test_malformed_prompt_rows_stop_the_phase_before_any_server(tmp_path, make_config):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "fine"}\n{"id": "b", "conversations": []}\nnot json\n')
    cfg = make_config({"datagen": {"prompts": str(bad)}}, check_files=False)
    with pytest.raises(ConfigError) as err:
        run_datagen(cfg, sup=None)  # no supervisor: reaching the server start would raise something else
    msg = str(err.value)
    assert f"{bad}:2: 'conversations' must be a non-empty list" in msg
    assert f"{bad}:3: not valid JSON" in msg
    assert not err.value.retryable
    assert not DatagenPaths.of(cfg).samples.exists() and not DatagenPaths.of(cfg).manifest.exists()


# ---- shared server -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.engine
def test_64_samples_each_id_once_with_tokens_manifest_summary(vllm_server, make_config):
    cfg = make_config()
    assert cfg.datagen.max_samples == 64
    calls: list[tuple[int, int]] = []
    with subscribed(counts("datagen", lambda d, t: calls.append((d, t)))):
        summary = run_datagen(cfg, None, base_url=vllm_server.base_url)
    paths = DatagenPaths.of(cfg)

    out = assert_exactly_once(cfg, paths.samples)
    got = summary.details
    assert (got["samples"], got["total"], got["new_samples"], got["resumed"], got["failed"]) == (64, 64, 64, 0, 0)
    assert got["complete"] and got["completion_tokens"] > 0 and got["output_tok_s"] > 0
    prompts = {p.id: p for p in load_prompts(cfg.datagen.prompts, 64).prompts}
    for row in out:
        conv = row["conversations"]
        assert conv[:-1] == list(prompts[row["id"]].messages)
        assert conv[-1]["role"] == "assistant" and isinstance(conv[-1]["content"], str)
        meta = row["meta"]
        assert meta["finish_reason"] in ("stop", "length")
        assert len(meta["token_ids"]) == meta["completion_tokens"] <= cfg.datagen.sampling.max_tokens
        assert len(meta["prompt_token_ids"]) == meta["prompt_tokens"] > 0
    assert summary.details["completion_tokens"] == sum(r["meta"]["completion_tokens"] for r in out)

    assert calls[-1] == (64, 64) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    manifest = json.loads(paths.manifest.read_text())
    assert manifest["endpoint"] == vllm_server.base_url and "tiny-llama" in manifest["server_models"]
    assert manifest["settings"]["sampling"] == cfg.datagen.sampling.model_dump(mode="json")
    assert manifest["config_hash"] == cfg.fingerprint("datagen")
    on_disk = json.loads(paths.summary.read_text())
    assert on_disk["samples"] == 64 and on_disk["complete"] is True

    before = paths.samples.read_bytes()
    again = run_datagen(cfg, None, base_url=vllm_server.base_url)
    got = again.details
    assert (got["resumed"], got["new_samples"], got["samples"]) == (64, 0, 64)
    assert paths.samples.read_bytes() == before

    check_prepare_data_can_load(paths.samples)


def check_prepare_data_can_load(samples: Path) -> None:
    """Load the file the way `speculators prepare-data --data FILE` does, and run its turn normaliser."""
    code = (
        "import sys, json\n"
        "from speculators.data_generation.preprocessing import load_raw_dataset, _normalize_conversation\n"
        "ds, _ = load_raw_dataset(sys.argv[1])\n"
        "convs = [_normalize_conversation(c) for c in ds['conversations']]\n"
        "print(json.dumps({'n': len(ds), 'cols': sorted(ds.column_names),\n"
        "                  'last_roles': sorted({c[-1]['role'] for c in convs})}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(samples.parent / "hf")}
    res = subprocess.run([str(ENGINE_PYTHON), "-c", code, str(samples)], capture_output=True, text=True,
                         timeout=180, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"n": 64, "cols": ["conversations", "id", "meta"], "last_roles": ["assistant"]}


@pytest.mark.slow
@pytest.mark.engine
def test_client_sigkilled_mid_run_then_resumed_loses_and_duplicates_nothing(vllm_server, make_config, tmp_path):
    cfg = make_config({"datagen": {"max_samples": 32, "concurrency": 4, "sampling": {"max_tokens": 32}}})
    paths = DatagenPaths.of(cfg)
    argv = [sys.executable, "-m", "eagle3.cli", "datagen", str(tmp_path / "config.yaml"),
            "--base-url", vllm_server.base_url]
    log = open(tmp_path / "client.log", "wb")
    client = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        at_kill = wait_for_rows(paths.samples, 4, 120, alive=lambda: client.poll() is None)
        os.kill(client.pid, signal.SIGKILL)
    finally:
        if client.poll() is None:
            os.kill(client.pid, signal.SIGKILL)
        client.wait(timeout=30)
        log.close()
    assert client.returncode == -signal.SIGKILL, (tmp_path / "client.log").read_text()[-3000:]
    survived = rows(paths.samples)
    assert 4 <= at_kill <= len(survived) < 32, "the kill must land mid-run"
    prefix = paths.samples.read_bytes()

    with phase_lock(cfg, "datagen"):  # the lock died with the client
        summary = run_datagen(cfg, None, base_url=vllm_server.base_url)
    assert summary.details["resumed"] == len(survived) and summary.details["new_samples"] == 32 - len(survived)
    assert_exactly_once(cfg, paths.samples)
    assert paths.samples.read_bytes().startswith(prefix), "resume must only append"


@pytest.mark.slow
@pytest.mark.engine
def test_resume_with_other_settings_is_refused(vllm_server, make_config, tmp_path):
    base = {"datagen": {"max_samples": 4}}
    cfg = make_config(base)
    run_datagen(cfg, None, base_url=vllm_server.base_url)
    paths = DatagenPaths.of(cfg)
    before = paths.samples.read_bytes()

    hotter = make_config({"datagen": {"max_samples": 4, "sampling": {"temperature": 0.5}}})
    with pytest.raises(ConfigError) as err:
        run_datagen(hotter, None, base_url=vllm_server.base_url)
    assert "refusing to resume" in str(err.value) and "sampling.temperature: was 0.8, now 0.5" in str(err.value)

    other = tmp_path / "other-prompts.jsonl"
    other.write_text(Path(cfg.datagen.prompts).read_text().replace("two sentences", "three sentences"))
    with pytest.raises(ConfigError, match="prompts_sha256"):
        run_datagen(make_config({"datagen": {"max_samples": 4, "prompts": str(other)}}), None,
                    base_url=vllm_server.base_url)
    assert paths.samples.read_bytes() == before

    # Throughput settings do not change the data: a resume with them changed goes ahead.
    faster = make_config({"datagen": {"max_samples": 6, "concurrency": 3}})
    summary = run_datagen(faster, None, base_url=vllm_server.base_url)
    assert (summary.details["resumed"], summary.details["new_samples"]) == (4, 2)


@pytest.mark.slow
@pytest.mark.engine
def test_rejected_prompt_logged_not_retried_and_gated(vllm_server, make_config, tmp_path):
    prompts = tmp_path / "p.jsonl"
    too_long = " ".join(f"word{i}" for i in range(3000))  # far beyond max_model_len 1024
    prompts.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "prompt": "Explain a mutex."}, {"id": "long", "prompt": too_long},
        {"id": "b", "prompt": "Explain a B-tree."}, {"id": "c", "prompt": "Explain a heap."}]))
    cfg = make_config({"datagen": {"prompts": str(prompts), "max_samples": None}})
    paths = DatagenPaths.of(cfg)
    with pytest.raises(GateError, match="1 of 4 prompts have no sample") as err:
        run_datagen(cfg, None, base_url=vllm_server.base_url)
    assert not err.value.retryable
    assert sorted(r["id"] for r in rows(paths.samples)) == ["a", "b", "c"]
    [failure] = rows(paths.failures)
    assert (failure["id"], failure["line"], failure["status"], failure["attempts"]) == ("long", 2, 400, 1)
    assert json.loads(paths.summary.read_text())["complete"] is False

    lenient = make_config({"datagen": {"prompts": str(prompts), "max_samples": None, "max_failed_fraction": 0.5}})
    summary = run_datagen(lenient, None, base_url=vllm_server.base_url)  # retries only the failed prompt
    got = summary.details
    assert (got["resumed"], got["new_samples"], got["failed"], got["samples"]) == (3, 0, 1, 3)


@pytest.mark.slow
@pytest.mark.engine
def test_self_prompts_a_user_turn_that_cannot_finish_fails_only_its_own_prompt(vllm_server, make_config):
    """One token per draw is never a finished user turn (cut off, or empty where it is the end of the
    turn): each written prompt fails after its draws, with the reason; the set's prompts are answered.
    vLLM took every request: a failure for the request shape would carry its HTTP status."""
    cfg = make_config({"datagen": {"max_samples": 3, "max_failed_fraction": 0.5,
                                   "server": {"api_key": SHARED_SERVER_KEY},
                                   "self_prompts": {"count": 2, "max_tokens": 1, "draws": 2}}})
    summary = run_datagen(cfg, None, base_url=vllm_server.base_url)
    paths = DatagenPaths.of(cfg)
    assert sorted(r["id"] for r in rows(paths.samples)) == load_prompts(cfg.datagen.prompts, 3).ids
    failures = rows(paths.failures)
    assert sorted(f["id"] for f in failures) == ["self-00000", "self-00001"]
    for f in failures:
        assert f["status"] is None and "no usable user turn in 2 draws" in f["reason"], f
        assert "datagen.self_prompts.max_tokens" in f["reason"]
    got = summary.details
    assert (got["total"], got["samples"], got["failed"]) == (5, 3, 2)
    manifest = json.loads(paths.manifest.read_text())
    assert manifest["settings"]["self_prompts"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 1, "system": None,
                                                    "draws": 2}


@pytest.mark.slow
@pytest.mark.engine
def test_self_prompts_written_under_a_system_turn_are_distinct_kept_on_a_resume_and_extended(vllm_server,
                                                                                               make_config):
    """The tiny random model ends a turn only by chance, so a stop string (request_extra, sent with every
    request) ends its written turns: each is then a finished, distinct turn. A resume writes nothing, and a
    larger count adds rows after the others, byte for byte."""
    def config(count: int):
        return make_config({"datagen": {"max_samples": 2, "request_extra": {"stop": [" "]},
                                        "sampling": {"max_tokens": 8},
                                        "self_prompts": {"count": count, "max_tokens": 48, "draws": 8,
                                                         "system": "You write recipes."}}})

    cfg = config(4)
    got = run_datagen(cfg, None, base_url=vllm_server.base_url).details
    assert (got["total"], got["samples"], got["failed"]) == (6, 6, 0), got
    paths = DatagenPaths.of(cfg)
    written = [r for r in rows(paths.samples) if r["id"].startswith("self-")]
    assert sorted(r["id"] for r in written) == [f"self-{i:05d}" for i in range(4)]
    turns = [r["conversations"][0]["content"] for r in written]
    given = {p.messages[-1]["content"] for p in load_prompts(cfg.datagen.prompts, None).prompts}
    for r, turn in zip(written, turns):
        assert [m["role"] for m in r["conversations"]] == ["user", "assistant"] and turn.strip() == turn != "", r
    assert len(set(turns)) == 4 and not set(turns) & given

    before = paths.samples.read_bytes()
    again = run_datagen(cfg, None, base_url=vllm_server.base_url).details
    assert (again["resumed"], again["new_samples"]) == (6, 0) and paths.samples.read_bytes() == before
    more = run_datagen(config(6), None, base_url=vllm_server.base_url).details
    assert (more["resumed"], more["new_samples"], more["samples"]) == (6, 2, 8)
    after = paths.samples.read_bytes()
    extra = [json.loads(line)["conversations"][0]["content"] for line in after[len(before):].splitlines()]
    assert after.startswith(before) and len(extra) == 2 and not set(extra) & (set(turns) | given)


# ---- own server ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.engine
def test_server_killed_mid_run_fails_retryable_then_rerun_completes(tiny_model, make_config):
    from tests.ports import free_port

    from eagle3.process import procfs
    from eagle3.phase_runner import supervisor

    # A smaller set than the 64 of the shared-server test: this one pays for two server starts.
    cfg = make_config({"datagen": {"max_samples": 24, "concurrency": 4, "sampling": {"max_tokens": 32},
                                   "server": {"port": free_port()}}})
    sup = supervisor(cfg)
    paths = DatagenPaths.of(cfg)
    box: dict = {}

    def phase():
        try:
            box["summary"] = run_datagen(cfg, sup)
        except BaseException as e:  # noqa: BLE001 - inspected below
            box["error"] = e

    worker = threading.Thread(target=phase)
    worker.start()
    try:
        wait_for_rows(paths.samples, 3, 300, alive=worker.is_alive)
        [entry] = [e for e in sup.registry.entries() if e.name == "datagen-vllm-server"]
        at_kill = count_rows(paths.samples)
        os.kill(entry.pid, signal.SIGKILL)  # the API server we started, by PID
    finally:
        worker.join(timeout=120)
    assert not worker.is_alive()
    err = box.get("error")
    assert err is not None and getattr(err, "retryable", False) is True, repr(err) or box
    assert at_kill < 24 and count_rows(paths.samples) < 24, "the kill must land mid-run"
    assert not procfs.group_members(entry.pgid), "the phase must stop what is left of its server"
    assert not sup.registry.entries()
    assert not paths.summary.exists()

    summary = run_datagen(cfg, sup)
    got = summary.details
    assert got["complete"] and got["resumed"] >= at_kill and got["new_samples"] == 24 - got["resumed"]
    assert_exactly_once(cfg, paths.samples)
    assert not sup.registry.entries(), "the phase must stop its server when done"
    assert not procfs.listening_ports({cfg.datagen.server.port})


@pytest.mark.slow
@pytest.mark.engine
def test_a_data_parallel_server_serves_datagen_from_two_copies_of_the_target(tiny_model, make_config):
    """target.data_parallel_size 2 (issue 40: SmolLM2's 9 query / 3 KV heads do not split over 2 GPUs, so a
    2-GPU node serves it as two copies) on vLLM's CPU build: the server runs two engine copies, every
    sample comes back once, and the whole server group is gone after the phase."""
    from tests.conftest import TEST_VLLM_INPROC_WORKER
    from tests.ports import free_port

    from eagle3.phase_runner import supervisor
    from eagle3.process import procfs
    from eagle3.process.registry import OWNER_ENV

    cfg = make_config({"target": {"data_parallel_size": 2},
                       # Each copy is an engine process of its own: vLLM's multiprocessing engine, not in-process.
                       "engines": {"vllm": {"env": {TEST_VLLM_INPROC_WORKER: "1"}}},
                       "datagen": {"max_samples": 16, "concurrency": 8, "sampling": {"max_tokens": 16},
                                   "server": {"port": free_port()}}})
    sup = supervisor(cfg)
    summary = run_datagen(cfg, sup)
    assert summary.details["complete"] and summary.details["new_samples"] == 16
    assert_exactly_once(cfg, DatagenPaths.of(cfg).samples)
    log = (cfg.phase_dir("datagen") / "logs" / "vllm-server.log").read_text(errors="replace")
    launch = next(line for line in log.splitlines() if "launching datagen-vllm-server" in line)
    assert "'--data-parallel-size', '2'" in launch
    assert "EngineCore_DP0" in log and "EngineCore_DP1" in log  # vLLM's own names for its two copies
    assert not sup.registry.entries() and not procfs.listening_ports({cfg.datagen.server.port})
    # Nothing the run started lives on: no process carries its owner token (both copies, the API servers, vLLM's
    # DP coordinator).
    assert not [p.pid for p in procfs.all_procs() if procfs.environ_value(p.pid, OWNER_ENV) == sup.registry.token]
