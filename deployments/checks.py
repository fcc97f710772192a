"""A `prefect deploy` build step: refuse to create the deployments unless EAGLE3_REPO names this
checkout. Without it, `{{ $EAGLE3_REPO }}` stays literal text in the pull step, the deploy
succeeds, and every run then crashes on the worker. Build steps run at deploy time, so the
mistake fails the deploy instead, with the fix in the message."""

from __future__ import annotations

from pathlib import Path

ENTRYPOINTS = ("flows/pipeline.py", "flows/benchmark.py")
FIX = "Run from the repo root: EAGLE3_REPO=$(pwd) prefect deploy --all --prefect-file deployments/prefect.yaml"


class DeployCheckError(SystemExit):
    """A SystemExit: Prefect's CLI passes it through, so the deploy ends with this message and
    exit code 1 instead of "An exception occurred." under two tracebacks."""

    def __init__(self, message: str):
        super().__init__(f"error: {message}")


def require_repo(directory: str = "") -> dict:
    """`directory` is the templated "{{ $EAGLE3_REPO }}" (Prefect drops an unset variable, or keeps
    the literal text). Returns {"repo": path}, a step output."""
    if not directory or "{{" in directory or "$EAGLE3_REPO" in directory:
        raise DeployCheckError(f"EAGLE3_REPO is not set, so the worker would not know where this checkout is. {FIX}")
    repo = Path(directory)
    if not repo.is_absolute():
        raise DeployCheckError(f"EAGLE3_REPO={directory!r} is not an absolute path (the worker resolves it from its "
                               f"own working directory). {FIX}")
    missing = [e for e in ENTRYPOINTS if not (repo / e).is_file()]
    if missing:
        raise DeployCheckError(f"EAGLE3_REPO={directory!r} is not a checkout of this pack (no {', '.join(missing)}); "
                               "the GPU nodes need the checkout at this same path. " + FIX)
    return {"repo": str(repo)}
