"""Measuring one server: warm-up, then bench.windows load-generator windows per concurrency (interleaved
over the concurrencies), with the server's spec-decode counters scraped right before and right after each."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Callable

import aiohttp

from .. import progress
from ..config import PipelineConfig
from .. import engine_registry
from ..engines import loadgen
from ..engines.metrics import SpecCounters, Traffic, acceptance, engine_version
from ..engines.serving import api_key, base_url, start_server
from ..errors import CommandFailed, ConfigError, TransientError
from ..openai_client import InvalidResponse, OpenAIClient, RetryPolicy
from ..process.services import Process, Supervisor
from ..coroutines import run_coroutine
from . import alternate
from .paths import PHASE, BenchPaths, slug
from .repeats import pair_by_slot, paired_ratio_interval, reach_pct
from .starts import graph_sizes, start_side_by_side

WINDOW_ATTEMPTS = 3  # measurements of one window before foreign traffic fails the phase
log = logging.getLogger("eagle3.bench")


def _headers(cfg: PipelineConfig) -> dict[str, str]:
    key = api_key(cfg, cfg.bench.server, "bench.server")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _snapshot(cfg: PipelineConfig, url: str, k: int, before: bool = True) -> tuple[SpecCounters | None, Traffic]:
    """(spec-decode counters, or None for the baseline; traffic counters), from the server's metrics."""
    engine = engine_registry.get(cfg.bench.engine)
    spec, traffic = engine.scrape(url, k, cfg.target.served_name, _headers(cfg), before=before)
    if k and spec is None:
        # The drafter is configured, yet the server counts no speculation: it is not speculating.
        raise ConfigError(f"{url}/metrics has no spec-decode counters although the server was started with a "
                          f"drafter ({' '.join(engine.spec_args(Path('DRAFTER'), k))}); check the server "
                          "log for how it took those flags")
    return spec, traffic


def foreign_traffic(load: loadgen.LoadResult, served: Traffic) -> str | None:
    """Why the server's own counts over a window do not match the load generator's requests
    (someone else used the server meanwhile), or None when the window holds exactly them."""
    if not load.completed <= served.requests <= load.completed + load.failed:
        return (f"the server finished {served.requests} requests, the load generator {load.completed} "
                f"(+{load.failed} failed)")
    if not load.failed and served.generation_tokens != load.total_output_tokens:
        return (f"the server generated {served.generation_tokens} tokens, the load generator received "
                f"{load.total_output_tokens}")
    return None


def _payload(cfg: PipelineConfig, text: str) -> dict:
    """A benchmark request as the load generator sends it: the prompt as one user turn, the phase's sampling."""
    b = cfg.bench
    payload = {"model": cfg.target.served_name, "messages": [{"role": "user", "content": text}],
               "max_tokens": b.max_tokens, "temperature": b.temperature}
    if b.ignore_eos:
        payload["ignore_eos"] = True
    return payload


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
                    await client.chat(_payload(cfg, text))

            await asyncio.gather(*(one(t) for t in todo))

    t0 = time.monotonic()
    run_coroutine(go())
    return {"requests": len(todo), "seconds": round(time.monotonic() - t0, 3)}


def _open_client(cfg: PipelineConfig, sup: Supervisor, paths: BenchPaths, label: str):
    """The load generator for one server's windows (vLLM: started now, importing while the server starts)."""
    b = cfg.bench
    env = dict(getattr(cfg.engines, b.engine).env)
    env["OPENAI_API_KEY"] = api_key(cfg, b.server, "bench.server")  # every engine's client reads the key from here
    return engine_registry.get(b.engine).open_load_client(sup, getattr(cfg.engines, b.engine), env,
                                                   f"bench-client-{slug(label)}", paths.logs, PHASE,
                                                   b.server.hang_timeout_s)


