"""SGLang PD transport ``sglang-bootstrap``: both legs at once, joined by a bootstrap room.

Both legs carry the client's body plus ``bootstrap_host`` / ``bootstrap_port`` /
``bootstrap_room``; a DP-attention prefill takes rank ``room % dp_size``, so the room is
chosen to land on the rank the router picked, and each leg names its rank in the
``X-Data-Parallel-Rank`` header. The prefill is never cancelled (the decode would hang).
"""

from __future__ import annotations

import secrets
from typing import Any

from infera_core.engines.pd import (
    LegRequest,
    PdContext,
    PdLegError,
    PdOrder,
    PdUnsupported,
    leg_headers,
    peer_host,
)
from infera_core.engines.support import bracket_host
from infera_core.worker import WorkerRecord

DEFAULT_BOOTSTRAP_PORT = 8998
ROOM_LIMIT = 2**63
ROUTES = ("/v1/completions", "/v1/chat/completions", "/generate")


def steer_room(room: int, dp_size: int, dp_rank: int | None) -> int:
    """``room`` moved (within 0…2^63-1) so that ``room % dp_size == dp_rank``."""
    if dp_rank is None or dp_size <= 1:
        return room
    if not 0 <= dp_rank < dp_size:
        raise PdUnsupported(f"DP rank {dp_rank} is outside the prefill's {dp_size} ranks")
    steered = room - room % dp_size + dp_rank
    return steered - dp_size if steered >= ROOM_LIMIT else steered


class SglangBootstrapTransport:
    name = "sglang-bootstrap"
    order = PdOrder.CONCURRENT

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        if ctx.route not in ROUTES:
            raise PdUnsupported(f"sglang-bootstrap PD serves {', '.join(ROUTES)}, not {ctx.route}")
        room = ctx.bootstrap_room if ctx.bootstrap_room is not None else secrets.randbelow(ROOM_LIMIT)
        ctx.bootstrap_room = steer_room(room, prefill.dp_size, ctx.prefill_dp_rank)

    def _with_bootstrap(self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord) -> dict[str, Any]:
        if ctx.bootstrap_room is None:
            raise PdLegError("sglang-bootstrap: prepare() must run before the legs are built (no room)")
        params = prefill.pd.params if prefill.pd else {}
        out = dict(body)
        out["bootstrap_host"] = bracket_host(peer_host(prefill, "bootstrap_host"))
        out["bootstrap_port"] = int(params.get("bootstrap_port") or DEFAULT_BOOTSTRAP_PORT)
        out["bootstrap_room"] = ctx.bootstrap_room
        return out

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        return LegRequest(
            body=self._with_bootstrap(body, ctx, prefill), headers=leg_headers(ctx, ctx.prefill_dp_rank)
        )

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        return LegRequest(
            body=self._with_bootstrap(body, ctx, prefill), headers=leg_headers(ctx, ctx.decode_dp_rank)
        )
