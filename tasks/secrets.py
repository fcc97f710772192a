"""API keys from Prefect Secret blocks. A server section with `api_key_secret_block: NAME` gets
the block's value in the environment variable its `api_key_env` names, where the (Prefect-free)
phases read it. Values are never logged or returned."""

from __future__ import annotations

import os

from eagle3 import phase_table
from eagle3.config import PipelineConfig
from eagle3.errors import ConfigError


def provide_api_keys(cfg: PipelineConfig) -> list[str]:
    """Fill the variables from their blocks, then check every configured key resolves (an unset
    variable fails here, naming the field, before the first handoff). Returns the fields filled."""
    from prefect.blocks.system import Secret

    filled = []
    for phase, server, _ in phase_table.servers(cfg):
        if server.api_key_secret_block:
            try:
                block = Secret.load(server.api_key_secret_block)
            except ValueError as e:
                raise ConfigError(
                    f"{phase}.server.api_key_secret_block: no Secret block named {server.api_key_secret_block!r} "
                    f"on the Prefect server ({e}); create it in the UI (Blocks, +, Secret) or with "
                    f"`prefect.blocks.system.Secret(value=KEY).save({server.api_key_secret_block!r})`") from None
            value = block.value.get_secret_value()  # not .get(): that JSON-decodes ("123" would become 123)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{phase}.server.api_key_secret_block: block {server.api_key_secret_block!r} "
                                  "must hold the key as a non-empty string")
            os.environ[server.api_key_env] = value
            filled.append(f"{phase}.server")
        server.key(f"{phase}.server")
    return filled
