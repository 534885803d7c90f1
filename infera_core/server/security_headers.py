"""Browser security headers on the admin surface (the dashboard and ``/v1/admin/*``).

Every admin answer carries ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``,
``Referrer-Policy: no-referrer`` and a ``Content-Security-Policy`` that allows nothing
(``default-src 'none'``, no framing). The dashboard's policy allows exactly its own inline
script and style, by their SHA-256 (computed from the page once, at start-up), and
``fetch`` to this origin: an injected script or a frame on another site gets nothing.
"""

from __future__ import annotations

import base64
import hashlib
import re

from infera_core.server.asgi import Message, Send

ADMIN_PREFIXES = ("/dashboard", "/v1/admin/", "/v1/workers", "/metrics")
"""Paths whose answers carry the headers (the admin routes; inference routes stay lean)."""

_BASE: list[tuple[bytes, bytes]] = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
NO_CONTENT_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def page_policy(html: str) -> str:
    """The CSP of a self-contained page: its inline ``<script>`` and ``<style>`` blocks by hash,
    ``connect-src 'self'`` for its polling, nothing else."""

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
        return " ".join(
            "'sha256-" + base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() + "'" for b in blocks
        )

    scripts, styles = hashes("script") or "'none'", hashes("style") or "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self';"
        " img-src 'self' data:;"
        " frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )


def security_headers(policy: str = NO_CONTENT_POLICY) -> list[tuple[bytes, bytes]]:
    """The headers, with ``policy`` as the Content-Security-Policy."""
    return [*_BASE, (b"content-security-policy", policy.encode())]


class WithHeaders:
    """A ``send`` that adds ``headers`` to the response start (those the app set win)."""

    __slots__ = ("headers", "inner")

    def __init__(self, inner: Send, headers: list[tuple[bytes, bytes]]) -> None:
        self.inner = inner
        self.headers = headers

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            have = {k.lower() for k, _ in message.get("headers", ())}
            message["headers"] = [
                *message.get("headers", ()),
                *((k, v) for k, v in self.headers if k not in have),
            ]
        await self.inner(message)
