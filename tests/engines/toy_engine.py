"""A third serving engine, added from this one file (docs/DESIGN.md, "Adding an engine"): its adapter
(Toy, instance ENGINE) and, run as a script, the engine itself: an OpenAI-compatible chat server with
Prometheus counters and speculative decoding by a drafter, and its own load generator.

  python toy_engine.py serve --model DIR --served-model-name NAME --host H --port P
                             [--draft-model DIR --num-draft-tokens K]
  python toy_engine.py load --base-url URL --model NAME --dataset FILE --num-prompts N --concurrency C
                            --max-tokens M --result FILE

The server answers a chat with the words of the last user message, cycled to max_tokens words (one
word = one token). With a drafter, each verify step proposes K tokens and accepts all of them, so a
request of n tokens takes ceil(n / (K + 1)) steps. Its API key comes from TOY_API_KEY. Stdlib only
when run as a script (it runs under engines.toy.python)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.standin_http import JSONHandler  # noqa: E402

KEY_ENV = "TOY_API_KEY"
COUNTERS = ("toy_requests_total", "toy_prompt_tokens_total", "toy_generation_tokens_total")
SPEC = ("toy_spec_drafts_total", "toy_spec_draft_tokens_total", "toy_spec_accepted_tokens_total")


# ---- the adapter ---------------------------------------------------------------------------------

def _adapter():
    from eagle3.engines import loadgen, metrics
    from eagle3.engines.loadgen import LoadResult
    from eagle3.engines.engine import Engine
    from eagle3.fsio import atomic_write_text
    from eagle3.process.readiness import HttpProbe

    class Toy(Engine):
        name = "toy"
        acceptance_source = "toy /metrics spec counter deltas around the window"
        load_client = "toy_engine.py load"
        load_client_module = "json"
        dataset_suffix = ".jsonl"
        drafter_layout = "vllm"  # its loader reads the speculators/vLLM layout
        shm_patterns = ("toy_seg_*",)  # what it would leave in /dev/shm: the handoff purges it
        shm_creator_pid = (r"^toy_seg_(\d+)_",)
        managed_flags = {("--model",): "target.model", ("--draft-model", "--num-draft-tokens"): "bench's drafter"}
        managed_env = {KEY_ENV: "*.server.api_key"}

        def serve_argv(self, env, target, server, extra=()):
            return [*env.python_argv(), __file__, "serve", "--model", str(target.model),
                    "--served-model-name", target.served_name, "--host", server.host, "--port", str(server.port),
                    *extra, *server.extra_args]

        def serve_env(self, key):
            return {KEY_ENV: key}

        def readiness(self, server, log):
            return [HttpProbe(f"http://{server.host}:{server.port}/health")]

        def spec_args(self, drafter, k):
            return ["--draft-model", str(drafter), "--num-draft-tokens", str(k)]

        def scrape(self, url, k, served_name, headers, before=True):
            samples = metrics.fetch_samples(url, headers)
            spec = None
            if any(s.name == SPEC[0] for s in samples):
                totals = {n: sum(s.value for s in samples if s.name == n) for n in SPEC}
                spec = metrics.SpecCounters(*(int(totals[n]) for n in SPEC))
            return spec, metrics.Traffic.from_samples(samples, served_name, COUNTERS)

        def write_dataset(self, path, texts):
            atomic_write_text(path, "".join(json.dumps({"prompt": t}) + "\n" for t in texts))
            return path

        def open_load_client(self, sup, env_cfg, env, name, log_dir, phase, hang_timeout_s):
            return loadgen.OneShotClient(sup, self, env_cfg, env, name, log_dir, phase, hang_timeout_s)

        def load_argv(self, env_cfg, spec):
            return [*env_cfg.python_argv(), __file__, "load", "--base-url", spec.base_url, "--model", spec.served_name,
                    "--dataset", str(spec.dataset), "--num-prompts", str(spec.num_prompts),
                    "--concurrency", str(spec.concurrency), "--max-tokens", str(spec.max_tokens),
                    "--result", str(spec.result_file)]

        def parse_load(self, result_file):
            r = json.loads(Path(result_file).read_text())
            return LoadResult(completed=r["completed"], failed=r["failed"], duration_s=r["duration"],
                              total_input_tokens=r["input_tokens"], total_output_tokens=r["output_tokens"],
                              request_throughput=r["completed"] / r["duration"],
                              output_throughput=r["output_tokens"] / r["duration"], mean_ttft_ms=None,
                              median_ttft_ms=None, p99_ttft_ms=None, mean_tpot_ms=None, median_tpot_ms=None,
                              p99_tpot_ms=None, mean_itl_ms=None, mean_e2el_ms=r["mean_latency_ms"],
                              client_spec=None, raw_file=str(result_file))

    return Toy()


# ---- the engine (script) -------------------------------------------------------------------------

def answer(messages: list[dict], max_tokens: int) -> tuple[str, int, int]:
    """(reply, prompt tokens, completion tokens)."""
    words = str(messages[-1]["content"]).split() or ["empty"]
    prompt_tokens = sum(len(str(m["content"]).split()) for m in messages)
    reply = [words[i % len(words)] for i in range(max_tokens)]
    return " ".join(reply), prompt_tokens, len(reply)


def serve(args) -> None:
    key, counts, lock = os.environ.get(KEY_ENV, ""), dict.fromkeys(COUNTERS + SPEC, 0), threading.Lock()
    k = args.num_draft_tokens if args.draft_model else 0

    class Handler(JSONHandler):
        def authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self.reply(401, {"error": "invalid api key"})
            return False

        def do_GET(self):
            if self.path == "/health":
                return self.reply(200, {})
            if not self.authorized():
                return None
            if self.path == "/v1/models":
                return self.reply(200, {"data": [{"id": args.served_model_name}]})
            if self.path == "/version":
                return self.reply(200, {"version": "toy-1"})
            if self.path == "/metrics":
                with lock:
                    names = COUNTERS + (SPEC if k else ())
                    text = "".join(f'{n}{{model_name="{args.served_model_name}"}} {counts[n]}\n' for n in names)
                return self.reply_text(200, text)
            return self.reply(404, {"error": self.path})

        def do_POST(self):
            if not self.authorized():
                return None
            body = self.read_json()
            reply, prompt_tokens, n = answer(body["messages"], int(body.get("max_tokens") or 16))
            steps = math.ceil(n / (k + 1)) if k else 0
            with lock:
                for name, add in zip(COUNTERS + SPEC, (1, prompt_tokens, n, steps, steps * k, n - steps)):
                    counts[name] += add
            if body.get("stream"):  # server-sent events: one chunk per step (k + 1 words with a drafter), then usage
                return self.stream(reply.split(" "), k + 1, prompt_tokens, n)
            self.reply(200, {"model": args.served_model_name, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n}})

        def stream(self, words: list[str], per_step: int, prompt_tokens: int, n: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes
            steps = [" ".join(words[i:i + per_step]) for i in range(0, len(words), per_step)]
            chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
            chunks += [{"choices": [{"index": 0, "delta": {"content": text}}]} for text in steps]
            chunks.append({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n}})
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"toy engine serving {args.model} as {args.served_model_name} (k={k})", flush=True)
    server.serve_forever()


def load(args) -> None:
    prompts = [json.loads(line)["prompt"] for line in Path(args.dataset).read_text().splitlines()][:args.num_prompts]
    key = os.environ.get("OPENAI_API_KEY", "")

    def one(text: str) -> tuple[int, int, float] | None:
        body = json.dumps({"model": args.model, "messages": [{"role": "user", "content": text}],
                           "max_tokens": args.max_tokens}).encode()
        request = urllib.request.Request(f"{args.base_url}/v1/chat/completions", body,
                                         {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        t0 = time.monotonic()
        try:
            usage = json.loads(urllib.request.urlopen(request, timeout=60).read())["usage"]
        except OSError:
            return None
        return usage["prompt_tokens"], usage["completion_tokens"], time.monotonic() - t0

    t0 = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        done = list(pool.map(one, prompts))
    ok = [d for d in done if d]
    Path(args.result).write_text(json.dumps({
        "completed": len(ok), "failed": len(done) - len(ok), "duration": max(time.monotonic() - t0, 1e-6),
        "input_tokens": sum(d[0] for d in ok), "output_tokens": sum(d[1] for d in ok),
        "mean_latency_ms": 1000 * sum(d[2] for d in ok) / max(len(ok), 1)}))
    print(f"toy load: {len(ok)} of {len(done)} requests", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="toy_engine.py")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    for flag in ("--model", "--served-model-name", "--host"):
        s.add_argument(flag, required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--draft-model")
    s.add_argument("--num-draft-tokens", type=int, default=0)
    g = sub.add_parser("load")
    for flag in ("--base-url", "--model", "--dataset", "--result"):
        g.add_argument(flag, required=True)
    for flag in ("--num-prompts", "--concurrency", "--max-tokens"):
        g.add_argument(flag, type=int, required=True)
    args = parser.parse_args(argv)
    (serve if args.command == "serve" else load)(args)


if __name__ == "__main__":
    main(sys.argv[1:])
else:
    ENGINE = _adapter()
