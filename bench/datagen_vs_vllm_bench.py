"""The pack's data-generation client vs `vllm bench serve`, same server, same work, side by side.

Both send the same prompts as chat requests (vLLM's custom dataset with --skip-chat-template, so the
server applies the chat template exactly once either way), at the same concurrency, with greedy
sampling and ignore_eos, so both generate exactly num_prompts x max_tokens tokens. Rounds alternate
the order (ours first, then vLLM's first) to cancel warm-up and drift. Prints the output tok/s of
each and the ratio ours / vllm (target >= 0.95) and appends a section to bench/RESULTS.md.

    .venv/bin/python bench/datagen_vs_vllm_bench.py [--config configs/tiny-cpu.yaml] [--base-url URL]
        [--rounds N] [--num-prompts N] [--json FILE] [--smoke]

--smoke (CI, tests/bench/test_bench_scripts.py): one round of a few prompts, nothing recorded, exit 0
whatever the ratio; it proves the script still runs against the phase's current interface.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from pydantic import SecretStr

from eagle3.config import TINY_CONFIG, PipelineConfig, load_config
from eagle3.engines.serving import api_key
from eagle3.engines.serving import base_url as server_url
from eagle3.engines.serving import start_server
from eagle3.phases.datagen import run_datagen
from eagle3.prompts import load_prompts
from eagle3.process.services import LaunchSpec, Supervisor

HERE = Path(__file__).resolve().parent
TARGET_RATIO = 0.95


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def variant(cfg: PipelineConfig, run_dir: Path, n: int, concurrency: int, max_tokens: int,
            port: int | None = None, key: str | None = None) -> PipelineConfig:
    d = cfg.datagen
    server = d.server.model_copy(update={"port": port}) if port else d.server
    if key:  # both clients send the server's key: the one the pack gave its own server, or --base-url's
        server = server.model_copy(update={"api_key": SecretStr(key), "api_key_env": None})
    datagen = d.model_copy(update={
        "max_samples": n, "concurrency": concurrency, "server": server,
        "sampling": d.sampling.model_copy(update={"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens}),
        "request_extra": {**d.request_extra, "ignore_eos": True}})
    return cfg.model_copy(update={"datagen": datagen, "run_dir": run_dir})


def run_ours(cfg: PipelineConfig, url: str) -> dict:
    cpu0 = time.process_time()
    s = run_datagen(cfg, None, base_url=url).details  # the phase's DatagenSummary, as a dict
    assert s["new_samples"] == s["total"] and s["failed"] == 0, s
    # The client shares the 2 cores with the server here, so its CPU time is throughput lost.
    return {"output_tok_s": s["output_tok_s"], "tokens": s["completion_tokens"], "seconds": s["generation_s"],
            "client_cpu_s": time.process_time() - cpu0, "retries": s["retries"]}


def run_vllm(cfg: PipelineConfig, sup: Supervisor, url: str, dataset: Path, out: Path, tag: str) -> dict:
    d, engine = cfg.datagen, cfg.engines.vllm
    argv = [*engine.script_argv("vllm"), "bench", "serve", "--backend", "openai-chat", "--base-url", url,
            "--endpoint", "/v1/chat/completions", "--model", cfg.target.served_name,
            "--tokenizer", str(cfg.target.model), "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(d.max_samples),
            "--custom-output-len", str(d.sampling.max_tokens), "--ignore-eos", "--temperature", "0",
            "--max-concurrency", str(d.concurrency), "--request-rate", "inf", "--num-warmups", "0",
            "--save-result", "--result-dir", str(out), "--result-filename", f"{tag}.json"]
    key = d.server.key("datagen.server")
    sup.run(LaunchSpec(name=f"vllm-bench-{tag}", argv=argv, log=out / f"{tag}.log", phase="bench",
                       env={**engine.env, **({"OPENAI_API_KEY": key} if key else {})}, stop_grace_s=5.0,
                       secrets=[key] if key else []), timeout_s=900)
    r = json.loads((out / f"{tag}.json").read_text())
    assert r["completed"] == d.max_samples and not r.get("failed"), r
    return {"output_tok_s": r["output_throughput"], "tokens": r["total_output_tokens"], "seconds": r["duration"]}


def pooled(rows: list[tuple[str, dict, dict]], side: int) -> float:
    """All tokens over all seconds: one slow round (a noisy neighbour) weighs by its length only."""
    return sum(r[side]["tokens"] for r in rows) / sum(r[side]["seconds"] for r in rows)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 2 ** 20
    return f"{cpu}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}, {gpus()}"


def gpus() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                     for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: a machine without a GPU
        return "no GPU"
    return ", ".join(str(n) for n in names) or "no GPU"


def record(path: Path, args, cfg: PipelineConfig, rows: list[tuple[str, dict, dict]], ratio: float, load: str,
           version: str) -> None:
    lines = [
        f"\n## Data-generation client vs `vllm bench serve` ({dt.datetime.now().strftime('%Y-%m-%d %H:%M')})\n",
        f"- Machine: {machine()}; load average at start {load} (machine shared with other work).",
        f"- Server: vLLM {version} serving `{cfg.target.model.name}` "
        f"({cfg.target.dtype}, {' '.join(cfg.datagen.server.extra_args) or 'default args'}).",
        f"- Work per run: {args.num_prompts} prompts from `{cfg.datagen.prompts.name}`, concurrency {args.concurrency}, "
        f"max_tokens {args.max_tokens}, ignore_eos, temperature 0; {args.rounds} rounds, order alternating.",
        f"- Ours: `run_datagen` (aiohttp, non-streaming, `return_token_ids`, rows fsynced; client CPU "
        f"{statistics.median(o['client_cpu_s'] for _, o, _ in rows):.2f} s per run, median); vLLM: "
        "`vllm bench serve --backend openai-chat --dataset-name custom --skip-chat-template` (streaming).",
        "",
        "| round | ours tok/s | vllm bench tok/s | ours / vllm |",
        "|---|---|---|---|",
        *[f"| {tag} | {o['output_tok_s']:.1f} | {v['output_tok_s']:.1f} | {o['output_tok_s'] / v['output_tok_s']:.3f} |"
          for tag, o, v in rows],
        "",
        f"| all rounds (tokens / seconds) | {pooled(rows, 1):.1f} | {pooled(rows, 2):.1f} | **{ratio:.3f}** |",
        "",
        f"**Output tok/s ratio ours / vllm bench serve: {ratio:.3f}** (all tokens over all seconds; per-round "
        f"ratios {min(r[1]['output_tok_s'] / r[2]['output_tok_s'] for r in rows):.2f}–"
        f"{max(r[1]['output_tok_s'] / r[2]['output_tok_s'] for r in rows):.2f}, spread from other work on the "
        f"shared 2-core machine). Target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'NOT met'}.",
        "",
    ]
    with open(path, "a") as fh:
        if fh.tell() == 0:
            fh.write("# Benchmark results\n")
        fh.write("\n".join(lines))


def work_args(doc: str, num_prompts: int, rounds: int) -> argparse.ArgumentParser:
    """The options both client benchmarks share: the server, and the work of one round."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=TINY_CONFIG)
    ap.add_argument("--base-url", help="use this running server (serving target.served_name) instead of starting one")
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME",
                    help="with --base-url: the environment variable holding that server's key (if it has one)")
    ap.add_argument("--num-prompts", type=int, default=num_prompts)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=rounds)
    return ap


