"""The NVML wrapper where no GPU exists (fail closed, say so plainly), the watchdog's GPU-idle
signal, and the CI fake that stands in for NVML behind the same interface."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from eagle3.handoff.gpus import GpuQueryError, NvmlBackend, NvmlUnavailable, gpu_sampler
from tests.fakegpu import FakeGpuBackend
from tests.procutil import HOLD, PY, wait_until

pytestmark = pytest.mark.timeout(60)


def nvml_works() -> bool:
    try:
        NvmlBackend().close()
        return True
    except NvmlUnavailable:
        return False


no_gpu = pytest.mark.skipif(nvml_works(), reason="this host has NVML; tests/gpu covers it")


@no_gpu
def test_nvml_missing_is_unavailable_not_free():
    with pytest.raises(NvmlUnavailable, match="NVML"):
        NvmlBackend()


@no_gpu
def test_gpus_command_says_plainly_there_is_no_gpu():
    eagle3 = Path(PY).parent / "eagle3"
    text = subprocess.run([eagle3, "gpus"], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and text.stdout.startswith("No NVIDIA GPU here")
    data = json.loads(subprocess.run([eagle3, "gpus", "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert data["available"] is False and data["gpus"] == [] and "NVML" in data["reason"]


def test_fake_backend_follows_real_holders(tmp_path, spawner):
    fake = FakeGpuBackend(tmp_path / "dev", count=2, mib_per_holder=4622)
    assert [s.used_mib for s in fake.snapshot()] == [0, 0]
    p = spawner.start(HOLD, fake.device(1))
    gpu1 = fake.snapshot([1])[0]
    assert gpu1.used_mib == 4622 and [q.pid for q in gpu1.processes] == [p.pid]
    assert gpu1.device_file(tmp_path / "dev") == fake.device(1)
    p.kill()
    p.wait()
    assert fake.snapshot([1])[0].used_mib == 0 and fake.snapshot([1])[0].processes == ()
    with pytest.raises(GpuQueryError):
        fake.snapshot([2])


def test_gpu_sampler_reads_the_given_gpus_and_none_when_it_cannot(tmp_path, spawner):
    fake = FakeGpuBackend(tmp_path / "dev", count=2)
    made = []
    sample = gpu_sampler(backend_factory=lambda: made.append(1) or fake)
    spawner.start(HOLD, fake.device(1))
    fake.util[1] = 100
    [gpu1] = sample([1])
    assert (gpu1.index, gpu1.used_mib, gpu1.util_gpu) == (1, 512, 100)
    assert [s.index for s in sample([0, 1])] == [0, 1] and made == [1]  # one NVML session, reused
    fake.error = "GPU is lost"
    assert sample([0]) is None  # unverifiable: the watchdog then never ends a service on silence alone


def test_gpu_sampler_without_nvml_answers_none():
    def broken():
        raise NvmlUnavailable("no driver")

    assert gpu_sampler(backend_factory=broken)([0]) is None
