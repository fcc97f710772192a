"""Where a server's API key comes from: the config file (api_key), an environment variable
(api_key_env), or, under Prefect, a Secret block that fills that variable (api_key_secret_block,
resolved in flows/: tests/flows/test_operator_view.py). Bad combinations are refused at load time
naming the field; an unset variable fails where the key is needed, naming the variable."""

from __future__ import annotations

import uuid

import pytest

from eagle3.config import Server
from eagle3.errors import ConfigError


def test_the_key_comes_from_the_config_or_from_the_variable_it_names(monkeypatch):
    var = f"EAGLE3_TEST_KEY_{uuid.uuid4().hex[:8].upper()}"
    assert Server(port=1).key() is None
    assert Server(port=1, api_key="literal").key() == "literal"
    monkeypatch.setenv(var, "from-env")
    assert Server(port=1, api_key_env=var).key() == "from-env"
    assert Server(port=1, api_key_env=var, api_key_secret_block="datagen-key").key() == "from-env"


def test_an_unset_variable_fails_naming_the_field_and_the_variable(monkeypatch):
    monkeypatch.delenv("EAGLE3_UNSET_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"datagen\.server\.api_key_env: environment variable EAGLE3_UNSET_KEY is "
                                          r"not set") as err:
        Server(port=1, api_key_env="EAGLE3_UNSET_KEY").key("datagen.server")
    assert "Secret block" not in str(err.value)
    monkeypatch.setenv("EAGLE3_UNSET_KEY", "")  # empty counts as unset: a server with an empty key is open
    with pytest.raises(ConfigError, match=r"filled from the Prefect Secret block 'datagen-key' only when the "
                                          r"pipeline runs as a Prefect flow"):
        Server(port=1, api_key_env="EAGLE3_UNSET_KEY", api_key_secret_block="datagen-key").key("datagen.server")


@pytest.mark.parametrize("fields,message", [
    ({"api_key": "k", "api_key_env": "KEY"}, "not both"),
    ({"api_key": "k", "api_key_secret_block": "b", "api_key_env": "KEY"}, "not both"),
    ({"api_key_secret_block": "datagen-key"}, "also set api_key_env"),
    ({"api_key_env": "1BAD"}, "api_key_env"),
    ({"api_key_env": "KEY", "api_key_secret_block": "Not A Block"}, "api_key_secret_block"),
])
def test_bad_key_sources_are_refused_when_the_config_loads(make_config, fields, message):
    with pytest.raises(ConfigError, match=message) as err:
        make_config({"datagen": {"server": fields}}, check_files=False)
    assert "datagen.server" in str(err.value)


def test_the_key_source_does_not_change_any_fingerprint(make_config, monkeypatch):
    """Switching from a key in the file to one in a variable or a Secret block must not redo phases."""
    plain = make_config(check_files=False)
    monkeypatch.setenv("EAGLE3_FP_KEY", "x")
    for fields in ({"api_key": "k"}, {"api_key_env": "EAGLE3_FP_KEY"},
                   {"api_key_env": "EAGLE3_FP_KEY", "api_key_secret_block": "datagen-key"}):
        cfg = make_config({"datagen": {"server": fields}}, check_files=False)
        assert cfg.fingerprint() == plain.fingerprint()
        assert {p: cfg.fingerprint(p) for p in ("datagen", "extract", "train", "bench")} == \
            {p: plain.fingerprint(p) for p in ("datagen", "extract", "train", "bench")}
    for phase in ("extract", "bench"):
        cfg = make_config({phase: {"server": {"api_key_env": "EAGLE3_FP_KEY"}}}, check_files=False)
        assert cfg.fingerprint(phase) == plain.fingerprint(phase)
