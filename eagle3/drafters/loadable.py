"""Checkpoint gate: will this serving engine load this drafter as it was trained, with the right
aux layers? Reads only config.json and the safetensors headers (no torch), so it runs in the pack's
venv in milliseconds, before anyone pays for a model load.

    report = check_drafter(dir, "vllm", target=model_dir, expected_aux_ids=[2, 4, 5])
    report.ok, report.problems  # each problem names the field or weight and says what to fix

Expected aux ids are always given in the "vllm" convention (id k = input of decoder layer k: vLLM,
speculators, the EAGLE reference, the extraction manifest); the gate converts what the file stores according to how
the named engine reads it (drafter_formats.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .formats import (EAGLE_LAYOUT, EXPECTED, LAYOUT_CONVENTION, SPECULATORS_LAYOUT, layout_of, LAYER_INPUT, DrafterConfig, Problem, config_problems, from_layer_input, parse_config, to_layer_input)
from ..errors import ConfigError, echo
from ..inputfiles import MAX_JSON_BYTES, dir_problem, file_problem, read_capped
from ..safetensors_header import SafetensorsError, TensorInfo, read_header

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
EXPORT_HINT = "eagle3 export-drafter DIR OUT --engine {engine}"


@dataclass
class GateReport:
    directory: str
    engine: str
    problems: list[Problem] = field(default_factory=list)
    layout: str | None = None
    aux_layer_ids: list[int] | None = None          # as stored in the checkpoint
    aux_layer_ids_vllm: list[int] | None = None  # what the engine will capture
    convention: str = LAYER_INPUT                   # how the engine reads the stored ids
    draft_vocab_size: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["problems"] = [str(p) for p in self.problems]
        d["ok"] = self.ok
        return d

    def render(self) -> str:
        head = f"{self.directory}: {'PASS' if self.ok else 'FAIL'} for {self.engine}"
        if self.aux_layer_ids is not None:
            head += f" (aux layer ids {self.aux_layer_ids}, {self.convention})"
        return "\n".join([head] + [f"  - {p}" for p in self.problems])


def read_weights(directory: Path) -> dict[str, TensorInfo]:
    """Tensor headers of a single-file or sharded safetensors checkpoint."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(read_capped(index, MAX_JSON_BYTES, INDEX_FILE)).get("weight_map", {})
        except (ConfigError, ValueError, AttributeError, RecursionError) as e:
            raise SafetensorsError(f"{index}: not a readable index ({echo(str(e), 200, quote=False)})") from None
        out: dict[str, TensorInfo] = {}
        for shard in sorted(set(weight_map.values())):
            out.update(read_header(directory / shard).tensors)
        return out
    return dict(read_header(directory / WEIGHTS_FILE).tensors)


def _target_fields(target: Path) -> tuple[dict | None, str | None]:
    path = Path(target) / "config.json"
    try:
        raw = json.loads(read_capped(path, MAX_JSON_BYTES, "target"))
    except ConfigError as e:  # missing, or not a regular file (a FIFO would block the read)
        return None, f"{e}; pass the target model dir"
    except (ValueError, RecursionError) as e:
        return None, f"{path} is not valid JSON ({echo(str(e), 200, quote=False)})"
    fields = (raw.get("text_config") or raw) if isinstance(raw, dict) else None
    return (fields, None) if isinstance(fields, dict) else (None, f"{path} must hold a JSON object (a model config)")


def _check_weights(layout: str, c: DrafterConfig, weights: dict[str, TensorInfo]) -> list[Problem]:
    exp = EXPECTED[layout](c)
    present = set(weights)
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for name in sorted(present):
        canonical = exp.aliases.get(name, name)
        if canonical in seen:
            problems.append(Problem(name, f"duplicates {seen[canonical]!r} (the loader maps both to {canonical!r}); "
                                          "keep one of them"))
        seen[canonical] = name
    allowed = {**exp.required, **exp.optional}
    renamed = {}  # present name -> the expected name it should have (an export fixes these)
    for name in present:
        if name in exp.aliases:  # a name the loader itself maps (vLLM: midlayer.* -> layers.0.*)
            continue
        for a, b in (("layers.0.", "midlayer."), ("midlayer.", "layers.0.")):
            if name.startswith(a) and name.replace(a, b, 1) in exp.required and name not in allowed:
                renamed[name] = name.replace(a, b, 1)
    for name, shape in sorted(exp.required.items()):
        if name not in seen and name not in renamed.values():
            problems.append(Problem(name, f"missing (expected shape {list(shape)}); {_missing_reason(name, c)}"))
    if renamed:
        first = sorted(renamed)[0]
        old_prefix = first.split(".")[0] + (".0." if first.startswith("layers.0.") else ".")
        new_prefix = renamed[first][: len(renamed[first]) - len(first) + len(old_prefix)]
        silently = "drops them silently, so the decoder layer would stay random (acceptance ~0)" \
            if layout == EAGLE_LAYOUT else "cannot load them"
        problems.append(Problem(f"{old_prefix}*", f"{len(renamed)} weights named {old_prefix}*, but {layout} expects "
                                f"{new_prefix}* and {silently}; rename them: `{EXPORT_HINT.format(engine=layout)}`"))
    for canonical, name in sorted(seen.items()):
        info = weights[name]
        if name in renamed:
            continue
        if canonical not in allowed:
            problems.append(Problem(name, _unexpected_reason(layout, canonical, c, allowed)))
            continue
        want = allowed[canonical]
        if tuple(info.shape) != tuple(want):
            problems.append(Problem(name, f"shape {list(info.shape)}, expected {list(want)} "
                                          f"({_shape_reason(canonical, c)}); the weights do not match config.json: "
                                          "re-save the checkpoint from the trainer"))
        if canonical == "d2t" and info.dtype != "I64":
            problems.append(Problem(name, f"dtype {info.dtype}, expected I64 (offsets target_id - draft_id)"))
    return problems


