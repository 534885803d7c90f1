"""The request handler base of the tests' small HTTP stand-ins (engines, metrics endpoints)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` that logs nothing and answers with one whole body."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, body: bytes | str, ctype: str = "application/json") -> None:
        """Send ``body`` (str: UTF-8) with ``status``, its type and its length."""
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
