"""Drafters that ship with the pack: trained on a GPU by the pack, committed, installed offline by
`eagle3 install-drafter NAME DIR`.

Each is one row of SHIPPED. Its files live in the checkout under configs/drafters/NAME/: the weights
compressed with xz (without the frozen copy of the target's embeddings that speculators saves: vLLM takes
them from the target), the trainer's config.json, and its provenance (data, trainer, the per-position
validation accuracy the serve-parity gate expects). Every one is pinned by sha256 here, and so are the
decompressed weights: they are the bytes the GPU wrote. The installer checks them all, decompresses into a
scratch dir beside DIR, checks again, stamps the dir with the row and swaps it into place: DIR is never
seen half-written, and a failed check leaves an existing DIR as it was.

A drafter is trained for one target. The stamp names the target row (eagle3.realmodel), and before a
server starts (`drafter_gate`: the benchmark and the doctor) an installed drafter is refused, naming what
differs, when its files are no longer the installed bytes or the configured target is not that row's
model as `eagle3 make-model` writes it.
"""

from __future__ import annotations

import lzma
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ..built_dir import building, ensure_built
from ..errors import ConfigError, GateError
from ..fsio import atomic_write_json, read_json
from ..realmodel import REAL_MODELS, STAMP as MODEL_STAMP, is_current as model_is_current, sha256_file
from .formats import PROVENANCE

CHECKOUT = Path(__file__).resolve().parents[2]
STAMP = "eagle3-shipped.json"
WEIGHTS = "model.safetensors"
ARCHIVE = WEIGHTS + ".xz"


@dataclass(frozen=True)
class ShippedDrafter:
    name: str
    description: str
    source_dir: str                # in the checkout: ARCHIVE, config.json and PROVENANCE
    files_sha256: dict             # those three, as committed
    weights_sha256: str            # the decompressed WEIGHTS: what the GPU machine wrote
    weights_bytes: int
    target: str                    # the REAL_MODELS row it was trained for
    training_prompts: str          # in the checkout: the prompt set whose rows it was trained on

    @property
    def source(self) -> Path:
        return CHECKOUT / self.source_dir


SMOLLM2_H200 = ShippedDrafter(
    name="smollm2-135m-h200",
    description=("EAGLE-3 drafter for SmolLM2-135M-Instruct, trained by the pack on one H200 (configs/h200-smollm2.yaml: "
                 "4,096 greedy answers of the generator's prompts, 10 epochs, draft vocabulary 16,384), 2026-12-06"),
    source_dir="configs/drafters/smollm2-135m-h200",
    files_sha256={
        "config.json": "20add49f5a71833d6d65915f6d3a4d849c8478439fc3f99eeb176e0404c46f67",
        PROVENANCE: "0df8cd01f9cef2543dfccd1fd664ffb1934b325fa6c271b3dbe9bb9d87b0802c",
        ARCHIVE: "efd66a6f7a594d8f7c98ef984b869cae73b91d31bd209b1ecc56040af193cca4",
    },
    weights_sha256="fbe7a0d112391d5cda30d1544aaa43b44bb9d0e437b755c78f4668832ab26169",
    weights_bytes=29_238_648,
    target="smollm2",
    training_prompts="configs/prompts/generated/train.jsonl",
)
SHIPPED = {d.name: d for d in (SMOLLM2_H200,)}


def shipped(name: str) -> ShippedDrafter:
    try:
        return SHIPPED[name]
    except KeyError:
        raise ConfigError(f"NAME: no shipped drafter {name!r}; the pack ships: {', '.join(sorted(SHIPPED))}") from None


def _check_sources(d: ShippedDrafter) -> None:
    for name, digest in d.files_sha256.items():
        path = d.source / name
        if not path.is_file():
            raise ConfigError(f"{path}: missing from the checkout; restore it with `git checkout -- {d.source_dir}`")
        got = sha256_file(path)
        if got != digest:
            raise ConfigError(f"{path}: sha256 {got}, expected {digest} (the committed file was changed or "
                              f"truncated); restore it with `git checkout -- {d.source_dir}`")


