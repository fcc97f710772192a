"""Security properties: config strings never pass through a shell, servers bind loopback unless told
otherwise, the API key is enforced by the server and never written down, and (docs/reliability.md) the
handoff never ends what it does not own.

The shell test walks the config schema, so a string field added later must be classified here
(reaching the engines as a literal argument, or rejected by validation) before it passes."""

from __future__ import annotations

import json
import os
import shutil
import types
import typing
import uuid
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from eagle3 import engine_registry
from eagle3.progress import counts, subscribed
from eagle3.process import procfs
from eagle3.config import Server, config_model, load_config
from eagle3.config.types import Target
from eagle3.engines import loadgen, speculators_cli as speculators
from eagle3.engines import sglang as sglang_module
from eagle3.engines.sglang import ENGINE as sglang
from eagle3.engines.vllm import ENGINE as vllm
from eagle3.engines.serving import KEY_PURPOSE, api_key, base_url
from eagle3.errors import ConfigError
from eagle3.process.services import LaunchSpec, Supervisor, state_dir_for
from tests.conftest import TINY_CONFIG, requires_engine, tiny_raw_config
from tests.ports import free_port
from tests.reliability.standins import fake_engine_venv, records, stub_model

# ---- the schema walk -------------------------------------------------------------------------------


def string_leaves(model: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """Every field of the schema that holds text: dotted path ([] = list items, {} = dict values)
    -> kind: "str", "path", "secret", "literal", "pattern" (a str with a pattern), "any" (free JSON)."""
    out: dict[str, str] = {}
    for name, field in model.model_fields.items():
        pattern = any(getattr(m, "pattern", None) for m in field.metadata)
        out.update(_leaves(field.annotation, prefix + name, pattern))
    return out


def _leaves(ann, path: str, pattern: bool = False) -> dict[str, str]:
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        pattern = pattern or any(getattr(m, "pattern", None) for m in args[1:]
                                 for m in ([m] + list(getattr(m, "metadata", []))))
        return _leaves(args[0], path, pattern)
    if origin in (typing.Union, types.UnionType):
        out: dict[str, str] = {}
        for a in args:
            if a is not type(None):
                out.update(_leaves(a, path, pattern))
        return out
    if origin is list:
        return _leaves(args[0], path + "[]", pattern)
    if origin is dict:
        return _leaves(args[1], path + "{}", pattern)
    if origin is typing.Literal:
        return {path: "literal"} if any(isinstance(a, str) for a in args) else {}
    if ann is typing.Any:
        return {path: "any"}
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return string_leaves(ann, path + ".")
    if ann is str:
        return {path: "pattern" if pattern else "str"}
    if ann is SecretStr:
        return {path: "secret"}
    if isinstance(ann, type) and issubclass(ann, Path):
        return {path: "path"}
    return {}


# ---- shell metacharacters in every string field -------------------------------------------------------


def payload(markers: Path, tag: str) -> str:
    """Text that a shell would turn into side effects: a file in `markers` for each construct."""
    m = markers / tag
    return (f"x $(touch {m}-subst) `touch {m}-backtick` ; touch {m}-semicolon | tee {m}-pipe "
            f"&& touch {m}-and || touch {m}-or > {m}-redirect < /dev/null & touch {m}-bg "
            f"'single' \"double\" *?[a] ~ \\ #comment\ntouch {m}-newline")


# Fields whose values are checked against a pattern or a fixed set: the payload must be refused
# with the field named. (engines.*.python/command_prefix are exclusive; both kinds are exercised.)
REJECTED = {"name", "target.served_name", "target.dtype", "datagen.engine", "extract.engine",
            "extract.hidden_states_dtype", "train.dry_run", "train.loss_implementation", "train.draft_attn_impl",
            "hidden_states.mode", "bench.engine", "bench.schedule", "bench.start_servers", "handoff.systemd_units[]",
            "datagen.server.host", "extract.server.host", "bench.server.host",
            "fanout.pools[]"} | {  # pool names: a pattern, and they reach Prefect, never an engine
            f"{phase}.server.{key}" for phase in ("datagen", "extract", "bench")
            for key in ("api_key_env", "api_key_secret_block")}
# Sent as an HTTP header: the payload's newline cannot get there and is refused (without echoing the
# key); the rest of it is accepted and reaches the engine literally.
API_KEYS = {f"{ph}.server.api_key" for ph in ("datagen", "extract", "bench")}


def header_safe(text: str) -> str:
    return text.replace("\n", " ")


def _set(raw: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.replace("[]", "").replace("{}", "").split(".")
    node = raw
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def test_every_config_string_reaches_the_engines_as_one_literal_argument(tmp_path):
    leaves = string_leaves(config_model())  # the schema with every phase section of the table
    assert len(leaves) >= 30, f"the walk found too few string fields: {sorted(leaves)}"
    markers = tmp_path / "markers"
    markers.mkdir()
    rec = tmp_path / "argv.jsonl"
    # Every path of the config lives under a directory whose name is itself a shell payload.
    weird = tmp_path / payload(markers, "path").replace("\n", " ")
    venv_python = fake_engine_venv(weird / "venv")
    model = stub_model(weird / "model")
    prompts = weird / "prompts.jsonl"
    shutil.copy(TINY_CONFIG.parent / "prompts" / "tiny-prompts.jsonl", prompts)
    drafter = weird / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")

    raw = tiny_raw_config()
    p = {leaf: payload(markers, leaf.replace(".", "_").replace("[]", "").replace("{}", "")) for leaf in leaves}
    env = {"STANDIN_MODE": "record", "STANDIN_RECORD": str(rec), "STANDIN_PAYLOAD": p["engines.vllm.env{}"]}
    raw.update(run_dir=str(weird / "run"), target={**raw["target"], "model": str(model)})
    raw["engines"] = {
        "vllm": {"python": str(venv_python), "env": env},
        "speculators": {"python": str(venv_python), "env": {**env, "STANDIN_PAYLOAD": p["engines.speculators.env{}"]}},
        # the other way to name an engine: a command prefix, whose items are literal arguments too
        "sglang": {"command_prefix": [str(venv_python.parent / "vllm"), p["engines.sglang.command_prefix[]"]],
                   "env": {**env, "STANDIN_PAYLOAD": p["engines.sglang.env{}"]}},
    }
    raw["datagen"].update(prompts=str(prompts), request_extra={"note": p["datagen.request_extra{}"]},
                          self_prompts={"count": 2, "system": p["datagen.self_prompts.system"]})
    raw["bench"].update(prompts=str(prompts), drafter=str(drafter))
    for phase in ("datagen", "extract", "bench"):
        raw[phase]["server"].update(port=free_port(), api_key=header_safe(p[f"{phase}.server.api_key"]),
                                    extra_args=[p[f"{phase}.server.extra_args[]"], "--flag=" + p["name"]])
    raw["train"]["extra_args"] = [p["train.extra_args[]"]]
    raw["handoff"] = {"shm_dir": str(weird / "shm"), "dev_dir": str(weird / "dev"),
                      "pycache_dirs": [str(weird / "pycache")], "protected_process_names": [p["handoff.protected_process_names[]"]]}

    set_here = {"run_dir", "target.model", "engines.vllm.python", "engines.speculators.python",
                "engines.sglang.python", "engines.vllm.command_prefix[]", "engines.speculators.command_prefix[]",
                "engines.sglang.command_prefix[]", "engines.vllm.env{}", "engines.speculators.env{}",
                "engines.sglang.env{}", "datagen.prompts", "datagen.request_extra{}", "datagen.self_prompts.system",
                "bench.prompts", "bench.drafter",
                "train.extra_args[]", "handoff.shm_dir", "handoff.dev_dir", "handoff.pycache_dirs[]",
                "handoff.protected_process_names[]"} | {f"{ph}.server.{k}" for ph in ("datagen", "extract", "bench")
                                                         for k in ("api_key", "extra_args[]")}
    unclassified = set(leaves) - set_here - REJECTED
    assert not unclassified, f"string fields this test does not cover yet; classify them: {sorted(unclassified)}"
    assert {leaves[f] for f in REJECTED} <= {"pattern", "literal"}
    assert {leaves[f] for f in set_here} <= {"str", "path", "secret", "any"}

    # Fields with a pattern or a fixed set of values refuse the payload, naming the field.
    for leaf in sorted(REJECTED):
        bad = json.loads(json.dumps(raw))
        _set(bad, leaf, [p[leaf]] if leaf.endswith("[]") else p[leaf])
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(ConfigError) as err:
            load_config(tmp_path / "bad.yaml")
        assert leaf.replace("[]", "") in str(err.value), f"{leaf}: {err.value}"
    for leaf in sorted(API_KEYS):
        bad = json.loads(json.dumps(raw))
        _set(bad, leaf, p[leaf])
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(ConfigError) as err:
            load_config(tmp_path / "bad.yaml")
        assert leaf in str(err.value) and "touch" not in str(err.value), f"{leaf}: {err.value}"

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)  # every free-text field accepts the payload as data
    assert cfg.datagen.server.host == "127.0.0.1" and cfg.target.model == model

    # The argv each engine command would get, built by the pack's own builders from this config.
    e = cfg.engines
    run = cfg.run_dir
    argvs = {
        "vllm-datagen": (e.vllm, vllm.serve_argv(e.vllm, cfg.target, cfg.datagen.server), cfg.datagen.server),
        "vllm-extract": (e.vllm, vllm.serve_argv(e.vllm, cfg.target, cfg.extract.server), cfg.extract.server),
        "vllm-bench": (e.vllm, vllm.serve_argv(e.vllm, cfg.target, cfg.bench.server,
                                               vllm.spec_args(cfg.bench.drafter, 3)), cfg.bench.server),
        "sglang-bench": (e.sglang, sglang.serve_argv(e.sglang, cfg.target, cfg.bench.server,
                                                     sglang.spec_args(cfg.bench.drafter, 3)),
                         cfg.bench.server),
        "prepare-data": (e.speculators, speculators.prepare_data_argv(
            e.speculators, cfg.target.model, run / "datagen" / "samples.jsonl", run / "extract" / "prepared.partial",
            cfg.extract.seq_length, base_url(cfg.extract.server)), None),
        "generate-offline-data": (e.speculators, speculators.generate_offline_data_argv(
            e.speculators, base_url(cfg.extract.server) + "/v1", run / "extract" / "prepared",
            run / "extract" / "hidden_states", cfg.extract.concurrency, served_name=cfg.target.served_name), None),
        "train": (e.speculators, speculators.train_argv(
            e.speculators, target=cfg.target.model, data_path=run / "extract" / "prepared",
            hidden_states_path=run / "extract" / "hidden_states", save_path=run / "train" / "checkpoints",
            target_layer_ids=[2, 4, 5], epochs=1, lr=1e-4, total_seq_len=512, draft_vocab_size=None, ttt_steps=3,
            hidden_states_dtype="float32", dry_run=True, extra_args=cfg.train.extra_args), None),
        "bench-client": (e.vllm, engine_registry.get("vllm").load_argv(e.vllm, loadgen.LoadSpec(
            base_url=base_url(cfg.bench.server), served_name=cfg.target.served_name, tokenizer=cfg.target.model,
            dataset=cfg.bench.prompts, num_prompts=2, concurrency=1, max_tokens=4, temperature=0.0, ignore_eos=False,
            result_file=run / "bench" / "r.json")), None),
    }
    texts = {leaf: p[leaf] for leaf in ("datagen.server.extra_args[]", "train.extra_args[]",
                                        "engines.sglang.command_prefix[]")}
    texts["bench.server.api_key"] = header_safe(p["bench.server.api_key"])
    joined = {name: "\0".join(argv) for name, (_, argv, _) in argvs.items()}
    assert texts["datagen.server.extra_args[]"] in joined["vllm-datagen"].split("\0")
    assert texts["train.extra_args[]"] in joined["train"].split("\0")
    assert texts["engines.sglang.command_prefix[]"] in joined["sglang-bench"].split("\0")
    # SGLang takes its key only as a flag: its launcher appends it after exec, from the environment.
    assert not any(texts["bench.server.api_key"] in j for j in joined.values()), "a key reached an argv"
    assert p["datagen.request_extra{}"] not in "".join(joined.values()), "request_extra is request JSON, not argv"
    assert p["datagen.self_prompts.system"] not in "".join(joined.values()), "a system turn is request JSON, not argv"

    # Launch a stand-in engine with each argv through the Supervisor (the pack's only launcher).
    sup = Supervisor(state_dir_for(tmp_path / "launch-state"))
    for name, (engine, argv, server) in argvs.items():
        adapter = sglang if name.startswith("sglang") else vllm
        extra_env = adapter.serve_env(server.key()) if server else {}  # as start_server does (the key)
        spec = LaunchSpec(name=name, argv=argv, log=tmp_path / "logs" / f"{name}.log", env={**engine.env, **extra_env},
                          secrets=[server.api_key.get_secret_value()] if server and server.api_key else [])
        assert sup.run(spec, timeout_s=60) == 0, spec.log.read_text()[-2000:]
    got = records(rec)
    assert [r["argv"] for r in got] == [argv for _, argv, _ in argvs.values()], "an argument was split, joined or expanded"
    by_name = dict(zip(argvs, got))
    assert by_name["vllm-datagen"]["env"]["STANDIN_PAYLOAD"] == p["engines.vllm.env{}"]
    assert by_name["vllm-datagen"]["env"]["VLLM_API_KEY"] == header_safe(p["datagen.server.api_key"])
    assert by_name["sglang-bench"]["env"][sglang_module.KEY_ENV] == texts["bench.server.api_key"]
    assert by_name["train"]["env"]["STANDIN_PAYLOAD"] == p["engines.speculators.env{}"]
    assert sorted(markers.iterdir()) == [], "a shell ran a payload"
    assert sup.registry.entries() == []


# ---- loopback by default ------------------------------------------------------------------------

def test_servers_bind_loopback_unless_configured(tmp_path):
    default = Server(port=8000)
    assert default.host == "127.0.0.1"
    env = types.SimpleNamespace(script_argv=lambda n: [n], python_argv=lambda: ["python"])
    target = Target(model=Path("/m"), served_name="t", max_model_len=8)
    for adapter in (vllm, sglang):
        argv = adapter.serve_argv(env, target, default)
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        wide = adapter.serve_argv(env, target, Server(port=8000, host="0.0.0.0", allow_remote=True))
        assert wide[wide.index("--host") + 1] == "0.0.0.0", "a configured host is passed through as given"
    with pytest.raises(ValidationError, match="allow_remote") as err:
        Server(port=8000, host="0.0.0.0")  # only with the explicit opt-in
    assert err.value.errors()[0]["loc"] == ("host",)


def tcp_listeners(port: int) -> list[tuple[str, str]]:
    """(table, local address hex) of every LISTEN socket on `port`, from /proc/net/tcp{,6}."""
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            addr, port_hex = cols[1].rsplit(":", 1)
            if cols[3] == "0A" and int(port_hex, 16) == port:
                found.append((table, addr))
    return found


@pytest.mark.slow
@pytest.mark.engine
def test_real_vllm_server_listens_on_loopback_only(vllm_server):
    port = vllm_server.config.datagen.server.port
    listeners = tcp_listeners(port)
    assert listeners == [("tcp", "0100007F")], f"expected only 127.0.0.1:{port}, got {listeners}"
    argv = procfs.cmdline(vllm_server.process.pid)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


# ---- the API key --------------------------------------------------------------------------------

@requires_engine
@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(900)
@pytest.mark.parametrize("source", ["config", "run"])
def test_api_key_is_enforced_and_never_written_under_run_dir(tiny_model, make_config, source):
    """The datagen phase starts its own vLLM server with the key (from datagen.server.api_key, or,
    with none configured, the run's own key derived from its owner token) and generates with it;
    while it runs, requests without the key or with a wrong one get 401, and the key is in no argv.
    Afterwards no file under run_dir (server log, registry, manifest, samples, summary) holds it.
    A key from the variable datagen.server.api_key_env names, filled from a Prefect Secret block,
    goes through the pipeline flow to a real server in tests/flows/test_operator_view.py; where the
    variable is read, test_api_key_sources.py. One vLLM start per source: the server is what costs."""
    import httpx

    from eagle3.phases.datagen import run_datagen
    from eagle3.phase_runner import supervisor

    key = f"sk-eagle3-{uuid.uuid4().hex}"
    key_fields = {"config": {"api_key": key}, "run": {}}[source]
    cfg = make_config({"datagen": {"max_samples": 4, "concurrency": 2, "sampling": {"max_tokens": 8},
                                   "server": {"port": free_port(), **key_fields}}})
    sup = supervisor(cfg)
    if source == "run":
        key = api_key(cfg, cfg.datagen.server, "datagen.server")
        assert key == sup.registry.secret(KEY_PURPOSE) and len(key) == 64
        assert oct(os.stat(state_dir_for(cfg.run_dir) / "owner-token").st_mode & 0o777) == "0o600"
    url = base_url(cfg.datagen.server)
    seen: dict = {}

    def while_serving(done: int, total: int) -> None:
        if done == 0 or seen:
            return
        seen["no key"] = httpx.get(f"{url}/v1/models", timeout=30).status_code
        seen["wrong key"] = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"},
                                      timeout=30).status_code
        seen["right key"] = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                                      timeout=30).status_code
        seen["chat without key"] = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": cfg.target.served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        ).status_code
        [entry] = sup.registry.entries()
        seen["argv"] = [procfs.cmdline(p.pid) for p in procfs.group_members(entry.pgid)]
        seen["registry"] = (state_dir_for(cfg.run_dir) / "services.json").read_text()

    with subscribed(counts("datagen", while_serving)):
        summary = run_datagen(cfg, sup)
    assert summary.details["samples"] == 4 and summary.details["complete"]
    assert seen and (seen["no key"], seen["wrong key"], seen["chat without key"]) == (401, 401, 401)
    assert seen["right key"] == 200
    assert seen["argv"] and not any(key in " ".join(a) for a in seen["argv"]), "the key is visible in ps"
    assert key not in seen["registry"]
    assert sup.registry.entries() == []
    files = [f for f in cfg.run_dir.rglob("*") if f.is_file()]
    assert any(f.name == "vllm-server.log" for f in files) and any(f.name == "samples.jsonl" for f in files)
    leaked = [str(f) for f in files if key.encode() in f.read_bytes()]
    assert not leaked, f"the API key was written to {leaked}"
