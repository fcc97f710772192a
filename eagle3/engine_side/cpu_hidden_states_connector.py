"""CPU variant of vLLM's ExampleHiddenStatesConnector, for CPU-only extraction rehearsals.

Imported INSIDE the vLLM server (engine interpreter), never by the pack: vLLM loads it through
`kv_transfer_config.kv_connector_module_path` with this directory on PYTHONPATH.

Why it exists: the upstream connector copies hidden states device-to-host on a dedicated CUDA
stream into pinned host memory and tracks completion with CUDA events. On a CPU-only machine the
first `pin_memory=True` raises ("requires a CUDA or other accelerator backend") inside the
engine's step, the engine dies and the client sees missing files. Here the KV cache already lives
in host memory, so the copy is a plain synchronous gather; the disk write keeps upstream's thread
pool and per-file lock (clients block on the lock), and completion is an always-finished event.
Everything else (scheduling, lock files, file names, tensor layout) is inherited unchanged.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _DoneEvent:
    """Stands in for torch.cuda.Event: the CPU copy is finished before the event is created."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None

        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slot_mapping = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]

        # Advanced indexing already returns a new tensor; clone() makes the independence from the
        # cache explicit: these blocks are freed (and reused) once get_finished reports the request.
        hidden_states = extract_from_kv_cache(self._kv_cache, slot_mapping, num_tokens).clone()
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}

        assert self._req_futures.get(pending.req_id) is None, "Found another KV transfer request with same req_id!"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)

        done = _DoneEvent()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