def main() -> int:
    ap = work_args(__doc__, num_prompts=64, rounds=2)
    ap.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the scratch dir (logs, samples, vLLM results)")
    ap.add_argument("--json", type=Path, help="also write every round's figures and the ratios to this file")
    ap.add_argument("--smoke", action="store_true", help="1 round of 8 prompts, no record, exit 0 whatever the ratio")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.num_prompts, args.max_tokens, args.no_record = 1, min(args.num_prompts, 8), 16, True

    base = load_config(args.config)
    work = Path(tempfile.mkdtemp(prefix="datagen-bench-"))
    sup = Supervisor(work / "state")
    cfg = variant(base, work, args.num_prompts, args.concurrency, args.max_tokens,
                  port=None if args.base_url else free_port())
    prompts = load_prompts(cfg.datagen.prompts, args.num_prompts).prompts
    if len(prompts) < args.num_prompts or any(len(p.messages) != 1 for p in prompts):
        sys.exit(f"{cfg.datagen.prompts}: need {args.num_prompts} single-turn prompts for vLLM's custom dataset")
    dataset = work / "custom.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p.messages[0]["content"]}) + "\n" for p in prompts))
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())

    proc = None
    try:
        if args.base_url:
            url, key = args.base_url, os.environ.get(args.api_key_env)
        else:
            print(f"starting vLLM on port {cfg.datagen.server.port} ...", flush=True)
            proc = start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
            url, key = server_url(cfg.datagen.server), api_key(cfg, cfg.datagen.server, "datagen.server")
        cfg = variant(cfg, work, args.num_prompts, args.concurrency, args.max_tokens, key=key)
        version = httpx.get(f"{url}/version", timeout=10).json().get("version", "?")
        run_ours(variant(cfg, work / "warmup", 8, args.concurrency, args.max_tokens, key=key), url)  # warm the server
        rows = []
        for i in range(args.rounds):
            ours_cfg = variant(cfg, work / f"ours-{i}", args.num_prompts, args.concurrency, args.max_tokens, key=key)
            if i % 2 == 0:
                o = run_ours(ours_cfg, url)
                v = run_vllm(cfg, sup, url, dataset, work, f"vllm-{i}")
            else:
                v = run_vllm(cfg, sup, url, dataset, work, f"vllm-{i}")
                o = run_ours(ours_cfg, url)
            assert o["tokens"] == v["tokens"] == args.num_prompts * args.max_tokens, (o, v)
            rows.append((f"{i + 1} ({'ours first' if i % 2 == 0 else 'vllm first'})", o, v))
            print(f"round {i + 1}: ours {o['output_tok_s']:.1f} tok/s ({o['seconds']:.2f} s, "
                  f"client CPU {o['client_cpu_s']:.2f} s), "
                  f"vllm bench {v['output_tok_s']:.1f} tok/s ({v['seconds']:.2f} s)", flush=True)
    finally:
        if proc is not None:
            proc.stop()
        sup.stop_all()
    ratio = pooled(rows, 1) / pooled(rows, 2)
    per_round = [o["output_tok_s"] / v["output_tok_s"] for _, o, v in rows]
    print(f"output tok/s ours {pooled(rows, 1):.1f} vs vllm bench serve {pooled(rows, 2):.1f} over {len(rows)} rounds: "
          f"ratio {ratio:.3f} (per round: median {statistics.median(per_round):.3f}, min {min(per_round):.3f}, "
          f"max {max(per_round):.3f}); target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine(), "load_at_start": load, "vllm": version, "concurrency": args.concurrency,
            "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
            "rounds": [{"round": tag, "ours": o, "vllm_bench": v} for tag, o, v in rows],
            "ours_tok_s": pooled(rows, 1), "vllm_bench_tok_s": pooled(rows, 2), "ratio": ratio,
            "ratio_per_round_median": statistics.median(per_round)}, indent=1))
    if not args.no_record:
        record(args.results, args, cfg, rows, ratio, load, version)
        print(f"recorded in {args.results}")
    if args.keep:
        print(f"scratch dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ratio >= TARGET_RATIO or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
