"""`eagle3 validate`: the shipped configs pass; broken ones exit 2 naming the field and the fix."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from typer.testing import CliRunner

from eagle3.cli import app
from eagle3.config import load_config
from tests.conftest import valid_raw_config

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture
def base(tmp_path) -> dict:
    return valid_raw_config(tmp_path)


def validate(tmp_path: Path, raw) -> tuple[int, str]:
    path = tmp_path / "cfg.yaml"
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    result = runner.invoke(app, ["validate", str(path)])
    return result.exit_code, result.output


def test_valid_base_passes(tmp_path, base):
    code, output = validate(tmp_path, base)
    assert code == 0, output
    assert "valid" in output


def test_shipped_tiny_config_is_valid_once_built(tiny_model):
    result = runner.invoke(app, ["validate", str(REPO / "configs" / "tiny-cpu.yaml")])
    assert result.exit_code == 0, result.output


def test_the_demo_config_is_the_default_and_valid_once_its_model_is_built(request):
    """`make demo` runs configs/smollm2-cpu.yaml, the CLI's default config: the real model, bf16, held-out bench prompts."""
    from eagle3.config import DEFAULT_CONFIG

    assert DEFAULT_CONFIG == REPO / "configs" / "smollm2-cpu.yaml"
    cfg = load_config(DEFAULT_CONFIG, check_files=False)
    assert cfg.target.model == REPO / "models" / "smollm2-135m" and cfg.cpu_rehearsal
    assert cfg.bench.prompts.name == "heldout.jsonl" and cfg.datagen.prompts.name == "train.jsonl"
    assert cfg.bench.drafter == REPO / "models" / "drafters" / "smollm2-135m-h200"
    request.getfixturevalue("smollm2_model")  # built (or found current) by make-model
    request.getfixturevalue("shipped_drafter")  # installed (or found current) by install-drafter
    result = runner.invoke(app, ["validate", str(DEFAULT_CONFIG)])
    assert result.exit_code == 0, result.output


def test_the_real_model_gpu_profile_parses():
    """It names paths that exist on the GPU machine only (the engine wrappers, the 16k prompt set)."""
    cfg = load_config(REPO / "configs" / "h200-smollm2.yaml", check_files=False)
    assert cfg.gpus == [0] and cfg.target.model == REPO / "models" / "smollm2-135m"
    assert cfg.train.dry_run == "never"


