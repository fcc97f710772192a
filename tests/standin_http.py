"""The HTTP side the test stand-ins share (tests/reliability/standin_engine.py,
tests/gpu/hs_endpoint.py, tests/engines/fake_sglang/): they run as real processes started by the
pack, by path, under any interpreter, so this is stdlib only and found through the script's own
location (`sys.path` gets tests/ prepended by the script)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that answers JSON with an exact Content-Length (keep-alive clients such as
    httpx and aiohttp wait for the body otherwise) and reads JSON request bodies."""

    def reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def reply_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
