"""What the benchmark serves and sends: the drafter (bench.drafter, else the train phase's manifest),
the held-out prompts, and the sample of training prompts the serve-parity gate measures."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..config import PipelineConfig
from ..drafters import shipped
from ..drafters.formats import PROVENANCE, Problem
from ..drafters.loadable import check_drafter
from ..drafters.testmaker import drafter_aux_ids
from ..errors import ConfigError, GateError
from ..fsio import read_input_json
from ..realmodel import sha256_file
from ..prompts import load_prompts
from ..prompts.sets import load_prompt_set
from . import products

def resolve_drafter(cfg: PipelineConfig) -> dict:
    """Which drafter to serve and whether it is trained: bench.drafter if set, else the train
    phase's manifest (a dry-run checkpoint there is trained: false)."""
    b = cfg.bench
    if b.drafter is not None:
        if not (b.drafter / "config.json").is_file():
            raise ConfigError(f"bench.drafter: {str(b.drafter)!r} has no config.json; point it at a drafter checkpoint")
        return {"path": str(b.drafter), "source": "bench.drafter (config)",
                "aux_layer_ids": drafter_aux_ids(b.drafter), "aux_layer_ids_convention": None, "train_manifest": None,
                **given_drafter(cfg, b.drafter)}
    m = products.trained_drafter(cfg)
    path = Path(m["checkpoint"])
    if m.get("engine") not in (None, b.engine):
        raise ConfigError(f"{cfg.layout.train_manifest}: the drafter was gated and exported for {m['engine']!r}, but "
                          f"bench.engine is {b.engine!r}; rerun the train phase (`eagle3 run --from train`)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{cfg.layout.train_manifest}: checkpoint {str(path)!r} is missing; rerun the train phase")
    return {"path": str(path), "trained": bool(m["trained"]), "source": "train manifest", "status": m.get("status"),
            "aux_layer_ids": m.get("aux_layer_ids"), "aux_layer_ids_convention": m.get("aux_layer_ids_convention"),
            "aux_layer_ids_vllm": m.get("aux_layer_ids_vllm"), "config_aux_layer_ids": drafter_aux_ids(path),
            "train_manifest": str(cfg.layout.train_manifest), "val_full_acc": m.get("val_full_acc"),
            "expectation_source": f"{cfg.layout.train_manifest} (val_full_acc from the trainer's log)",
            "data": m.get("data")}


def given_drafter(cfg: PipelineConfig, path: Path) -> dict:
    """What a drafter given in bench.drafter says of itself. A drafter the pack ships is trained, and its
    training prompts are known (its row); another is as trained as bench.drafter_trained declares. Its
    provenance file (the train phase writes one beside every checkpoint) gives its data and, where its
    training prompts are known, the serve-parity gate's expectation: a shipped drafter's, or this config's
    datagen.prompts when that file is the one its data was generated from (the same sha256)."""
    prov = read_input_json(path / PROVENANCE) or {}
    data, row = prov.get("data"), shipped.row_of(path)
    if row is not None:
        prompts = shipped.CHECKOUT / row.training_prompts
        status = f"TRAINED (shipped with the pack: {row.name}, {row.description})"
    else:
        same = data and cfg.datagen.prompts.is_file() and data.get("prompts_sha256") == sha256_file(cfg.datagen.prompts)
        prompts = cfg.datagen.prompts if same else None
        status = "TRAINED (as declared by bench.drafter_trained)" if cfg.bench.drafter_trained else "UNTRAINED"
    acc = (prov.get("training") or {}).get("val_full_acc") if prompts is not None else None
    return {"trained": row is not None or cfg.bench.drafter_trained, "status": status, "data": data,
            "training_prompts": str(prompts) if prompts is not None else None, "shipped": row.name if row else None,
            "val_full_acc": acc, "expectation_source": f"{path / PROVENANCE} (the drafter's own training record)"}


def drafter_gate(cfg: PipelineConfig, drafter: dict):
    """The checkpoint gate of `drafter` (resolve_drafter's answer) for bench.engine, and where it came
    from ("bench.drafter" or "train manifest"). A drafter the pack ships must also still be the bytes it
    was installed as, and be served with the target it was trained for. Used before the benchmark's
    first server and by the doctor."""
    report = check_drafter(drafter["path"], cfg.bench.engine, target=cfg.target.model,
                           expected_aux_ids=drafter.get("aux_layer_ids_vllm"))
    if shipped.is_shipped(drafter["path"]):
        for why in (shipped.installed_problem(drafter["path"]), shipped.target_problem(drafter["path"], cfg.target.model)):
            if why:
                report.problems.append(Problem("shipped drafter", why))
    return report, drafter["source"].split(" (")[0]


