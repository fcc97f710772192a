"""Checks of hidden-state files (hs_{i}.safetensors) in pure Python, against the prepared-data index.

A file is valid when it is a complete safetensors file (header tiles the data and ends at EOF, so
truncation shows), holds exactly `hidden_states` [seq_len_i, n_layers, hidden] and `token_ids`
[seq_len_i] int64, and its token ids hash to the prepared sample's ids. Reading the token ids costs
8 bytes per position; the hidden states themselves are not read (speculators' --validate-outputs
checks them for non-finite values when it writes each file).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..safetensors_header import TORCH_TO_ST, SafetensorsError, read_header, read_tensor_bytes

HS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")


@dataclass(frozen=True)
class PreparedIndex:
    seq_len: list[int]
    ids_sha256: list[str]

    @property
    def num_samples(self) -> int:
        return len(self.seq_len)

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_len)

    @classmethod
    def from_dict(cls, d: dict) -> "PreparedIndex":
        if len(d["seq_len"]) != len(d["ids_sha256"]):
            raise ValueError("index is inconsistent: seq_len and ids_sha256 differ in length")
        return cls(list(d["seq_len"]), list(d["ids_sha256"]))


@dataclass(frozen=True)
class Expect:
    num_layers: int
    hidden_size: int
    dtype: str | None  # torch name; None accepts any floating dtype (target.dtype "auto")


def check_file(path: Path, idx: int, index: PreparedIndex, expect: Expect) -> tuple[int, str]:
    """Raise SafetensorsError with the reason when hs file `idx` is not valid; return (bytes, dtype)."""
    header = read_header(path)
    names = set(header.tensors)
    if names != {"hidden_states", "token_ids"}:
        raise SafetensorsError(f"{path.name}: tensors {sorted(names)}, expected hidden_states and token_ids")
    hs, tok = header.tensors["hidden_states"], header.tensors["token_ids"]
    seq = index.seq_len[idx]
    want = (seq, expect.num_layers, expect.hidden_size)
    if hs.shape != want:
        raise SafetensorsError(f"{path.name}: hidden_states shape {list(hs.shape)}, expected {list(want)} "
                               "[seq_len, layers, hidden]")
    if expect.dtype is not None and hs.dtype != TORCH_TO_ST[expect.dtype]:
        raise SafetensorsError(f"{path.name}: hidden_states dtype {hs.dtype}, expected {TORCH_TO_ST[expect.dtype]}")
    if hs.dtype not in ("F32", "BF16", "F16"):
        raise SafetensorsError(f"{path.name}: hidden_states dtype {hs.dtype} is not a float type")
    if tok.dtype != "I64" or tok.shape != (seq,):
        raise SafetensorsError(f"{path.name}: token_ids {tok.dtype}{list(tok.shape)}, expected I64[{seq}]")
    digest = hashlib.sha256(read_tensor_bytes(header, "token_ids")).hexdigest()[:16]
    if digest != index.ids_sha256[idx]:
        raise SafetensorsError(f"{path.name}: token ids differ from prepared sample {idx}")
    st_to_torch = {v: k for k, v in TORCH_TO_ST.items()}
    return header.file_size, st_to_torch[hs.dtype]


@dataclass
class Scan:
    valid: dict[int, tuple[int, str]]   # idx -> (bytes, dtype)
    invalid: dict[int, str]             # idx -> reason
    strays: list[Path]                  # hs files beyond the index, temp files


def scan_dir(directory: Path, index: PreparedIndex, expect: Expect, owned: range | None = None) -> Scan:
    """The hs files of `directory` checked; those outside `owned` (default: the whole index) are strays."""
    owned = range(index.num_samples) if owned is None else owned
    scan = Scan({}, {}, [])
    if not directory.is_dir():
        return scan
    for path in sorted(directory.iterdir()):
        m = HS_NAME.match(path.name)
        if not m:
            scan.strays.append(path)
            continue
        idx = int(m.group(1))
        if idx not in owned or idx >= index.num_samples:
            scan.strays.append(path)
            continue
        try:
            scan.valid[idx] = check_file(path, idx, index, expect)
        except (SafetensorsError, OSError) as e:
            scan.invalid[idx] = str(e)
    return scan
