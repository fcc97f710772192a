"""The one place artifact keys are built: every artifact the pack publishes is keyed
`<config name>-<what>-...`, so the UI's Artifacts page groups a pipeline's artifacts together and
a key versions one artifact across runs."""

from __future__ import annotations

import re


def artifact_key(name: str, *parts: str) -> str:
    # Prefect keys allow lowercase ASCII letters, digits and dashes only: a config name may hold
    # '.', '_' and uppercase (tests/test_artifact_keys.py checks against Prefect's own validation).
    key = re.sub(r"[^a-z0-9]+", "-", "-".join((name, *parts)).lower()).strip("-")
    return key or "eagle3"
