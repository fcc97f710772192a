"""speculators' clients of the pack's own server carry the run's key (eagle3/engine_side/client_auth).

speculators 0.9 sends api_key="EMPTY" from its OpenAI clients and nothing from its render client.
With the environment serving.client_env gives them, the engine interpreter's httpx and openai
requests to the run's server carry the run's key, and requests to any other origin do not. Two
real HTTP listeners record what arrives; the clients are the engine venv's own libraries."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import ThreadingHTTPServer

import pytest

from eagle3.engines.serving import CLIENT_AUTH_DIR, client_env
from tests.conftest import ENGINE_PYTHON, requires_engine
from tests.standin_http import JSONHandler

CLIENTS = r"""
import asyncio, sys, httpx, openai
ours, other = sys.argv[1], sys.argv[2]
httpx.Client().post(ours + "/v1/chat/completions/render", json={})    # prepare-data's render client
openai.OpenAI(base_url=ours + "/v1", api_key="EMPTY", max_retries=0).models.list()   # the trainer's
async def offline():                                                    # generate-offline-data's
    async with openai.AsyncOpenAI(base_url=ours + "/v1", api_key="EMPTY", max_retries=0) as c:
        await c.models.list()
asyncio.run(offline())
openai.OpenAI(base_url=other + "/v1", api_key="EMPTY", max_retries=0).models.list()  # elsewhere
httpx.get(other + "/v1/models")
"""


@pytest.fixture
def listener():
    """A listener that records (path, Authorization) of every request; returns (url, seen)."""
    servers = []

    def start():
        seen: list[tuple[str, str | None]] = []

        class Handler(JSONHandler):
            def _record(self):
                seen.append((self.path, self.headers.get("Authorization")))
                self.reply(200, {"object": "list", "data": [{"id": "target", "object": "model"}]})

            do_GET = do_POST = _record

            def log_message(self, *a):
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", seen

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@requires_engine
def test_requests_to_the_runs_server_carry_its_key_and_no_other_origin_sees_it(make_config, listener):
    (ours, seen), (other, elsewhere) = listener(), listener()
    cfg = make_config({"extract": {"server": {"port": int(ours.rsplit(":", 1)[1])}}})
    env = client_env(cfg, cfg.extract.server, "extract.server", {"PYTHONPATH": "/keep/this"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(CLIENT_AUTH_DIR), "/keep/this"]
    key = env["EAGLE3_SERVER_API_KEY"]
    res = subprocess.run([str(ENGINE_PYTHON), "-c", CLIENTS, ours, other], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env, "PYTHONPATH": str(CLIENT_AUTH_DIR)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert [p for p, _ in seen] == ["/v1/chat/completions/render", "/v1/models", "/v1/models"]
    assert {auth for _, auth in seen} == {f"Bearer {key}"}
    assert [auth for _, auth in elsewhere] == ["Bearer EMPTY", None], "the run's key left for another origin"
    assert key not in json.dumps(elsewhere)