def _run_client(cfg: PipelineConfig, client, proc: Process, paths: BenchPaths, url: str, label: str,
                concurrency: int, dataset: Path, num_prompts: int, tag: str = "") -> loadgen.LoadResult:
    b = cfg.bench
    result_file = paths.clients / f"{slug(label)}{tag}-c{concurrency}.json"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)  # SGLang's client appends; a retry must not read an old line
    spec = loadgen.LoadSpec(base_url=url, served_name=cfg.target.served_name, tokenizer=cfg.target.model,
                                dataset=dataset, num_prompts=num_prompts, concurrency=concurrency,
                                max_tokens=b.max_tokens, temperature=b.temperature, ignore_eos=b.ignore_eos,
                                result_file=result_file)
    try:
        log = client.run(spec, timeout_s=b.client_timeout_s)
    except CommandFailed:
        proc.check_alive()  # a dead server explains a failed client better (and is retryable)
        raise
    load = engine_registry.get(b.engine).parse_load(result_file)
    if load.completed == 0:
        proc.check_alive()
        raise TransientError(f"{label}, concurrency {concurrency}: no request completed ({load.failed} failed); "
                             f"see {log}")
    return load


def _window_record(cfg: PipelineConfig, url: str, label: str, k: int, c: int, load: loadgen.LoadResult,
                   before: tuple, after: tuple, started: float) -> tuple[dict, str | None]:
    """One window's record from its load and the server's counters around it (_snapshot's pairs), and
    why it held other traffic than the load's (the server's own counts disagree), or None."""
    engine = engine_registry.get(cfg.bench.engine)
    (spec_before, traffic_before), (spec_after, traffic_after) = before, after
    w = {"concurrency": c, "started_at": started, "finished_at": time.time(), "load": load.to_dict(),
         "client_spec": load.client_spec, "counters_before": None, "counters_after": None, "delta": None,
         "acceptance": None, "traffic_before": None, "traffic_after": None, "traffic_delta": None}
    if traffic_after is not None:
        served = traffic_after - traffic_before
        w.update(traffic_before=traffic_before.to_dict(), traffic_after=traffic_after.to_dict(),
                 traffic_delta=served.to_dict())
        why = foreign_traffic(load, served)
        if why:
            return w, why
    if spec_after is not None:
        delta = spec_after - spec_before
        w.update(counters_before=spec_before.to_dict(), counters_after=spec_after.to_dict(), delta=delta.to_dict(),
                 acceptance=acceptance(delta, engine.acceptance_source).to_dict())
    if k:  # the engine's own acceptance figure, if it has one: a cross-check only
        own = engine.cross_check(url, _headers(cfg))
        if own.get("cross_check_error"):
            log.warning("bench %s c=%d: %s (the window's acceptance comes from its counters)", label, c,
                        own.pop("cross_check_error"))
        w.update(own)
    return w, None


def _measure_window(cfg: PipelineConfig, client, proc: Process, paths: BenchPaths, url: str, label: str,
                    k: int, c: int, dataset: Path, num_prompts: int, tag: str = "") -> dict:
    """One load-generator run at concurrency c between two counter snapshots. A window whose
    server-side request and token counts differ from the load generator's was shared with other
    traffic; it is discarded and measured again (WINDOW_ATTEMPTS in all)."""
    discarded = []
    for attempt in range(1, WINDOW_ATTEMPTS + 1):
        before = _snapshot(cfg, url, k)
        started = time.time()
        load = _run_client(cfg, client, proc, paths, url, label, c, dataset, num_prompts, tag)
        proc.check_alive()
        w, why = _window_record(cfg, url, label, k, c, load, before, _snapshot(cfg, url, k, before=False), started)
        if why:
            log.warning("bench %s c=%d attempt %d: window discarded: %s", label, c, attempt, why)
            discarded.append(why)
            continue
        return {**w, "attempt": attempt, "discarded_attempts": discarded}
    raise TransientError(f"bench {label}, concurrency {c}: {WINDOW_ATTEMPTS} windows in a row held other requests "
                         f"than the load generator's ({'; '.join(discarded)}): something else is sending requests to "
                         f"{url}; stop it, or give the benchmark server another port (bench.server.port), and rerun")


