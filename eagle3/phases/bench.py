"""Phase 4: speculative-decoding benchmark of the trained drafter against the no-speculation baseline.

One server after another on the same GPUs: the target alone (baseline), then target + drafter for
each k in bench.num_speculative_tokens, with the core GPU handoff between two servers; the whole
sequence bench.rounds times (A B A B). With bench.schedule interleaved, a round's servers run at once
on their own ports and their windows take turns (measure_interleaved), a handoff between two rounds;
on vLLM they also start at once, each with a KV cache the pack sizes (bench.start_servers).
On each server: a warm-up outside the measured windows, then
bench.windows runs of the engine's own load generator (`vllm bench serve` / SGLang's bench_serving)
per concurrency on held-out prompts, interleaved over the concurrencies, with the
server's spec-decode counters scraped right before and right after each run; the deltas are
the window's acceptance (eagle3/engines/metrics.py). vLLM's client runs all windows of a server
in one process, started together with the server (eagle3/engines/loadgen.py).

Files in the phase dir (cfg.phase_dir("bench")):
  results.json      everything of this run (schema below); also copied to
                    <run_dir>/bench-history/<UTC timestamp>.json, outside the phase dir (a forced
                    rerun wipes the phase dir; the history accumulates across scheduled reruns)
  report.md         markdown summary (`eagle3 run` prints it at the end), with the serve-parity gate,
                    acceptance per prompt category and the comparison with the history (benchwatch)
  trend.md          acceptance length and speedup per k over every run in bench-history/
  prompts.jsonl     the held-out prompts, in the load generator's dataset format (.json for SGLang)
  servers/<x>.json  one record per finished server; a retried run reuses those whose settings match
  clients/          the load generator's raw result files;  logs/  server and client logs
  client-jobs/      the windows handed to vLLM's client process (one <n>.json + <n>.rc each)

results.json: schema, pipeline, created_at, config_hash, bench_config_hash, pack_version, engine,
engine_version, bench_client, acceptance_source, target, gpus, drafter {path, trained, status,
source, aux_layer_ids, ...}, prompts, sampling, servers [{label, k, startup_s, engine_version,
counters_at_ready, warmup, windows [{concurrency, load, counters_before, counters_after, delta,
acceptance, client_spec}], probes [{name, kind, count, ids, window}], counters_at_stop}], table, best_k,
acceptance_by_k, gate, parity, categories, watch, platform, notes; interleaved: round_starts [{round, start,
servers, first_launch_to_last_ready_s, sum_of_starts_s}], and each server's launched_at, ready_at, start.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .. import __version__, progress
from ..bench import watch as benchwatch
from ..bench.gates import category_table, evaluate_parity, parity_error_text
from ..bench.stats import best_k, evaluate_gate, gate_error_text, on_rerun, pooled_by_k, table
from ..bench.repeats import rounds_agree, twin_agrees
from ..bench.provenance import drafter_checksum, platform, serving_fingerprint, target_fingerprint
from ..bench.trend import write_trend
from .. import managed
from . import products
from ..bench import kv_budget
from ..config import PipelineConfig, num_hidden_layers
from ..config.target_model import read_json_file, target_config
from .. import engine_registry
from ..drafters.formats import LAYER_INPUT, LAYOUT_CONVENTION
from ..errors import ConfigError, GateError
from ..fsio import atomic_write_json, read_json
from ..progress import PhaseProgress
from ..bench.report import write_report
from ..process.services import Supervisor
from . import PhaseSummary

PHASE = "bench"
SCHEMA = 1

log = logging.getLogger("eagle3.bench")

from .bench_inputs import held_out_prompts, parity_expectation, parity_prompts, refuse_unloadable, resolve_drafter
from ..bench.measure import measure_interleaved, measure_server
from ..bench.starts import round_starts
from ..bench.paths import BenchPaths, slug


# ---- the phase -----------------------------------------------------------------------------------

def _label(k: int, round_: int, twin: bool = False) -> str:
    """A server's name: its config, and from the second round on the round too (A B A B)."""
    if twin:  # bench.aa_twin: a second baseline server, the in-round A/A check
        return "baseline (twin)" if round_ == 1 else f"baseline (twin, round {round_})"
    name = f"k={k}" if k else "baseline"
    return name if round_ == 1 else f"{name} (round {round_})"


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
              "prompts", "watch", "first_position_floor", "rounds", "start_servers")
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
                         label=f"bench-{slug(after)}-to-{slug(before)}", supervisor=sup)
    return {"label": report.label, "seconds": report.seconds, "path": report.path, "gpu_check": report.gpu_check}


