"""The request as the router sees it: built once per request by the route handler,
read by tokenizers, the KV index and the scheduling policies."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from infera_core.worker import Role


def estimate_tokens(body: dict[str, Any]) -> int:
    """A rough prompt size without a tokenizer: the text of ``prompt`` or ``messages`` at four
    characters a token."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt) // 4
    messages = body.get("messages")
    if isinstance(messages, list):
        return sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict)) // 4
    return 0


class RequestContext:
    """Per-request routing input, built once by the route handler.

    ``token_ids`` is filled by the scheduler (tokenizing at most once, only when a
    scorer has ``needs_tokens``); ``block_hashes`` caches per block size.
    """

    __slots__ = (
        "_block_hashes",
        "access",
        "base_model",
        "body",
        "budget",
        "client_request_id",
        "explain",
        "headers",
        "kv_root",
        "lora",
        "model",
        "principal",
        "request_id",
        "role",
        "route",
        "session_key",
        "token_ids",
        "tokenize_failed",
        "trace",
    )

    def __init__(
        self,
        request_id: str,
        model: str,
        route: str,
        body: dict[str, Any],
        headers: Mapping[str, str] | None = None,
        role: Role = Role.MIXED,
        token_ids: list[int] | None = None,
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.route = route
        self.body = body
        self.headers: Mapping[str, str] = headers or {}
        self.role = role
        self.token_ids = token_ids
        self.tokenize_failed = False
        self.session_key: str | None = None
        self._block_hashes: dict[int, list[int]] = {}
        self.client_request_id: str | None = None
        """The client's ``X-Request-Id``: a label for logs, echoed back, never a key."""
        self.principal: Any = None
        """Who sent it (the server's API-key principal), None without ``--api-key-file``."""
        self.budget: Any = None
        """The server's reservation of the principal's tokens for this request (its ``Charge``)."""
        self.lora: str | None = None
        """The LoRA adapter the request names as its ``model`` (None: a base model)."""
        self.base_model = model
        """The model whose tokenizer and card serve the request: ``model``, or the adapter's base."""
        self.kv_root: int | None = None
        """The root its block hashes chain from when the engine hashes more than its tokens (its
        ``cache_salt``, a LoRA adapter: ``infera_core.kv.hashing.namespace_root``); None: the base."""
        self.explain: Any = None
        """A :class:`~infera_core.scheduling.explain.Decision` the scheduler records its decision
        in, when an explanation was asked for (``X-Infera-Explain``) or sampled; None: nothing kept."""
        self.access: Any = None
        """The server's access-log record of this request (``--access-log``), None when not logged."""
        self.trace: Any = None
        """The request's OpenTelemetry spans (``--otlp-traces-endpoint``), None when tracing is off."""

    def continued(self, request_id: str, body: dict[str, Any]) -> RequestContext:
        """A fresh context for another leg of this request (a migration's continuation, a whole
        retry): same model, route, headers, session, LoRA adapter and KV root; new id and body,
        not yet tokenized."""
        leg = RequestContext(request_id, self.model, self.route, body, self.headers)
        leg.client_request_id = self.client_request_id
        leg.session_key = self.session_key
        leg.lora, leg.base_model, leg.kv_root = self.lora, self.base_model, self.kv_root
        return leg

    @property
    def log_id(self) -> str:
        """``request_id`` for log lines, with the client's own id when it sent one."""
        if self.client_request_id is None:
            return self.request_id
        return f"{self.request_id} (client id {self.client_request_id[:128]!r})"

    def prompt_tokens(self) -> int:
        """The prompt's tokens: the tokenizer's count when it ran, else :func:`estimate_tokens`."""
        return len(self.token_ids) if self.token_ids else estimate_tokens(self.body)

    def cached_block_hashes(self, block_size: int, compute: Callable[..., list[int]]) -> list[int]:
        """Block hashes of ``token_ids`` at ``block_size``, computed once per size:
        ``compute(token_ids, block_size)``, or with ``kv_root`` as a third argument when set."""
        hashes = self._block_hashes.get(block_size)
        if hashes is None:
            if not self.token_ids:
                hashes = []
            elif self.kv_root is None:
                hashes = compute(self.token_ids, block_size)
            else:
                hashes = compute(self.token_ids, block_size, self.kv_root)
            self._block_hashes[block_size] = hashes
        return hashes
