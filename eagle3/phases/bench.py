"""Phase 4: speculative-decoding benchmark of the trained drafter against the no-speculation baseline.

One server after another on the same GPUs: the target alone (baseline), then target + drafter for
each k in bench.num_speculative_tokens, with the core GPU handoff between two servers. On each
server: a warm-up outside the measured windows, then one run of the engine's own load generator
(`vllm bench serve` / SGLang's bench_serving) per concurrency on held-out prompts, with the
server's spec-decode counters scraped right before and right after each run; the deltas are
the window's acceptance (eagle3/engines/metrics.py). vLLM's client runs all windows of a server
in one process, started together with the server (eagle3/engines/loadgen.py).

Files in the phase dir (cfg.phase_dir("bench")):
  results.json      everything of this run (schema below); also copied to
                    <run_dir>/bench-history/<UTC timestamp>.json, outside the phase dir (a forced
                    rerun wipes the phase dir; the history accumulates across scheduled reruns)
  report.md         markdown summary (`eagle3 run` prints it at the end), with the serve-parity gate,
                    acceptance per prompt category and the comparison with the history (benchwatch)
  bench.png         throughput and TPOT vs concurrency, per-position acceptance
  trend.md/.png     acceptance length and speedup per k over every run in bench-history/
  prompts.jsonl     the held-out prompts, in the load generator's dataset format (.json for SGLang)
  servers/<x>.json  one record per finished server; a retried run reuses those whose settings match
  clients/          the load generator's raw result files;  logs/  server and client logs
  client-jobs/      the windows handed to vLLM's client process (one <n>.json + <n>.rc each)

results.json: schema, pipeline, created_at, config_hash, bench_config_hash, pack_version, engine,
engine_version, bench_client, acceptance_source, target, gpus, drafter {path, trained, status,
source, aux_layer_ids, ...}, prompts, sampling, servers [{label, k, startup_s, engine_version,
counters_at_ready, warmup, windows [{concurrency, load, counters_before, counters_after, delta,
acceptance, client_spec}], probes [{name, kind, count, ids, window}], counters_at_stop}], table, best_k,
acceptance_by_k, gate, parity, categories, watch, platform, notes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .. import __version__, benchwatch, progress
from ..benchgates import category_table, evaluate_parity, parity_error_text
from ..benchmath import best_k, evaluate_gate, gate_error_text, pooled_acceptance, table
from ..benchsetup import drafter_checksum, platform
from ..benchtrend import write_trend
from ..config import PipelineConfig, num_hidden_layers
from ..engines import benchclient, loadgen
from ..engines.drafter_formats import PROVENANCE
from ..engines.drafters import drafter_aux_ids
from ..engines.metrics import SpecCounters, Traffic, acceptance, engine_version, scrape_vllm_all, sglang_accept_length
from ..engines.serving import api_key, base_url, start_server
from ..engines.speculative import acceptance_source, spec_args
from ..errors import CommandFailed, ConfigError, GateError, TransientError
from ..fsio import atomic_write_json, read_input_json, read_json
from ..layout import BENCH_REPORT, BENCH_RESULTS, RunLayout
from ..openai_client import OpenAIClient, RetryPolicy
from ..progress import PhaseProgress
from ..prompts import load_prompts
from ..promptsets import load_prompt_set
from ..report import write_report
from ..process.services import Process, Supervisor
from . import PhaseSummary, ProgressFn, run_coroutine
from .train_manifest import read_train_manifest

PHASE = "bench"
SCHEMA = 1
WINDOW_ATTEMPTS = 3  # measurements of one window before foreign traffic fails the phase

log = logging.getLogger("eagle3.bench")

@dataclass(frozen=True)
class BenchPaths:
    dir: Path
    history: Path

    @classmethod
    def of(cls, cfg: PipelineConfig) -> "BenchPaths":
        return cls(cfg.phase_dir(PHASE), RunLayout(cfg.run_dir).bench_history)

    results = property(lambda self: self.dir / BENCH_RESULTS)
    report = property(lambda self: self.dir / BENCH_REPORT)
    plot = property(lambda self: self.dir / "bench.png")
    trend = property(lambda self: self.dir / "trend.md")
    trend_plot = property(lambda self: self.dir / "trend.png")
    servers = property(lambda self: self.dir / "servers")
    clients = property(lambda self: self.dir / "clients")
    logs = property(lambda self: self.dir / "logs")


def _slug(label: str) -> str:
    return label.replace("=", "")  # "k=3" -> "k3": file names and Prefect keys


# ---- inputs --------------------------------------------------------------------------------------

def resolve_drafter(cfg: PipelineConfig) -> dict:
    """Which drafter to serve and whether it is trained: bench.drafter if set, else the train
    phase's manifest (a dry-run checkpoint there is trained: false)."""
    b = cfg.bench
    if b.drafter is not None:
        if not (b.drafter / "config.json").is_file():
            raise ConfigError(f"bench.drafter: {str(b.drafter)!r} has no config.json; point it at a drafter checkpoint")
        return {"path": str(b.drafter), "trained": b.drafter_trained, "source": "bench.drafter (config)",
                "status": "TRAINED (as declared by bench.drafter_trained)" if b.drafter_trained else "UNTRAINED",
                "aux_layer_ids": drafter_aux_ids(b.drafter), "aux_layer_ids_convention": None,
                "train_manifest": None, "data": (read_input_json(b.drafter / PROVENANCE) or {}).get("data")}
    m = read_train_manifest(cfg)
    path = Path(m["checkpoint"])
    if m.get("engine") not in (None, b.engine):
        raise ConfigError(f"{cfg.layout.train_manifest}: the drafter was gated and exported for {m['engine']!r}, but "
                          f"bench.engine is {b.engine!r}; rerun the train phase (`eagle3 run --from train`)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{cfg.layout.train_manifest}: checkpoint {str(path)!r} is missing; rerun the train phase")
    return {"path": str(path), "trained": bool(m["trained"]), "source": "train manifest", "status": m.get("status"),
            "aux_layer_ids": m.get("aux_layer_ids"), "aux_layer_ids_convention": m.get("aux_layer_ids_convention"),
            "aux_layer_ids_vllm": m.get("aux_layer_ids_vllm"), "config_aux_layer_ids": drafter_aux_ids(path),
            "train_manifest": str(cfg.layout.train_manifest), "val_full_acc": m.get("val_full_acc"),
            "data": m.get("data")}