def _missing_reason(name: str, c: DrafterConfig) -> str:
    if name == "fc.weight":
        return "the drafter cannot fuse the aux hidden states without it; the checkpoint is incomplete"
    if name == "d2t":
        return (f"draft vocab {c.draft_vocab_size} < target vocab {c.vocab_size}, so draft ids must be mapped to "
                "target ids (without d2t acceptance collapses); train with a token-frequency file "
                "(prepare-data --no-skip-token-freq) or set draft_vocab_size to the full vocab")
    if name == "input_norm.weight":
        return "norm_before_fc is true in config.json but the weight is absent; fix the config or the weights"
    if name == "lm_head.weight":
        return "the drafter has no output head (a random head gives ~0 acceptance); re-save from the trainer"
    return "the engine would leave it randomly initialised; re-save the checkpoint from the trainer"


def _unexpected_reason(layout: str, name: str, c: DrafterConfig, allowed: dict) -> str:
    if layout == EAGLE_LAYOUT:
        if name == "input_norm.weight":
            return ("SGLang's drafter has no input_norm parameter and drops it silently (norm_before_fc); retrain "
                    "with train.extra_args [--no-norm-before-fc, --no-norm-before-residual, --no-norm-output]")
        if name.startswith("layers."):
            return ("SGLang drops unknown names silently, so this decoder weight would stay random (acceptance ~0); "
                    f"rename layers.0.* to midlayer.*: `{EXPORT_HINT.format(engine=layout)}`")
        return "SGLang drops unknown names silently: this weight would never load; remove it or fix its name"
    if name.startswith("midlayer.") and name.replace("midlayer.", "layers.0.", 1) in allowed:
        return "vLLM reads midlayer.* as layers.0.* (accepted); keep only one of them"
    return ("unknown to vLLM's EAGLE-3 loader, which fails the whole load on it; remove it or rename it to one of "
            "the expected names (fc.weight, norm.weight, lm_head.weight, layers.N.*, embed_tokens.weight, d2t, t2d)")


def _shape_reason(name: str, c: DrafterConfig) -> str:
    if name == "fc.weight":
        return "hidden_size x (number of aux layers x target_hidden_size)"
    if name == "lm_head.weight":
        return "draft_vocab_size x hidden_size"
    if name in ("d2t",):
        return "draft_vocab_size"
    if name in ("t2d", "embed_tokens.weight"):
        return "target vocab_size (x hidden_size)"
    if name == "input_norm.weight":
        return "number of aux layers x target_hidden_size"
    return "from hidden_size, heads, head_dim and intermediate_size in config.json"


def _check_aux(report: GateReport, c: DrafterConfig, layout: str, expected: list[int] | None,
               target_layers: int | None) -> None:
    conv = LAYOUT_CONVENTION[layout]
    field_name = c.aux_ids_field if layout == SPECULATORS_LAYOUT else "eagle_config.eagle_aux_hidden_state_layer_ids"
    if not c.aux_ids:
        fix = f"set it to {from_layer_input(expected, conv)}" if expected else "set it to the extraction's layer ids"
        report.problems.append(Problem(field_name, f"missing; {layout} would then capture its default layers "
                                       f"(2, L//2, L-3) silently, whatever the drafter was trained on; {fix} "
                                       f"({conv} convention)"))
        return
    report.aux_layer_ids = list(c.aux_ids)
    li = to_layer_input(c.aux_ids, conv)
    report.aux_layer_ids_vllm = li
    if expected is not None and li != list(expected):
        report.problems.append(Problem(
            c.aux_ids_field, f"{c.aux_ids} means layers {li} to {layout} ({conv} convention), but the drafter's "
            f"hidden states came from layers {list(expected)} (vllm convention: input of decoder layer k); set it to "
            f"{from_layer_input(expected, conv)}" + (" (SGLang adds 1 to each id)" if conv != LAYER_INPUT else "")))
    if len(set(li)) != len(li):
        report.problems.append(Problem(c.aux_ids_field, f"{c.aux_ids} repeats a layer; give distinct ids"))
    if target_layers:
        bad = [i for i in li if not 0 <= i < target_layers]
        if bad:
            report.problems.append(Problem(c.aux_ids_field, f"layers {bad} do not exist in a {target_layers}-layer target "
                                           f"(valid vllm-convention ids: 0..{target_layers - 1})"))


