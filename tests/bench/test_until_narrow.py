"""bench.max_windows: window slots go on past bench.windows until every paired interval is narrow enough
(eagle3/bench/measure.py: narrow_enough, measure_interleaved). The servers here are stand-ins whose
windows follow a script (a slot-wide drift, a twin's noise), so when the loop must stop is known exactly;
the interleaved schedule on real vLLM CPU servers is tests/phases/test_bench.py's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from eagle3.bench import measure
from eagle3.bench.repeats import pair_by_slot, paired_ratio_interval, reach_pct
from tests.bench.standin_server import StandInServer


class ScriptedServer(StandInServer):
    """Each window's tok/s is `speed(slot number, concurrency)`, from `speeds` by k ("twin" for the twin)."""
    speeds: dict = {}

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.speed = self.speeds["twin" if self.twin else self.k]


def drift(n: int) -> float:
    return 400 + 60 * math.sin(n)  # the machine's speed moves from slot to slot; pairing cancels it


def run(monkeypatch, speeds: dict, windows: int, max_windows: int | None, target: float = 3.0,
        concurrency=(1, 4)) -> tuple[list[dict], list[int]]:
    monkeypatch.setattr(ScriptedServer, "speeds", speeds)
    monkeypatch.setattr(measure, "BenchServer", ScriptedServer)
    bench = SimpleNamespace(schedule="interleaved", windows=windows, max_windows=max_windows, target_halfwidth_pct=target,
                            concurrency=list(concurrency), server_ports=lambda: [9000, 9001, 9002])
    plan = [("baseline", 0, False), ("k=3", 3, False), ("baseline (twin)", 0, True)]
    extra: list[int] = []
    records = measure.measure_interleaved(SimpleNamespace(bench=bench), None, plan, "drafter", None, 8, [], 1,
                                          on_extra_slot=extra.append)
    return records, extra


def half_width_pct(records: list[dict], which: int, c: int, slots: int) -> float:
    """How far the interval reaches, recomputed from the first `slots` slots, as bench.max_windows judges it:
    the twin's from 1 (within ±target of 1), a speedup's from its value (its half-width)."""
    at = lambda r: [w for w in r["windows"] if w["concurrency"] == c and w["repeat"] <= slots]  # noqa: E731
    ratio = paired_ratio_interval(pair_by_slot(at(records[which]), at(records[0])))
    return reach_pct(ratio, around=1.0 if records[which].get("twin") else None)


def test_slots_go_on_until_the_twin_is_within_the_target_and_no_further(monkeypatch):
    speeds = {0: lambda n, c: drift(n) * c, 3: lambda n, c: 1.2 * drift(n) * c,  # k=3 decided faster at once
              "twin": lambda n, c: drift(n) * c * (1.02 if n % 2 else 0.98)}     # ±2 % A/A noise
    records, extra = run(monkeypatch, speeds, windows=2, max_windows=12)
    slots = max(w["repeat"] for w in records[0]["windows"])
    assert all(len(r["windows"]) == 2 * slots for r in records) and all(r["stopped"] for r in records)
    # It stopped at the first slot count at which the twin's interval was within ±3 %, at both concurrencies.
    assert all(half_width_pct(records, 2, c, slots) <= 3.0 for c in (1, 4))
    assert any(half_width_pct(records, 2, c, slots - 1) > 3.0 for c in (1, 4))
    assert 2 < slots < 12 and extra == [3 * 2] * (slots - 2)  # each extra slot announced with its windows


def test_noise_wider_than_the_target_runs_to_max_windows(monkeypatch):
    speeds = {0: lambda n, c: drift(n), 3: lambda n, c: drift(n) * (1.25 if n % 2 else 0.8),  # undecided, wide
              "twin": lambda n, c: drift(n)}
    records, extra = run(monkeypatch, speeds, windows=3, max_windows=6, concurrency=(1,))
    assert [len(r["windows"]) for r in records] == [6, 6, 6] and extra == [3, 3, 3]
    assert half_width_pct(records, 1, 1, 6) > 3.0


@pytest.mark.parametrize("max_windows", [None, 3])
def test_without_max_windows_or_when_already_narrow_it_measures_exactly_windows(monkeypatch, max_windows):
    speeds = {0: lambda n, c: drift(n), 3: lambda n, c: 1.2 * drift(n), "twin": lambda n, c: drift(n) * 1.001}
    records, extra = run(monkeypatch, speeds, windows=3, max_windows=max_windows, concurrency=(1,))
    assert [len(r["windows"]) for r in records] == [3, 3, 3] and extra == []


def test_one_slot_is_never_narrow_enough():
    servers = [SimpleNamespace(k=0, twin=False, record={"windows": [
                   {"concurrency": 1, "slot": "r1w1", "load": {"output_throughput": 100.0}}]}),
               SimpleNamespace(k=3, twin=False, record={"windows": [
                   {"concurrency": 1, "slot": "r1w1", "load": {"output_throughput": 300.0}}]})]
    assert not measure.narrow_enough(servers, [1], 50.0)
