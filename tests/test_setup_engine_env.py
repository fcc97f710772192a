"""scripts/setup-engine-env.sh is idempotent: on the built engine venv it is a quick no-op.

Every run goes through --check first, so a stale venv fails the test instead of starting a
3.5 GB rebuild inside the test suite."""

from __future__ import annotations

import shutil
import time

import pytest

from eagle3.errors import CommandFailed
from eagle3.process.services import LaunchSpec, Supervisor

from tests.conftest import REPO, engine_available

SCRIPT = REPO / "scripts" / "setup-engine-env.sh"
VENV = REPO / ".venv-engine"


def run_script(tmp_path, *args: str) -> tuple[int, str, float]:
    sup = Supervisor(tmp_path / "state")
    log = tmp_path / f"setup-{len(list(tmp_path.glob('setup-*.log')))}.log"
    t0 = time.monotonic()
    try:
        rc = sup.run(LaunchSpec(name="setup-engine-env", argv=[str(SCRIPT), *args], log=log, cwd=REPO),
                     timeout_s=120)
    except CommandFailed as e:
        rc = e.returncode
    assert sup.registry.entries() == []
    return rc, log.read_text(), time.monotonic() - t0


@pytest.mark.engine
@pytest.mark.skipif(not engine_available(), reason="engine venv missing: run scripts/setup-engine-env.sh")
def test_rerun_on_built_venv_does_nothing(tmp_path):
    rc, text, _ = run_script(tmp_path, "--check", str(VENV))
    assert rc == 0, f"the engine venv is not up to date; rebuild it outside the tests:\n{text}"
    rc, text, seconds = run_script(tmp_path, str(VENV))
    assert rc == 0
    assert "(nothing to do)" in text
    assert "installing" not in text and "pip" not in text
    assert seconds < 30, f"a no-op run took {seconds:.1f} s"


def test_check_reports_a_missing_or_unfinished_venv(tmp_path):
    rc, text, _ = run_script(tmp_path, "--check", str(tmp_path / "absent"))
    assert rc == 1 and "not up to date" in text
    assert not (tmp_path / "absent").exists(), "--check must not create anything"
    # A stamp alone (an interrupted build, say) is not an up-to-date venv.
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    if (VENV / ".eagle3-engine-stamp").exists():
        shutil.copy(VENV / ".eagle3-engine-stamp", fake / ".eagle3-engine-stamp")
    rc, text, _ = run_script(tmp_path, "--check", str(fake))
    assert rc == 1 and "not up to date" in text


def test_console_scripts_that_name_another_clone_s_link_are_repaired(tmp_path):
    """A venv built through a link (the CI cache) had its scripts name that clone's path, e.g.
    `#!/<other clone>/.venv-engine/bin/python`, which no longer exists in the next clone: every
    `vllm` launch failed with ENOENT. The script points them at the venv's own real interpreter."""
    import os
    import subprocess
    import sys

    real = tmp_path / "cache" / "venv-engine"
    (real / "bin").mkdir(parents=True)
    os.symlink(sys.executable, real / "bin" / "python")
    script = real / "bin" / "vllm"
    gone = tmp_path / "gone-clone" / ".venv-engine" / "bin" / "python"
    script.write_text(f"#!{gone}\nprint('ran')\n")
    script.chmod(0o755)
    (real / "bin" / "plain").write_text("#!/bin/sh\necho plain\n")
    link = tmp_path / "clone" / ".venv-engine"
    link.parent.mkdir()
    link.symlink_to(real)
    rc, text, _ = run_script(tmp_path, "--repair-scripts", str(link))
    assert rc == 0 and f"repaired vllm: it named {gone}" in text, text
    assert script.read_text().splitlines()[0] == f"#!{real.resolve()}/bin/python"
    assert (real / "bin" / "plain").read_text().startswith("#!/bin/sh"), "only python scripts are touched"
    assert subprocess.run([str(link / "bin" / "vllm")], capture_output=True, text=True).stdout == "ran\n"
    rc, text, _ = run_script(tmp_path, "--repair-scripts", str(link))
    assert rc == 0 and "repaired" not in text, "a second pass has nothing to do"


def test_scripts_that_name_a_python_of_the_venv_itself_are_left_alone(tmp_path):
    """A venv made in the checkout (a newcomer's `make test`, no cache link): `python -m venv` writes
    its pip scripts with `#!<venv>/bin/python3`. That is the venv's own interpreter; rewriting it made
    every rerun "repair" pip again, so the no-op rerun was not one (found by a cache-free clone)."""
    import os
    import sys

    venv = tmp_path / ".venv-engine"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    os.symlink("python", venv / "bin" / "python3")
    for name, interp in (("pip", "python3"), ("pip3.11", "python3"), ("vllm", "python")):
        (venv / "bin" / name).write_text(f"#!{venv.resolve()}/bin/{interp}\nprint('ran')\n")
    before = {f.name: f.read_text() for f in (venv / "bin").iterdir() if not f.is_symlink()}
    rc, text, _ = run_script(tmp_path, "--repair-scripts", str(venv))
    assert rc == 0 and "repaired" not in text, text
    assert {f.name: f.read_text() for f in (venv / "bin").iterdir() if not f.is_symlink()} == before