def _check_target(report: GateReport, c: DrafterConfig, target: Path) -> int | None:
    t, err = _target_fields(target)
    if t is None:
        report.problems.append(Problem("--target", err))
        return None
    vocab, hidden = t.get("vocab_size"), t.get("hidden_size")
    where = "transformer_layer_config.vocab_size" if c.layout == "speculators" else "vocab_size"
    if vocab is not None and c.vocab_size != vocab:
        report.problems.append(Problem(where, f"{c.vocab_size}, but the target's vocab is {vocab}; the drafter was "
                                       "built for another target: retrain against this one"))
    if c.draft_vocab_size and vocab and c.draft_vocab_size > vocab:
        report.problems.append(Problem("draft_vocab_size", f"{c.draft_vocab_size} exceeds the target vocab {vocab}"))
    if hidden is not None and c.target_hidden_size != hidden:
        report.problems.append(Problem("target_hidden_size", f"{c.target_hidden_size}, but the target's hidden size is "
                                       f"{hidden}; the aux states would not fit `fc`"))
    return t.get("num_hidden_layers")


def check_drafter(directory: Path | str, engine: str, target: Path | str | None = None,
                  expected_aux_ids: list[int] | None = None) -> GateReport:
    """Gate one checkpoint dir for one engine. Never raises for a bad checkpoint: problems are listed."""
    layout = layout_of(engine)
    directory = Path(directory)
    report = GateReport(str(directory), engine, convention=LAYOUT_CONVENTION[layout])
    if why := dir_problem(directory):
        report.problems.append(Problem("checkpoint dir", f"{directory} {why}; point at the checkpoint dir "
                                       "(e.g. <save-path>/<epoch>)"))
        return report
    if why := file_problem(directory / "config.json"):
        report.problems.append(Problem("config.json", f"{why if why != 'does not exist' else 'not found'} in "
                                       f"{directory}; point at the checkpoint dir (e.g. <save-path>/<epoch>)"))
        return report
    try:
        raw = json.loads(read_capped(directory / "config.json", MAX_JSON_BYTES, "config.json"))
    except ConfigError as e:
        report.problems.append(Problem("config.json", f"{e}; re-save the checkpoint"))
        return report
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        report.problems.append(Problem("config.json", f"not valid JSON ({echo(str(e), 200, quote=False)}); "
                                       "re-save the checkpoint"))
        return report
    if not isinstance(raw, dict):
        report.problems.append(Problem("config.json", f"holds {type(raw).__name__}, not a JSON object; re-save the "
                                       "checkpoint"))
        return report
    c, problems = parse_config(raw)
    report.problems += problems
    try:
        weights = read_weights(directory)
    except SafetensorsError as e:
        report.problems.append(Problem(WEIGHTS_FILE, f"{e}; the checkpoint is incomplete or corrupt: re-save it"))
        weights = None
    if c is None:
        return report
    report.layout, report.draft_vocab_size = c.layout, c.draft_vocab_size
    if c.draft_vocab_size is None:
        rows = weights.get("lm_head.weight").shape[0] if weights and "lm_head.weight" in weights else "lm_head rows"
        report.problems.append(Problem("draft_vocab_size", f"missing; set it to the draft vocabulary size ({rows})"))
    cfg_problems = config_problems(layout, c)
    report.problems += cfg_problems
    target_layers = _check_target(report, c, Path(target)) if target is not None else None
    _check_aux(report, c, layout, expected_aux_ids, target_layers)
    if weights is not None:
        report.problems += _check_weights(layout, c, weights)
    return report


def needs_export(directory: Path | str, engine: str) -> bool:
    """True when the checkpoint is not in the layout `engine` loads (names or config format)."""
    directory = Path(directory)
    c, _ = parse_config(json.loads((directory / "config.json").read_text()))
    if layout_of(engine) == EAGLE_LAYOUT:
        names = read_weights(directory)
        return c is None or c.layout != "eagle" or any(n.startswith("layers.") for n in names)
    return False
