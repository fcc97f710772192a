"""How a benchmark round's servers start: side by side (each in a thread, the baseline's twin once the
baseline is ready), what a round's starts took, and the CUDA-graph sizes a benchmark server's steps take.
The servers are eagle3.bench.measure.BenchServer objects (start(), stop(), k, twin, label)."""

from __future__ import annotations

import threading


def graph_sizes(k: int, concurrency: list[int]) -> list[int]:
    """Every number of tokens one step of a benchmark server can take: up to max(concurrency) requests
    decoding at once, each 1 token (the baseline, a drafter's step) or k + 1 (a verify step)."""
    n = max(concurrency)
    return sorted({*range(1, n + 1), *(r * (k + 1) for r in range(1, n + 1))})


def start_side_by_side(servers: list, poll_s: float = 0.2) -> None:
    """Start every server at once, each in a thread of its own; the baseline's twin only once the baseline
    is ready, so that it finds the baseline's compile cache filled (two starts of one key at once would
    compile twice: eagle3/engines/compile_cache.py). Returns when every server is ready. When one start
    fails, or this thread is interrupted (Ctrl-C, a cancelled flow), no further start begins and every
    server launched so far is stopped, so that a start still waiting ends too, before the failure is
    raised: no thread is left to launch a server after the phase has ended."""
    base = next((s for s in servers if not s.k and not s.twin), None)
    ended = {id(s): threading.Event() for s in servers}
    failures: list[BaseException] = []
    cancelled = threading.Event()

    def start(server) -> None:
        try:
            if server.twin and base is not None:
                ended[id(base)].wait()
            if not (failures or cancelled.is_set()):
                server.start()
        except BaseException as e:  # raised again by the calling thread below
            failures.append(e)
        finally:
            ended[id(server)].set()

    threads = [threading.Thread(target=start, args=(s,), name=f"bench-start-{s.label}", daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        while not failures and (alive := [t for t in threads if t.is_alive()]):
            alive[0].join(poll_s)
    except BaseException:
        _cancel(servers, threads, cancelled)
        raise
    if failures:
        _cancel(servers, threads, cancelled)
        raise failures[0]


def _cancel(servers: list, threads: list[threading.Thread], cancelled: threading.Event) -> None:
    """No start begins from now on; every server launched is stopped (a start waiting on one then fails at
    once), the threads are waited for, and whatever launched meanwhile is stopped too."""
    cancelled.set()
    for _ in range(2):
        for server in servers:
            server.stop()
        for t in threads:
            t.join(60)


def round_starts(runs: list[dict]) -> list[dict]:
    """Per interleaved round: how its servers started, the time from its first launch to its last server
    ready, and the sum of the servers' own start times (about what one by one takes)."""
    out = []
    for n in sorted({r.get("round", 1) for r in runs if "start" in r}):
        group = [r for r in runs if r.get("round", 1) == n and "start" in r and "launched_at" in r]
        if group:
            out.append({"round": n, "start": group[0]["start"], "servers": len(group),
                        "first_launch_to_last_ready_s": round(max(r["ready_at"] for r in group)
                                                              - min(r["launched_at"] for r in group), 1),
                        "sum_of_starts_s": round(sum(r["startup_s"] for r in group), 1)})
    return out