def _expected_stamp(d: ShippedDrafter) -> dict:
    return {"shipped": asdict(d), "files": {"config.json": d.files_sha256["config.json"],
                                            PROVENANCE: d.files_sha256[PROVENANCE], WEIGHTS: d.weights_sha256}}


def install(d: ShippedDrafter, out_dir: Path) -> Path:
    """Check, decompress, check, stamp, swap into place (eagle3/built_dir.py); returns `out_dir`."""
    _check_sources(d)
    out_dir = Path(out_dir).resolve()
    with building(out_dir, "install") as (staged, _):
        staged.mkdir()
        with lzma.open(d.source / ARCHIVE) as src, open(staged / WEIGHTS, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        got = sha256_file(staged / WEIGHTS)
        if got != d.weights_sha256:
            raise GateError(f"{d.source / ARCHIVE} decompresses to weights of sha256 {got}, expected "
                            f"{d.weights_sha256}; nothing was installed")
        for name in ("config.json", PROVENANCE):
            shutil.copyfile(d.source / name, staged / name)
        atomic_write_json(staged / STAMP, _expected_stamp(d))
    return out_dir


def ensure_installed(name: str, out_dir: Path, force: bool = False) -> tuple[Path, bool]:
    """(`out_dir`, installed now?): installs unless it already holds this drafter's checked bytes."""
    d = shipped(name)
    return ensure_built(out_dir, lambda p: installed_problem(p) is None and read_json(p / STAMP) == _expected_stamp(d),
                        lambda p: install(d, p), force)


def installed_problem(directory: Path) -> str | None:
    """Why a dir stamped as a shipped drafter no longer holds what was installed, or None."""
    directory = Path(directory)
    stamp = read_json(directory / STAMP) or {}
    row = SHIPPED.get((stamp.get("shipped") or {}).get("name"))
    if row is None or stamp != _expected_stamp(row):
        fix = f"`eagle3 install-drafter {row.name} {directory} --force`" if row else "`eagle3 install-drafter` again"
        return f"{directory / STAMP} is not the stamp of a drafter this pack ships (now); run {fix}"
    for name, digest in stamp["files"].items():
        path = directory / name
        if not path.is_file():
            return f"{path} is missing (installed as {row.name}); run `eagle3 install-drafter {row.name} {directory}`"
        if sha256_file(path) != digest:
            return (f"{path} is not the installed {row.name} (swapped, edited or truncated); run "
                    f"`eagle3 install-drafter {row.name} {directory} --force`")
    return None


def target_problem(directory: Path, target: Path) -> str | None:
    """Why `target` is not the model the shipped drafter in `directory` was trained for, or None."""
    row = row_of(directory)
    if row is None:
        return None
    model = REAL_MODELS[row.target]
    made = (read_json(Path(target) / MODEL_STAMP) or {}).get("source") or {}
    if made.get("name") != row.target or not model_is_current(Path(target), model):
        what = f"a model made as {made['name']!r}" if made.get("name") else "not a model `eagle3 make-model` made"
        return (f"{row.name} was trained for {model.description.split(' (')[0]} (`eagle3 make-model {row.target}`), "
                f"but the target {target} is {what}" + ("" if made.get("name") != row.target else
                                                         " whose files are no longer the pinned ones")
                + f"; point target.model at `eagle3 make-model {row.target}`'s dir, or bench another drafter")
    return None


def is_shipped(directory: Path) -> bool:
    return (Path(directory) / STAMP).is_file()


def row_of(directory: Path) -> ShippedDrafter | None:
    """The row a dir is stamped as (its bytes are checked by installed_problem, before any server)."""
    stamp = read_json(Path(directory) / STAMP) or {}
    return SHIPPED.get((stamp.get("shipped") or {}).get("name"))