class BenchServer:
    """One benchmark server: its load client and the server itself started together, a warm-up, then
    windows on demand, and a stop. Its record is the phase's per-server schema (bench.py)."""

    def __init__(self, cfg: PipelineConfig, sup: Supervisor, label: str, k: int, drafter: str | None,
                 warmup_texts: list[str], port: int | None = None, instance: str = "", twin: bool = False,
                 extra_args: list[str] = ()):
        self.cfg, self.sup, self.label, self.k, self.warmup_texts = cfg, sup, label, k, warmup_texts
        self.paths = BenchPaths.of(cfg)
        b = cfg.bench
        engine = engine_registry.get(b.engine)
        self.server = b.server.model_copy(update={
            "port": b.server.port if port is None else port,
            "extra_args": engine.with_graph_sizes(list(b.server.extra_args), graph_sizes(k, b.concurrency))})
        self.url = base_url(self.server)
        self.extra = (engine.spec_args(Path(drafter), k) if k else []) + list(extra_args)
        self.instance, self.twin = instance, twin
        self.client = self.proc = None
        self.record: dict = {}

    def start(self) -> None:
        cfg, b = self.cfg, self.cfg.bench
        engine = engine_registry.get(b.engine)
        self.client = _open_client(cfg, self.sup, self.paths, self.label)
        t0, launched_at = time.monotonic(), time.time()
        try:
            self.proc = start_server(self.sup, cfg, PHASE, b.engine, self.server, self.extra, instance=self.instance,
                                     on_launch=self._launched)
        except BaseException:
            self.client.stop()
            raise
        self.record = {"label": self.label, "k": self.k, **({"twin": True} if self.twin else {}),
                       "startup_s": round(time.monotonic() - t0, 3),
                       "launched_at": launched_at, "ready_at": time.time(),
                       "argv": self.proc.spec.shown_argv(), "log": str(self.proc.spec.log),
                       "engine_version": engine_version(self.url, engine.version_paths, _headers(cfg))}
        if self.server.port != b.server.port:
            self.record["port"] = self.server.port
        self._at_ready = _snapshot(cfg, self.url, self.k)
        progress.step(PHASE, f"{self.label}: warm-up ({b.warmup_prompts} requests, not measured)")
        self.record["warmup"] = _warmup(cfg, self.url, self.warmup_texts)
        self.record["windows"] = []

    def _launched(self, proc: Process) -> None:
        self.proc = proc  # stop() can end it from now on, also while start() still waits for it

    def window(self, c: int, dataset: Path, num_prompts: int, repeat: int, **marks) -> None:
        tag = f"-w{repeat}" if self.cfg.bench.windows > 1 else ""
        w = _measure_window(self.cfg, self.client, self.proc, self.paths, self.url, self.label, self.k, c, dataset,
                            num_prompts, tag=tag)
        self.record["windows"].append({**w, "repeat": repeat, **marks})

    def probes(self, probes: list[dict]) -> None:
        b, self.record["probes"] = self.cfg.bench, []
        for p in probes if self.k else ():
            progress.step(PHASE, f"{self.label}: acceptance on {p['name']} ({p['count']} prompts)")
            c = min(max(b.concurrency), p["count"])
            self.record["probes"].append({"name": p["name"], "kind": p["kind"], "count": p["count"], "ids": p["ids"],
                                          "window": _measure_window(self.cfg, self.client, self.proc, self.paths,
                                                                    self.url, self.label, self.k, c, p["dataset"],
                                                                    p["count"], tag=f"-{p['slug']}")})

    def finish(self) -> None:
        """The counters at the end, and proof the server is still alive after its last window."""
        at_ready, traffic_at_ready = self._at_ready
        at_stop, traffic_at_stop = _snapshot(self.cfg, self.url, self.k, before=False)
        r = self.record
        r["counters_at_ready"] = at_ready.to_dict() if at_ready else None
        r["counters_at_stop"] = at_stop.to_dict() if at_stop else None
        r["traffic_at_ready"] = traffic_at_ready.to_dict() if traffic_at_ready else None
        r["traffic_at_stop"] = traffic_at_stop.to_dict() if traffic_at_stop else None
        if self.k and r["windows"] and "server_avg_accept_length_since_start" in r["windows"][-1]:
            r["accept_length_final"] = r["windows"][-1]["server_avg_accept_length_since_start"]
        self.proc.check_alive()

    def stop(self) -> None:
        if self.client is not None:
            self.client.stop()
        if self.proc is not None:
            stopped = self.proc.stop()
            self.record["stop"] = {"signal": stopped.signal, "seconds": stopped.seconds, "clean": stopped.clean}


