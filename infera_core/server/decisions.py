"""Routing explanations on the wire, and the last decisions kept for ``/v1/admin/decisions``.

A client that may (an API key with ``explain: true``, or the admin) sends
``X-Infera-Explain: 1``; the scheduler then records its decision
(:mod:`infera_core.scheduling.explain`) and the answer carries it as compact JSON: in the
``X-Infera-Explain`` response header, or for a stream (whose headers left before the
decision could change on a retry… and to keep the header small) as a trailing SSE comment
``: infera-explain {...}`` after the last event. Without the header nothing is recorded.
"""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Mapping
from typing import Any

from infera_core.scheduling.explain import Decision
from infera_core.server.asgi import Message, Send
from infera_core.server.auth import AdminGate
from infera_core.server.keys import ADMIN, Principal

EXPLAIN_HEADER = b"x-infera-explain"
SSE_PREFIX = b": infera-explain "
_MAX_HEADER = 6144
"""Bytes of explanation JSON a response header carries (beyond it the candidates' terms are dropped)."""
_YES = (b"1", b"true", b"yes", b"on")


def asked(value: bytes | None) -> bool:
    """The request's ``X-Infera-Explain`` value asks for an explanation."""
    return value is not None and value.strip().lower() in _YES


def may_explain(principal: Principal | None, admin: AdminGate, scope: Mapping[str, Any]) -> bool:
    """Keys with ``explain: true`` and the admin may; without API keys, whoever passes the admin
    check (the admin token, or a loopback client when none is set). Everyone else is ignored."""
    if principal is not None:
        if principal is ADMIN:
            return True
        key = principal.key
        return key is not None and bool(getattr(key, "explain", False))
    return admin.allows(scope)


def compact(decision: Decision, limit: int = _MAX_HEADER) -> bytes:
    """The explanation as compact JSON of at most about ``limit`` bytes."""
    data = decision.as_dict()
    raw = json.dumps(data, separators=(",", ":")).encode()
    if len(raw) > limit:  # keep the ranking, drop the terms
        data["candidates"] = [{k: v for k, v in c.items() if k != "terms"} for c in data["candidates"]]
        data["truncated"] = True
        raw = json.dumps(data, separators=(",", ":")).encode()
    return raw


class DecisionLog:
    """The last ``kept`` decisions (explained or sampled), newest last; admin-only to read."""

    __slots__ = ("_ring", "sample")

    def __init__(self, kept: int, sample: float) -> None:
        self._ring: collections.deque[dict[str, Any]] = collections.deque(maxlen=max(kept, 0))
        self.sample = sample

    def sampled(self) -> bool:
        """Whether this request's decision is recorded though nobody asked (``--decisions-sample``)."""
        return self.sample > 0.0 and random.random() < self.sample

    def add(self, decision: Decision, status: int) -> None:
        if decision.attempt and self._ring.maxlen:
            entry = decision.as_dict()
            entry["status"] = status
            self._ring.append(entry)

    def recent(self) -> list[dict[str, Any]]:
        """Newest first."""
        return list(reversed(self._ring))


class ExplainSend:
    """A ``send`` adding the request's explanation: as a response header, or for a stream as a
    trailing SSE comment (the relay sends every chunk through it: no splicing)."""

    __slots__ = ("decision", "inner", "stream")

    def __init__(self, inner: Send, decision: Decision) -> None:
        self.inner = inner
        self.decision = decision
        self.stream = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = list(message.get("headers", ()))
            self.stream = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
            if not self.stream and self.decision.attempt:
                headers.append((EXPLAIN_HEADER, compact(self.decision)))
            message["headers"] = headers
        elif kind == "http.response.body" and self.stream and not message.get("more_body"):
            tail = SSE_PREFIX + compact(self.decision, 1 << 16) + b"\n\n"
            message["body"] = bytes(message.get("body", b"")) + tail
        await self.inner(message)
