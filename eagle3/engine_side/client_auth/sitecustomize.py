"""Engine-side, on the PYTHONPATH of speculators' clients of the pack's own server.

speculators 0.9 talks to the extraction server with a fixed key ("EMPTY": prepare-data's render
client over httpx, generate-offline-data and the online trainer's OpenAI clients over the httpx
or httpx2 that the installed openai builds on). The
servers the pack starts demand the run's key, so here, at interpreter start, every httpx request
to the run's server (EAGLE3_SERVER_ORIGIN, scheme://host:port) gets `Authorization: Bearer` the
run's key (EAGLE3_SERVER_API_KEY). Requests anywhere else are left as they are: the key never
leaves for another origin. Any other sitecustomize further along sys.path still runs.
"""

from __future__ import annotations

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _origin(url) -> str:
    return f"{url.scheme}://{url.host}:{url.port}"


def _install() -> None:
    key, origin = os.environ.get("EAGLE3_SERVER_API_KEY"), os.environ.get("EAGLE3_SERVER_ORIGIN")
    if not key or not origin:
        return
    header = f"Bearer {key}"
    # httpx for the render client; the OpenAI client of the installed openai may build on httpx2.
    for name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _patch(module.Client, module.AsyncClient, origin, header)


def _patch(client, async_client, origin: str, header: str) -> None:
    sync_send, async_send = client.send, async_client.send

    def send(self, request, *args, **kwargs):
        if _origin(request.url) == origin:
            request.headers["Authorization"] = header
        return sync_send(self, request, *args, **kwargs)

    async def asend(self, request, *args, **kwargs):
        if _origin(request.url) == origin:
            request.headers["Authorization"] = header
        return await async_send(self, request, *args, **kwargs)

    client.send, async_client.send = send, asend


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any (site.py imports only the first)."""
    saved, mine = sys.path[:], sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        sys.modules["sitecustomize"] = mine


_install()
_chain()
