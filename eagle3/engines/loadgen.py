"""The engines' own load generators: what one run is asked (LoadSpec), what the report reads of it
(LoadResult), and the two shapes of client an engine's open_load_client picks for a server's windows
(eagle3/phases/bench.py). Each engine's module builds its own client's command line and reads its
result file (Engine.load_argv, parse_load).

Every client is driven the same way: a file of held-out prompts, one run per concurrency, the chat
endpoint (so the server applies the same chat template as in data generation), explicit sampling and
output length, no built-in warm-up or ready-check request (the phase warms the server up itself,
outside the measured window, so that the window holds exactly the measured requests and the server's
counter deltas around it belong to them alone).

DriverClient: one long-lived process per server (vLLM's engine_side/vllm_bench_driver.py runs `vllm bench
serve`'s own main() once per job), so the client's import (~10 s for vLLM's) is paid once per server, and
while that server starts (it is launched first), instead of once per window. The window's counter
snapshots are taken right before a job is handed over and right after it finished. OneShotClient: one
process per window (SGLang's `python -m sglang.bench_serving`).

Both raise what `Supervisor.run` raised for a one-shot client: CommandFailed (non-zero exit, with
the log tail), ServiceStartTimeout (over the window's time budget), ServiceHung (a silent log)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CommandFailed, ServiceHung, ServiceStartTimeout
from ..fsio import atomic_write_json
from ..process.services import LaunchSpec, Supervisor, Watchdog


@dataclass(frozen=True)
class LoadSpec:
    base_url: str
    served_name: str
    tokenizer: Path          # the target's model dir (prompt-length counting on the client)
    dataset: Path
    num_prompts: int
    concurrency: int
    max_tokens: int
    temperature: float
    ignore_eos: bool
    result_file: Path
    seed: int = 0


@dataclass
class LoadResult:
    """The numbers the report uses, in one vocabulary whichever client produced them."""

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float          # tok/s over the window
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_itl_ms: float | None
    mean_e2el_ms: float | None
    client_spec: dict | None          # the client's own acceptance numbers, if it printed any
    raw_file: str
    # Per request (vLLM's client, --save-detailed): {"output_tokens", "ttft_ms", "latency_ms", "chunks"} of
    # each completed request; the benchmark watch bootstraps its noise intervals from them.
    requests: list[dict] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def read_result_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CommandFailed(f"the benchmark client exited 0 but wrote no result file {path}") from None


class OneShotClient:
    """A fresh load-generator process per window."""

    def __init__(self, sup: Supervisor, engine, env_cfg, env: dict, name: str, log_dir: Path,
                 phase: str, hang_timeout_s: float | None):
        """`engine`: its Engine object (load_argv builds each run's command line)."""
        self.sup, self.argv_fn, self.env_cfg, self.env = sup, engine.load_argv, env_cfg, env
        self.name, self.log_dir, self.phase, self.hang_timeout_s = name, log_dir, phase, hang_timeout_s

    def run(self, spec: LoadSpec, timeout_s: float) -> Path:
        """Returns the log of the run."""
        log = self.log_dir / f"{self.name}-c{spec.concurrency}.log"
        self.sup.run(LaunchSpec(name=f"{self.name}-c{spec.concurrency}", argv=self.argv_fn(self.env_cfg, spec), log=log,
                                phase=self.phase, env=self.env, stop_grace_s=10.0, hang_timeout_s=self.hang_timeout_s),
                     timeout_s=timeout_s)
        return log

    def stop(self) -> None:
        pass


class DriverClient:
    """One driver process for all windows of a server; start it before the server. The driver (run as
    `python DRIVER JOBS_DIR`) runs each job N.json ({"argv": job_argv(spec)}) and writes its exit code to N.rc."""

    def __init__(self, sup: Supervisor, engine, env_cfg, env: dict, name: str, log_dir: Path, phase: str,
                 hang_timeout_s: float | None, driver: Path, job_argv: Callable[[LoadSpec], list[str]]):
        self.jobs = log_dir.parent / "client-jobs" / name
        for old in self.jobs.glob("*") if self.jobs.is_dir() else []:
            old.unlink()  # a retried run starts its numbering afresh
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.hang_timeout_s, self.n, self.job_argv, self.client = hang_timeout_s, 0, job_argv, engine.load_client
        self.log = log_dir / f"{name}.log"
        self.proc = sup.launch(LaunchSpec(name=name, argv=[*env_cfg.python_argv(), str(driver), str(self.jobs)],
                                          log=self.log, phase=phase, env=env, stop_grace_s=10.0))

    def run(self, spec: LoadSpec, timeout_s: float) -> Path:
        self.n += 1
        done = self.jobs / f"{self.n}.rc"
        atomic_write_json(self.jobs / f"{self.n}.json", {"argv": self.job_argv(spec)})
        t0, dog = time.monotonic(), Watchdog(self.log, self.hang_timeout_s)
        while not done.exists():
            rc = self.proc.poll()
            if rc is not None:
                self.proc.stop()
                raise CommandFailed(f"{self.proc.spec.name} exited with code {rc}", self.proc.log_tail(),
                                    returncode=rc, retryable=rc < 0)
            if time.monotonic() - t0 > timeout_s:
                self.proc.stop()
                raise ServiceStartTimeout(f"{self.proc.spec.name}: window {self.n} did not finish within "
                                          f"{timeout_s:.0f} s", self.proc.log_tail())
            if dog.hung():
                self.proc.stop()
                raise ServiceHung(f"{self.proc.spec.name} hung: no log output for {dog.silent_for():.0f} s",
                                  self.proc.log_tail())
            time.sleep(0.05)
        rc = int(done.read_text() or 1)
        if rc != 0:
            raise CommandFailed(f"{self.proc.spec.name}: {self.client} failed with exit code {rc} (window {self.n})",
                                self.proc.log_tail(), returncode=rc)
        return self.log

    def stop(self) -> None:
        self.proc.stop()
