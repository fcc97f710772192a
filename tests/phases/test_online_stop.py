"""The online step's server, played by tests/gpu/hs_endpoint.py (the stand-in the H200 test uses:
same argv, same supervisor service, same readiness probe, vLLM's extraction contract), on CPU.

- The stand-in itself: /v1/models, and a completion whose file appears under the cache with its
  `.lock` held until it is complete, a byte copy of the recorded file for those token ids.
- A stop that ends the trainer (which saved its interrupt checkpoint) and the server together
  surfaces as TrainingStopped, resumable; on the H200 it surfaced as the server's exit (-15),
  which hid the interrupt save (tests/gpu/RESULTS.md). A trainer failing beside a dead server
  still names the server."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from eagle3.config import load_config
from eagle3.errors import CommandFailed, ServiceExited
from eagle3.phases import train_online
from eagle3.phases.train import TrainingStopped
from eagle3.process.services import Supervisor, state_dir_for
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "gpu" / "hs_endpoint.py"
STANDIN_VLLM = REPO / "tests" / "reliability" / "standin_vllm"
TOKENS = [5, 17, 42]


def _hs_file(path: Path, tokens: list[int]) -> None:
    """A safetensors file shaped like vLLM's: token_ids (I64) and hidden_states (F32)."""
    ids = struct.pack(f"<{len(tokens)}q", *tokens)
    hs = struct.pack(f"<{len(tokens) * 2}f", *range(len(tokens) * 2))
    header = json.dumps({"token_ids": {"dtype": "I64", "shape": [len(tokens)], "data_offsets": [0, len(ids)]},
                         "hidden_states": {"dtype": "F32", "shape": [len(tokens), 1, 2],
                                           "data_offsets": [len(ids), len(ids) + len(hs)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + ids + hs)


@pytest.fixture
def cfg(tmp_path):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    _hs_file(recorded / "hs_0.safetensors", TOKENS)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (bindir / "vllm").write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} \"$@\"\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    engine = {"python": str(bindir / "python"), "env": {"EAGLE3_STANDIN_HS_DIR": str(recorded)}}
    # The stand-in's answer to the pack's engine probe (which vLLM serve flags exist), vLLM's side only.
    vllm = {**engine, "env": {**engine["env"], "PYTHONPATH": str(STANDIN_VLLM)}}
    server = {"port": free_port(), "startup_timeout_s": 30, "stop_grace_s": 5}
    raw = {"name": "online-stop", "run_dir": str(tmp_path / "run"), "gpus": [],
           "target": {"model": str(REPO / "tests" / "fixtures" / "eagle3-tiny" / "target"), "served_name": "tiny"},
           "engines": {"vllm": vllm, "speculators": engine},
           "datagen": {"prompts": str(REPO / "configs" / "prompts" / "tiny-prompts.jsonl"),
                       "server": {**server, "port": free_port()}},
           "extract": {"server": server}, "hidden_states": {"mode": "online"},
           "bench": {"server": {**server, "port": free_port()}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


EXT = SimpleNamespace(layer_ids=[2, 4, 5, 8], dtype="float32")


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_standin_speaks_the_extraction_contract(cfg):
    sup = Supervisor(state_dir_for(cfg.run_dir))
    base = train_online.endpoint(cfg)
    name = train_online.served_name(cfg)
    with train_online.extraction_server(cfg, sup, EXT) as (_server, guard):
        with urllib.request.urlopen(base + "/models", timeout=10) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == [name]
        answer = _post(base + "/completions", {"model": name, "prompt": TOKENS, "max_tokens": 1,
                                               "return_token_ids": True})
        assert answer["choices"][0]["prompt_token_ids"] == TOKENS
        path = Path(answer["kv_transfer_params"]["hidden_states_path"])
        assert path.parent == guard.cache
        with open(str(path) + ".lock") as lf:  # as speculators waits: until the server releases LOCK_EX
            fcntl.flock(lf, fcntl.LOCK_SH)
        recorded = Path(cfg.engines.vllm.env["EAGLE3_STANDIN_HS_DIR"]) / "hs_0.safetensors"
        assert path.read_bytes() == recorded.read_bytes()
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(base + "/completions", {"model": name, "prompt": [1, 2], "max_tokens": 1})
        assert err.value.code == 400
    assert not guard.cache.exists() and sup.registry.entries() == []


def test_a_stop_that_ends_both_services_surfaces_as_training_stopped(cfg):
    sup = Supervisor(state_dir_for(cfg.run_dir))
    with pytest.raises(TrainingStopped):
        with train_online.extraction_server(cfg, sup, EXT) as (server, _guard):
            sup.stop_all()  # the operator's stop: SIGTERM to every service of the run
            assert server.poll() is not None
            raise TrainingStopped("training was stopped; its interrupt checkpoint is kept")
    assert sup.registry.entries() == []


def test_a_trainer_failing_beside_a_dead_server_names_the_server(cfg):
    sup = Supervisor(state_dir_for(cfg.run_dir))
    with pytest.raises(ServiceExited, match="train-vllm-server exited"):
        with train_online.extraction_server(cfg, sup, EXT) as (server, _guard):
            os.kill(server.pid, 15)
            server.popen.wait(timeout=10)
            raise CommandFailed("train-speculators failed with exit code 1", returncode=1)
