"""A request's latency targets (``X-Infera-TTFT-Target-Ms`` / ``X-Infera-TPOT-Target-Ms``):
checked once per request, read by SLO-aware scorers (``predicted-latency``)."""

from __future__ import annotations

import math

from infera_core.scheduling.types import TPOT_TARGET_HEADER, TTFT_TARGET_HEADER
from infera_core.server.errors import ApiError

TARGET_HEADERS = {
    TTFT_TARGET_HEADER.encode(): "X-Infera-TTFT-Target-Ms",
    TPOT_TARGET_HEADER.encode(): "X-Infera-TPOT-Target-Ms",
}


def check_target(name: bytes, value: bytes) -> None:
    """400 unless ``value`` is a positive number of milliseconds."""
    raw = value.decode("latin-1")
    try:
        ms = float(raw)
    except ValueError:
        ms = math.nan
    if not (ms > 0 and math.isfinite(ms)):
        label = TARGET_HEADERS[name]
        raise ApiError(
            400,
            f"{label} must be a positive number of milliseconds, not {raw!r}.",
            param=name.decode(),
            code="invalid_latency_target",
        )
