"""Emptying a phase's scratch dir (its table row's `purge`), e.g. an online train step's hidden-state
cache (RunLayout.hs_cache): the extraction server writes one file per requested sample there and the
trainer deletes each once loaded, so whatever is left belongs to a step that has ended. Every
handoff runs this after every service is stopped; the online step before it starts and after it ends."""

from __future__ import annotations

import shutil
from pathlib import Path


def purge(cache: Path) -> int:
    """Remove the dir and all in it (never through a link); returns the bytes removed."""
    removed = 0
    cache = Path(cache)
    if cache.is_dir() and not cache.is_symlink():
        for p in cache.iterdir():
            try:
                removed += p.lstat().st_size
            except OSError:
                pass
        shutil.rmtree(cache, ignore_errors=True)
    return removed
