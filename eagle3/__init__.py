"""EAGLE-3 drafter pipeline: framework-free core (no Prefect import anywhere under this package)."""

__version__ = "0.1.0"
