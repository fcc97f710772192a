"""A stand-in for the engines' command-line tools (`vllm`, `speculators`, an SGLang command prefix),
installed by tests/reliability/standins.py as the console scripts of a fake engine venv. It runs as
a real process under the pack's Supervisor, exactly where the real engine would, and behaves as
its environment says (engines.<name>.env in the test's config reaches it):

  STANDIN_RECORD=FILE   append {"argv": sys.argv, "env": {...}, "pid", "pgid"} as one JSON line
  STANDIN_MODE (for `vllm serve` / `sglang.launch_server`):
      ok         listen on --host/--port; /health 200, /v1/models lists --served-model-name; chat
                 completions answer a few words made from the question (deterministic)
      never-200  listen and answer every request 503, logging a line every 0.2 s (busy, never ready)
      silent     listen but never answer and never write to the log again (a hung startup)
      exit       print an error and exit 1 at once
      record     record the argv and exit 0 (any command)
  STANDIN_VLLM_RELEASE=0.25  (`vllm serve`) refuse --enable-scale-out as that release's parser does
                        (exit 2, "unrecognized arguments"); the probe's answer comes from standin_vllm/
  STANDIN_CONTROL=DIR   (generate-offline-data) after STANDIN_PAUSE_AFTER files, create DIR/paused
                        and wait for DIR/go before writing the rest
  STANDIN_FSIZE=N       (generate-offline-data) instead of pausing, limit its file size (RLIMIT_FSIZE)
  STANDIN_TRAIN_FILES=DIR  (`speculators train`) where the checkpoint files to write come from
                        (model.safetensors, config.json, optimizer_state_dict.pt, scheduler_state_dict.pt)
  STANDIN_TRAIN_SAVE_S=S   (`speculators train`) on SIGTERM, take S seconds to save interrupted/ (one
                        file at a time, `complete` last), as the real trainer's interrupt save takes time
Stdlib only: it runs under the pack's own interpreter, not the engine venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standin_http import JSONHandler  # noqa: E402


def flag(name: str, default: str | None = None) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv[:-1] else default


def record() -> None:
    path = os.environ.get("STANDIN_RECORD")
    if not path:
        return
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("STANDIN_", "EAGLE3_", "VLLM_API", "OPENAI_API")) or k == "PYTHONPATH"}
    line = json.dumps({"argv": sys.argv, "env": env, "pid": os.getpid(), "pgid": os.getpgid(0)})
    with open(path, "a") as fh:
        fh.write(line + "\n")


# ---- servers -------------------------------------------------------------------------------------

def serve(mode: str) -> None:
    if os.environ.get("STANDIN_VLLM_RELEASE") == "0.25" and "--enable-scale-out" in sys.argv:
        print("vllm serve: error: unrecognized arguments: --enable-scale-out", file=sys.stderr, flush=True)
        sys.exit(2)
    host, port = flag("--host", "127.0.0.1"), int(flag("--port", "0"))
    served = flag("--served-model-name", "target")
    if mode == "exit":
        print("ERROR stand-in engine: RuntimeError: Engine core initialization failed", flush=True)
        sys.exit(1)
    if mode == "silent":
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()  # connections queue up; nothing ever answers, nothing more is logged
        print("INFO loading weights ... (then nothing: a hung startup)", flush=True)
        while True:
            time.sleep(1)

    class Handler(JSONHandler):
        def do_GET(self):  # noqa: N802
            if mode == "never-200":
                return self.reply(503, {"status": "starting"})
            if self.path == "/health":
                return self.reply(200, {})
            if self.path == "/v1/models":
                return self.reply(200, {"object": "list", "data": [{"id": served, "object": "model"}]})
            return self.reply(404, {"error": "not found"})

        def do_POST(self):  # noqa: N802 - a chat completion: a short answer made from the question
            if self.path != "/v1/chat/completions" or mode != "ok":
                return self.reply(404, {"error": "not found"})
            body = self.read_json()
            question = str((body.get("messages") or [{}])[-1].get("content", ""))
            words = [f"w{int(hashlib.sha256(f'{question}/{i}'.encode()).hexdigest()[:4], 16) % 97}"
                     for i in range(min(int(body.get("max_tokens") or 8), 8))]
            ids = [int(w[1:]) for w in words]
            return self.reply(200, {"id": "standin", "object": "chat.completion", "model": served,
                                    "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(words)},
                                                 "finish_reason": "length", "token_ids": ids}],
                                    "prompt_token_ids": [1, 2, 3],
                                    "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)}})

        def log_message(self, fmt, *args):
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    print(f"INFO stand-in {mode} server on {host}:{port}", flush=True)
    if mode == "never-200":
        def chatter() -> None:
            while True:
                print("INFO engine core still initialising, waiting", flush=True)
                time.sleep(0.2)

        threading.Thread(target=chatter, daemon=True).start()
    server.serve_forever()


# ---- generate-offline-data -------------------------------------------------------------------------

def safetensors_bytes(seq: int, layers: int, hidden: int, ids: list[int]) -> bytes:
    hs = seq * layers * hidden * 4
    header = {"hidden_states": {"dtype": "F32", "shape": [seq, layers, hidden], "data_offsets": [0, hs]},
              "token_ids": {"dtype": "I64", "shape": [seq], "data_offsets": [hs, hs + 8 * seq]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(hs) + struct.pack(f"<{seq}q", *ids)


def generate_offline_data() -> None:
    """Writes hs_{i}.safetensors for the ids the test put in prepared/ids.json, straight into the
    output dir with plain writes (no temp file, no rename): a full disk leaves a half-written file,
    and the error propagates as an uncaught OSError, as a naive writer would."""
    prepared, output = flag("--preprocessed-data"), flag("--output")
    spec = json.loads(open(os.path.join(prepared, "ids.json")).read())
    os.makedirs(output, exist_ok=True)
    control = os.environ.get("STANDIN_CONTROL")
    pause_after = int(os.environ.get("STANDIN_PAUSE_AFTER", "-1"))
    written = 0
    for i, ids in enumerate(spec["ids"]):
        path = os.path.join(output, f"hs_{i}.safetensors")
        if os.path.exists(path):
            continue  # resume: the real client skips existing readable files too
        if written == pause_after and os.environ.get("STANDIN_FSIZE"):
            import resource, signal  # noqa: E401 - where no small filesystem can be mounted:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) mid-file
            limit = int(os.environ["STANDIN_FSIZE"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        elif control and written == pause_after:
            open(os.path.join(control, "paused"), "w").close()
            while not os.path.exists(os.path.join(control, "go")):
                time.sleep(0.02)
        data = safetensors_bytes(len(ids), spec["layers"], spec["hidden"], ids)
        with open(path, "wb") as fh:
            for start in range(0, len(data), 4096):
                fh.write(data[start:start + 4096])
                fh.flush()
        written += 1
        print(f"wrote {path} ({len(data)} bytes)", flush=True)
    print(f"generate-offline-data: {written} files written", flush=True)


# ---- speculators train ---------------------------------------------------------------------------

def train() -> None:
    """Logs a step line every 0.1 s until SIGTERM, then saves interrupted/ slowly and exits 143. Run
    again (a resume), it says which checkpoint it found under --save-path and writes the
    end-of-training checkpoint of the last epoch."""
    import shutil
    import signal

    save, epochs = flag("--save-path"), int(flag("--epochs", "1"))
    files = os.environ["STANDIN_TRAIN_FILES"]
    found = sorted(d for d in os.listdir(save) if d.isdigit()) if os.path.isdir(save) else []
    state = None
    if found:
        path = os.path.join(save, found[-1], "training_state.json")
        state = json.loads(open(path).read()) if os.path.exists(path) else None
    print(f"stand-in trainer: resume from {found[-1] if found else None} state {json.dumps(state)}", flush=True)
    if state is not None:  # resumed: finish at once
        last = os.path.join(save, str(epochs - 1))
        os.makedirs(last, exist_ok=True)
        for name in ("config.json", "model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt"):
            shutil.copy2(os.path.join(files, name), os.path.join(last, name))
        with open(os.path.join(last, "training_state.json"), "w") as fh:
            json.dump({"epoch": epochs - 1, "local_step": 0, "global_step": state["global_step"] + 1}, fh)
        print("stand-in trainer: training complete", flush=True)
        return
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(time.monotonic()))
    step = 0
    while not stop:
        step += 1
        print(f"step {step} loss 1.0", flush=True)
        time.sleep(0.1)
    names = ("config.json", "model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt")
    inter = os.path.join(save, "interrupted")
    os.makedirs(inter, exist_ok=True)
    pause = float(os.environ.get("STANDIN_TRAIN_SAVE_S", "0")) / (len(names) + 1)
    for name in names:
        time.sleep(pause)
        shutil.copy2(os.path.join(files, name), os.path.join(inter, name))
    time.sleep(pause)
    open(os.path.join(inter, "complete"), "w").close()
    print(f"stand-in trainer: saved interrupted/ in {time.monotonic() - stop[0]:.1f} s", flush=True)
    sys.exit(143)


def ids_digest(ids: list[int]) -> str:
    """The prepared-index hash (eagle3/engine_side/index_prepared.py)."""
    return hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).hexdigest()[:16]


def main() -> None:
    record()
    args = sys.argv[1:]
    mode = os.environ.get("STANDIN_MODE", "ok")
    if mode == "record":
        return
    if "serve" in args[:1] or "sglang.launch_server" in args:
        serve(mode)
    elif args[:1] == ["generate-offline-data"]:
        generate_offline_data()
    elif args[:1] == ["train"]:
        train()
    else:
        print(f"stand-in: {os.path.basename(sys.argv[0])} {args[:1]} recorded", flush=True)


if __name__ == "__main__":
    main()

