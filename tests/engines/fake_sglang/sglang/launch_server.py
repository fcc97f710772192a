"""Stand-in for `python -m sglang.launch_server`: accepts SGLang's documented launch flags (an
unknown flag fails like the real parser does) and reproduces its startup as seen from outside:
HTTP answers at once, /health is 503 until FAKE_SGLANG_HEALTH_AFTER seconds, and the ready line
is printed after FAKE_SGLANG_READY_AFTER seconds (negative: never).

/metrics (like SGLang with --enable-metrics, which it then requires) answers the Prometheus text of the
file FAKE_SGLANG_METRICS names, read anew on every request.

FAKE_SGLANG_CHILDREN=1 adds SGLang 0.5.16's shutdown as seen on the H200: a child process (its
detokenizer); SIGTERM to this leader drains, then kills the child and itself (kill_process_tree, exit
-9); a child that dies of a signal the leader did not send reads as a crash: "crashed with exit code
-15", SIGQUIT, five seconds before its crash diagnostics, then the same kill."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from standin_http import JSONHandler  # noqa: E402

READY_LINE = "The server is fired up and ready to roll!"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="sglang.launch_server")
    for flag in ("--model-path", "--served-model-name", "--host", "--context-length", "--dtype", "--api-key",
                 "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                 "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--mem-fraction-static"):
        ap.add_argument(flag)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--enable-metrics", action="store_true")
    return ap.parse_args()


def main() -> None:
    args = parse()
    t0 = time.monotonic()
    health_after = float(os.environ.get("FAKE_SGLANG_HEALTH_AFTER", "0"))
    ready_after = float(os.environ.get("FAKE_SGLANG_READY_AFTER", "0"))

    class Handler(JSONHandler):
        def do_GET(self):
            if self.path == "/health":
                code = 200 if time.monotonic() - t0 >= health_after else 503
            elif self.path == "/v1/models":  # like SGLang: 200 long before the server can serve
                # Like SGLang's API-key middleware: every route but /health and /metrics wants the key.
                key_ok = not args.api_key or self.headers.get("Authorization") == f"Bearer {args.api_key}"
                code = 200 if key_ok else 401
            elif self.path == "/metrics" and args.enable_metrics:
                return self.reply_text(200, Path(os.environ.get("FAKE_SGLANG_METRICS", os.devnull)).read_text())
            else:
                code = 404
            self.reply(code, {"model": args.served_model_name})

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer((args.host or "127.0.0.1", args.port), Handler)
    if os.environ.get("FAKE_SGLANG_CHILDREN") == "1":
        _children_like_sglang()
    print(f"fake sglang: serving {args.model_path} as {args.served_model_name} on port {args.port}", flush=True)
    if ready_after >= 0:
        threading.Timer(ready_after, lambda: print(f"[ts] {READY_LINE}", flush=True)).start()
    httpd.serve_forever()


def _children_like_sglang() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    killing = threading.Event()  # set once this leader ends the child itself

    def kill_tree() -> None:
        killing.set()
        print(f"[ts] kill_process_tree called: parent_pid={os.getpid()}, include_parent=True", flush=True)
        child.kill()
        os.kill(os.getpid(), signal.SIGKILL)

    def drained() -> None:
        if child.poll() is None:  # a drain needs its children: with one dead, the crash path ends it
            kill_tree()

    def on_sigterm(signum, frame):
        print("[ts] SIGTERM received. Draining requests and shutting down...", flush=True)
        threading.Timer(0.5, drained).start()

    def watch_child() -> None:
        rc = child.wait()
        if not killing.is_set():  # draining or not: SGLang's leader watches its children all along
            print(f"[ts] Subprocess detokenizer (pid={child.pid}) crashed with exit code {rc}. "
                  "Triggering SIGQUIT for cleanup...", flush=True)
            print("[ts] Sleeping 5 seconds before crash diagnostics to let GPU activity settle.", flush=True)
            time.sleep(5)
            kill_tree()

    signal.signal(signal.SIGTERM, on_sigterm)
    threading.Thread(target=watch_child, daemon=True).start()


if __name__ == "__main__":
    main()