def measure_alternating_slot(cfg: PipelineConfig, servers: list[BenchServer], texts: list[str], c: int, repeat: int,
                             slot: str) -> None:
    """bench.schedule alternating: one window slot at concurrency c, every prompt of `texts` to every
    server, the servers taking turns c requests at a time (alternate.py), between two counter snapshots
    of each. A slot in which any server's own counts disagree with what it was sent held other traffic:
    the whole slot is measured again (WINDOW_ATTEMPTS in all). Appends each server's window."""
    payloads = [_payload(cfg, t) for t in texts]
    key = api_key(cfg, cfg.bench.server, "bench.server")
    discarded: list[str] = []
    for attempt in range(1, WINDOW_ATTEMPTS + 1):
        before = [_snapshot(cfg, s.url, s.k) for s in servers]
        started = time.time()
        try:
            done, busy = run_coroutine(alternate.run_slot([s.url for s in servers], key, payloads, c,
                                                           cfg.bench.server.hang_timeout_s))
        # a 4xx (the key, the model, the request) stays what it is; the rest is the servers' state
        except (aiohttp.ClientError, asyncio.TimeoutError, InvalidResponse, TransientError) as e:
            for s in servers:
                s.proc.check_alive()  # a dead server explains a failed request better (and is retryable)
            raise TransientError(f"bench slot {slot}, concurrency {c} (schedule alternating): a request failed: "
                                 f"{type(e).__name__}: {e}") from e
        windows, why = [], []
        for s, requests, seconds, snap in zip(servers, done, busy, before):
            s.proc.check_alive()
            raw = s.paths.clients / f"{slug(s.label)}-{slot}-c{c}.json"
            load = alternate.load_result(requests, seconds, raw)
            after = _snapshot(cfg, s.url, s.k, before=False)
            w, foreign = _window_record(cfg, s.url, s.label, s.k, c, load, snap, after, started)
            windows.append(w)
            if foreign:
                why.append(f"{s.label}: {foreign}")
        if why:
            log.warning("bench slot %s c=%d attempt %d: slot discarded: %s", slot, c, attempt, "; ".join(why))
            discarded.append("; ".join(why))
            continue
        for s, w in zip(servers, windows):
            s.record["windows"].append({**w, "attempt": attempt, "discarded_attempts": discarded, "repeat": repeat,
                                        "slot": slot})
        return
    raise TransientError(f"bench slot {slot}, concurrency {c}: {WINDOW_ATTEMPTS} slots in a row held other requests "
                         f"than the benchmark's ({'; '.join(discarded)}): something else is sending requests to the "
                         "benchmark's servers; stop it, or give them other ports (bench.server.port), and rerun")


def narrow_enough(servers: list[BenchServer], concurrencies: list[int], target_pct: float) -> bool:
    """Whether every paired ratio to the baseline, at every concurrency, is narrow enough to stop adding
    window slots: a speedup decided (its 95 % interval wholly above or below 1) or within ±target_pct,
    the baseline's twin within ±target_pct (an A/A check is never "decided")."""
    base = next(s for s in servers if not s.k and not s.twin)
    for other in (s for s in servers if s is not base):
        for c in concurrencies:
            at = lambda server: [w for w in server.record.get("windows", []) if w["concurrency"] == c]  # noqa: E731
            ratio = paired_ratio_interval(pair_by_slot(at(other), at(base)) or [])
            # The twin's reach from 1 is the noise floor the report gives (repeats.twin_agrees).
            reach = reach_pct(ratio, around=1.0 if other.twin else None)
            if reach is None:
                return False
            decided = not other.twin and (ratio["lo"] > 1 or ratio["hi"] < 1)
            if not decided and reach > target_pct:
                return False
    return True


