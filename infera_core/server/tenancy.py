"""Tenant-safe KV caching: the key file's ``cache_isolation`` on the request path.

With ``cache_isolation: key`` (or ``team``) in ``--api-key-file`` every request of a key (of a
team) carries a ``cache_salt`` the router makes: ``infera-`` + 32 hex digits of an HMAC-SHA256
of the tenant under the key file's ``cache_salt_secret`` (or, without one, a secret derived from
the file's keys) — never the tenant's name. Engines that honour ``cache_salt`` (vLLM: the first
block's hash; SGLang: the radix tree's namespace) then never share a cached block between
tenants, while each tenant keeps its own hits; the router hashes the request's blocks from the
same salted root (:func:`~infera_core.kv.hashing.namespace_root`), as the engines' salted KV
events are, so its predicted overlap is the tenant's own. A client's own ``cache_salt`` is
combined with the tenant's (a keyed hash of both), never used in its place.

Without isolation, a client's ``cache_salt`` is forwarded unchanged and its blocks hashed from
the salted root too (the engine keeps them apart; the router must as well).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from infera_core.kv.hashing import namespace_root
from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint, KvIndexView
from infera_core.server.errors import ApiError
from infera_core.server.series import LeanCounter

log = logging.getLogger("infera.server.tenancy")

SALT_ENGINES = frozenset({"vllm", "sglang", "sim"})
"""Engines whose OpenAI routes take ``cache_salt`` and hash it into the prefix cache (vLLM's
``ChatCompletionRequest`` / ``CompletionRequest`` / Anthropic ``MessagesRequest``; SGLang's;
the sim, as vLLM does)."""
SALT_PREFIX = "infera-"


class CacheIsolation(StrEnum):
    """Whose requests may share cached prefixes (the key file's ``cache_isolation``)."""

    NONE = "none"
    KEY = "key"
    TEAM = "team"


def default_secret(digests: Iterable[bytes]) -> bytes:
    """The HMAC key when the key file names no ``cache_salt_secret``: derived from its keys'
    sha256 digests, so every router replica reading the same file salts alike (and nobody
    without the file can compute a tenant's salt). Adding or removing a key changes it."""
    h = hashlib.sha256(b"infera-cache-salt\0")
    for d in sorted(digests):
        h.update(d)
    return h.digest()


def tenant_salt(secret: bytes, mode: CacheIsolation, key_name: str, team: str | None) -> str | None:
    """The ``cache_salt`` of a key's requests under ``mode`` (None: no isolation)."""
    if mode is CacheIsolation.NONE:
        return None
    tenant = f"key\0{key_name}" if mode is CacheIsolation.KEY or team is None else f"team\0{team}"
    return SALT_PREFIX + hmac.new(secret, tenant.encode(), hashlib.sha256).hexdigest()[:32]


def combined_salt(tenant: str, client: str | None) -> str:
    """The tenant's salt with a client's own ``cache_salt`` folded in (a keyed hash of both)."""
    if client is None:
        return tenant
    mac = hmac.new(tenant.encode(), client.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return SALT_PREFIX + mac.hexdigest()[:32]


def with_cache_salt(raw: bytes, body: dict[str, Any], salt: str) -> bytes:
    """``raw`` (the client's JSON object) with ``cache_salt`` set: spliced in after the opening
    brace when the client sent none (no re-encoding), else the object re-encoded."""
    if "cache_salt" not in body:
        i = raw.find(b"{")
        return raw[: i + 1] + b'"cache_salt":' + json.dumps(salt).encode() + b"," + raw[i + 1 :]
    return json.dumps({**body, "cache_salt": salt}).encode()


_FORBIDDEN = frozenset("@/\\\0")


def _client_salt(body: dict[str, Any]) -> str | None:
    """The request's own ``cache_salt``; a 400 for one vLLM would refuse (what it checks)."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt or len(salt) > 128 or not _FORBIDDEN.isdisjoint(salt):
        raise ApiError(
            400,
            "'cache_salt' must be a non-empty string of at most 128 characters without '@', '/', '\\' or NUL.",
            param="cache_salt",
            code="invalid_value",
        )
    return salt


class CacheSalting:
    """Salts one server's requests (see the module docstring) and counts, per API key, the
    prompt tokens routed and how many of them the router predicted cached on the worker it
    picked: ``infera_key_prefix_cache_tokens_total{key,kind="prompt"|"predicted_cached"}``
    (one series per key name of the file, so the label stays bounded)."""

    __slots__ = ("_warned", "index", "tokens")

    def __init__(self) -> None:
        self._warned: set[str] = set()
        self.index: KvIndexView | None = None
        """The KV index the predictions read (set by the app when KV-aware routing is on)."""
        self.tokens = LeanCounter(
            "infera_key_prefix_cache_tokens",
            "Prompt tokens routed per API key, and those predicted cached on the picked worker",
            ["key", "kind"],
        )

    def routed(self, ctx: RequestContext, ep: Endpoint) -> None:
        """Count a keyed request routed to ``ep`` (its prompt, and the overlap the router saw),
        when it is routed: by the time its answer arrives the worker has cached its prompt."""
        principal = ctx.principal
        tokens = ctx.token_ids
        if principal is None or not tokens:
            return
        name: str = principal.name
        self.tokens.child((name, "prompt")).value += len(tokens)
        index = self.index
        view = index.views_by_key.get((ep.worker_id, ep.dp_rank)) if index is not None else None
        if index is None or view is None:
            return
        hashes = ctx.cached_block_hashes(view.block_size, index.hash_prompt)
        blocks = index.match(hashes, [view], (1.0, 1.0, 1.0))[0] if hashes else 0.0
        self.tokens.child((name, "predicted_cached")).value += int(blocks) * view.block_size

    def apply(self, ctx: RequestContext, raw: bytes, engines: Iterable[str]) -> bytes:
        """Set ``ctx.kv_root`` (and, under isolation, the body's ``cache_salt``) for a request
        whose workers run ``engines``; returns the body to forward."""
        tenant: str | None = getattr(ctx.principal, "cache_salt", None)
        if tenant is None and ctx.body.get("cache_salt") is None:
            return raw
        unsalted = sorted(set(engines) - SALT_ENGINES)
        if unsalted:  # the engine would ignore (or refuse) the salt: hash as it caches
            if tenant is not None and ctx.model not in self._warned:
                self._warned.add(ctx.model)
                log.warning(
                    "model %s: cache_isolation is on but its workers run %s, which take no "
                    "cache_salt: their prefix caches are shared between tenants",
                    ctx.model,
                    ", ".join(unsalted),
                )
            return raw
        client_salt = _client_salt(ctx.body)  # checked where it would be used
        if tenant is None:
            ctx.kv_root = namespace_root(None, client_salt)
            return raw
        salt = combined_salt(tenant, client_salt)
        ctx.kv_root = namespace_root(None, salt)
        out = with_cache_salt(raw, ctx.body, salt)
        ctx.body["cache_salt"] = salt
        return out
