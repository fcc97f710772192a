"""The pack's own loggers (`eagle3.*`: request retries, failed prompts, discarded benchmark
windows, phase start/finish) in the flow and task run logs of the Prefect API.

Prefect sends only its own loggers to the API unless a logger is named in
PREFECT_LOGGING_EXTRA_LOGGERS, and the root level (WARNING) drops INFO. Rather than relying on that
variable being set wherever a flow runs (`eagle3 run`, a worker's flow-run process, serve.py, a
user's own script), the flows attach Prefect's API handler to the `eagle3` logger themselves."""

from __future__ import annotations

import logging

from prefect.logging.handlers import APILogHandler


class _RunLogHandler(APILogHandler):
    """Prefect's API handler, minus its warning for records logged outside a run context (a
    pack thread without the run's context): those still reach the console through the root logger."""

    def emit(self, record: logging.LogRecord) -> None:
        from prefect.context import FlowRunContext, TaskRunContext

        if getattr(record, "flow_run_id", None) or FlowRunContext.get() or TaskRunContext.get():
            super().emit(record)


def route_pack_logs(level: int = logging.INFO) -> logging.Logger:
    """Idempotent; returns the `eagle3` logger."""
    pack = logging.getLogger("eagle3")
    pack.setLevel(min(pack.level or level, level))
    if not any(isinstance(h, APILogHandler) for h in pack.handlers):  # also one added by EXTRA_LOGGERS
        pack.addHandler(_RunLogHandler())
    return pack
