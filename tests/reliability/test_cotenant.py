"""Nobody else on the node can steer the pack (docs/security.md).

Each case is set up by a second, unprivileged local user (an account made with useradd where the
system allows it, else a uid no account has: the kernel checks numbers, not names) while the pack
runs as root, as it does on most GPU nodes. In each, the pack refuses (exit 2, naming the path or
PID and the fix) or stays harmless, and the victim file or process is untouched. The second user
acts from a forked child that dropped root (setgroups, setgid, setuid), so it can do exactly what
that user could, and nothing more. Without root, nobody can act as a second user: skipped."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from eagle3 import owned
from eagle3.process import lease, procfs
from eagle3.process.services import Registry, Supervisor, state_dir_for
from tests.procutil import SLEEP

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only root can act as a second local user "
                                                            "to set the cases up (CI runs as root)")

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
NAME = "eagle3-stranger"


@pytest.fixture(scope="module")
def stranger():
    """(uid, gid) of the second user, made for this module and removed after it."""
    made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
                          capture_output=True, text=True) if shutil.which("useradd") else None
    try:
        import pwd

        entry = pwd.getpwnam(NAME)
        yield entry.pw_uid, entry.pw_gid
    except KeyError:
        yield 54321, 54321
    finally:
        if made is not None and made.returncode == 0:
            subprocess.run(["userdel", NAME], capture_output=True)


@pytest.fixture
def shared(tmp_path_factory):
    """A scratch directory every user can create things in, like /tmp (root's, 1777)."""
    path = Path(tempfile.mkdtemp(prefix="eagle3-cotenant-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(user: tuple[int, int], action: Callable[[], object]) -> object:
    """Run `action` in a forked child that is `user` and nothing more; returns what it returned
    (JSON), or raises AssertionError with what it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            os.umask(0o022)  # a user's usual umask, not the one the pack set for itself
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
            out = {"ok": action()}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out, code = {"error": f"{type(e).__name__}: {e}"}, 1
        os.write(w, json.dumps(out, default=str).encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    result = json.loads(data)
    assert "ok" in result, f"the second user's setup failed: {result['error']}"
    return result["ok"]


def victim_file(directory: Path) -> tuple[Path, bytes]:
    """A root-owned file of mode 0600: what a planted link would make the pack overwrite."""
    path = directory / "victim"
    path.write_bytes(b"root's secret\n")
    os.chmod(path, 0o600)
    return path, path.read_bytes()


def assert_untouched(path: Path, content: bytes) -> None:
    st = os.stat(path)
    assert (path.read_bytes(), st.st_uid, st.st_mode & 0o7777) == (content, 0, 0o600)


def eagle3(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EAGLE3, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def refused(res: subprocess.CompletedProcess, *needles: str) -> str:
    msg = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2, msg
    assert "Traceback" not in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in: {msg}"
    return msg


# ---- the node lock dir -------------------------------------------------------------------------

def test_symlinked_lease_in_a_lock_dir_the_stranger_made_is_refused_and_the_victim_untouched(
        stranger, shared, monkeypatch, tmp_path):
    victim, content = victim_file(tmp_path)
    os.chmod(tmp_path, 0o755)
    locks = shared / "locks"

    def plant():
        os.mkdir(locks, 0o777)
        os.symlink(victim, locks / lease.gpu_lease_path(0, uid=0).name)

    as_user(stranger, plant)
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(locks))
    with pytest.raises(owned.NotOwned) as err:
        with lease.hold(tmp_path / "run", [0]):
            pass
    msg = str(err.value)
    assert str(locks) in msg and NAME in msg or "uid 54321" in msg
    assert "Remove it" in msg and lease.LOCK_DIR_ENV in msg
    assert_untouched(victim, content)


def test_a_lock_dir_owned_by_the_stranger_is_refused_through_the_cli(stranger, shared, tmp_path):
    locks = shared / "their-locks"
    as_user(stranger, lambda: os.mkdir(locks, 0o755))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    res = eagle3("handoff", "--run-dir", str(run_dir), "--gpus", "0", env={lease.LOCK_DIR_ENV: str(locks)})
    refused(res, f"GPU lock directory {locks}", "neither root nor you", "drwxr-xr-x")
    assert os.listdir(locks) == []  # nothing was written into it


def test_a_link_planted_in_roots_sticky_lock_dir_is_refused_and_the_victim_untouched(
        stranger, shared, monkeypatch, tmp_path):
    victim, content = victim_file(tmp_path)
    os.chmod(tmp_path, 0o755)
    locks = shared / "node-locks"
    monkeypatch.setattr(lease, "SHARED_LOCK_DIR", locks)
    monkeypatch.delenv(lease.LOCK_DIR_ENV, raising=False)
    assert lease.ensure_lock_dir() == locks  # made by root: root's, mode 1777, for every user's runs
    st = os.lstat(locks)
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o1777)
    as_user(stranger, lambda: os.symlink(victim, locks / lease.gpu_lease_path(0, uid=0).name))
    with pytest.raises(owned.NotOwned, match="is a symbolic link, which the pack never follows"):
        with lease.hold(tmp_path / "run", [0]):
            pass
    assert_untouched(victim, content)


def test_runs_of_two_users_exclude_each_other_through_their_own_lease_files(stranger, shared, monkeypatch, tmp_path):
    """Each user locks a file of their own; a GPU is held while anyone's is. Nobody writes through
    another user's file (root's run reads the stranger's, and the other way round)."""
    locks = shared / "node-locks"
    monkeypatch.setattr(lease, "SHARED_LOCK_DIR", locks)
    monkeypatch.delenv(lease.LOCK_DIR_ENV, raising=False)
    stranger_run = shared / "stranger-run"

    def try_gpu0():
        assert lease.node_lock_dir() == locks, "a non-root user uses root's shared dir once root has made it"
        try:
            with lease.hold(stranger_run, [0]):
                return "held"
        except lease.LeaseBusy as e:
            return str(e)

    with lease.hold(tmp_path / "run", [0]):
        msg = as_user(stranger, try_gpu0)
        assert msg.startswith("GPU 0 is in use by PID " + str(os.getpid())), msg
    assert as_user(stranger, try_gpu0) == "held"  # free again once root's run let go
    root_file, their_file = lease.gpu_lease_path(0, uid=0), lease.gpu_lease_path(0, uid=stranger[0])
    assert os.stat(root_file).st_uid == 0 and os.stat(their_file).st_uid == stranger[0]
    assert os.stat(their_file).st_mode & 0o022 == 0


def test_without_roots_shared_dir_a_user_gets_a_lock_dir_of_their_own(stranger, shared, monkeypatch):
    monkeypatch.setattr(lease, "SHARED_LOCK_DIR", shared / "not-made-yet")
    monkeypatch.delenv(lease.LOCK_DIR_ENV, raising=False)

    def where():
        path = lease.ensure_lock_dir()
        st = os.lstat(path)
        return [str(path), st.st_uid, st.st_mode & 0o7777]

    path, uid, mode = as_user(stranger, where)
    assert (path, uid, mode) == (str(shared / f"not-made-yet-{stranger[0]}"), stranger[0], 0o700)


# ---- the run dir -------------------------------------------------------------------------------

def test_a_registry_planted_in_a_world_writable_run_dir_never_ends_roots_process(stranger, shared, spawner):
    victim = spawner.start(SLEEP)  # a root process, in a group of its own, PID and ticks readable by all
    run_dir = shared / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o777)  # a run dir under /tmp or scratch that others can write
    info = procfs.read_stat(victim.pid)

    def plant():
        (run_dir / "state").mkdir()
        entry = {"id": "x", "name": "vllm", "phase": "datagen", "pid": victim.pid, "pgid": info.pgid,
                 "start_time": procfs.start_time(victim.pid), "argv": ["vllm"], "log": "/dev/null",
                 "start_ticks": info.start_ticks}
        (run_dir / "state" / "services.json").write_text(json.dumps([entry]))

    as_user(stranger, plant)
    res = eagle3("handoff", "--run-dir", str(run_dir))
    refused(res, f"run dir {run_dir}", "is writable by group or others", f"chmod go-w {run_dir}")
    assert procfs.same_start(victim.pid, info.start_ticks), "root's process was signalled"


def test_a_registry_entry_without_the_runs_token_is_left_alone_and_dropped(spawner, tmp_path):
    """Even in a private run dir, PID + start ticks are not proof: anyone can read them in /proc.
    (No second user needed; the entry is what a stranger would have written.)"""
    victim = spawner.start(SLEEP)
    info = procfs.read_stat(victim.pid)
    sup = Supervisor(state_dir_for(tmp_path / "run"))
    sup.registry.path.write_text(json.dumps([{
        "id": "forged", "name": "vllm", "phase": "datagen", "pid": victim.pid, "pgid": info.pgid,
        "start_time": procfs.start_time(victim.pid), "argv": ["vllm"], "log": "/dev/null",
        "start_ticks": info.start_ticks}]))
    os.chmod(sup.registry.path, 0o600)
    [outcome] = sup.sweep(default_grace_s=1.0)
    assert outcome.signal == "skipped" and outcome.members == []
    assert f"registry entry names PID {victim.pid} which does not carry this run's token: left alone" in outcome.note
    assert procfs.same_start(victim.pid, info.start_ticks)
    assert sup.registry.entries() == []  # dropped


def test_an_owner_token_replaced_by_the_stranger_is_refused(stranger, shared):
    run_dir = shared / "run"
    state = run_dir / "state"
    state.mkdir(parents=True)
    Registry(state)  # the run's own token, 0600
    os.chmod(run_dir, 0o755)
    os.chmod(state, 0o777)  # a moment of wrong permissions is enough

    def replace():
        (state / "owner-token").unlink()  # allowed: the directory, not the file, decides
        (state / "owner-token").write_text("stranger-chosen-token")

    as_user(stranger, replace)
    os.chmod(state, 0o700)  # the permissions are fixed again; the planted file stays
    with pytest.raises(owned.NotOwned) as err:
        Registry(state)
    assert f"owner token {state / 'owner-token'}" in str(err.value) and "not by you" in str(err.value)
    res = eagle3("handoff", "--run-dir", str(run_dir))
    refused(res, str(state / "owner-token"), "Another user made it")


def test_a_done_marker_planted_by_the_stranger_is_refused(stranger, shared, make_config):
    cfg = make_config(run_dir=shared / "run", check_files=False)
    state = cfg.layout.state
    state.mkdir(parents=True)
    os.chmod(cfg.run_dir, 0o755)
    os.chmod(state, 0o777)
    as_user(stranger, lambda: cfg.layout.done_marker("datagen").write_text('{"phase": "datagen"}'))
    os.chmod(state, 0o700)
    from eagle3.phase_runner import is_done

    with pytest.raises(owned.NotOwned, match="not by you"):
        is_done(cfg, "datagen")
    with pytest.raises(owned.NotOwned) as err:
        with lease.hold(cfg.run_dir):
            pass
    assert str(cfg.layout.done_marker("datagen")) in str(err.value)


def test_state_as_a_link_to_the_strangers_directory_is_refused(stranger, shared):
    run_dir = shared / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o777)
    theirs = shared / "theirs"

    def plant():
        theirs.mkdir()
        os.symlink(theirs, run_dir / "state")

    as_user(stranger, plant)
    os.chmod(run_dir, 0o700)
    with pytest.raises(owned.NotOwned, match="state directory .* is a symbolic link"):
        with lease.hold(run_dir):
            pass
    with pytest.raises(owned.NotOwned, match="is a symbolic link"):
        Supervisor(state_dir_for(run_dir))
    assert os.listdir(theirs) == []  # no registry, token or lease went there


def test_the_validator_refuses_a_run_dir_another_user_owns_or_a_parent_anyone_can_swap(stranger, shared, make_config):
    from eagle3.errors import ConfigError

    theirs = shared / "their-run"
    as_user(stranger, lambda: os.mkdir(theirs, 0o755))
    with pytest.raises(ConfigError, match=f"run_dir: {theirs}: it is owned by .*give each user a run dir"):
        make_config(run_dir=theirs, check_files=False)
    open_parent = shared / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)
    with pytest.raises(ConfigError, match=f"parent directory {open_parent} is writable by every user without "
                                          "the sticky bit"):
        make_config(run_dir=open_parent / "run", check_files=False)


