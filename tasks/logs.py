"""The pack's log records in Prefect, and the console's view of Prefect's own.

The pack's own loggers (`eagle3.*`: request retries, failed prompts, discarded benchmark
windows, phase start/finish) in the flow and task run logs of the Prefect API.

Prefect sends only its own loggers to the API unless a logger is named in
PREFECT_LOGGING_EXTRA_LOGGERS, and the root level (WARNING) drops INFO. Rather than relying on that
variable being set wherever a flow runs (`eagle3 run`, a worker's flow-run process, serve.py, a
user's own script), the flows attach Prefect's API handler to the `eagle3` logger themselves."""

from __future__ import annotations

import logging
import re

from prefect.logging.handlers import APILogHandler

from eagle3.errors import PipelineError


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


class _SaidByThePack(logging.Filter):
    """Drops, from a console only, the Prefect engine's restatements of a failure the pack has
    already said: the task's and the flow's "failed with exception" records (with a traceback each)
    and their "Finished in state Failed(...)" lines, for a pack error (eagle3.errors.PipelineError).
    The phase's own END line and the run's last line say it once; the API keeps every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("prefect.flow_runs", "prefect.task_runs")):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PipelineError):
            return False
        message = record.getMessage()
        return not (message.startswith("Finished in state Failed(") and _pack_error().search(message))


def _pack_error() -> re.Pattern:
    """The names of the pack's error classes imported so far (a phase's own are imported with it)."""
    names, todo = set(), [PipelineError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")


def quiet_console_restatements() -> None:
    """Idempotent: the filter on each console handler of Prefect's loggers."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs", ""):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, PrefectConsoleHandler) and not any(isinstance(f, _SaidByThePack)
                                                                      for f in handler.filters):
                handler.addFilter(_SaidByThePack())
