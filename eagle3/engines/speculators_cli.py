"""Command lines of the speculators CLI (0.9), one builder per subcommand.

Pure functions from explicit arguments to argv lists; running them is the supervised-services
layer's job. The flags' traps are in docs/FACTS.md §1.
"""

from __future__ import annotations

from pathlib import Path

from ..config import EngineEnv

# ---- prepare-data ------------------------------------------------------------------------------


def prepare_data_argv(env: EngineEnv, model: Path, data: Path, output: Path, seq_length: int,
                      render_endpoint: str, workers: int = 1, seed: int = 0, token_freq: bool = True,
                      trust_remote_code: bool = False) -> list[str]:
    """Render chat rows through the server's /v1/chat/completions/render and tokenize them.

    `render_endpoint` is the server's base URL WITHOUT /v1 (prepare-data appends the route; with
    /v1 it gets 404s), and the server must run with --enable-scale-out (else 403 and "No samples
    remain after preprocessing"). prepare-data skips its work when `output` already holds .arrow
    files, so callers give it a fresh directory. `token_freq` writes output/token_freq.pt, which
    training needs for a reduced draft vocabulary (0.9 skips it by default)."""
    argv = [*env.script_argv("speculators"), "prepare-data",
            "--model", str(model),
            "--data", str(data),
            "--output", str(output),
            "--seq-length", str(seq_length),
            "--render-endpoint", render_endpoint.rstrip("/"),
            "--num-preprocessing-workers", str(workers),
            "--seed", str(seed),
            "--no-skip-token-freq" if token_freq else "--skip-token-freq"]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return argv


# ---- generate-offline-data ---------------------------------------------------------------------


def generate_offline_data_argv(env: EngineEnv, endpoint: str, preprocessed: Path, output: Path, concurrency: int,
                               served_name: str | None = None, validate: bool = True,
                               request_timeout_s: float | None = None, max_retries: int | None = None,
                               world: tuple[int, int] | None = None) -> list[str]:
    """Send each prepared sample to an extract-hidden-states vLLM server; write output/hs_{i}.safetensors.

    `endpoint` is the OpenAI base URL WITH /v1. `served_name` makes the client refuse a server that
    serves another model (it must be the served name, not the model path). --fail-on-error: a
    sample that fails after retries aborts the run (default would skip it silently and leave a
    hole that only training notices). Existing readable hs files are skipped (resume). `world=(rank,
    size)`: only rank's contiguous part of the prepared rows (a shard on one node of several)."""
    argv = [*env.script_argv("speculators"), "generate-offline-data",
            "--endpoint", endpoint.rstrip("/"),
            "--preprocessed-data", str(preprocessed),
            "--output", str(output),
            "--concurrency", str(concurrency),
            "--fail-on-error"]
    if served_name:
        argv += ["--model", served_name]
    if validate:
        argv.append("--validate-outputs")  # reload each new file: token ids, length, finite values
    if request_timeout_s is not None:
        argv += ["--request-timeout", str(request_timeout_s)]
    if max_retries is not None:
        argv += ["--max-retries", str(max_retries)]
    if world is not None:
        argv += ["--world-size", str(world[1]), "--rank", str(world[0])]
    return argv


# ---- train -------------------------------------------------------------------------------------


# speculators train validates on the prepared dataset's last rows, in prepare-data's (shuffled) order:
# rows [int(n * ratio), n) with --train-data-ratio, 0.9 unless given (0.9.0's schema default).
TRAIN_DATA_RATIO = 0.9


def validation_rows(num_rows: int, train_data_ratio: str | None = None) -> range:
    """The prepared rows the trainer measures its validation accuracy on; `train_data_ratio`: the
    --train-data-ratio a user gave the trainer (train.extra_args), if any."""
    try:
        ratio = float(train_data_ratio) if train_data_ratio is not None else TRAIN_DATA_RATIO
    except ValueError:
        ratio = TRAIN_DATA_RATIO  # the trainer refuses such a value itself, before it validates anything
    return range(int(num_rows * ratio), num_rows)


def train_argv(env: EngineEnv, *, target: Path, data_path: Path, hidden_states_path: Path, save_path: Path,
               target_layer_ids: list[int], epochs: int, lr: float, total_seq_len: int,
               draft_vocab_size: int | None, ttt_steps: int, hidden_states_dtype: str, dry_run: bool,
               nproc: int = 1, trust_remote_code: bool = False, extra_args: list[str] = (),
               vllm_endpoint: str | None = None) -> list[str]:
    """`speculators train` (one process) or `torchrun -m speculators.train` (one process per GPU).

    `target_layer_ids` are the extraction's aux ids WITHOUT the last layer (vllm convention).
    --on-missing raise: a sample without hidden states is an error, never a request to a server
    that is not there. Resume is the trainer's default (latest integer epoch dir under save_path;
    the phase deals with interrupted/). `ttt_steps` also sets the checkpoint's proposal length.
    `extra_args` come last, so they override what is set here. With `vllm_endpoint` (online mode):
    --on-missing generate, so each sample's hidden states are requested from that extraction server,
    written by it under `hidden_states_path` and deleted by the trainer once loaded."""
    args = ["--speculator-type", "eagle3",
            "--verifier-name-or-path", str(target),
            "--data-path", str(data_path),
            "--hidden-states-path", str(hidden_states_path),
            "--save-path", str(save_path),
            *(["--on-missing", "generate", "--vllm-endpoint", vllm_endpoint] if vllm_endpoint else
              ["--on-missing", "raise"]),
            "--target-layer-ids", *map(str, target_layer_ids),
            "--epochs", str(epochs),
            "--lr", repr(float(lr)),
            "--total-seq-len", str(total_seq_len),
            "--ttt-steps", str(ttt_steps),
            "--hidden-states-dtype", hidden_states_dtype]
    if draft_vocab_size is not None:
        args += ["--draft-vocab-size", str(draft_vocab_size)]
    if trust_remote_code:
        args.append("--trust-remote-code")
    if dry_run:
        args.append("--dry-run")
    args += list(extra_args)
    if nproc > 1 and not dry_run:
        return [*env.script_argv("torchrun"), "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
                "-m", "speculators.train", *args]
    return [*env.script_argv("speculators"), "train", *args]