def _history_path(paths: BenchPaths, now: datetime) -> Path:
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    path, n = paths.history / f"{stamp}.json", 1
    while path.exists():  # two runs within one second keep both files
        n += 1
        path = paths.history / f"{stamp}-{n}.json"
    return path


def run_bench(cfg: PipelineConfig, sup: Supervisor) -> PhaseSummary:
    """Run (or finish) the benchmark; returns the summary. Raises GateError (not retryable, with the
    PhaseSummary as `.summary`) when a trained drafter's acceptance length is below
    bench.acceptance_floor, after writing everything."""
    b = cfg.bench
    paths = BenchPaths.of(cfg)
    paths.dir.mkdir(parents=True, exist_ok=True)
    drafter = resolve_drafter(cfg)
    refuse_unloadable(cfg, drafter)
    prompts = held_out_prompts(cfg)
    engine = engine_registry.get(b.engine)
    dataset = engine.write_dataset(paths.dir / f"prompts{engine.dataset_suffix}", prompts["texts"])
    probes = _probes(cfg, drafter, prompts, paths)
    # (label, k, round, twin): every server of every round, the baseline's twin last in each (bench.aa_twin)
    plan = [(_label(k, n, twin), k, n, twin) for n in range(1, b.rounds + 1)
            for k, twin in [(0, False), *((k, False) for k in b.num_speculative_tokens), *[(0, True)] * b.aa_twin]]
    # The total grows when bench.max_windows adds slots until the intervals are narrow (measure_interleaved).
    total, done = [len(plan) * len(b.concurrency) * b.windows], [0]
    prog = PhaseProgress(PHASE, unit="windows")
    prog(0, total[0])

    def tick(windows: int = 1) -> None:
        done[0] += windows
        prog(done[0], total[0])

    def grow(windows: int) -> None:
        total[0] += windows

    def announce(label: str, k: int) -> Callable[[int], None]:
        return lambda c: prog.step(f"window {done[0] + 1}/{total[0]}: {label}, concurrency {c}", window=done[0] + 1,
                                   k=k, concurrency=c)

    measure = _interleaved if b.all_at_once else _sequential
    runs, handoffs = measure(cfg, sup, plan, drafter, prompts, probes, dataset, tick, announce, paths, grow)

    results = _assemble(cfg, drafter, prompts, runs, handoffs)
    w = cfg.bench.watch
    if w.enabled:  # before this run's own history file exists
        results["watch"] = benchwatch.watch(results, benchwatch.read_history(paths.history),
                                            w.acceptance_tolerance_pct, w.speed_tolerance_pct, w.min_noise_runs)
        results["gate"] = on_rerun(results["gate"], results["watch"])
    atomic_write_json(paths.results, results)
    history = _history_path(paths, datetime.fromisoformat(results["created_at"]))
    atomic_write_json(history, results)
    write_report(results, paths.report)
    trend = write_trend(paths.history, paths.trend)
    details = {"results": str(paths.results), "report": str(paths.report), "trend": str(paths.trend),
               "trend_rows": trend, "history": str(history), "drafter": drafter["path"], "trained": drafter["trained"],
               "engine_version": results["engine_version"], "gate": results["gate"]["status"],
               "best_acceptance_length": results["gate"]["best_acceptance_length"],
               "best_k": results["best_k"], "table": results["table"],
               "watch": (results.get("watch") or {}).get("status"),
               "watch_message": (results.get("watch") or {}).get("message"), "fail_on_regression": w.fail_on_regression}
    summary = PhaseSummary(str(paths.results), (
        f"gate {details['gate']}, best acceptance length {details['best_acceptance_length']}, drafter "
        f"{'trained' if drafter['trained'] else 'UNTRAINED'}, watch {details['watch'] or '-'} -> {paths.report}"),
        details)
    failures = []
    if results["gate"]["status"] == "failed":
        failures.append(gate_error_text(results["gate"], str(paths.results)))
    if (results.get("parity") or {}).get("status") == "failed":
        failures.append(parity_error_text(results["parity"], str(paths.results)))
    if details["watch"] == "drafter regression" and w.fail_on_regression:
        failures.append(f"benchmark regression: {results['watch']['message']}.\nAll numbers: {paths.results}; "
                        f"the report compares every figure with its interval: {paths.report}")
    if failures:
        err = GateError("\n".join(failures))
        err.summary = summary  # a regression still has its numbers to show (the flow publishes them)
        raise err
    return summary


