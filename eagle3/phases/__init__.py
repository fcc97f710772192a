"""The pipeline's phases, each a plain function over the config (no orchestrator imports here)."""
