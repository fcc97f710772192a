"""tests/xdist_plan.py: `make test`'s workers get each shared server's tests on one of them, and the
heaviest work first. The real scheduler class is driven with the plan the workers would write."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import xdist_plan


def _item(nodeid: str, fixtures=(), slow=False):
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures),
                           get_closest_marker=lambda name: object() if slow and name == "slow" else None)


ITEMS = [_item("tests/a.py::t1"), _item("tests/a.py::t2", ("vllm_server",), slow=True),
         _item("tests/b.py::t1", slow=True), _item("tests/c.py::t1"), _item("tests/c.py::t2"),
         _item("tests/flows/f.py::t1", ("worker", "prefect_server")), _item("tests/d.py::t1", slow=True),
         _item("tests/d.py::t2", slow=True)]


def test_a_module_is_shared_when_any_of_its_tests_uses_a_shared_server():
    plan = xdist_plan.modules(ITEMS)
    assert {m for m, e in plan.items() if e["shared"]} == {"tests/a.py", "tests/flows/f.py"}
    assert plan["tests/d.py"] == {"shared": False, "slow": 2, "tests": 2}


def test_the_scheduler_groups_the_shared_modules_and_queues_the_heaviest_first(tmp_path, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv(xdist_plan.PLAN_ENV, str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    xdist_plan.write_plan(ITEMS)
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True),
                             getvalue=lambda name: {"tx": ["2*popen"], "dist": "loadscope"}.get(name))
    sched = xdist_plan.make_scheduler(config, None)
    ids = [i.nodeid for i in ITEMS]

    class Node:  # what the scheduler reads of xdist's WorkerController
        def __init__(self, name):
            self.gateway = SimpleNamespace(id=name)

    nodes = [Node("gw0"), Node("gw1")]
    sched.registered_collections = {node: list(ids) for node in nodes}
    sched.numnodes = 2
    sched.assigned_work = {}  # no nodes yet: schedule() only builds its queue
    sched.schedule()
    assert set(sched.workqueue) == {xdist_plan.SHARED_GROUP, "tests/b.py", "tests/c.py", "tests/d.py"}
    assert list(sched.workqueue[xdist_plan.SHARED_GROUP]) == ["tests/a.py::t1", "tests/a.py::t2",
                                                               "tests/flows/f.py::t1"]
    # A worker is sent the shared group first, by the indexes of the tests in its own collection.
    sent = []
    worker = nodes[0]
    worker.send_runtest_some = sent.append
    sched._assign_work_unit(worker)
    assert sent == [[0, 1, 5]] and sched.registered_collections[worker] == ids
    assert list(sched.workqueue) == ["tests/d.py", "tests/b.py", "tests/c.py"]