def refuse_unloadable(cfg: PipelineConfig, drafter: dict) -> None:
    """F7 before any server starts: a drafter bench.engine would load with weights dropped or
    mis-read (SGLang skips unmatched tensor names without a word) is refused here, not measured as a
    bad drafter after the baseline has run. The train phase gates its own drafter; bench.drafter is
    whatever the user points at, and this is where it is gated."""
    report, where = drafter_gate(cfg, drafter)
    if report.ok:
        return
    engine = cfg.bench.engine
    problems = "\n".join(f"  - {p.where}: {p.message}" for p in report.problems)
    raise GateError(f"{where}: {drafter['path']} is not loadable as trained by {engine} (F7: {engine} would serve "
                    f"it with weights dropped or misread); no server was started:\n{problems}")


def parity_expectation(cfg: PipelineConfig, drafter: dict) -> tuple[list[float] | None, str | None]:
    """What training measured (per-position validation accuracy), and where that figure comes from."""
    if cfg.bench.parity.expected_full_acc:
        return list(cfg.bench.parity.expected_full_acc), "bench.parity.expected_full_acc (config)"
    if drafter.get("val_full_acc"):
        return list(drafter["val_full_acc"]), drafter.get("expectation_source") or \
            f"{drafter.get('train_manifest')} (val_full_acc from the trainer's log)"
    return None, None


def training_prompts(cfg: PipelineConfig, drafter: dict | None = None) -> list:
    """A sample (bench.parity.prompts) of the prompts the drafter was trained on: rows spread evenly
    over them (acceptance differs a lot between families of prompts: rows next to each other are often
    one family). Its own training prompts where they are known (a shipped drafter's), else the rows of
    datagen.prompts that data generation used."""
    return _spread(_trained_rows(cfg, drafter), cfg.bench.parity.prompts)


def parity_prompts(cfg: PipelineConfig, drafter: dict) -> tuple[list, str]:
    """The serve-parity gate's prompts and what they are. Its validation prompts where its training record
    names them: the prompts of the samples its validation accuracy was measured on, drawn like its training
    data and never trained on, so that serving them is expected to give that accuracy back. Else its
    training prompts, which it serves better than it validated (it learned their very answers)."""
    held = set((drafter.get("data") or {}).get("validation_ids") or ())
    rows = [p for p in _trained_rows(cfg, drafter) if p.id in held]
    if rows:
        return _spread(rows, cfg.bench.parity.prompts), "validation"
    return training_prompts(cfg, drafter), "training"


def _trained_rows(cfg: PipelineConfig, drafter: dict | None) -> list:
    if drafter and drafter.get("training_prompts") and Path(drafter["training_prompts"]) != cfg.datagen.prompts:
        return load_prompts(Path(drafter["training_prompts"]), None).prompts
    ps, used = _datagen_split(cfg)
    return [p for p in ps.prompts if p.id in used] + products.written_prompts(cfg)


def _datagen_split(cfg: PipelineConfig):
    """datagen.prompts, and the ids of those data generation used (where phase 1's output is gone, those
    it would have taken)."""
    d = cfg.datagen
    ps = load_prompts(d.prompts, None, skip_invalid=d.skip_invalid_prompts)
    used = products.sample_ids(cfg)
    if used is None:
        used = {p.id for p in ps.prompts[: d.max_samples]} if d.max_samples else set(ps.ids)
    return ps, used


def _spread(rows: list, count: int) -> list:
    n = min(count, len(rows))
    return [rows[i * len(rows) // n] for i in range(n)]


def held_out_prompts(cfg: PipelineConfig) -> dict:
    """The benchmark prompts: bench.prompts if set, else the rows of datagen.prompts that phase 1
    did not generate from (prompts the drafter never trained on). Returns texts (the last user
    turn of each row: the load generators send one user message) plus provenance."""
    b = cfg.bench
    if b.prompts is not None:
        ps, selection = load_prompt_set(b.prompts), "bench.prompts"
        rows = ps.prompts
    else:
        ps, used = _datagen_split(cfg)
        rows = [p for p in ps.prompts if p.id not in used]
        selection = f"held out: not among the {len(used)} prompts data generation used"
        if not rows:
            raise ConfigError(f"bench: no held-out prompts: data generation used all {len(ps.prompts)} rows of "
                              f"{cfg.datagen.prompts}; lower datagen.max_samples below the prompt count, or give a "
                              "separate benchmark prompt set in bench.prompts")
    need = b.num_prompts + b.warmup_prompts
    measured, spare = rows[: b.num_prompts], rows[b.num_prompts: need]
    texts = [p.messages[-1]["content"] for p in measured]
    return {"path": str(ps.path), "selection": selection, "count": len(texts), "requested": b.num_prompts,
            "ids": [p.id for p in measured], "texts": texts,
            # Warm-up uses other prompts than the measured ones where there are enough, so the
            # measured prefills do not all hit vLLM's prefix cache.
            "warmup_texts": [p.messages[-1]["content"] for p in spare] or texts,
            "multi_turn_reduced": sum(1 for p in measured if len(p.messages) > 1),
            "categories": [p.category for p in measured],
            "sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest()}
