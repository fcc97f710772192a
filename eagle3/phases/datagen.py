"""Phase 1: the target regenerates the answers of a prompt set, as input for `speculators prepare-data`.

Files in the phase dir (cfg.phase_dir("datagen")):
  samples.jsonl   one row per finished prompt, append-only, keyed by id:
                  {"id", "conversations": [...prompt turns, {"role": "assistant", "content"}], "meta": {...}}
                  `meta` keeps finish reason, reasoning text, token counts and the token ids the server
                  returned (vLLM: `return_token_ids`). Pass this file (not the dir: prepare-data would
                  also read the other JSON files there) to `speculators prepare-data --data`.
  failures.jsonl  one row per prompt that failed in a run: id, line, reason, HTTP status, attempts
  manifest.json   endpoint, model, content-affecting settings and config hash of the first run;
                  a resume with different settings is refused before any server starts
  summary.json    written only when a run ends normally (absent while a run is in flight or failed)
  logs/           the server log, when the phase started its own server

Resume: the rows of samples.jsonl are the only record of what is done; a torn last row is cut off,
finished ids are skipped, failed ones are tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..appendlog import AppendLog, recover
from ..config import PipelineConfig
from ..layout import DATAGEN_MANIFEST, SAMPLES
from ..slices import Shard
from .. import engine_registry
from ..engines.serving import base_url as server_url
from ..engines.serving import api_key, start_server
from ..errors import ConfigError, GateError, TransientError
from ..fsio import atomic_write_json, read_json
from ..openai_client import (EndpointConfigError, InvalidResponse, OpenAIClient, RequestRejected, RetriesExhausted, RetryPolicy)
from ..progress import PhaseProgress
from ..prompts import Prompt, PromptSet, load_prompts
from ..process.services import Process, Supervisor
from . import PhaseSummary
from .datagen_self_prompts import UserTurnWriter, texts_taken, unwritten, unwritten_prompts
from ..coroutines import run_coroutine

PHASE = "datagen"
SEED_POLICY = "seed + sha256(id)"  # recorded: per-id seeds keep a resumed row identical to an uninterrupted one
WATCH_S = 0.5
PROGRESS_EVERY_S = 0.1

log = logging.getLogger("eagle3.datagen")
@dataclass(frozen=True)
class DatagenPaths:
    dir: Path

    @property
    def samples(self) -> Path:
        return self.dir / SAMPLES

    @property
    def failures(self) -> Path:
        return self.dir / "failures.jsonl"

    @property
    def manifest(self) -> Path:
        return self.dir / DATAGEN_MANIFEST

    @property
    def summary(self) -> Path:
        return self.dir / "summary.json"

    @classmethod
    def of(cls, cfg: PipelineConfig) -> "DatagenPaths":
        return cls(cfg.phase_dir(PHASE))


@dataclass
class DatagenSummary:
    samples: int            # finished rows of the prompt set in samples.jsonl (resumed + new)
    total: int              # prompts in the set
    new_samples: int        # written by this run
    resumed: int            # already done when this run began
    failed: int             # prompts that failed in this run (reasons in failures.jsonl)
    invalid_prompts: int    # malformed rows skipped (only with datagen.skip_invalid_prompts)
    prompt_tokens: int      # this run
    completion_tokens: int  # this run
    retries: int            # transient errors retried in this run
    generation_s: float
    elapsed_s: float        # including the server start
    output_tok_s: float     # completion tokens / generation seconds
    endpoint: str
    model: str
    output: str

    @property
    def complete(self) -> bool:
        return self.samples == self.total


# ---- settings a resume must match ----------------------------------------------------------------

def content_settings(cfg: PipelineConfig, prompts: PromptSet) -> dict[str, Any]:
    """What decides the generated text. Concurrency, timeouts, port and max_samples do not: they
    may change between runs (a larger max_samples extends the set)."""
    d = cfg.datagen
    return {
        "engine": d.engine,
        "model": str(cfg.target.model),
        "served_name": cfg.target.served_name,
        "dtype": cfg.target.dtype,
        "sampling": d.sampling.model_dump(mode="json"),
        "seed_policy": SEED_POLICY,
        "request_extra": d.request_extra,
        "return_token_ids": engine_registry.get(d.engine).returns_token_ids,
        "prompts_sha256": prompts.sha256,
        # only when set: manifests written before self_prompts existed still match
        **({"self_prompts": d.self_prompts.model_dump(mode="json", exclude={"count"})} if d.self_prompts else {}),
    }


def datagen_prompts(cfg: PipelineConfig) -> PromptSet:
    """The phase's prompts: the set's first datagen.max_samples, then the ones the target is to write
    (datagen.self_prompts), which a count that grows extends like a larger max_samples."""
    d = cfg.datagen
    prompts = load_prompts(d.prompts, d.max_samples, skip_invalid=d.skip_invalid_prompts)
    if d.self_prompts:
        prompts = replace(prompts, prompts=prompts.prompts + unwritten_prompts(d.self_prompts.count))
    return prompts


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_manifest(paths: DatagenPaths, settings: dict) -> None:
    """Refuse to add rows made with other settings to rows already there."""
    manifest = read_json(paths.manifest)
    if manifest is None:
        if paths.samples.exists() and paths.samples.stat().st_size > 0:
            raise ConfigError(f"{paths.samples} exists but {paths.manifest} does not, so the settings its rows were "
                              f"made with are unknown; delete {paths.dir} to start over, or restore the manifest")
        return
    old, new = _flatten(manifest.get("settings", {})), _flatten(settings)
    diffs = [f"  {key}: was {old.get(key)!r}, now {new.get(key)!r}"
             for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    if diffs:
        raise ConfigError(
            f"{paths.manifest}: refusing to resume: the data in {paths.dir} was generated with other settings, "
            "and mixing them would give an inconsistent training set:\n" + "\n".join(diffs) +
            f"\nFix: restore those settings, or give the pipeline a new run_dir, or delete {paths.dir} to regenerate.")


def _write_manifest(paths: DatagenPaths, cfg: PipelineConfig, prompts: PromptSet, settings: dict,
                    endpoint: str, server_models: list[str]) -> None:
    if paths.manifest.exists():
        return
    atomic_write_json(paths.manifest, {
        "phase": PHASE,
        "created_at": time.time(),
        "endpoint": endpoint,
        "server_models": server_models,
        "prompts_path": str(prompts.path),
        "config_hash": cfg.fingerprint(PHASE),
        "settings": settings,
    })


# ---- requests and rows -----------------------------------------------------------------------------

def build_payload(cfg: PipelineConfig, prompt: Prompt) -> dict[str, Any]:
    d, s = cfg.datagen, cfg.datagen.sampling
    # Sampling is always explicit: vLLM otherwise takes defaults from the model's generation_config.json.
    payload: dict[str, Any] = {**d.request_extra, "model": cfg.target.served_name, "messages": list(prompt.messages),
                               "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
    if s.seed is not None:
        payload["seed"] = s.seed_for(prompt.id)
    if engine_registry.get(d.engine).returns_token_ids:
        payload["return_token_ids"] = True
    return payload


def sample_row(prompt: Prompt, result) -> dict[str, Any]:
    # Fixed types in every row (no nulls), so an Arrow reader infers one schema for the whole file.
    return {
        "id": prompt.id,
        "conversations": [*prompt.messages, {"role": "assistant", "content": result.content}],
        "meta": {
            "line": prompt.line,
            "finish_reason": result.finish_reason,
            "reasoning": result.reasoning,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "prompt_token_ids": list(result.prompt_token_ids or []),
            "token_ids": list(result.token_ids or []),
        },
    }


# ---- the run -------------------------------------------------------------------------------------

@dataclass
class _Stats:
    new: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    generation_s: float = 0.0
    t0: float = 0.0  # monotonic start of generation


class _Progress:
    def __init__(self, fn: PhaseProgress, total: int):
        self.fn, self.total, self._last = fn, total, 0.0

    def __call__(self, done: int, force: bool = False, stats: _Stats | None = None) -> None:
        now = time.monotonic()
        if force or now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            detail = {}
            if stats is not None and stats.t0 and now > stats.t0:
                detail = {"tok_s": round(stats.completion_tokens / (now - stats.t0), 1), "failed": stats.failed}
            self.fn(done, self.total, **detail)


async def _generate(cfg: PipelineConfig, url: str, todo: list[Prompt], done_before: int, paths: DatagenPaths,
                    progress: _Progress, proc: Process | None, on_connected: Callable[[list[str]], None],
                    stats: _Stats, writer: UserTurnWriter | None) -> None:
    d = cfg.datagen
    # The pack's own server demands the run's key; a server given by --base-url, only what is configured.
    key = d.server.key("datagen.server") if proc is None else api_key(cfg, d.server, "datagen.server")
    breaker = max(4, d.concurrency)  # this many failed prompts in a row: the endpoint, not the prompts, is broken
    client = OpenAIClient(url, api_key=key, connect_timeout_s=d.connect_timeout_s, read_timeout_s=d.request_timeout_s,
                          max_connections=d.concurrency, retry=RetryPolicy(max_retries=d.max_retries),
                          on_retry=lambda n, why: log.warning("retry %d: %s", n, why))
    async with client:
        models = [m.get("id", "") for m in await client.list_models()]
        if cfg.target.served_name not in models:
            raise EndpointConfigError(f"{url} serves {models}, not target.served_name {cfg.target.served_name!r}; "
                                      "point datagen at the target's server or fix target.served_name", 404)
        on_connected(models)
        pending = iter(todo)
        consecutive_failures = 0
        t0 = stats.t0 = time.monotonic()

        with AppendLog(paths.samples, d.fsync_every) as out, AppendLog(paths.failures, 1) as failures:
            def fail(prompt: Prompt, err: Exception, status: int | None, attempts: int, transient: bool) -> None:
                nonlocal consecutive_failures
                failures.append({"id": prompt.id, "line": prompt.line, "reason": f"{type(err).__name__}: {err}",
                                 "status": status, "attempts": attempts, "at": time.time()})
                stats.failed += 1
                log.warning("prompt %s (line %d) failed: %s", prompt.id, prompt.line, err)
                # Only transient failures point at the endpoint; a rejected prompt says nothing about it.
                consecutive_failures = consecutive_failures + 1 if transient else 0
                if consecutive_failures >= breaker:
                    raise TransientError(f"{consecutive_failures} prompts in a row failed at {url} (last: {err}); "
                                         "the endpoint is unhealthy; a rerun resumes")

            async def worker() -> None:
                nonlocal consecutive_failures
                for prompt in pending:  # one shared iterator: each prompt goes to exactly one worker
                    try:
                        prompt = await writer.write(client, prompt) if unwritten(prompt) else prompt
                        result = await client.chat(build_payload(cfg, prompt))
                    except RequestRejected as e:
                        fail(prompt, e, e.status, 1, transient=False)
                    except InvalidResponse as e:
                        fail(prompt, e, None, 1, transient=False)
                    except RetriesExhausted as e:
                        if e.kind == "connection":
                            raise  # the server is gone, not this prompt: stop the run (retryable)
                        fail(prompt, e, e.status, e.attempts, transient=True)
                    else:
                        consecutive_failures = 0
                        out.append(sample_row(prompt, result))
                        stats.new += 1
                        stats.prompt_tokens += result.prompt_tokens
                        stats.completion_tokens += result.completion_tokens
                    progress(done_before + stats.new + stats.failed, stats=stats)

            async def watch_server() -> None:
                while True:
                    if proc.poll() is not None:
                        proc.check_alive()  # stops what is left of its group, raises ServiceExited (retryable)
                    await asyncio.sleep(WATCH_S)

            workers = [asyncio.create_task(worker()) for _ in range(min(d.concurrency, len(todo)))]
            watcher = asyncio.create_task(watch_server()) if proc is not None else None
            try:
                waiting = set(workers) | ({watcher} if watcher else set())
                while any(not w.done() for w in workers):
                    finished, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    for task in finished:
                        if task.exception() is not None:
                            raise task.exception()
            except BaseException:
                if proc is not None and proc.poll() is not None:
                    proc.check_alive()  # a dead server explains the failure better than the client error
                raise
            finally:
                for task in [*workers, *([watcher] if watcher else [])]:
                    task.cancel()
                await asyncio.gather(*workers, *([watcher] if watcher else []), return_exceptions=True)
                stats.retries = client.retries
                stats.generation_s = time.monotonic() - t0


def run_datagen(cfg: PipelineConfig, sup: Supervisor | None,
                base_url: str | None = None, shard: tuple[int, int] | None = None) -> PhaseSummary:
    """Generate (or finish generating) the phase's samples; returns the summary (details: the
    DatagenSummary, also written to summary.json).

    Without `base_url` the configured engine's server is started under `sup` and always stopped
    before returning, also on error. With `base_url` an already running server is used (sup may be None).
    Progress (to the event bus) as prompts finish, at most every 0.1 s and once at the end.
    The caller holds the phase lock (eagle3.phases.phase_lock).
    Raises ConfigError (bad prompts, settings differ from the manifest, wrong model/key),
    or a retryable error (server died, endpoint unreachable): a rerun resumes."""
    t_start = time.monotonic()
    paths = DatagenPaths.of(cfg)
    paths.dir.mkdir(parents=True, exist_ok=True)
    d = cfg.datagen
    prompts = datagen_prompts(cfg)
    if shard is not None:
        prompts = replace(prompts, prompts=Shard(PHASE, *shard).take(prompts.prompts))
    for problem in prompts.problems:
        log.warning("skipped malformed prompt row: %s", problem)
    settings = content_settings(cfg, prompts)
    check_manifest(paths, settings)

    wanted = set(prompts.ids)
    done_rows = recover(paths.samples)
    done_ids = {row.get("id") for row in done_rows} & wanted
    recover(paths.failures)
    todo = [p for p in prompts.prompts if p.id not in done_ids]
    writer = UserTurnWriter(cfg, texts_taken(cfg, done_rows)) if any(map(unwritten, todo)) else None
    report = PhaseProgress(PHASE, unit="samples")
    progress = _Progress(report, len(prompts.prompts))
    progress(len(done_ids), force=True)
    stats = _Stats()
    endpoint = base_url or server_url(d.server)

    if todo:
        paths.summary.unlink(missing_ok=True)  # a summary means "the last run ended normally"
        proc = None
        if base_url is None:
            if sup is None:
                raise ValueError("run_datagen needs a Supervisor to start its server (or a base_url)")
            proc = start_server(sup, cfg, PHASE, d.engine, d.server)
        report.step(f"generating {len(todo)} of {len(prompts.prompts)} samples at {endpoint} "
                    f"(concurrency {d.concurrency})")
        try:
            run_coroutine(_generate(cfg, endpoint, todo, len(done_ids), paths, progress, proc,
                           lambda models: _write_manifest(paths, cfg, prompts, settings, endpoint, models), stats,
                           writer))
        finally:
            if proc is not None:
                proc.stop()

    progress(len(done_ids) + stats.new + stats.failed, force=True, stats=stats)
    return _finish(cfg, paths, prompts, len(done_ids), stats, endpoint, t_start)


def failed_prompts_gate(cfg: PipelineConfig, paths: DatagenPaths, summary: DatagenSummary, where: str) -> None:
    """GateError when more prompts than datagen.max_failed_fraction allows have no sample (after
    summary.json is written: it says what there is)."""
    missing, allowed = summary.total - summary.samples, cfg.datagen.max_failed_fraction
    if missing > allowed * summary.total:
        raise GateError(f"{missing} of {summary.total} prompts have no sample{where} (allowed: "
                        f"datagen.max_failed_fraction = {allowed}); reasons in {paths.failures}. A rerun retries "
                        "only those prompts.")


def _finish(cfg: PipelineConfig, paths: DatagenPaths, prompts: PromptSet, resumed: int, stats: _Stats,
            endpoint: str, t_start: float) -> PhaseSummary:
    """Write summary.json, then apply the failed-prompts gate."""
    summary = DatagenSummary(
        samples=resumed + stats.new, total=len(prompts.prompts), new_samples=stats.new, resumed=resumed,
        failed=stats.failed, invalid_prompts=len(prompts.problems), prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.completion_tokens, retries=stats.retries,
        generation_s=round(stats.generation_s, 3), elapsed_s=round(time.monotonic() - t_start, 3),
        output_tok_s=round(stats.completion_tokens / stats.generation_s, 2) if stats.generation_s > 0 else 0.0,
        endpoint=endpoint, model=cfg.target.served_name, output=str(paths.samples))
    details = {**asdict(summary), "complete": summary.complete}
    atomic_write_json(paths.summary, details)
    failed_prompts_gate(cfg, paths, summary, "")
    return PhaseSummary(summary.output, (
        f"{summary.samples}/{summary.total} samples ({summary.new_samples} new, {summary.resumed} resumed, "
        f"{summary.failed} failed), {summary.completion_tokens} tokens at {summary.output_tok_s:.1f} tok/s, "
        f"{summary.retries} retries -> {summary.output}"), details)