@pytest.mark.parametrize("example", sorted((REPO / "configs" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_parse(example):
    """Examples for GPU nodes name paths that only exist there: check shape and cross-field rules."""
    cfg = load_config(example, check_files=False)
    assert cfg.gpus, "GPU examples must list their GPUs"


def _set(raw: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value


DELETE = object()

# (case id, {dotted path: new value}, text the message must contain to name the field)
BROKEN = [
    ("missing-model-dir", {"target.model": "/nonexistent/model"}, "target.model"),
    ("model-dir-without-config", {"target.model": "/tmp"}, "target.model"),
    ("missing-target", {"target": DELETE}, "target"),
    ("missing-name", {"name": DELETE}, "name"),
    ("bad-name", {"name": "has spaces"}, "name"),
    ("unknown-engine-datagen", {"datagen.engine": "tgi"}, "datagen.engine"),
    ("unknown-engine-bench", {"bench.engine": "trtllm"}, "bench.engine"),
    ("extract-engine-sglang", {"extract.engine": "sglang"}, "extract.engine"),
    ("port-zero", {"datagen.server.port": 0}, "datagen.server.port"),
    ("port-too-big", {"bench.server.port": 70000}, "bench.server.port"),
    ("port-string", {"extract.server.port": "eighty"}, "extract.server.port"),
    ("duplicate-ports", {"bench.server.port": 18601}, "bench.server.port"),
    ("gpu-ids-not-ints", {"gpus": ["a", "b"]}, "gpus"),
    ("gpu-ids-float", {"gpus": [0.5]}, "gpus"),
    ("gpu-ids-negative", {"gpus": [-1]}, "gpus"),
    ("gpu-ids-duplicate", {"gpus": [0, 0]}, "gpus"),
    ("gpus-not-list", {"gpus": 4}, "gpus"),
    ("negative-concurrency", {"datagen.concurrency": -4}, "datagen.concurrency"),
    ("zero-max-tokens", {"datagen.sampling.max_tokens": 0}, "datagen.sampling.max_tokens"),
    ("negative-temperature", {"datagen.sampling.temperature": -0.1}, "datagen.sampling.temperature"),
    ("top-p-above-one", {"datagen.sampling.top_p": 1.5}, "datagen.sampling.top_p"),
    ("negative-max-samples", {"datagen.max_samples": -1}, "datagen.max_samples"),
    ("negative-retries", {"datagen.max_retries": -2}, "datagen.max_retries"),
    ("unknown-top-level-key", {"datagne": {}}, "datagne"),
    ("unknown-nested-key", {"datagen.server.prot": 1234}, "datagen.server.prot"),
    ("unknown-handoff-key", {"handoff.sleep_s": 5}, "handoff.sleep_s"),
    ("wrong-type-extra-args", {"datagen.server.extra_args": "--enforce-eager"}, "datagen.server.extra_args"),
    ("wrong-type-epochs", {"train.epochs": "three"}, "train.epochs"),
    ("zero-epochs", {"train.epochs": 0}, "train.epochs"),
    ("negative-lr", {"train.lr": -1e-4}, "train.lr"),
    ("bad-dry-run", {"train.dry_run": "maybe"}, "train.dry_run"),
    ("spec-tokens-zero", {"bench.num_speculative_tokens": [0]}, "bench.num_speculative_tokens"),
    ("spec-tokens-empty", {"bench.num_speculative_tokens": []}, "bench.num_speculative_tokens"),
    ("bench-concurrency-dupes", {"bench.concurrency": [4, 4]}, "bench.concurrency"),
    ("acceptance-floor-below-one", {"bench.acceptance_floor": 0.5}, "bench.acceptance_floor"),
    ("aux-layer-out-of-range", {"extract.aux_layer_ids": [2, 4, 40]}, "extract.aux_layer_ids"),
    ("aux-layer-negative", {"extract.aux_layer_ids": [-1, 2, 3]}, "extract.aux_layer_ids"),
    ("aux-layer-duplicates", {"extract.aux_layer_ids": [2, 2, 5]}, "extract.aux_layer_ids"),
    ("handoff-negative-grace", {"handoff.grace_s": -1}, "handoff.grace_s"),
    ("handoff-zero-deadline", {"handoff.deadline_s": 0}, "handoff.deadline_s"),
    ("handoff-threshold-negative", {"handoff.used_mib_threshold": -5}, "handoff.used_mib_threshold"),
    ("systemd-unit-with-shell", {"handoff.systemd_units": ["vllm; rm -rf /"]}, "handoff.systemd_units"),
    ("engine-env-empty", {"engines.vllm": {}}, "engines.vllm"),
    ("engine-env-both", {"engines.vllm": {"python": sys.executable, "command_prefix": ["conda", "run"]}}, "engines.vllm"),
    ("engine-python-missing", {"engines.speculators.python": "/nonexistent/bin/python"}, "engines.speculators.python"),
    ("engine-for-sglang-missing", {"datagen.engine": "sglang"}, "engines.sglang"),
    ("speculators-missing", {"engines.speculators": DELETE}, "engines.speculators"),
    ("tp-above-gpu-count", {"gpus": [0, 1], "target.tensor_parallel_size": 4}, "target.tensor_parallel_size"),
    ("tp-on-cpu", {"target.tensor_parallel_size": 2}, "target.tensor_parallel_size"),
    ("dp-zero", {"target.data_parallel_size": 0}, "target.data_parallel_size"),
    ("bad-dtype", {"target.dtype": "int3"}, "target.dtype"),
    ("zero-max-model-len", {"target.max_model_len": 0}, "target.max_model_len"),
    ("served-name-with-space", {"target.served_name": "my model"}, "target.served_name"),
    ("prompts-missing", {"datagen.prompts": "/nonexistent/prompts.jsonl"}, "datagen.prompts"),
    ("startup-timeout-zero", {"datagen.server.startup_timeout_s": 0}, "datagen.server.startup_timeout_s"),
]


@pytest.mark.parametrize("case,changes,field", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_config_exits_2_naming_the_field(tmp_path, base, case, changes, field):
    refused(tmp_path, base, changes, field)


# ---- the loader as an attack surface: each class of bad input, several instances of each --------
# (case id, {dotted path: value, or fn(tmp_path) -> value}, field the message names, text it says)


def fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def symlink_loop(tmp: Path) -> str:
    os.symlink(tmp / "loop-b", tmp / "loop-a")
    os.symlink(tmp / "loop-a", tmp / "loop-b")
    return str(tmp / "loop-a")


def regular_file(tmp: Path) -> str:
    (tmp / "a-file").write_text("x")
    return str(tmp / "a-file")


def model_with_config_json(make):
    def build(tmp: Path) -> str:
        model = tmp / "odd-model"
        model.mkdir()
        make(model / "config.json")
        return str(model)
    return build


def drafter_with_fifo_config(tmp: Path) -> str:
    (tmp / "drafter").mkdir()
    os.mkfifo(tmp / "drafter" / "config.json")
    return str(tmp / "drafter")


def link_to_root(tmp: Path) -> str:
    os.symlink("/", tmp / "root-link")
    return str(tmp / "root-link")


def not_executable(tmp: Path) -> str:
    (tmp / "python").write_text("#!/bin/sh\n")
    os.chmod(tmp / "python", 0o644)
    return str(tmp / "python")


SGLANG = {"engines.sglang": {"python": sys.executable}}

STRICT_SCALARS = [
    ("port-true", {"datagen.server.port": True}, "datagen.server.port", "a boolean"),
    ("max-samples-true", {"datagen.max_samples": True}, "datagen.max_samples", "a boolean"),
    ("concurrency-string", {"datagen.concurrency": "8"}, "datagen.concurrency", "a string"),
    ("epochs-float", {"train.epochs": 3.0}, "train.epochs", "a number"),
    ("max-disk-bytes-float", {"extract.max_disk_bytes": 1e12}, "extract.max_disk_bytes", "a number"),
    ("temperature-string", {"datagen.sampling.temperature": "0.5"}, "datagen.sampling.temperature", "a string"),
    ("lr-true", {"train.lr": True}, "train.lr", "a boolean"),
    ("seed-false", {"datagen.sampling.seed": False}, "datagen.sampling.seed", "a boolean"),
    ("trust-remote-code-string", {"target.trust_remote_code": "false"}, "target.trust_remote_code", "a string"),
    ("trust-remote-code-int", {"target.trust_remote_code": 1}, "target.trust_remote_code", "an integer"),
    ("ignore-eos-string", {"bench.ignore_eos": "yes"}, "bench.ignore_eos", "a string"),
    ("spec-tokens-true", {"bench.num_speculative_tokens": [True]}, "bench.num_speculative_tokens[0]", "a boolean"),
    ("extra-port-string", {"handoff.extra_ports": ["8000"]}, "handoff.extra_ports[0]", "a string"),
    ("served-name-int", {"target.served_name": 7}, "target.served_name", "an integer"),
    ("env-value-int", {"engines.vllm.env.VLLM_CPU_KVCACHE_SPACE": 1}, "engines.vllm.env.VLLM_CPU_KVCACHE_SPACE",
     "an integer"),
    ("timeout-inf", {"datagen.server.startup_timeout_s": float("inf")}, "datagen.server.startup_timeout_s", "inf"),
    ("grace-nan", {"handoff.grace_s": float("nan")}, "handoff.grace_s", "nan"),
    ("timeout-beyond-a-week", {"bench.client_timeout_s": 1e12}, "bench.client_timeout_s", "604800"),
]

def _above_checkout_reason() -> str:
    """What refusing the checkout's parent names: "checkout", unless that parent is refused for a
    reason checked first (a clone made directly in /tmp sits under a system directory)."""
    from eagle3.config import dirs as config_module

    parent, home = os.path.realpath(REPO.parent), os.path.realpath(Path.home())
    if parent == home:
        return "home directory"
    if parent in {os.path.realpath(d) for d in config_module._SYSTEM_DIRS}:
        return "system directory"
    if any(parent.startswith(t + os.sep) for t in config_module._SYSTEM_TREES):
        return "system tree"
    return "holds your home directory" if home.startswith(parent + os.sep) else "checkout"


RUN_DIRS = [
    ("root", {"run_dir": "/"}, "run_dir", "system directory"),
    ("usr", {"run_dir": "/usr"}, "run_dir", "system directory"),
    ("etc-subdir", {"run_dir": "/etc/eagle3"}, "run_dir", "system tree /etc"),
    ("home", {"run_dir": "/home"}, "run_dir", "system directory"),
    ("tilde", {"run_dir": "~"}, "run_dir", "home directory"),
    ("home-itself", {"run_dir": lambda tmp: str(Path.home())}, "run_dir", "home directory"),
    ("proc", {"run_dir": "/proc/self"}, "run_dir", "system tree /proc"),
    ("dev-shm", {"run_dir": "/dev/shm/eagle3-run"}, "run_dir", "system tree /dev"),
    ("var", {"run_dir": "/var"}, "run_dir", "system directory"),
    ("checkout", {"run_dir": str(REPO)}, "run_dir", "checkout"),
    ("above-checkout", {"run_dir": str(REPO.parent)}, "run_dir", _above_checkout_reason()),
    ("in-sources", {"run_dir": str(REPO / "eagle3" / "run")}, "run_dir", "source tree"),
    ("a-regular-file", {"run_dir": regular_file}, "run_dir", "a regular file, not a directory"),
    ("below-a-file", {"run_dir": lambda tmp: regular_file(tmp) + "/run"}, "run_dir", "cannot be created"),
    ("symlink-to-root", {"run_dir": link_to_root}, "run_dir", "system directory"),
]

INPUT_FILES = [
    ("prompts-directory", {"datagen.prompts": lambda tmp: str(tmp)}, "datagen.prompts", "a directory"),
    ("prompts-fifo", {"datagen.prompts": fifo}, "datagen.prompts", "FIFO"),
    ("prompts-dev-zero", {"datagen.prompts": "/dev/zero"}, "datagen.prompts", "character device"),
    ("prompts-symlink-loop", {"datagen.prompts": symlink_loop}, "datagen.prompts", "symlink loop"),
    ("bench-prompts-fifo", {"bench.prompts": fifo}, "bench.prompts", "FIFO"),
    ("model-is-a-file", {"target.model": regular_file}, "target.model", "not a directory"),
    ("model-config-json-fifo", {"target.model": model_with_config_json(os.mkfifo)}, "target.model", "FIFO"),
    ("model-config-json-dir", {"target.model": model_with_config_json(Path.mkdir)}, "target.model", "a directory"),
    ("model-config-json-dev-zero", {"target.model": model_with_config_json(lambda p: os.symlink("/dev/zero", p))},
     "target.model", "character device"),
    ("engine-python-directory", {"engines.vllm.python": "/usr/bin"}, "engines.vllm.python", "a directory"),
    ("engine-python-not-executable", {"engines.speculators.python": not_executable}, "engines.speculators.python",
     "not executable"),
    ("drafter-config-fifo", {"bench.drafter": drafter_with_fifo_config}, "bench.drafter", "FIFO"),
    ("shm-dir-a-file", {"handoff.shm_dir": regular_file}, "handoff.shm_dir", "not a directory"),
]

MANAGED_FLAGS = [
    ("vllm-port", {"datagen.server.extra_args": ["--port", "18799"]}, "datagen.server.extra_args[0]",
     "datagen.server.port"),
    ("vllm-port-equals", {"bench.server.extra_args": ["--enforce-eager", "--port=18799"]},
     "bench.server.extra_args[1]", "bench.server.port"),
    ("vllm-port-abbreviated", {"extract.server.extra_args": ["--por", "1"]}, "extract.server.extra_args[0]",
     "extract.server.port"),
    ("vllm-host-equals", {"datagen.server.extra_args": ["--host=0.0.0.0"]}, "datagen.server.extra_args[0]",
     "datagen.server.host"),
    ("vllm-served-name", {"bench.server.extra_args": ["--served-model-name", "x"]}, "bench.server.extra_args[0]",
     "target.served_name"),
    ("vllm-served-name-underscores", {"datagen.server.extra_args": ["--served_model_name=x"]},
     "datagen.server.extra_args[0]", "target.served_name"),
    ("vllm-model", {"datagen.server.extra_args": ["--model", "/m"]}, "datagen.server.extra_args[0]", "target.model"),
    ("vllm-tp-short", {"datagen.server.extra_args": ["-tp", "2"]}, "datagen.server.extra_args[0]",
     "target.tensor_parallel_size"),
    ("vllm-tp-short-equals", {"bench.server.extra_args": ["-tp=2"]}, "bench.server.extra_args[0]",
     "target.tensor_parallel_size"),
    ("vllm-tp-long", {"extract.server.extra_args": ["--tensor-parallel-size", "2"]}, "extract.server.extra_args[0]",
     "target.tensor_parallel_size"),
    ("vllm-dp-short", {"datagen.server.extra_args": ["-dp", "2"]}, "datagen.server.extra_args[0]",
     "target.data_parallel_size"),
    ("vllm-dp-long", {"bench.server.extra_args": ["--data-parallel-size=2"]}, "bench.server.extra_args[0]",
     "target.data_parallel_size"),
    ("vllm-speculative-config", {"bench.server.extra_args": ["--speculative-config", '{"method": "eagle3"}']},
     "bench.server.extra_args[0]", "speculative"),
    ("vllm-speculative-config-dotted", {"bench.server.extra_args": ["--speculative-config.num_speculative_tokens=5"]},
     "bench.server.extra_args[0]", "speculative"),
    ("vllm-speculative-config-short", {"datagen.server.extra_args": ["-sc", "{}"]}, "datagen.server.extra_args[0]",
     "speculative"),
    ("vllm-api-key", {"datagen.server.extra_args": ["--api-key", "k"]}, "datagen.server.extra_args[0]",
     "datagen.server.api_key"),
    ("vllm-max-model-len", {"extract.server.extra_args": ["--max-model-len=2048"]}, "extract.server.extra_args[0]",
     "target.max_model_len"),
    ("vllm-flag-file", {"datagen.server.extra_args": ["--config", "flags.yaml"]}, "datagen.server.extra_args[0]",
     "flag file"),
    ("extract-kv-transfer", {"extract.server.extra_args": ["--kv-transfer-config", "{}"]},
     "extract.server.extra_args[0]", "hidden-state capture"),
    ("sglang-tp-size", {**SGLANG, "datagen.engine": "sglang", "datagen.server.extra_args": ["--tp-size", "2"]},
     "datagen.server.extra_args[0]", "target.tensor_parallel_size"),
    ("sglang-tp-abbreviated", {**SGLANG, "bench.engine": "sglang", "bench.server.extra_args": ["--tp", "2"]},
     "bench.server.extra_args[0]", "target.tensor_parallel_size"),
    ("sglang-model-path", {**SGLANG, "datagen.engine": "sglang", "datagen.server.extra_args": ["--model-path=/m"]},
     "datagen.server.extra_args[0]", "target.model"),
    ("sglang-context-length", {**SGLANG, "bench.engine": "sglang", "bench.server.extra_args": ["--context-length", "9"]},
     "bench.server.extra_args[0]", "target.max_model_len"),
    ("sglang-eagle", {**SGLANG, "bench.engine": "sglang", "bench.server.extra_args": ["--speculative-algorithm", "EAGLE"]},
     "bench.server.extra_args[0]", "speculative"),
    ("sglang-draft-model", {**SGLANG, "bench.engine": "sglang",
                            "bench.server.extra_args": ["--speculative-draft-model-path", "/d"]},
     "bench.server.extra_args[0]", "speculative"),
    ("sglang-port", {**SGLANG, "datagen.engine": "sglang", "datagen.server.extra_args": ["--port=30001"]},
     "datagen.server.extra_args[0]", "datagen.server.port"),
    ("train-save-path", {"train.extra_args": ["--save-path", "/tmp/x"]}, "train.extra_args[0]", "run_dir"),
    ("train-epochs", {"train.extra_args": ["--optimizer", "adamw", "--epochs=5"]}, "train.extra_args[2]", "train.epochs"),
    ("train-layer-ids", {"train.extra_args": ["--target-layer-ids", "1", "2"]}, "train.extra_args[0]",
     "extract.aux_layer_ids"),
    ("env-vllm-port", {"engines.vllm.env.VLLM_PORT": "18799"}, "engines.vllm.env.VLLM_PORT", "server.port"),
    ("env-vllm-api-key", {"engines.vllm.env.VLLM_API_KEY": "k"}, "engines.vllm.env.VLLM_API_KEY", "server.api_key"),
    ("env-cuda-visible-devices", {"engines.speculators.env.CUDA_VISIBLE_DEVICES": "0"},
     "engines.speculators.env.CUDA_VISIBLE_DEVICES", "gpus"),
    ("env-vllm-host-ip-remote", {"engines.vllm.env.VLLM_HOST_IP": "0.0.0.0"}, "engines.vllm.env.VLLM_HOST_IP",
     "allow_remote"),
    ("env-owner-token", {"engines.vllm.env.EAGLE3_OWNER_TOKEN": "x"}, "engines.vllm.env.EAGLE3_OWNER_TOKEN", "pack"),
    ("host-any", {"datagen.server.host": "0.0.0.0"}, "datagen.server.host", "allow_remote"),
    ("host-lan-address", {"bench.server.host": "192.168.1.5"}, "bench.server.host", "allow_remote"),
    ("host-name", {"extract.server.host": "gpu-node-1"}, "extract.server.host", "allow_remote"),
    ("host-ipv6-any", {"datagen.server.host": "::"}, "datagen.server.host", "hostname or an IPv4 address"),
    ("host-url", {"datagen.server.host": "http://127.0.0.1"}, "datagen.server.host", "hostname or an IPv4 address"),
]

BOUNDS = [
    ("dp-beyond-gpus", {"gpus": [0], "target.data_parallel_size": 2}, "target.data_parallel_size",
     "set it to at most 1"),
    ("tp-times-dp-beyond-gpus", {"gpus": [0, 1], "target.tensor_parallel_size": 2, "target.data_parallel_size": 2},
     "target.data_parallel_size", "need 4 GPUs"),
    ("deadline-below-grace", {"handoff.grace_s": 30, "handoff.deadline_s": 10}, "handoff.deadline_s", "grace_s (30 s)"),
    ("deadline-equals-grace", {"handoff.grace_s": 10, "handoff.deadline_s": 10}, "handoff.deadline_s", "grace_s"),
    ("deadline-below-default-grace", {"handoff": {"deadline_s": 5}}, "handoff.deadline_s", "grace_s (15 s)"),
    ("poll-beyond-deadline", {"handoff.poll_interval_s": 40}, "handoff.poll_interval_s", "deadline_s (30 s)"),
    ("poll-equals-deadline", {"handoff.poll_interval_s": 30}, "handoff.poll_interval_s", "deadline_s"),
]

UNREACHABLE = [
    ("api-key-newline", {"datagen.server.api_key": "s3cr3t\nX"}, "datagen.server.api_key", "HTTP header"),
    ("api-key-tab", {"bench.server.api_key": "s3cr3t\tX"}, "bench.server.api_key", "HTTP header"),
    ("api-key-non-ascii", {"extract.server.api_key": "s3cr3t-\u043a\u043b\u044e\u0447"}, "extract.server.api_key",
     "HTTP header"),
    ("api-key-padded", {"datagen.server.api_key": " s3cr3t "}, "datagen.server.api_key", "HTTP header"),
    ("nul-in-extra-args", {"datagen.server.extra_args": ["--x\0y"]}, "datagen.server.extra_args[0]", "NUL"),
    ("nul-in-env-value", {"engines.vllm.env.FOO": "a\0b"}, "engines.vllm.env.FOO", "NUL"),
    ("nul-in-path", {"datagen.prompts": "/tmp/a\0b"}, "datagen.prompts", "NUL"),
    ("nul-in-run-dir", {"run_dir": "/tmp/a\0b"}, "run_dir", "NUL"),
    ("huge-argument", {"train.extra_args": ["x" * 70_000]}, "train.extra_args[0]", "70000 characters"),
    ("env-name-with-dash", {"engines.vllm.env.BAD-NAME": "1"}, "engines.vllm.env", "environment variable name"),
    ("request-extra-inf", {"datagen.request_extra": {"x": float("inf")}}, "datagen.request_extra", "inf"),
]

# bench.schedule interleaved runs every benchmark server at once (baseline and k = 1, 3 here: 3 servers).
INTERLEAVED = {"bench.schedule": "interleaved"}
ON_GPU = {**INTERLEAVED, "gpus": [0]}
CAP = "bench.server.extra_args"
INTERLEAVED_CASES = [
    ("gpu-uncapped", ON_GPU, CAP, "add [--gpu-memory-utilization, '0.30']"),
    ("gpu-over-budget", {**ON_GPU, CAP: ["--gpu-memory-utilization", "0.5"]}, CAP, "1.50 of each GPU, over 0.9"),
    # 0.9 / 7 = 0.1286: the share offered is rounded down, or 7 servers of it would be refused in turn.
    ("gpu-uncapped-seven", {**ON_GPU, "bench.aa_twin": True, "bench.num_speculative_tokens": [1, 2, 3, 4, 5]}, CAP,
     "add [--gpu-memory-utilization, '0.12']"),
    ("gpu-cap-not-a-number", {**ON_GPU, CAP: ["--gpu-memory-utilization=lots"]}, CAP, "not a number"),
    ("sglang-uncapped", {**ON_GPU, **SGLANG, "bench.engine": "sglang"}, CAP, "--mem-fraction-static"),
    ("port-is-datagens", {**INTERLEAVED, "bench.server.port": 18600}, "bench.server.port",
     "k=1 on port 18601, which is also datagen.server.port"),
    ("port-is-handoffs", {**INTERLEAVED, "handoff.extra_ports": [18605]}, "bench.server.port",
     "k=3 on port 18605, which is also handoff.extra_ports"),
    ("ports-beyond-65535", {**INTERLEAVED, "bench.server.port": 65534}, "bench.server.port", "beyond 65535"),
    ("twin-without-interleaving", {"bench.aa_twin": True}, "bench.aa_twin", "set bench.schedule: interleaved"),
    ("twin-port-is-datagens", {**INTERLEAVED, "bench.aa_twin": True, "bench.server.port": 18598}, "bench.server.port",
     "the baseline's twin on port 18601, which is also datagen.server.port"),
    ("gpu-twin-over-budget", {**ON_GPU, "bench.aa_twin": True, CAP: ["--gpu-memory-utilization", "0.25"]}, CAP,
     "0.25 x 4 servers = 1.00 of each GPU"),
    ("max-windows-sequential", {"bench.max_windows": 8}, "bench.max_windows", "set bench.schedule: interleaved"),
    ("max-windows-below-windows", {**INTERLEAVED, "bench.windows": 5, "bench.max_windows": 4}, "bench.max_windows",
     "set it to at least 5"),
    ("max-windows-one-slot", {**INTERLEAVED, "bench.windows": 1, "bench.max_windows": 6}, "bench.windows",
     "set bench.windows to at least 2"),
    ("target-halfwidth-zero", {**INTERLEAVED, "bench.max_windows": 6, "bench.target_halfwidth_pct": 0},
     "bench.target_halfwidth_pct", "greater than 0"),
    ("side-by-side-sequential", {"bench.start_servers": "side_by_side"}, "bench.start_servers",
     "set bench.schedule: interleaved"),
    ("side-by-side-sglang", {**INTERLEAVED, **SGLANG, "bench.engine": "sglang", "bench.start_servers": "side_by_side"},
     "bench.start_servers", "set start_servers: one_by_one"),
    ("start-servers-unknown", {**INTERLEAVED, "bench.start_servers": "all_at_once"}, "bench.start_servers",
     "one_by_one"),
]

CLASSES = {"strict-scalar": STRICT_SCALARS, "run-dir": RUN_DIRS, "input-file": INPUT_FILES,
           "managed-flag": MANAGED_FLAGS, "bound": BOUNDS, "unreachable": UNREACHABLE,
           "interleaved": INTERLEAVED_CASES}
CASES = [(f"{cls}/{case[0]}", *case[1:]) for cls, cases in CLASSES.items() for case in cases]


@pytest.mark.parametrize("case,changes,field,says", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_the_field_and_nothing_starts(tmp_path, base, case, changes, field, says):
    output = refused(tmp_path, base, changes, field)
    assert says in output, f"{case}: message does not say {says!r}:\n{output}"
    assert "s3cr3t" not in output, "a message echoed the api_key"


def test_every_class_has_several_instances():
    assert all(len(cases) >= 5 for cases in CLASSES.values()), {k: len(v) for k, v in CLASSES.items()}


def refused(tmp_path: Path, base: dict, changes: dict, field: str) -> str:
    """Validate `base` with `changes`; assert exit 2 naming `field`, no traceback, no process
    started and the run dir neither created nor changed. Returns the output."""
    raw = copy.deepcopy(base)
    for dotted, value in changes.items():
        _set(raw, dotted, value(tmp_path) if callable(value) else value)
    run_dir = Path(os.path.expanduser(raw["run_dir"])) if isinstance(raw.get("run_dir"), str) else None
    before = _listing(run_dir), _children()
    code, output = validate(tmp_path, raw)
    assert code == 2, f"expected exit 2, got {code}\n{output}"
    assert field in output, f"message does not name {field!r}:\n{output}"
    assert "Traceback" not in output
    assert (_listing(run_dir), _children()) == before, "the run dir was created or changed, or a process started"
    return output


def _listing(path: Path | None):
    try:
        return sorted(os.listdir(path)) if path is not None else None
    except (OSError, ValueError) as e:
        return type(e).__name__


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_every_problem_is_listed_at_once(tmp_path, base):
    raw = copy.deepcopy(base)
    _set(raw, "datagen.server.port", 0)
    _set(raw, "train.epochs", 0)
    _set(raw, "bench.engine", "nope")
    code, output = validate(tmp_path, raw)
    assert code == 2
    for field in ("datagen.server.port", "train.epochs", "bench.engine"):
        assert field in output


@pytest.mark.parametrize("text,needle", [
    ("", "empty"),
    ("name: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "mapping"),
], ids=["empty-file", "bad-yaml", "list-top-level"])
def test_unparseable_files_exit_2(tmp_path, text, needle):
    code, output = validate(tmp_path, text)
    assert code == 2 and needle in output, output


def test_missing_file_exit_2(tmp_path):
    result = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "not found" in result.output


def test_relative_paths_resolve_against_the_config_file(tmp_path, base):
    sub = tmp_path / "sub"
    sub.mkdir()
    raw = copy.deepcopy(base)
    raw["run_dir"] = "runs/x"
    path = sub / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.run_dir == (sub / "runs" / "x").resolve()


def test_shell_metacharacters_stay_literal_strings(tmp_path, base):
    raw = copy.deepcopy(base)
    raw["datagen"]["server"]["extra_args"] = ["--chat-template", "$(touch /tmp/pwned); `id` | cat > x"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.datagen.server.extra_args[1] == "$(touch /tmp/pwned); `id` | cat > x"


def test_remote_bind_is_taken_only_when_explicit_and_warned_at_every_use(tmp_path, base):
    """allow_remote lets a server listen beyond loopback; every command that loads the config says
    so (run and the phase commands share `_load` with these), and the doctor reports a WARN."""
    raw = copy.deepcopy(base)
    raw["bench"]["server"].update(host="0.0.0.0", allow_remote=True)
    raw["engines"]["vllm"]["env"] = {**raw["engines"]["vllm"]["env"], "VLLM_HOST_IP": "10.0.0.7"}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    for command in (["validate"], ["train"], ["bench"], ["doctor", "--no-engines"]):
        result = runner.invoke(app, [command[0], str(path), *command[1:]])
        assert "Traceback" not in result.output and result.exit_code in (0, 1, 2), result.output
        assert "warning: bench.server.host is 0.0.0.0: the bench server is reachable from the network" in result.output
        assert "without an api_key" in result.output and "engines.vllm.env.VLLM_HOST_IP is '10.0.0.7'" in result.output
    assert result.exit_code == 1 and "WARN network-exposure" in result.output  # the doctor (no model weights here)
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    assert not (tmp_path / "run" / "train").exists() and not (tmp_path / "run" / "bench" / "servers").exists()


HOSTILE_VALUES = [True, False, "yes", 3.5, -1, 0, 10**30, float("nan"), "", "\x00", "x" * 70_000, [], {}, None,
                  "/", "[/x] $(id)", ["--port=1"], {"a": [1, {"b": None}]}]


def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node:
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    yield path


def test_any_value_in_any_field_is_taken_or_refused_never_a_crash(tmp_path, base):
    """Every field of a valid config (and every list item), set to each of a set of hostile values:
    parse_config returns or raises ConfigError with a bounded message; nothing else escapes."""
    from eagle3.config import parse_config
    from eagle3.errors import ConfigError

    tried = 0
    for path in [p for p in _leaves(base) if p]:
        for value in HOSTILE_VALUES:
            raw = copy.deepcopy(base)
            node = raw
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = copy.deepcopy(value)
            try:
                parse_config(raw, tmp_path)
            except ConfigError as e:
                assert len(str(e)) < 100_000, f"{path}={value!r:.40}: a {len(str(e))}-character message"
            tried += 1
    assert tried > 500 and not (tmp_path / "run").exists()


def test_allow_remote_leaves_the_fingerprints_alone(tmp_path, base):
    """It changes no output, so done markers written before the field existed (or with another
    value) still match: no phase is redone for it."""
    from eagle3.config import parse_config

    opened = copy.deepcopy(base)
    for section in ("datagen", "extract", "bench"):
        opened[section]["server"]["allow_remote"] = True
    a, b = parse_config(base, tmp_path), parse_config(opened, tmp_path)
    assert b.bench.server.allow_remote and not a.bench.server.allow_remote
    assert [a.fingerprint(p) for p in (None, "datagen", "extract", "bench")] == \
        [b.fingerprint(p) for p in (None, "datagen", "extract", "bench")]


def test_an_interleaved_schedule_claims_one_port_per_server_and_fits_the_gpu(make_config):
    """Capped within the budget, the interleaved schedule validates; its servers' ports (the baseline's,
    then one per k) are all the bench phase's, so a handoff and the preflight prove each free."""
    cfg = make_config({"gpus": [0], "bench": {"schedule": "interleaved", "server": {
        "port": 18700, "extra_args": ["--gpu-memory-utilization", "0.3"]}}}, check_files=False)
    assert cfg.bench.server_ports() == [18700, 18701, 18702]
    assert {18700, 18701, 18702} <= set(cfg.phase_ports("bench"))
    sequential = make_config({"bench": {"server": {"port": 18700}}}, check_files=False)
    assert sequential.bench.server_ports() == [18700] and 18701 not in sequential.phase_ports("bench")


def test_an_interleaved_round_starts_side_by_side_where_the_engine_takes_a_kv_cache_size(make_config):
    """bench.start_servers unset: side by side for vLLM (--kv-cache-memory-bytes), one by one for SGLang
    and for the sequential schedule; either choice leaves the bench fingerprint as it was."""
    interleaved = {"schedule": "interleaved"}
    vllm = make_config({"bench": interleaved}, check_files=False)
    assert vllm.bench.side_by_side()
    sglang = make_config({"engines": {"sglang": {"python": sys.executable}},
                          "bench": {**interleaved, "engine": "sglang"}}, check_files=False)
    assert not sglang.bench.side_by_side()
    assert not make_config({}, check_files=False).bench.side_by_side()
    chosen = make_config({"bench": {**interleaved, "start_servers": "one_by_one"}}, check_files=False)
    assert not chosen.bench.side_by_side()
    assert chosen.fingerprint("bench") == vllm.fingerprint("bench")


def test_data_parallel_copies_change_no_fingerprint_and_reach_each_engines_flag(make_config):
    """target.data_parallel_size: vLLM's --data-parallel-size, SGLang's --dp-size; how many copies serve is in
    no phase's fingerprint (like fan-out: where a phase ran, not what it produced)."""
    from eagle3.engines.sglang import ENGINE as SGLANG
    from eagle3.engines.vllm import ENGINE as VLLM

    one = make_config({}, check_files=False)
    two = make_config({"target": {"data_parallel_size": 2}}, check_files=False)
    assert [one.fingerprint(p) for p in (None, "datagen", "extract", "train", "bench")] == \
        [two.fingerprint(p) for p in (None, "datagen", "extract", "train", "bench")]
    env = two.engines.vllm
    argv = VLLM.serve_argv(env, two.target, two.datagen.server)
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert "--data-parallel-size" not in VLLM.serve_argv(env, one.target, one.datagen.server)
    sglang = SGLANG.serve_argv(env, two.target, two.datagen.server)
    assert sglang[sglang.index("--dp-size") + 1] == "2" and "--dp-size" not in SGLANG.serve_argv(
        env, one.target, one.datagen.server)


def test_the_extraction_engine_is_one_whose_module_says_it_extracts_hidden_states(make_config):
    from eagle3.errors import ConfigError

    assert make_config({}, check_files=False).extract.engine == "vllm"
    with pytest.raises(ConfigError) as err:
        make_config({"engines": {"sglang": {"python": sys.executable}}, "extract": {"engine": "sglang"}},
                    check_files=False)
    assert "extract.engine" in str(err.value) and "sglang cannot extract hidden states; use one that can: vllm" in str(err.value)
