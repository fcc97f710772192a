"""Read and check safetensors files in pure Python (the pack's venv has no torch or safetensors).

Format: 8-byte little-endian header length N, then N bytes of JSON mapping tensor names to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte buffer that starts
at 8 + N), plus an optional "__metadata__" string map. A valid file's tensors tile the buffer
exactly, with no gap or overlap, and the buffer ends at the end of the file: that is what catches
a file truncated by an interrupted copy, without reading any tensor data.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .inputfiles import file_problem

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
# torch/HF dtype names -> safetensors dtype codes (for comparing against configs).
TORCH_TO_ST = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
               "int64": "I64", "int32": "I32", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's own limit


class SafetensorsError(ValueError):
    """The file is not a complete, well-formed safetensors file (or not the expected one)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    file_size: int = 0


def read_header(path: Path | str) -> Header:
    """Parse and structurally validate a safetensors file; raise SafetensorsError naming the flaw."""
    path = Path(path)
    why = file_problem(path)  # before open(): a FIFO would block it, /dev/zero would never end
    if why:
        raise SafetensorsError(f"{path}: {why}")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"{path.name}: {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise SafetensorsError(f"{path.name}: header length {n} does not fit a {size}-byte file (truncated?)")
            raw = fh.read(n)
    except OSError as e:
        raise SafetensorsError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SafetensorsError(f"{path.name}: header is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise SafetensorsError(f"{path.name}: header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    data_start = 8 + n
    tensors: dict[str, TensorInfo] = {}
    for name, spec in doc.items():
        try:
            dtype, shape, (begin, end) = spec["dtype"], tuple(int(d) for d in spec["shape"]), spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path.name}: tensor {name!r} has a malformed header entry {spec!r}") from None
        if dtype not in DTYPE_BYTES:
            raise SafetensorsError(f"{path.name}: tensor {name!r} has unknown dtype {dtype!r}")
        if any(d < 0 for d in shape) or not (0 <= begin <= end):
            raise SafetensorsError(f"{path.name}: tensor {name!r} has invalid shape/offsets {shape}/{[begin, end]}")
        want = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != want:
            raise SafetensorsError(f"{path.name}: tensor {name!r} {dtype}{list(shape)} needs {want} bytes, "
                                   f"its offsets cover {end - begin}")
        tensors[name] = TensorInfo(name, dtype, shape, data_start + begin, data_start + end)
    # The tensors must tile the buffer: sorted by offset, each starts where the previous ended.
    cursor = data_start
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != cursor:
            raise SafetensorsError(f"{path.name}: tensor {info.name!r} starts at {info.begin}, expected {cursor} "
                                   "(gap or overlap in the data buffer)")
        cursor = info.end
    if cursor != size:
        raise SafetensorsError(f"{path.name}: data ends at byte {cursor} but the file has {size} bytes "
                               f"({'truncated' if size < cursor else 'trailing garbage'})")
    return Header(path, tensors, dict(metadata), size)


def read_tensor_bytes(header: Header, name: str) -> bytes:
    info = header.tensors[name]
    with open(header.path, "rb") as fh:
        fh.seek(info.begin)
        data = fh.read(info.nbytes)
    if len(data) != info.nbytes:
        raise SafetensorsError(f"{header.path.name}: short read of {name!r}")
    return data
