"""The load generator of one benchmark server's windows (eagle3/phases/bench.py), in one of two shapes
an engine's open_load_client picks.

DriverClient: one long-lived process per server (vLLM's engine_side/vllm_bench_driver.py runs `vllm bench
serve`'s own main() once per job), so the client's import (~10 s for vLLM's) is paid once per server, and
while that server starts (it is launched first), instead of once per window. The window's counter
snapshots are taken right before a job is handed over and right after it finished. OneShotClient: one
process per window (SGLang's `python -m sglang.bench_serving`).

Both raise what `Supervisor.run` raised for a one-shot client: CommandFailed (non-zero exit, with
the log tail), ServiceStartTimeout (over the window's time budget), ServiceHung (a silent log)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..errors import CommandFailed, ServiceHung, ServiceStartTimeout
from ..fsio import atomic_write_json
from ..process.services import LaunchSpec, Supervisor, Watchdog
from . import benchclient

class OneShotClient:
    """A fresh load-generator process per window."""

    def __init__(self, sup: Supervisor, engine, env_cfg, env: dict, name: str, log_dir: Path,
                 phase: str, hang_timeout_s: float | None):
        """`engine`: its Engine object (load_argv builds each run's command line)."""
        self.sup, self.argv_fn, self.env_cfg, self.env = sup, engine.load_argv, env_cfg, env
        self.name, self.log_dir, self.phase, self.hang_timeout_s = name, log_dir, phase, hang_timeout_s

    def run(self, spec: benchclient.LoadSpec, timeout_s: float) -> Path:
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
                 hang_timeout_s: float | None, driver: Path, job_argv: Callable[[benchclient.LoadSpec], list[str]]):
        self.jobs = log_dir.parent / "client-jobs" / name
        for old in self.jobs.glob("*") if self.jobs.is_dir() else []:
            old.unlink()  # a retried run starts its numbering afresh
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.hang_timeout_s, self.n, self.job_argv, self.client = hang_timeout_s, 0, job_argv, engine.load_client
        self.log = log_dir / f"{name}.log"
        self.proc = sup.launch(LaunchSpec(name=name, argv=[*env_cfg.python_argv(), str(driver), str(self.jobs)],
                                          log=self.log, phase=phase, env=env, stop_grace_s=10.0))

    def run(self, spec: benchclient.LoadSpec, timeout_s: float) -> Path:
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