def test_a_new_run_dir_is_private_and_so_is_what_the_run_creates(tmp_path):
    from eagle3.process.services import LaunchSpec

    run_dir = tmp_path / "fresh" / "run"
    previous = os.umask(0o022)  # a user's usual umask
    try:
        with lease.hold(run_dir):
            made = os.umask(0o077)
            os.umask(made)
            sup = Supervisor(state_dir_for(run_dir))
            out = run_dir / "child-wrote-this"
            sup.run(LaunchSpec(name="writer", argv=[sys.executable, "-c", f"open({str(out)!r}, 'w').write('x')"],
                               log=run_dir / "writer.log"))
    finally:
        os.umask(previous)
    assert os.stat(run_dir).st_mode & 0o777 == 0o700
    assert os.stat(run_dir / "state").st_mode & 0o777 == 0o700
    assert made & 0o077 == 0o077, "the pack's own files are the user's alone once it holds a run dir"
    assert os.stat(out).st_mode & 0o777 == 0o600, "what the processes it starts write is private too"
    assert os.stat(run_dir / "writer.log").st_mode & 0o077 == 0


# ---- the run's Prefect server --------------------------------------------------------------------

def _post(url: str, path: str, auth: str | None) -> int:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    conn.request("POST", f"/api{path}", body="{}", headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_another_users_request_to_the_runs_prefect_api_is_refused(stranger, tmp_path):
    from flows.local_server import auth_string, start_local_server

    sup = Supervisor(state_dir_for(tmp_path / "run"))
    proc, url = start_local_server(sup, tmp_path / "logs")
    try:
        assert as_user(stranger, lambda: _post(url, "/flow_runs/filter", None)) == 401
        assert as_user(stranger, lambda: _post(url, "/flow_runs/filter", "eagle3:guess")) == 401
        assert _post(url, "/flow_runs/filter", auth_string(sup)) == 200  # the run's own clients
        argv = [" ".join(procfs.cmdline(p.pid)) for p in procfs.group_members(proc.entry.pgid)]
        assert argv and not any(auth_string(sup) in a for a in argv)
    finally:
        proc.stop()
    assert procfs.group_members(proc.entry.pgid) == []
