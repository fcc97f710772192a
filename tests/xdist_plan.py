"""How `make test` (TEST_WORKERS=N, 2 by default) spreads the suite over N pytest-xdist workers.

- One module runs on one worker, with its module-scoped fixtures built once.
- Every module that uses a server the session shares (SHARED_SERVERS) runs on the same worker, so
  each of those servers starts once per suite, not once per worker.
- Work goes out heaviest first (that group, then modules by their count of `slow` tests), so no
  long module starts last while the other worker sits idle.

Only the workers collect. Each writes what the controller's scheduler needs (per module: shared or
not, slow tests, tests) into a directory the controller made for this run (PLAN_ENV). The scheduler
reads it once every worker has collected."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

SHARED_SERVERS = frozenset({"prefect_server", "vllm_server"})
SHARED_GROUP = "shared-servers"
PLAN_ENV = "EAGLE3_TEST_PLAN_DIR"


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def make_plan_dir() -> None:
    """In the controller, at configure time, before it starts its workers (they inherit the variable)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(PLAN_ENV):
        return
    import atexit

    made = tempfile.mkdtemp(prefix="eagle3-test-plan-")
    os.environ[PLAN_ENV] = made
    atexit.register(shutil.rmtree, made, True)


def modules(items) -> dict[str, dict]:
    """{module: {"shared": uses a shared server, "slow": its slow tests, "tests": its tests}}."""
    plan: dict[str, dict] = {}
    for item in items:
        entry = plan.setdefault(module_of(item.nodeid), {"shared": False, "slow": 0, "tests": 0})
        entry["shared"] = entry["shared"] or bool(SHARED_SERVERS & set(item.fixturenames))
        entry["slow"] += item.get_closest_marker("slow") is not None
        entry["tests"] += 1
    return plan


def write_plan(items) -> None:
    """In a worker, after collection."""
    where, worker = os.environ.get(PLAN_ENV), os.environ.get("PYTEST_XDIST_WORKER")
    if not where or not worker:
        return
    tmp = Path(where) / f".{worker}.json.tmp"
    tmp.write_text(json.dumps(modules(items)))
    os.replace(tmp, Path(where) / f"{worker}.json")


def read_plan() -> dict[str, dict]:
    where = os.environ.get(PLAN_ENV)
    for path in sorted(Path(where).glob("gw*.json")) if where else ():
        return json.loads(path.read_text())  # every worker collected the same tests
    return {}


def weight(scope: str, plan: dict[str, dict]) -> tuple:
    """Sort key: the shared group first, then modules with more slow tests, then more tests."""
    if scope == SHARED_GROUP:
        return (0, 0, 0)
    entry = plan.get(scope, {})
    return (1, -entry.get("slow", 0), -entry.get("tests", 0))


def make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class PlannedScheduling(LoadScopeScheduling):
        plan: dict[str, dict] = {}

        def _split_scope(self, nodeid: str) -> str:
            module = module_of(nodeid)
            return SHARED_GROUP if self.plan.get(module, {}).get("shared") else module

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:
                PlannedScheduling.plan = read_plan()
            super().schedule()

        def _assign_work_unit(self, node) -> None:
            # The queue is reordered, never the collections: a worker runs tests by their index in
            # the collection it reported.
            ordered = sorted(self.workqueue.items(), key=lambda unit: weight(unit[0], self.plan))
            self.workqueue.clear()
            self.workqueue.update(ordered)
            super()._assign_work_unit(node)

    return PlannedScheduling(config, log)