def _saved(paths: BenchPaths, label: str, key: str) -> dict | None:
    """A finished server's run from a previous attempt, if its settings match."""
    saved = read_json(paths.servers / f"{slug(label)}.json")
    return saved["run"] if saved and saved.get("key") == key else None


def _sequential(cfg, sup, plan, drafter, prompts, probes, dataset, tick, announce, paths, _grow):
    """One server after another, a handoff between two; a retried run reuses each finished server.
    Exactly bench.windows windows each (bench.max_windows is the interleaved schedule's)."""
    b, runs, handoffs, last_started = cfg.bench, [], [], None
    for i, (label, k, round_, _) in enumerate(plan, 1):
        key = _server_key(cfg, k, drafter, prompts, probes)
        if (saved := _saved(paths, label, key)) is not None:
            log.info("bench: reusing the finished %s server run from a previous attempt", label)
            runs.append(saved)
            tick(len(b.concurrency) * b.windows)
            continue
        if last_started is not None:
            handoffs.append(_handoff(cfg, sup, last_started, label))
        progress.step(PHASE, f"server {i}/{len(plan)}: {label} ({b.engine}"
                      + (f", drafter {drafter['path']}" if k else "") + ")")
        run = measure_server(cfg, sup, label, k, drafter["path"] if k else None, dataset, prompts["count"],
                             prompts["warmup_texts"], on_window=tick, before_window=announce(label, k),
                             probes=probes if round_ == 1 else ())
        run["round"] = round_
        last_started = label
        atomic_write_json(paths.servers / f"{slug(label)}.json", {"key": key, "run": run})
        runs.append(run)
    return runs, handoffs


def _interleaved(cfg, sup, plan, drafter, prompts, probes, dataset, tick, announce, paths, grow):
    """Each round's servers all at once, their windows taking turns (measure_interleaved); a handoff
    between two rounds. A retried run reuses a round only if every server of it finished."""
    b, runs, handoffs, last_round = cfg.bench, [], [], None
    flags = _side_by_side_flags(cfg, drafter, prompts, probes)
    for round_ in range(1, b.rounds + 1):
        group = [(label, k, twin) for label, k, n, twin in plan if n == round_]
        keys = [_server_key(cfg, k, drafter, prompts, probes) for _, k, _ in group]
        saved = [_saved(paths, label, key) for (label, _, _), key in zip(group, keys)]
        if all(run is not None for run in saved):
            log.info("bench: reusing the finished round %d (%s) from a previous attempt", round_,
                     ", ".join(label for label, _, _ in group))
            runs += saved
            windows = sum(len(run["windows"]) for run in saved)  # more than planned if max_windows added slots
            grow(max(0, windows - len(group) * len(b.concurrency) * b.windows))
            tick(windows)
            continue
        if last_round is not None:
            handoffs.append(_handoff(cfg, sup, f"round {last_round}", f"round {round_}"))
        ports = b.server_ports()
        progress.step(PHASE, f"round {round_}/{b.rounds}: {', '.join(label for label, _, _ in group)} at once on "
                             f"ports {ports[0]}-{ports[-1]}, started {'side by side' if flags else 'one by one'} "
                             f"({b.engine}, drafter {drafter['path']})")
        measured = measure_interleaved(cfg, sup, group, drafter["path"], dataset, prompts["count"],
                                       prompts["warmup_texts"], round_, texts=prompts["texts"], on_window=tick,
                                       before_window=lambda label, k, c: announce(label, k)(c),
                                       probes=probes if round_ == 1 else (), on_extra_slot=grow,
                                       start_flags=flags)
        for (label, _, _), key, run in zip(group, keys, measured):
            run["round"] = round_
            atomic_write_json(paths.servers / f"{slug(label)}.json", {"key": key, "run": run})
        runs += measured
        last_round = round_
    return runs, handoffs


