"""A stand-in for vLLM's hidden-state extraction server, for the GPU machine (which has no vLLM).

Run as the `vllm` the pack launches (`vllm serve MODEL --served-model-name NAME --host H --port P
... --kv-transfer-config JSON ...`; the other flags are accepted and ignored). It speaks the
contract speculators 0.9's trainer relies on (`--on-missing generate --vllm-endpoint URL`):

- GET /health: 200 (the pack's readiness probe); GET /v1/models: the served name as the one model
  (speculators' data loader refuses a server that lists another);
- POST /v1/completions with {model, prompt: [token ids], max_tokens: 1, return_token_ids: true}:
  answers choices[0].prompt_token_ids == prompt and kv_transfer_params.hidden_states_path, a fresh
  file under the connector's shared_storage_path whose `.lock` is created and held LOCK_EX before
  the answer and released once the file is complete, as vLLM's ExampleHiddenStatesConnector does;
  the client waits on the lock, loads the file, checks it and deletes it (and the lock).

What it does not do is compute: the file it writes is a byte copy of the hidden states the real
vLLM (CPU build) produced for that prompt on another machine ($EAGLE3_STANDIN_HS_DIR, the
`hs_*.safetensors` of a phase-2 run), found by the prompt's token ids. A prompt it has no file for
gets HTTP 400. Stdlib only (it reads the safetensors header itself), so it runs anywhere.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import struct
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standin_http import JSONHandler  # noqa: E402


def token_ids(path: Path) -> tuple[int, ...]:
    """The `token_ids` tensor of a safetensors file, read from its header and byte range."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        meta = header["token_ids"]
        start, end = meta["data_offsets"]
        fh.seek(8 + n + start)
        raw = fh.read(end - start)
    fmt = {"I64": "q", "I32": "i"}[meta["dtype"]]
    return struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw)


def index(src: Path) -> dict[tuple[int, ...], Path]:
    files = sorted(src.glob("hs_*.safetensors"))
    if not files:
        raise SystemExit(f"hs_endpoint: no hs_*.safetensors under {src} (EAGLE3_STANDIN_HS_DIR)")
    return {token_ids(p): p for p in files}


class Handler(JSONHandler):
    protocol_version = "HTTP/1.1"
    server: "StandIn"

    def log_message(self, fmt, *args):  # one line per request on stdout (the pack's server log)
        print(f"hs_endpoint: {self.address_string()} {fmt % args}", flush=True)

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, {})
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": self.server.served_name, "object": "model",
                                                          "created": 0, "owned_by": "vllm"}]})
        else:
            self.reply(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        if self.path != "/v1/completions":
            self.reply(404, {"error": {"message": f"no route {self.path}"}})
            return
        body = self.read_json()
        prompt = body.get("prompt")
        if body.get("model") != self.server.served_name:
            self.reply(404, {"error": {"message": f"model {body.get('model')!r} is not served"}})
            return
        src = self.server.files.get(tuple(prompt)) if isinstance(prompt, list) else None
        if src is None:
            self.reply(400, {"error": {"message": "no hidden states recorded for this prompt"}})
            return
        out = self.server.cache / f"standin-{uuid.uuid4().hex}.safetensors"
        lock_fd = os.open(str(out) + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # held until the file is complete, like the connector's
        threading.Thread(target=self.server.write, args=(src, out, lock_fd), daemon=True).start()
        self.server.served += 1
        self.reply(200, {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": self.server.served_name,
            "choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": None,
                         "prompt_token_ids": list(prompt), "token_ids": [int(prompt[-1])]}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1},
            "kv_transfer_params": {"hidden_states_path": str(out)},
        })


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, served_name: str, cache: Path, files: dict):
        super().__init__(addr, Handler)
        self.served_name, self.cache, self.files, self.served = served_name, cache, files, 0

    @staticmethod
    def write(src: Path, out: Path, lock_fd: int) -> None:
        try:
            shutil.copyfile(src, out)
        finally:
            os.close(lock_fd)  # releases LOCK_EX: the client's wait ends


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="vllm (hs_endpoint stand-in)")
    ap.add_argument("cmd", choices=["serve"])
    ap.add_argument("model")
    ap.add_argument("--served-model-name", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--kv-transfer-config", required=True)
    args, ignored = ap.parse_known_args(argv)
    cache = Path(json.loads(args.kv_transfer_config)["kv_connector_extra_config"]["shared_storage_path"])
    cache.mkdir(parents=True, exist_ok=True)
    files = index(Path(os.environ["EAGLE3_STANDIN_HS_DIR"]))
    server = StandIn((args.host, args.port), args.served_model_name, cache, files)
    print(f"hs_endpoint: serving {len(files)} recorded samples as {args.served_model_name!r} on "
          f"{args.host}:{args.port}, cache {cache}; ignored flags: {' '.join(ignored)}", flush=True)
    try:
        server.serve_forever()
    finally:
        print(f"hs_endpoint: answered {server.served} completion requests", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
