"""TensorRT-LLM disaggregated serving (``pd.protocol = "trtllm-disagg"``), request by request.

What ``trtllm-serve disaggregated`` (``tensorrt_llm/serve/openai_disagg_server.py``) does between
a context and a generation ``trtllm-serve``, the router does here — serial:

1. **Prefill (context) leg**: the client's body with ``"disaggregated_params":
   {"request_type": "context_only"}``, ``stream: false``, no ``stream_options`` and one token
   (``max_tokens: 1``, as the disaggregated server and Dynamo's TRT-LLM worker send it).
2. **Decode (generation) leg**: the client's body with ``disaggregated_params`` = the context
   reply's ``choices[0].disaggregated_params`` (``first_gen_tokens``, ``ctx_request_id``,
   ``opaque_state``/``encoded_opaque_state``, ``draft_tokens``… kept verbatim) and
   ``request_type: "generation_only"``; the generation server pulls the KV from the context
   server with its cache transceiver.

Both servers need ``cache_transceiver_config`` in their LLM API YAML (``backend``: ``DEFAULT``,
``UCX``, ``NIXL`` or ``MPI``), and a context server runs with ``disable_overlap_scheduler``
(``examples/disaggregated/README.md``); the adapter writes both for ``--role prefill|decode``.
"""

from __future__ import annotations

from typing import Any

from infera_core.engines.pd import (
    LegRequest,
    PdContext,
    PdLegError,
    PdOrder,
    one_token_prefill_body,
)
from infera_core.worker import WorkerRecord

PROTOCOL = "trtllm-disagg"
BACKENDS = ("DEFAULT", "UCX", "NIXL", "MPI")


class TrtllmDisaggProtocol:
    """Serial context → generation legs over ``disaggregated_params`` (see the module doc)."""

    name = PROTOCOL
    order = PdOrder.SERIAL

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        return None

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        out = one_token_prefill_body(body, None)
        out["disaggregated_params"] = {"request_type": "context_only"}
        return LegRequest(out)

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        choices = (prefill_response or {}).get("choices")
        params = choices[0].get("disaggregated_params") if isinstance(choices, list) and choices else None
        if not isinstance(params, dict):
            raise PdLegError(
                f"trtllm-disagg: context server {prefill.worker_id} returned no choices[0].disaggregated_params "
                "(start it with infera-run worker trtllm --role prefill: cache_transceiver_config is needed)"
            )
        out = dict(body)
        out["disaggregated_params"] = {**params, "request_type": "generation_only"}
        return LegRequest(out)