def _side_by_side_flags(cfg: PipelineConfig, drafter: dict, prompts: dict,
                        probes: list[dict]) -> Callable[[int], list[str]] | None:
    """Each server's own flags for a side-by-side start (its KV cache's size, by k), or None where a
    round's servers start one by one (bench.start_servers)."""
    b = cfg.bench
    if not b.side_by_side():
        return None
    flag = engine_registry.get(b.engine).kv_cache_size_flag
    if managed.flag_value(list(b.server.extra_args), flag) is not None:
        return lambda k: []  # the user's own size, in every server's flags already
    target = target_config(cfg.target.model)
    drafter_cfg = read_json_file(Path(drafter["path"]) / "config.json", "bench.drafter")
    longest = max([len(t.encode()) for t in prompts["texts"]] + [p["longest_bytes"] for p in probes])
    sizes = {k: kv_budget.kv_cache_bytes(target, cfg.target.dtype, drafter_cfg if k else None,
                                         cfg.target.max_model_len, max(b.concurrency), longest, b.max_tokens, k)
             for k in (0, *b.num_speculative_tokens)}
    if all(sizes.values()):
        return lambda k: [flag, str(sizes[k])]
    why = (f"the config.json of {cfg.target.model} or of the drafter gives no attention shape the pack can size a KV "
           "cache by (num_hidden_layers with num_key_value_heads and head_dim, or kv_lora_rank)")
    if b.start_servers == "side_by_side":
        raise ConfigError(f"bench.start_servers: side_by_side, but {why}: set start_servers: one_by_one, or give "
                          f"[{flag}, BYTES] in bench.server.extra_args")
    log.info("bench: the servers of a round start one by one: %s", why)
    return None


def _probes(cfg: PipelineConfig, drafter: dict, prompts: dict, paths: BenchPaths) -> list[dict]:
    """The prompt subsets whose acceptance each speculative server also measures: the parity
    sample (a trained drafter with an expectation: its validation prompts, else its training prompts), and
    each category of the benchmark prompts. Every engine: each window's acceptance is the delta of the
    server's own counters."""
    sets = []
    if cfg.bench.parity.enabled and drafter["trained"] and parity_expectation(cfg, drafter)[0]:
        rows, kind = parity_prompts(cfg, drafter)
        sets.append((f"{kind} prompts (parity)", "parity", "parity", [p.id for p in rows],
                     [p.messages[-1]["content"] for p in rows]))
    for name, idx in sorted(categories_of(prompts).items()):
        slug = "cat-" + "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
        sets.append((name, "category", slug, [prompts["ids"][i] for i in idx], [prompts["texts"][i] for i in idx]))
    out, engine = [], engine_registry.get(cfg.bench.engine)
    for name, kind, slug, ids, texts in sets:
        if texts:
            out.append({"name": name, "kind": kind, "slug": slug, "ids": ids, "count": len(texts),
                        "longest_bytes": max(len(t.encode()) for t in texts),
                        "sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest(),
                        "dataset": engine.write_dataset(paths.dir / f"prompts-{slug}{engine.dataset_suffix}", texts)})
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
    found = {r["k"]: next((p for p in r.get("probes", []) if p["kind"] == "parity"), None)
             for r in runs if r["k"] and r.get("round", 1) == 1}  # probes are measured in the first round
    sample = next((p for p in found.values() if p), None)
    expected, source = parity_expectation(cfg, drafter)
    gate = evaluate_parity(expected, source, {k: p["window"]["acceptance"] if p else None for k, p in found.items()},
                           cfg.bench.parity.min_fraction, bool(drafter["trained"]),
                           {"count": sample["count"], "ids": sample["ids"],
                            "kind": sample.get("name", "training").split()[0]} if sample else None)
    # What the drafter's own data was sampled at (its train manifest, or the provenance file beside a
    # bench.drafter), never this config's datagen section: that may describe other data.
    trained_at, served_at = training_temperature(drafter), cfg.bench.temperature
    if trained_at is not None and trained_at != served_at:  # the likeliest gap: other text than it learned from
        gate["note"] = (f"the training data was generated at temperature {trained_at}, the benchmark serves at "
                        f"{served_at}: the drafter is measured on other text than it learned from")
        gate["message"] += f" (note: {gate['note']})"
    return gate