def parity_expectation(cfg: PipelineConfig, drafter: dict) -> tuple[list[float] | None, str | None]:
    """What training measured (per-position validation accuracy), and where that figure comes from."""
    if cfg.bench.parity.expected_full_acc:
        return list(cfg.bench.parity.expected_full_acc), "bench.parity.expected_full_acc (config)"
    if drafter.get("val_full_acc"):
        return list(drafter["val_full_acc"]), f"{drafter['train_manifest']} (val_full_acc from the trainer's log)"
    return None, None


def training_prompts(cfg: PipelineConfig) -> list:
    """A sample (bench.parity.prompts) of the prompts the drafter was trained on: rows spread evenly
    over those of datagen.prompts that data generation used (acceptance differs a lot between
    families of prompts: rows next to each other are often one family)."""
    d = cfg.datagen
    ps = load_prompts(d.prompts, None, skip_invalid=d.skip_invalid_prompts)
    used = _datagen_ids(cfg)
    if used is None:
        used = {p.id for p in ps.prompts[: d.max_samples]} if d.max_samples else set(ps.ids)
    rows = [p for p in ps.prompts if p.id in used]
    n = min(cfg.bench.parity.prompts, len(rows))
    return [rows[i * len(rows) // n] for i in range(n)]


def _datagen_ids(cfg: PipelineConfig) -> set[str] | None:
    """Ids data generation wrote (None if it has no samples file). Read-only and tolerant of a
    torn last row: this phase must never modify phase 1's files."""
    try:
        data = cfg.layout.samples.read_bytes()
    except FileNotFoundError:
        return None
    ids = set()
    for line in data.split(b"\n"):
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            continue
    return ids


def held_out_prompts(cfg: PipelineConfig) -> dict:
    """The benchmark prompts: bench.prompts if set, else the rows of datagen.prompts that phase 1
    did not generate from (prompts the drafter never trained on). Returns texts (the last user
    turn of each row: the load generators send one user message) plus provenance."""
    b = cfg.bench
    if b.prompts is not None:
        ps, selection = load_prompt_set(b.prompts), "bench.prompts"
        rows = ps.prompts
    else:
        d = cfg.datagen
        ps = load_prompts(d.prompts, None, skip_invalid=d.skip_invalid_prompts)
        used = _datagen_ids(cfg)
        if used is None:  # phase 1's output is gone: hold out what it would have taken
            used = {p.id for p in ps.prompts[: d.max_samples]} if d.max_samples else set(ps.ids)
        rows = [p for p in ps.prompts if p.id not in used]
        selection = f"held out: not among the {len(used)} prompts data generation used"
        if not rows:
            raise ConfigError(f"bench: no held-out prompts: data generation used all {len(ps.prompts)} rows of "
                              f"{d.prompts}; lower datagen.max_samples below the prompt count, or give a separate "
                              "benchmark prompt set in bench.prompts")
    need = b.num_prompts + b.warmup_prompts
    measured, spare = rows[: b.num_prompts], rows[b.num_prompts: need]
    texts = [p.messages[-1]["content"] for p in measured]
    return {"path": str(ps.path), "selection": selection, "count": len(texts), "requested": b.num_prompts,
            "ids": [p.id for p in measured], "texts": texts,
            # Warm-up uses other prompts than the measured ones where there are enough, so the
            # measured prefills do not all hit vLLM's prefix cache.
            "warmup_texts": [p.messages[-1]["content"] for p in spare] or texts,
            "multi_turn_reduced": sum(1 for p in measured if len(p.messages) > 1),
            "categories": [p.category for p in measured],
            "sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest()}


# ---- one server ----------------------------------------------------------------------------------

def _headers(cfg: PipelineConfig) -> dict[str, str]:
    key = api_key(cfg, cfg.bench.server, "bench.server")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _snapshot(cfg: PipelineConfig, url: str, k: int) -> tuple[SpecCounters | None, Traffic | None]:
    """vLLM: (spec-decode counters or None for the baseline, traffic counters). SGLang: (None, None)."""
    if cfg.bench.engine != "vllm":
        return None, None
    spec, traffic = scrape_vllm_all(url, cfg.target.served_name, _headers(cfg))
    if k and spec is None:
        # The drafter is configured, yet the server counts no speculation: it is not speculating.
        raise ConfigError(f"{url}/metrics has no vllm:spec_decode_* counters although the server was started with "
                          "a speculative config; check the server log for how it parsed --speculative-config")
    return spec, traffic


def foreign_traffic(load: benchclient.LoadResult, served: Traffic) -> str | None:
    """Why the server's own counts over a window do not match the load generator's requests
    (someone else used the server meanwhile), or None when the window holds exactly them."""
    if not load.completed <= served.requests <= load.completed + load.failed:
        return (f"the server finished {served.requests} requests, the load generator {load.completed} "
                f"(+{load.failed} failed)")
    if not load.failed and served.generation_tokens != load.total_output_tokens:
        return (f"the server generated {served.generation_tokens} tokens, the load generator received "
                f"{load.total_output_tokens}")
    return None


def _warmup(cfg: PipelineConfig, url: str, texts: list[str]) -> dict:
    """A few chat requests with the benchmark's sampling, so one-time costs (first allocations,
    graph/kernel warm-up) fall outside the measured windows."""
    b = cfg.bench
    todo = [texts[i % len(texts)] for i in range(b.warmup_prompts)]
    if not todo:
        return {"requests": 0, "seconds": 0.0}
    key = api_key(cfg, b.server, "bench.server")

    async def go() -> None:
        async with OpenAIClient(url, api_key=key, max_connections=max(b.concurrency),
                                retry=RetryPolicy(max_retries=2)) as client:
            sem = asyncio.Semaphore(max(b.concurrency))

            async def one(text: str) -> None:
                async with sem:
                    payload = {"model": cfg.target.served_name, "messages": [{"role": "user", "content": text}],
                               "max_tokens": b.max_tokens, "temperature": b.temperature}
                    if b.ignore_eos:
                        payload["ignore_eos"] = True
                    await client.chat(payload)

            await asyncio.gather(*(one(t) for t in todo))

    t0 = time.monotonic()
    run_coroutine(go())
    return {"requests": len(todo), "seconds": round(time.monotonic() - t0, 3)}


def _open_client(cfg: PipelineConfig, sup: Supervisor, paths: BenchPaths, label: str):
    """The load generator for one server's windows (vLLM: started now, importing while the server starts)."""
    b = cfg.bench
    env = dict(getattr(cfg.engines, b.engine).env)
    env["OPENAI_API_KEY"] = api_key(cfg, b.server, "bench.server")  # both clients read the key from here
    return loadgen.open_client(sup, b.engine, getattr(cfg.engines, b.engine), env, f"bench-client-{_slug(label)}",
                               paths.logs, PHASE, b.server.hang_timeout_s)


def _run_client(cfg: PipelineConfig, client, proc: Process, paths: BenchPaths, url: str, label: str,
                concurrency: int, dataset: Path, num_prompts: int, tag: str = "") -> benchclient.LoadResult:
    b = cfg.bench
    parse_fn = benchclient.CLIENTS[b.engine][2]
    result_file = paths.clients / f"{_slug(label)}{tag}-c{concurrency}.json"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)  # SGLang's client appends; a retry must not read an old line
    spec = benchclient.LoadSpec(base_url=url, served_name=cfg.target.served_name, tokenizer=cfg.target.model,
                                dataset=dataset, num_prompts=num_prompts, concurrency=concurrency,
                                max_tokens=b.max_tokens, temperature=b.temperature, ignore_eos=b.ignore_eos,
                                result_file=result_file)
    try:
        log = client.run(spec, timeout_s=b.client_timeout_s)
    except CommandFailed:
        proc.check_alive()  # a dead server explains a failed client better (and is retryable)
        raise
    load = parse_fn(result_file)
    if load.completed == 0:
        proc.check_alive()
        raise TransientError(f"{label}, concurrency {concurrency}: no request completed ({load.failed} failed); "
                             f"see {log}")
    return load


def _measure_window(cfg: PipelineConfig, client, proc: Process, paths: BenchPaths, url: str, label: str,
                    k: int, c: int, dataset: Path, num_prompts: int, tag: str = "") -> dict:
    """One load-generator run at concurrency c between two counter snapshots. A window whose
    server-side request and token counts differ from the load generator's was shared with other
    traffic; it is discarded and measured again (WINDOW_ATTEMPTS in all)."""
    discarded = []
    for attempt in range(1, WINDOW_ATTEMPTS + 1):
        before, traffic_before = _snapshot(cfg, url, k)
        started = time.time()
        load = _run_client(cfg, client, proc, paths, url, label, c, dataset, num_prompts, tag)
        proc.check_alive()
        after, traffic_after = _snapshot(cfg, url, k)
        w = {"concurrency": c, "started_at": started, "finished_at": time.time(), "attempt": attempt,
             "discarded_attempts": discarded, "load": load.to_dict(), "client_spec": load.client_spec,
             "counters_before": None, "counters_after": None, "delta": None, "acceptance": None,
             "traffic_before": None, "traffic_after": None, "traffic_delta": None}
        if traffic_after is not None:
            served = traffic_after - traffic_before
            w.update(traffic_before=traffic_before.to_dict(), traffic_after=traffic_after.to_dict(),
                     traffic_delta=served.to_dict())
            why = foreign_traffic(load, served)
            if why:
                log.warning("bench %s c=%d attempt %d: window discarded: %s", label, c, attempt, why)
                discarded.append(why)
                continue
        if after is not None:
            delta = after - before
            w.update(counters_before=before.to_dict(), counters_after=after.to_dict(), delta=delta.to_dict(),
                     acceptance=acceptance(delta).to_dict())
        elif cfg.bench.engine == "sglang" and k:
            w["acceptance"] = {"acceptance_length": sglang_accept_length(url, _headers(cfg)), "acceptance_rate": None,
                               "per_position": [], "source": acceptance_source("sglang")}
        return w
    raise TransientError(f"bench {label}, concurrency {c}: {WINDOW_ATTEMPTS} windows in a row held other requests "
                         f"than the load generator's ({'; '.join(discarded)}): something else is sending requests to "
                         f"{url}; stop it, or give the benchmark server another port (bench.server.port), and rerun")


def measure_server(cfg: PipelineConfig, sup: Supervisor, label: str, k: int, drafter: str | None,
                   dataset: Path, num_prompts: int, warmup_texts: list[str],
                   on_window: Callable[[], None] = lambda: None,
                   before_window: Callable[[int], None] = lambda concurrency: None, probes: list[dict] = ()) -> dict:
    """Start one server (baseline if k == 0, else with the drafter and k speculative tokens),
    warm it up, run the load generator once per concurrency, then once per probe (acceptance on a
    prompt subset: the parity sample, each category; speculative servers only), and stop it.
    Returns its record. before_window(concurrency) and on_window() are called around each window."""
    b = cfg.bench
    paths = BenchPaths.of(cfg)
    extra = spec_args(b.engine, Path(drafter), k) if k else []
    client = _open_client(cfg, sup, paths, label)
    t0 = time.monotonic()
    try:
        proc = start_server(sup, cfg, PHASE, b.engine, b.server, extra)
    except BaseException:
        client.stop()
        raise
    startup_s = round(time.monotonic() - t0, 3)
    url = base_url(b.server)
    try:
        record = {"label": label, "k": k, "startup_s": startup_s, "argv": proc.spec.shown_argv(),
                  "log": str(proc.spec.log), "engine_version": engine_version(url, b.engine, _headers(cfg))}
        at_ready, traffic_at_ready = _snapshot(cfg, url, k)
        progress.step(PHASE, f"{label}: warm-up ({b.warmup_prompts} requests, not measured)")
        record["warmup"] = _warmup(cfg, url, warmup_texts)
        windows = []
        for c in b.concurrency:
            before_window(c)
            windows.append(_measure_window(cfg, client, proc, paths, url, label, k, c, dataset, num_prompts))
            on_window()
        record["windows"] = windows
        record["probes"] = []
        for p in probes if k else ():
            progress.step(PHASE, f"{label}: acceptance on {p['name']} ({p['count']} prompts)")
            c = min(max(b.concurrency), p["count"])
            record["probes"].append({"name": p["name"], "kind": p["kind"], "count": p["count"], "ids": p["ids"],
                                     "window": _measure_window(cfg, client, proc, paths, url, label, k, c,
                                                               p["dataset"], p["count"], tag=f"-{p['slug']}")})
        at_stop, traffic_at_stop = _snapshot(cfg, url, k)
        record["counters_at_ready"] = at_ready.to_dict() if at_ready else None
        record["counters_at_stop"] = at_stop.to_dict() if at_stop else None
        record["traffic_at_ready"] = traffic_at_ready.to_dict() if traffic_at_ready else None
        record["traffic_at_stop"] = traffic_at_stop.to_dict() if traffic_at_stop else None
        if b.engine == "sglang" and k:
            record["accept_length_final"] = windows[-1]["acceptance"]["acceptance_length"]
        proc.check_alive()
    finally:
        client.stop()
        record_stop = proc.stop()
    record["stop"] = {"signal": record_stop.signal, "seconds": record_stop.seconds, "clean": record_stop.clean}
    return record


# ---- the phase -----------------------------------------------------------------------------------

def _server_key(cfg: PipelineConfig, k: int, drafter: dict, prompts: dict, probes: list[dict] = ()) -> str:
    """What decides a server's numbers; a retried run reuses a finished server only if it matches."""
    drafter_cfg = ""
    if k:
        try:
            drafter_cfg = hashlib.sha256((Path(drafter["path"]) / "config.json").read_bytes()).hexdigest()
        except OSError:
            pass
    # Only what changes the measurement: a new floor or trained flag re-judges saved numbers
    # instead of re-measuring them.
    judged = ("acceptance_floor", "drafter_trained", "client_timeout_s", "num_speculative_tokens", "drafter",
              "prompts", "watch", "first_position_floor")
    bench = cfg.bench.model_dump(mode="json", exclude={**dict.fromkeys(judged, True),
                                                       "parity": {"min_fraction", "expected_full_acc"}})
    for field in ("api_key", "api_key_env", "api_key_secret_block"):
        bench["server"].pop(field, None)
    parts = {"schema": SCHEMA, "target": cfg.target.model_dump(mode="json"), "bench": bench, "k": k,
             "prompts": prompts["sha256"], "drafter": [drafter["path"], drafter_cfg] if k else None}
    if k and probes:  # absent without probes: the keys of servers saved before probes existed still match
        parts["probes"] = [[p["name"], p["sha256"]] for p in probes]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _handoff(cfg: PipelineConfig, sup: Supervisor, after: str, before: str) -> dict:
    """The same proof as between phases: the previous server's processes gone, its port closed,
    and on a GPU node every configured GPU back to ~0 MiB, before the next server may load."""
    from ..handoff.core import run_handoff

    report = run_handoff(cfg.run_dir, cfg.handoff, list(cfg.gpus), cfg.phase_ports(PHASE),
                         label=f"bench-{_slug(after)}-to-{_slug(before)}", supervisor=sup)
    return {"label": report.label, "seconds": report.seconds, "path": report.path, "gpu_check": report.gpu_check}


def _history_path(paths: BenchPaths, now: datetime) -> Path:
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    path, n = paths.history / f"{stamp}.json", 1
    while path.exists():  # two runs within one second keep both files
        n += 1
        path = paths.history / f"{stamp}-{n}.json"
    return path


def run_bench(cfg: PipelineConfig, sup: Supervisor, on_progress: ProgressFn | None = None) -> PhaseSummary:
    """Run (or finish) the benchmark; returns the summary. Raises GateError (not retryable, with the
    PhaseSummary as `.summary`) when a trained drafter's acceptance length is below
    bench.acceptance_floor, after writing everything."""
    b = cfg.bench
    paths = BenchPaths.of(cfg)
    paths.dir.mkdir(parents=True, exist_ok=True)
    drafter = resolve_drafter(cfg)
    prompts = held_out_prompts(cfg)
    client_name, _, _, write_dataset, ext = benchclient.CLIENTS[b.engine]
    dataset = write_dataset(paths.dir / f"prompts{ext}", prompts["texts"])
    probes = _probes(cfg, drafter, prompts, write_dataset, ext, paths)
    plan = [("baseline", 0)] + [(f"k={k}", k) for k in b.num_speculative_tokens]
    total, done = len(plan) * len(b.concurrency), [0]
    prog = PhaseProgress(PHASE, on_progress, unit="windows")
    prog(0, total)

    def tick() -> None:
        done[0] += 1
        prog(done[0], total)

    def announce(label: str, k: int) -> Callable[[int], None]:
        return lambda c: prog.step(f"window {done[0] + 1}/{total}: {label}, concurrency {c}", window=done[0] + 1,
                                   k=k, concurrency=c)

    runs, handoffs, last_started = [], [], None
    for label, k in plan:
        key = _server_key(cfg, k, drafter, prompts, probes)
        saved = read_json(paths.servers / f"{_slug(label)}.json")
        if saved and saved.get("key") == key:
            log.info("bench: reusing the finished %s server run from a previous attempt", label)
            runs.append(saved["run"])
            for _ in b.concurrency:
                tick()
            continue
        if last_started is not None:
            handoffs.append(_handoff(cfg, sup, last_started, label))
        prog.step(f"server {plan.index((label, k)) + 1}/{len(plan)}: {label} ({b.engine}"
                  + (f", drafter {drafter['path']}" if k else "") + ")")
        run = measure_server(cfg, sup, label, k, drafter["path"] if k else None, dataset, prompts["count"],
                             prompts["warmup_texts"], on_window=tick, before_window=announce(label, k), probes=probes)
        last_started = label
        atomic_write_json(paths.servers / f"{_slug(label)}.json", {"key": key, "run": run})
        runs.append(run)

    results = _assemble(cfg, drafter, prompts, runs, handoffs, client_name)
    w = cfg.bench.watch
    if w.enabled:  # before this run's own history file exists
        results["watch"] = benchwatch.watch(results, benchwatch.read_history(paths.history),
                                            w.acceptance_tolerance_pct, w.speed_tolerance_pct)
    atomic_write_json(paths.results, results)
    history = _history_path(paths, datetime.fromisoformat(results["created_at"]))
    atomic_write_json(history, results)
    write_report(results, paths.report, paths.plot)
    trend = write_trend(paths.history, paths.trend, paths.trend_plot)
    details = {"results": str(paths.results), "report": str(paths.report), "plot": str(paths.plot),
               "trend": str(paths.trend), "trend_plot": str(paths.trend_plot), "trend_rows": trend,
               "history": str(history), "drafter": drafter["path"], "trained": drafter["trained"],
               "engine_version": results["engine_version"], "gate": results["gate"]["status"],
               "best_acceptance_length": results["gate"]["best_acceptance_length"],
               "best_k": results["best_k"], "table": results["table"],
               "watch": (results.get("watch") or {}).get("status")}
    summary = PhaseSummary(str(paths.results), (
        f"gate {details['gate']}, best acceptance length {details['best_acceptance_length']}, drafter "
        f"{'trained' if drafter['trained'] else 'UNTRAINED'}, watch {details['watch'] or '-'} -> {paths.report}"),
        details)
    failures = []
    if results["gate"]["status"] == "failed":
        failures.append(gate_error_text(results["gate"], str(paths.results)))
    if (results.get("parity") or {}).get("status") == "failed":
        failures.append(parity_error_text(results["parity"], str(paths.results)))
    if details["watch"] == "regression" and w.fail_on_regression:
        failures.append(f"benchmark regression: {results['watch']['message']}.\nAll numbers: {paths.results}; "
                        f"the report compares every figure with its interval: {paths.report}")
    if failures:
        err = GateError("\n".join(failures))
        err.summary = summary  # a regression still has its numbers to show (the flow publishes them)
        raise err
    return summary


def _probes(cfg: PipelineConfig, drafter: dict, prompts: dict, write_dataset, ext: str, paths: BenchPaths) -> list[dict]:
    """The prompt subsets whose acceptance each speculative server also measures: the parity
    sample of training prompts (a trained drafter with an expectation), and each category of the
    benchmark prompts. vLLM only: SGLang's acceptance is an average since start, not per window."""
    if cfg.bench.engine != "vllm":
        return []
    sets = []
    if cfg.bench.parity.enabled and drafter["trained"] and parity_expectation(cfg, drafter)[0]:
        rows = training_prompts(cfg)
        sets.append(("training prompts (parity)", "parity", "parity", [p.id for p in rows],
                     [p.messages[-1]["content"] for p in rows]))
    for name, idx in sorted(categories_of(prompts).items()):
        slug = "cat-" + "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
        sets.append((name, "category", slug, [prompts["ids"][i] for i in idx], [prompts["texts"][i] for i in idx]))
    out = []
    for name, kind, slug, ids, texts in sets:
        if texts:
            out.append({"name": name, "kind": kind, "slug": slug, "ids": ids, "count": len(texts),
                        "sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest(),
                        "dataset": write_dataset(paths.dir / f"prompts-{slug}{ext}", texts)})
    return out


def categories_of(prompts: dict) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, cat in enumerate(prompts.get("categories") or []):
        if cat:
            out.setdefault(cat, []).append(i)
    return out


def _parity(cfg: PipelineConfig, drafter: dict, runs: list[dict]) -> dict | None:
    if not cfg.bench.parity.enabled:
        return None
    found = {r["k"]: next((p for p in r.get("probes", []) if p["kind"] == "parity"), None) for r in runs if r["k"]}
    sample = next((p for p in found.values() if p), None)
    expected, source = parity_expectation(cfg, drafter)
    gate = evaluate_parity(expected, source, {k: p["window"]["acceptance"] if p else None for k, p in found.items()},
                           cfg.bench.parity.min_fraction, bool(drafter["trained"]),
                           {"count": sample["count"], "ids": sample["ids"]} if sample else None)
    # What the drafter's own data was sampled at (its train manifest, or the provenance file beside a
    # bench.drafter), never this config's datagen section: that may describe other data.
    trained_at, served_at = training_temperature(drafter), cfg.bench.temperature
    if trained_at is not None and trained_at != served_at:  # the likeliest gap: other text than it learned from
        gate["note"] = (f"the training data was generated at temperature {trained_at}, the benchmark serves at "
                        f"{served_at}: the drafter is measured on other text than it learned from")
        gate["message"] += f" (note: {gate['note']})"
    return gate


def training_temperature(drafter: dict) -> float | None:
    """The sampling temperature of the drafter's training data, where its provenance records it."""
    sampling = (drafter.get("data") or {}).get("sampling") or {}
    value = sampling.get("temperature")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _assemble(cfg: PipelineConfig, drafter: dict, prompts: dict, runs: list[dict], handoffs: list[dict],
              client_name: str) -> dict:
    b = cfg.bench
    rows = table(runs)
    pooled = {r["k"]: pooled_acceptance(r, b.engine) for r in runs if r["k"]}
    notes = []
    if prompts["count"] < prompts["requested"]:
        notes.append(f"only {prompts['count']} benchmark prompts were available (bench.num_prompts is "
                     f"{prompts['requested']}); add prompts to the set or lower datagen.max_samples")
    if prompts["multi_turn_reduced"]:
        notes.append(f"{prompts['multi_turn_reduced']} multi-turn prompts were sent as their last user turn only "
                     "(the load generators take one user message per request)")
    if any(w["load"]["failed"] for r in runs for w in r["windows"]):
        notes.append("some requests failed; see the `failed` column and the client logs")
    ids, trained_on = drafter.get("config_aux_layer_ids"), drafter.get("aux_layer_ids_vllm")
    if ids and trained_on and b.engine == "vllm":
        # The extraction may list the final layer too (speculators' verifier_last_hidden_states); it is not an aux input.
        last = num_hidden_layers(cfg.target.model)
        if list(ids) != [i for i in trained_on if i != last]:
            notes.append(f"the drafter config declares aux layers {ids} but it was trained on layers {trained_on} "
                         "(vllm convention): vLLM serves it with other hidden states than it learned from")
    public_prompts = {k: v for k, v in prompts.items() if k not in ("texts", "warmup_texts")}
    now = datetime.now(timezone.utc)
    return {
        "schema": SCHEMA, "pipeline": cfg.name, "created_at": now.isoformat(timespec="seconds"),
        "config_hash": cfg.fingerprint(), "bench_config_hash": cfg.fingerprint(PHASE), "pack_version": __version__,
        "engine": b.engine, "engine_version": runs[0].get("engine_version", "unknown"),
        "engine_versions": {r["label"]: r.get("engine_version") for r in runs},
        "bench_client": client_name, "acceptance_source": acceptance_source(b.engine),
        "target": {"model": str(cfg.target.model), "served_name": cfg.target.served_name,
                   "dtype": cfg.target.dtype, "max_model_len": cfg.target.max_model_len,
                   "tensor_parallel_size": cfg.target.tensor_parallel_size},
        "gpus": list(cfg.gpus), "platform": platform(list(cfg.gpus)), "cpu_rehearsal": cfg.cpu_rehearsal,
        "drafter": {**drafter, "checksum": drafter_checksum(drafter["path"])}, "prompts": public_prompts,
        "sampling": {"temperature": b.temperature, "max_tokens": b.max_tokens, "ignore_eos": b.ignore_eos,
                     "warmup_prompts": b.warmup_prompts},
        "num_speculative_tokens": list(b.num_speculative_tokens), "concurrency": list(b.concurrency),
        "servers": runs, "handoffs": handoffs, "table": rows, "best_k": best_k(rows),
        "acceptance_by_k": {str(k): v for k, v in pooled.items()},
        "gate": evaluate_gate(pooled, bool(drafter["trained"]), b.acceptance_floor, best_k(rows), cfg.cpu_rehearsal,
                              b.first_position_floor), "notes": notes,
        "parity": _parity(cfg, drafter, runs),
        "categories": category_table({r["k"]: r.get("probes", []) for r in runs if r["k"]}),
    }
