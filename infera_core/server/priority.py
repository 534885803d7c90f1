"""The request's tier as the engine's own ``priority`` field (issue #30, item 4).

A worker whose record says it schedules by priority (``WorkerRecord.priority``: vLLM
``--scheduling-policy priority``, SGLang ``--enable-priority-scheduling``, the sim's
``--scheduling-policy priority``) gets the body's ``priority`` set from the request's tier
(:func:`~infera_core.scheduling.fairqueue.engine_priority`), so the engine's own waiting queue
serves a critical request before sheddable ones. Any other worker never gets the field: a vLLM
without priority scheduling ignores it (0.32) or refuses a non-zero one (older releases). The
key file decides a request's tier, so a client's own ``priority`` is replaced (priority workers)
or removed (the others): a tenant cannot claim urgency through the body.
"""

from __future__ import annotations

import json
from typing import Any

from infera_core.scheduling.fairqueue import engine_priority
from infera_core.worker import PriorityOrder


def with_priority(raw: bytes, body: dict[str, Any], tier: int, order: PriorityOrder | None) -> bytes:
    """``raw`` (the JSON object ``body``) as a worker scheduling in ``order`` (None: not by
    priority) takes it: its ``priority`` set from ``tier`` (spliced in after the opening brace
    when the client sent none; nothing added for the engines' default, 0), or removed."""
    if order is None:
        if "priority" not in body:
            return raw
        return json.dumps({k: v for k, v in body.items() if k != "priority"}).encode()
    value = engine_priority(tier, order)
    if "priority" in body:
        if body["priority"] == value and type(body["priority"]) is int:
            return raw
        return json.dumps({**body, "priority": value}).encode()
    if not value:
        return raw
    i = raw.find(b"{")
    return raw[: i + 1] + b'"priority":' + str(value).encode() + b"," + raw[i + 1 :]


def body_with_priority(body: dict[str, Any], tier: int, order: PriorityOrder | None) -> dict[str, Any]:
    """:func:`with_priority` for a body the router re-encodes anyway (a PD pair's legs):
    ``body`` itself when nothing changes, else a copy."""
    if order is None:
        return body if "priority" not in body else {k: v for k, v in body.items() if k != "priority"}
    value = engine_priority(tier, order)
    if body.get("priority", 0) == value and ("priority" not in body or type(body["priority"]) is int):
        return body
    return {**body, "priority": value}