def _run_drafter(cfg: PipelineConfig) -> dict | None:
    """This run's own trained (or dry-run) checkpoint, when bench.drafter serves another: the report says
    which one its rows measure."""
    m = products.trained_drafter(cfg, required=False) if cfg.bench.drafter is not None else None
    return {"checkpoint": m["checkpoint"], "status": m.get("status")} if m else None


def training_temperature(drafter: dict) -> float | None:
    """The sampling temperature of the drafter's training data, where its provenance records it."""
    sampling = (drafter.get("data") or {}).get("sampling") or {}
    value = sampling.get("temperature")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _assemble(cfg: PipelineConfig, drafter: dict, prompts: dict, runs: list[dict], handoffs: list[dict]) -> dict:
    b, engine = cfg.bench, engine_registry.get(cfg.bench.engine)
    rows = table(runs, b.engine)
    pooled = pooled_by_k(runs, b.engine)
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
    if ids and trained_on and LAYOUT_CONVENTION.get(engine.drafter_layout) == LAYER_INPUT:  # stored ids: layer inputs
        # The extraction may list the final layer too (speculators' verifier_last_hidden_states); it is not an aux input.
        last = num_hidden_layers(cfg.target.model)
        if list(ids) != [i for i in trained_on if i != last]:
            notes.append(f"the drafter config declares aux layers {ids} but it was trained on layers {trained_on} "
                         "(vllm convention): vLLM serves it with other hidden states than it learned from")
    public_prompts = {k: v for k, v in prompts.items() if k not in ("texts", "warmup_texts")}
    now = datetime.now(timezone.utc)
    return {
        "schema": SCHEMA, "pipeline": cfg.name, "created_at": now.isoformat(timespec="seconds"),
        "config_hash": cfg.fingerprint(), "bench_config_hash": cfg.fingerprint(PHASE),
        "serving_hash": serving_fingerprint(cfg), "pack_version": __version__,
        "engine": b.engine, "engine_version": runs[0].get("engine_version", "unknown"),
        "engine_versions": {r["label"]: r.get("engine_version") for r in runs},
        "bench_client": engine.load_client, "acceptance_source": engine.acceptance_source,
        "target": {"model": str(cfg.target.model), "fingerprint": target_fingerprint(cfg.target.model),
                   "served_name": cfg.target.served_name,
                   "dtype": cfg.target.dtype, "max_model_len": cfg.target.max_model_len,
                   "tensor_parallel_size": cfg.target.tensor_parallel_size,
                   "data_parallel_size": cfg.target.data_parallel_size},
        "gpus": list(cfg.gpus), "platform": platform(list(cfg.gpus)), "cpu_rehearsal": cfg.cpu_rehearsal,
        "drafter": {**drafter, "checksum": drafter_checksum(drafter["path"])}, "prompts": public_prompts,
        "run_drafter": _run_drafter(cfg),
        "sampling": {"temperature": b.temperature, "max_tokens": b.max_tokens, "ignore_eos": b.ignore_eos,
                     "warmup_prompts": b.warmup_prompts},
        "num_speculative_tokens": list(b.num_speculative_tokens), "concurrency": list(b.concurrency),
        "servers": runs, "handoffs": handoffs, "table": rows, "best_k": best_k(rows),
        "acceptance_by_k": {str(k): v for k, v in pooled.items()},
        "gate": evaluate_gate(pooled, bool(drafter["trained"]), b.acceptance_floor, best_k(rows), cfg.cpu_rehearsal,
                              b.first_position_floor), "notes": notes,
        "parity": _parity(cfg, drafter, runs),
        "categories": category_table({r["k"]: r.get("probes", []) for r in runs if r["k"] and r.get("probes")}),
        "windows": b.windows, "rounds": b.rounds, "schedule": b.schedule, "round_starts": round_starts(runs),
        "max_windows": b.max_windows, "target_halfwidth_pct": b.target_halfwidth_pct if b.max_windows else None,
        "aa": rounds_agree(runs) if b.rounds > 1 else None, "aa_twin": twin_agrees(runs) if b.aa_twin else None,
    }
