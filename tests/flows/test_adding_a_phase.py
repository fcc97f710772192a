"""Adding a phase is one module plus one table row: standin_phase.py declares a phase after bench with
a config section of its own and a server, the fixture adds its row, and nothing else changes. Config
validation builds and checks its section, the CLI has `eagle3 digest`, the flow (in process, on the
session's real Prefect server) and `eagle3 run` (a subprocess with its own embedded server) run it
between GPU handoffs that prove its port free and purge its scratch dir, `eagle3 status` shows it,
and the doctor checks its port."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import standin_phase
import yaml
from flowkit import PHASES, base_env, config, end_session_leftovers, params, task_runs
from noop_phases import counts
from tests.ports import free_port

from eagle3 import phase_table
from eagle3.process import procfs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
HERE = Path(__file__).resolve().parent
TABLE_SPEC = f"{standin_phase.__name__}:TABLE"


@pytest.fixture
def added_phase(monkeypatch):
    """The no-op pipeline plus the stand-in row: in this process through phase_table.using, in the
    processes the test starts through EAGLE3_PHASE_TABLE (read when they ask for the table)."""
    monkeypatch.setenv(phase_table.TABLE_ENV, TABLE_SPEC)
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    with phase_table.using(standin_phase.TABLE) as table:
        yield table


def digest_config(tmp_path: Path, name: str, **section) -> tuple[str, Path, int]:
    """A no-op pipeline config with a `digest:` section (its own free port unless given)."""
    path, run_dir = config(tmp_path, name)
    raw = yaml.safe_load(Path(path).read_text())
    raw["digest"] = {"server": {"port": free_port()}, **section}
    Path(path).write_text(yaml.safe_dump(raw))
    return path, run_dir, raw["digest"]["server"]["port"]


def cli(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = env or base_env() | {phase_table.TABLE_ENV: TABLE_SPEC, "PYTHONPATH": str(HERE)}
    return subprocess.run([EAGLE3, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def assert_digest_done(run_dir: Path, port: int) -> dict:
    marker = json.loads((run_dir / "state" / "digest.done.json").read_text())
    bench = json.loads((run_dir / "state" / "bench.done.json").read_text())
    assert marker["upstream"] == bench["fingerprint"], "the new phase consumed bench's output"
    assert (run_dir / "digest" / "digest.txt").read_text().strip() == marker["summary"]["details"]["digest"]
    assert counts(run_dir) == dict.fromkeys(PHASES, 1)
    assert procfs.read_stat(marker["summary"]["details"]["server_pid"]) is None, "its server was ended"
    assert not procfs.listening_sockets({port}), "nothing listens on its port any more"
    assert not (run_dir / "digest" / "scratch").exists(), "the handoff after it purged its scratch dir"
    after = [json.loads(f.read_text()) for f in (run_dir / "handoffs").glob("*-digest-to-end-*.json")]
    assert after and all(r["ok"] and str(run_dir / "digest" / "scratch") in r["scratch_bytes_removed"] for r in after)
    return marker


def test_the_new_section_is_validated_like_the_others(added_phase, tmp_path):
    path, run_dir, port = digest_config(tmp_path, "added-phase-config", algorithm="blake2b")
    ok = cli("validate", path)
    assert ok.returncode == 0, ok.stderr
    raw = yaml.safe_load(Path(path).read_text())
    cases = {
        "missing": ({k: v for k, v in raw.items() if k != "digest"}, "digest: required field is missing"),
        "bad value": (raw | {"digest": raw["digest"] | {"algorithm": "md5"}}, "digest.algorithm: Input should be"),
        "unknown key": (raw | {"digest": raw["digest"] | {"algo": "x"}}, "digest.algo: unknown key"),
        "shared port": (raw | {"digest": {"server": {"port": raw["bench"]["server"]["port"]}}},
                        "digest.server.port: port"),
    }
    for case, (bad, expected) in cases.items():
        Path(path).write_text(yaml.safe_dump(bad))
        res = cli("validate", path)
        assert res.returncode == 2 and expected in res.stderr, (case, res.stderr)
    # the schema of another table has no such section: the key is refused there
    Path(path).write_text(yaml.safe_dump(raw))
    plain = cli("validate", path, env=base_env())
    assert plain.returncode == 2 and "digest: unknown key" in plain.stderr, plain.stderr


def test_the_flow_runs_an_added_phase_between_handoffs(prefect_server, added_phase, tmp_path):
    from flows.pipeline import eagle3_pipeline

    path, run_dir, port = digest_config(tmp_path, "added-phase-flow")
    state = eagle3_pipeline(**params(path), return_state=True)
    assert state.is_completed(), state.message
    runs = task_runs(state.state_details.flow_run_id)
    assert runs["digest"].state.name == "Completed"
    handoffs = sorted(name for name in runs if name.startswith("handoff-after-"))
    assert handoffs == sorted(f"handoff-after-{p}" for p in ("start", *PHASES, "digest"))
    reports = {json.loads(f.read_text())["label"]: json.loads(f.read_text()) for f in (run_dir / "handoffs").glob("*.json")}
    assert {"bench-to-digest", "digest-to-end"} <= set(reports)
    assert port in reports["bench-to-digest"]["ports_checked"], "the handoff proved its port free"
    assert_digest_done(run_dir, port)
    shown = cli("status", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert "done" in shown.stdout.split("digest", 1)[1].splitlines()[0]


def test_the_cli_status_doctor_and_handoff_know_an_added_phase(added_phase, tmp_path):
    path, run_dir, port = digest_config(tmp_path, "added-phase-cli", algorithm="blake2b")
    helped = cli("--help")
    assert "digest" in helped.stdout and "Digest bench's output through the phase's own server." in helped.stdout
    refused = cli("digest", path)  # its upstream is not done yet
    assert refused.returncode == 2 and "phase 'digest' needs 'bench' finished" in refused.stderr, refused.stderr
    home = tmp_path / "prefect-home"
    try:
        res = cli("run", path, "--no-doctor", env=base_env() | {"PREFECT_HOME": str(home), "PYTHONPATH": str(HERE),
                                                                phase_table.TABLE_ENV: TABLE_SPEC}, timeout=500)
    finally:
        end_session_leftovers(home)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "done digest" in res.stdout
    marker = assert_digest_done(run_dir, port)
    assert marker["summary"]["details"]["algorithm"] == "blake2b"
    # its own command, through run_phase: done is skipped, --force redoes it (server, handoff and all)
    again = cli("digest", path)
    assert again.returncode == 0 and "digest: blake2b" in again.stdout, again.stderr
    assert json.loads((run_dir / "state" / "digest.done.json").read_text()) == marker
    forced = cli("digest", path, "--force")
    assert forced.returncode == 0, forced.stderr
    redone = json.loads((run_dir / "state" / "digest.done.json").read_text())
    assert redone["finished_at"] > marker["finished_at"] and redone["upstream"] == marker["upstream"]
    shown = cli("status", str(run_dir))
    assert shown.returncode == 0 and "done" in shown.stdout.split("digest", 1)[1].splitlines()[0], shown.stdout
    doctor = cli("doctor", path, "--no-engines", "--json")
    ports = next(c for c in json.loads(doctor.stdout) if c["name"] == "ports")
    assert ports["status"] == "PASS" and str(port) in ports["reason"], ports
    handoff = cli("handoff", path, "--after", "digest", "--json")
    assert handoff.returncode == 0, handoff.stderr
    assert port in json.loads(handoff.stdout)["ports_checked"]
    # Only the selected table knows the phase: without it the CLI refuses the name, naming the choices.
    plain = cli("run", path, "--only", "digest", env=base_env())
    assert plain.returncode == 2 and "unknown phase 'digest'; choose from datagen, extract, train, bench" in plain.stderr
