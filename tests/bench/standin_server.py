"""A stand-in for eagle3.bench.measure.BenchServer: the same constructor and calls, no process. A test
gives it the start and window speed it needs (measure_interleaved constructs BenchServer by name)."""

from __future__ import annotations


class StandInServer:
    def __init__(self, cfg, sup, label, k, drafter, warmup_texts, port, twin, instance, extra_args=()):
        self.label, self.k, self.twin, self.extra = label, k, twin, list(extra_args)
        self.record = {"label": label, "k": k, **({"twin": True} if twin else {}), "windows": [], "extra": self.extra}

    def start(self):
        pass

    def speed(self, repeat: int, concurrency: int) -> float:
        return 100.0

    def window(self, c, dataset, num_prompts, repeat, slot):
        self.record["windows"].append({"concurrency": c, "repeat": repeat, "slot": slot,
                                       "load": {"output_throughput": self.speed(repeat, c)}})

    def probes(self, probes):
        pass

    def finish(self):
        pass

    def stop(self):
        self.record["stopped"] = True
