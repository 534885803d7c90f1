"""Moved to :mod:`infera_core.engines.pd`; this re-export stays for one release."""

from infera_core.engines.pd import (
    KvTransferParamsLegs,
    LegRequest,
    PdContext,
    PdLegError,
    PdOrder,
    PdPairError,
    PdProtocol,
    PdProtocolRegistry,
    PdTransport,
    PdTransportRegistry,
    PdUnsupported,
    check_pair,
    leg_headers,
    one_token_prefill_body,
    peer_host,
    prefill_transfer_params,
)

__all__ = [
    "KvTransferParamsLegs",
    "LegRequest",
    "PdContext",
    "PdLegError",
    "PdOrder",
    "PdPairError",
    "PdProtocol",
    "PdProtocolRegistry",
    "PdTransport",
    "PdTransportRegistry",
    "PdUnsupported",
    "check_pair",
    "leg_headers",
    "one_token_prefill_body",
    "peer_host",
    "prefill_transfer_params",
]
