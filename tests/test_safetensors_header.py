"""The pure-Python safetensors reader: accepts what the reference library writes, and names the
flaw of truncated, padded, overlapping or malformed files."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from eagle3.safetensors_header import SafetensorsError, read_header, read_tensor_bytes

REPO = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"


def write(path: Path, header: dict, data: bytes, pad_header: int = 0) -> Path:
    raw = json.dumps(header).encode() + b" " * pad_header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def good(tmp_path: Path) -> Path:
    ids = struct.pack("<3q", 7, 8, 9)
    hs = struct.pack("<12f", *range(12))
    return write(tmp_path / "hs_0.safetensors",
                 {"__metadata__": {"format": "pt"},
                  "token_ids": {"dtype": "I64", "shape": [3], "data_offsets": [0, 24]},
                  "hidden_states": {"dtype": "F32", "shape": [3, 2, 2], "data_offsets": [24, 72]}},
                 ids + hs, pad_header=5)


def test_reads_a_valid_file(tmp_path):
    h = read_header(good(tmp_path))
    assert h.metadata == {"format": "pt"}
    assert h.tensors["hidden_states"].shape == (3, 2, 2) and h.tensors["hidden_states"].dtype == "F32"
    assert struct.unpack("<3q", read_tensor_bytes(h, "token_ids")) == (7, 8, 9)


@pytest.mark.parametrize("cut", [1, 7, 8, 20, 100])
def test_truncation_is_detected_anywhere(tmp_path, cut):
    path = good(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-cut] if cut < len(data) else data[:4])
    with pytest.raises(SafetensorsError):
        read_header(path)


def test_trailing_bytes_overlap_and_bad_sizes(tmp_path):
    path = good(tmp_path)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(SafetensorsError, match="trailing garbage"):
        read_header(path)
    overlap = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    with pytest.raises(SafetensorsError, match="gap or overlap"):
        read_header(write(tmp_path / "o.safetensors", overlap, b"\0" * 12))
    wrong = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    with pytest.raises(SafetensorsError, match="needs 12 bytes"):
        read_header(write(tmp_path / "w.safetensors", wrong, b"\0" * 8))
    with pytest.raises(SafetensorsError, match="unknown dtype"):
        read_header(write(tmp_path / "d.safetensors", {"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"))
    (tmp_path / "j.safetensors").write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        read_header(tmp_path / "j.safetensors")
    (tmp_path / "big.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(SafetensorsError, match="does not fit"):
        read_header(tmp_path / "big.safetensors")
    with pytest.raises(SafetensorsError, match="does not exist"):
        read_header(tmp_path / "missing.safetensors")


@pytest.mark.engine
@pytest.mark.skipif(not ENGINE_PYTHON.exists(), reason="engine venv missing")
def test_agrees_with_the_reference_writer(tmp_path):
    script = (
        "import sys, torch\n"
        "from safetensors.torch import save_file\n"
        "save_file({'hidden_states': torch.randn(5, 4, 8, dtype=torch.bfloat16),"
        " 'token_ids': torch.arange(5), 'empty': torch.zeros(0, 3), 'flags': torch.ones(2, dtype=torch.bool)},"
        " sys.argv[1], metadata={'k': 'v'})\n")
    out = tmp_path / "ref.safetensors"
    subprocess.run([str(ENGINE_PYTHON), "-c", script, str(out)], check=True, timeout=120)
    h = read_header(out)
    assert {n: (t.dtype, t.shape) for n, t in h.tensors.items()} == {
        "hidden_states": ("BF16", (5, 4, 8)), "token_ids": ("I64", (5,)), "empty": ("F32", (0, 3)),
        "flags": ("BOOL", (2,))}
    assert h.metadata == {"k": "v"}
    assert struct.unpack("<5q", read_tensor_bytes(h, "token_ids")) == (0, 1, 2, 3, 4)