def measure_server(cfg: PipelineConfig, sup: Supervisor, label: str, k: int, drafter: str | None,
                   dataset: Path, num_prompts: int, warmup_texts: list[str],
                   on_window: Callable[[], None] = lambda: None,
                   before_window: Callable[[int], None] = lambda concurrency: None, probes: list[dict] = ()) -> dict:
    """Start one server (baseline if k == 0, else with the drafter and k speculative tokens),
    warm it up, run the load generator once per concurrency, then once per probe (acceptance on a
    prompt subset: the parity sample, each category; speculative servers only), and stop it.
    Returns its record. before_window(concurrency) and on_window() are called around each window."""
    server = BenchServer(cfg, sup, label, k, drafter, warmup_texts)
    try:
        server.start()
        # Concurrencies interleaved: drift within a server hits every concurrency alike.
        for repeat in range(1, cfg.bench.windows + 1):
            for c in cfg.bench.concurrency:
                before_window(c)
                server.window(c, dataset, num_prompts, repeat)
                on_window()
        server.probes(list(probes))
        server.finish()
    finally:
        server.stop()
    return server.record


def measure_interleaved(cfg: PipelineConfig, sup: Supervisor, plan: list[tuple[str, int, bool]], drafter: str,
                        dataset: Path, num_prompts: int, warmup_texts: list[str], round_: int,
                        on_window: Callable[[], None] = lambda: None,
                        before_window: Callable[[str, int, int], None] = lambda label, k, concurrency: None,
                        probes: list[dict] = (), on_extra_slot: Callable[[int], None] = lambda windows: None,
                        start_flags: Callable[[int], list[str]] | None = None, texts: list[str] = ()) -> list[dict]:
    """bench.schedule interleaved: every (label, k, twin) of `plan` served at once, each on its own port
    (bench.server_ports()), started one after another, or with `start_flags` (each k's own flags) side by
    side (start_side_by_side); then each window slot (repeat, concurrency)
    measures every server in turn, the order rotated by one each repeat, so drift lands on every config
    alike and each k's window pairs with the baseline's window of its slot ("slot", stats.py). With
    bench.max_windows, slots go on until narrow_enough (each extra slot announced to `on_extra_slot` with
    its window count). With bench.schedule alternating, a slot's servers take turns request by request
    instead (measure_alternating_slot, the prompts `texts`). Every server is stopped, whatever happened.
    Returns their records, in plan order."""
    ports = cfg.bench.server_ports()
    servers = [BenchServer(cfg, sup, label, k, drafter if k else None, warmup_texts, port=port, twin=twin,
                           instance=f"k{k}" if k else "baseline-twin" if twin else "baseline",
                           extra_args=start_flags(k) if start_flags else ())
               for (label, k, twin), port in zip(plan, ports)]
    try:
        if start_flags is None:
            for server in servers:
                server.start()
        else:
            start_side_by_side(servers)
        for server in servers:
            server.record["start"] = "one by one" if start_flags is None else "side by side"
        repeat, b = 0, cfg.bench
        while repeat < b.windows or (b.max_windows and repeat < b.max_windows
                                     and not narrow_enough(servers, b.concurrency, b.target_halfwidth_pct)):
            repeat += 1
            if repeat > b.windows:
                on_extra_slot(len(servers) * len(b.concurrency))
            turn = (repeat - 1) % len(servers)
            order = servers[turn:] + servers[:turn]
            for c in cfg.bench.concurrency:
                if b.schedule == "alternating":
                    progress.step(PHASE, f"slot {repeat}, concurrency {c}: {', '.join(s.label for s in order)} "
                                         f"taking turns request by request")
                    measure_alternating_slot(cfg, order, list(texts)[:num_prompts], c, repeat, f"r{round_}w{repeat}")
                    for _ in order:
                        on_window()
                    continue
                for server in order:
                    before_window(server.label, server.k, c)
                    server.window(c, dataset, num_prompts, repeat, slot=f"r{round_}w{repeat}")
                    on_window()
        for server in servers:
            server.probes(list(probes))
            server.finish()
    finally:
        for server in servers:
            server.stop()
    return [s.record for s in servers]
