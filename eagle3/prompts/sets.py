"""Benchmark prompt sets as users have them, each row with an optional `category` (chat, math,
code, ...) so acceptance can be reported per category, as drafters are published.

Read (by path):
  *.jsonl            one row per line: the rows of eagle3/prompts/__init__.py, ShareGPT rows, or MT-Bench
                     question rows {"question_id", "category", "turns": ["...", ...]}
  *.json             a JSON list of such rows (ShareGPT's file layout)
  *.parquet          a table with such columns (pyarrow)
  a directory        a Hugging Face dataset saved with `save_to_disk` (*.arrow files, read with
                     pyarrow, no `datasets` needed), or a directory of *.parquet files (a hub snapshot)
MT-Bench's second turn answers the model's own first answer, so only the first turn is sent: the
load generators send one user message (the report notes multi-turn rows reduced to one turn).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import ConfigError
from . import PromptSet, jsonl_rows, validate_rows


def _mt_bench(row: dict) -> dict:
    """An MT-Bench question row as a prompt row (other rows pass through)."""
    turns = row.get("turns")
    if "turns" not in row or any(k in row for k in ("conversations", "messages", "prompt")):
        return row
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        return {**row, "conversations": None}  # parse_row names the problem
    out = {k: v for k, v in row.items() if k != "turns"}
    out.setdefault("id", row.get("question_id"))
    out.pop("question_id", None)
    out["conversations"] = [{"role": "user", "content": turns[0]}]
    return out


def _rows_of(records: list) -> list[tuple[int, object]]:
    return [(i, _mt_bench(r) if isinstance(r, dict) else r) for i, r in enumerate(records, start=1)]


def _arrow_records(files: list[Path], kind: str) -> list[dict]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"reading {kind} prompt sets needs pyarrow; install it in the pack's venv "
                          "(pip install pyarrow), or convert the set to JSONL") from None
    records: list[dict] = []
    for f in files:
        try:
            if kind == "parquet":
                table = pq.read_table(f)
            else:  # datasets' save_to_disk writes Arrow IPC streams
                with pa.memory_map(str(f)) as source:
                    table = pa.ipc.open_stream(source).read_all()
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{f}: not a readable {kind} file ({e})") from None
        records += table.to_pylist()
    return records


def _sha(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def load_prompt_set(path: Path | str) -> PromptSet:
    """Any of the layouts of the module docstring, validated like eagle3.prompts.load_prompts."""
    path = Path(path)
    if path.is_dir():
        arrow, parquet = sorted(path.glob("*.arrow")), sorted(path.rglob("*.parquet"))
        files, kind = (arrow, "arrow") if arrow else (parquet, "parquet")
        if not files:
            raise ConfigError(f"{path}: a directory without *.arrow (datasets' save_to_disk) or *.parquet files; "
                              "give a prompt file or a saved dataset directory")
        return validate_rows(path, _sha(files), _rows_of(_arrow_records(files, kind)))
    if not path.is_file():
        raise ConfigError(f"{path}: prompt set not found; set bench.prompts to a JSONL/JSON/parquet file or a saved "
                          "dataset directory")
    if path.suffix == ".parquet":
        return validate_rows(path, _sha([path]), _rows_of(_arrow_records([path], "parquet")))
    if path.suffix == ".json":
        try:
            records = json.loads(path.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid JSON ({e}); a .json prompt set is one JSON list of rows") from None
        if not isinstance(records, list):
            raise ConfigError(f"{path}: a .json prompt set must be a JSON list of rows (ShareGPT layout), "
                              f"got {type(records).__name__}")
        return validate_rows(path, _sha([path]), _rows_of(records))
    data = path.read_bytes()
    rows = [(n, _mt_bench(r) if isinstance(r, dict) else r) for n, r in jsonl_rows(data)]
    return validate_rows(path, hashlib.sha256(data).hexdigest(), rows)
