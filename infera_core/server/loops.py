"""Routing-loop detection: a worker record whose URL leads back to a router.

Every request a router sends to a worker carries a ``Via`` header (RFC 9110 §7.6.3) with
the router's own id appended (``Via: 1.1 infera-<id>``; a ``Via`` the client sent is kept
in front, so a loop through several routers is seen too). A router that receives a request
already stamped with its own id answers it at once with 508 Loop Detected and the header
``X-Infera-Loop: <id>``; the router that sent it (the same one) sees that answer, takes the
worker out of rotation (:meth:`~infera_core.server.breaker.Breakers.isolate`), logs one
line and tries another worker. One request costs one extra hop, never 4,097.
"""

from __future__ import annotations

from infera_core.server.errors import ApiError

LOOP_STATUS = 508
LOOP_HEADER = "X-Infera-Loop"


def via_of(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """A request's ``Via`` header values (raw ASGI headers), joined; None without one."""
    values = [v for k, v in headers if k == b"via"]
    return b", ".join(values) if values else None


def stamped(via: bytes | None, router_id: bytes) -> bool:
    """Whether a request's ``Via`` header already carries this router's id."""
    return via is not None and router_id in via


def via_value(incoming: bytes | None, router_id: str) -> str:
    """The ``Via`` to send upstream: the incoming one (if any), then this router."""
    mine = f"1.1 {router_id}"
    if not incoming:
        return mine
    return f"{incoming.decode('latin-1')}, {mine}"


def came_back(router_id: str) -> ApiError:
    """The answer to a request that came back to the router that sent it."""
    return ApiError(
        LOOP_STATUS,
        f"Loop detected: this request already passed through this router ({router_id}); a worker"
        " record's URL points back at the router.",
        code="loop_detected",
        type="upstream_error",
        headers={LOOP_HEADER: router_id},
    )


def loop_error(worker_id: str, url: str) -> ApiError:
    """What the client gets when the only worker(s) tried led back to this router."""
    return ApiError(
        LOOP_STATUS,
        f"Loop detected: worker {worker_id} ({url}) is this router itself, not an engine; it was"
        " taken out of rotation. Fix or remove its worker record.",
        code="loop_detected",
        type="upstream_error",
    )
