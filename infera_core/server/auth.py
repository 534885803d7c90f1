"""Who may call what: the admin token, loopback-only defaults, and the admin check for routes.

* :class:`AdminGate` — ``/v1/workers``, ``/v1/admin/*``, ``/metrics`` (unless
  ``--public-metrics``) and direct mode (``x-worker-instance-id``) need
  ``Authorization: Bearer <--admin-token>``; with no admin token configured they
  answer clients on a loopback address only.
* :func:`require_admin` — a FastAPI dependency (or plain call) any route uses to be
  admin-only: ``@app.get("/dashboard", dependencies=[Depends(require_admin)])``.

Works on the raw ASGI ``scope`` so the hot routes can use it without a Request object.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
from collections.abc import Mapping
from typing import Any

from starlette.requests import HTTPConnection

from infera_core.server.auth_settings import DEFAULT_MAX_TOKENS
from infera_core.server.budget_slices import LeaseMiss
from infera_core.server.errors import ApiError
from infera_core.server.keys import ADMIN, KeyRing, Principal
from infera_core.server.reserve import Charge, prompt_estimate, reservation
from infera_core.server.usage import UsageLedger

ADMIN_STATE = "admin_gate"
"""``app.state`` attribute holding the app's :class:`AdminGate`."""
CLIENT_STATE = "client_auth"
"""``app.state`` attribute holding the app's :class:`ClientAuth` (None without ``--api-key-file``)."""


def presented_key(scope: Mapping[str, Any]) -> bytes | None:
    """The key of ``Authorization: Bearer <key>`` (OpenAI) or ``x-api-key`` (Anthropic)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            if value[:7].lower() == b"bearer ":
                return bytes(value[7:].strip()) or None
        elif name == b"x-api-key":
            return bytes(value.strip()) or None
    return None


def bearer(scope: Mapping[str, Any]) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (bytes, as received), else None."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            if value[:7].lower() == b"bearer ":
                token: bytes = value[7:].strip()
                return token or None
            return None
    return None


def is_loopback(scope: Mapping[str, Any]) -> bool:
    """True when the client connected from a loopback address (127.0.0.0/8, ::1, ::ffff:127.x)."""
    client = scope.get("client")
    if not client:
        return False
    try:
        addr = ipaddress.ip_address(str(client[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


class AdminGate:
    """The admin check of one server (``--admin-token``; loopback-only without one)."""

    __slots__ = ("_token",)

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @property
    def has_token(self) -> bool:
        return self._token is not None

    def is_token(self, token: bytes | None) -> bool:
        """Constant-time comparison with the admin token (False when none is configured)."""
        return self._token is not None and token is not None and hmac.compare_digest(token, self._token)

    def allows(self, scope: Mapping[str, Any]) -> bool:
        if self._token is None:
            return is_loopback(scope)
        return self.is_token(bearer(scope))

    def check(self, scope: Mapping[str, Any], what: str = "This route") -> None:
        """Raise a 401 (token missing or wrong) or 403 (remote client, no token configured)."""
        if self.allows(scope):
            return
        if self._token is None:
            raise ApiError(
                403,
                f"{what} answers loopback clients only; the operator sets --admin-token "
                "(env INFERA_ADMIN_TOKEN) to allow remote admin access.",
                code="admin_only",
            )
        raise ApiError(
            401,
            f"{what} needs the admin token: 'Authorization: Bearer <admin token>'.",
            code="invalid_admin_token",
            headers={"WWW-Authenticate": 'Bearer realm="infera-admin"'},
        )


def require_admin(conn: HTTPConnection) -> None:
    """FastAPI/Starlette dependency: raise :class:`ApiError` unless the caller is an admin.

    The app answers the error as OpenAI-shaped JSON (401 or 403).
    """
    gate: AdminGate | None = getattr(conn.app.state, ADMIN_STATE, None)
    if gate is None:  # an app built without create_app: be safe
        gate = AdminGate(None)
    gate.check(conn.scope)


class ClientAuth:
    """``--api-key-file`` on the request path: who is calling (401), may they (403/429), and
    what they spent. The admin token is accepted as a key too (no limits, label ``admin``)."""

    __slots__ = ("_admin_token", "admin", "default_max_tokens", "ledger", "ring")

    def __init__(
        self,
        ring: KeyRing,
        admin: AdminGate,
        ledger: UsageLedger,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        self.ring = ring
        self.admin = admin
        self.ledger = ledger
        self.default_max_tokens = default_max_tokens
        """Output tokens reserved per sequence for a request that names no ``max_tokens``."""
        self._admin_token = admin.has_token

    def authenticate(self, scope: Mapping[str, Any]) -> Principal:
        token = presented_key(scope)
        if token is None:
            raise _unauthorized(
                "Missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>').",
                "missing_api_key",
            )
        if self._admin_token and self.admin.is_token(token):
            return ADMIN
        principal = self.ring.lookup(token)
        if principal is None:
            raise _unauthorized("Invalid API key.", "invalid_api_key")
        return principal

    def admit(
        self,
        principal: Principal,
        model: str,
        body: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
    ) -> Charge | None:
        """403/429 as :meth:`KeyRing.admit`; with the request's ``body``, its most possible cost
        is reserved against the key's daily tokens (settle it with :meth:`spent`)."""
        if body is None or principal.key is None or principal.key.tpd is None:
            return self.ring.admit(principal, model, 0, 0)
        prompt = prompt_estimate(body, token_ids)
        return self.ring.admit(
            principal, model, reservation(body, self.default_max_tokens, token_ids), prompt
        )

    async def admit_waiting(
        self,
        principal: Principal,
        model: str,
        body: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
    ) -> Charge | None:
        """:meth:`admit`; when the key's slice of a cluster-wide budget is empty, again after
        the lease in flight for it (:class:`~infera_core.server.global_budgets.LeaseMiss`;
        a key's two budgets may each miss once)."""
        for _ in range(2):
            try:
                return self.admit(principal, model, body, token_ids)
            except LeaseMiss as miss:
                await miss.wait()
        return self.admit(principal, model, body, token_ids)

    def spent(
        self,
        principal: Principal,
        model: str,
        prompt: int,
        completion: int,
        charge: Charge | None = None,
        cached: int = 0,
    ) -> None:
        """What one request cost: per (key, model), and against the key's budget (its
        reservation ``charge`` replaced by the real count; ``cached`` of the prompt tokens at
        the key's ``cached_prompt_price``)."""
        cached = min(max(0, cached), prompt)
        self.ledger.add(principal.name, model, prompt, completion, cached)
        cost = prompt + completion
        key = principal.key
        if cached > 0 and key is not None and key.cached_price < 1.0:
            cost -= cached - math.ceil(cached * key.cached_price)
        if charge is not None:
            self.ring.settle(principal, charge, cost)
        else:
            self.ring.spent(principal, cost)

    def release(self, principal: Principal, charge: Charge | None) -> None:
        """The request ended without generating anything (refused, failed before an answer)."""
        self.ring.settle(principal, charge, 0)

    def usage(self) -> dict[str, Any]:
        """The JSON of ``GET /v1/admin/usage``."""
        spent = self.ledger.by_key()
        keys = []
        for key in self.ring.all_keys():
            keys.append({"key": key.name, **self.ring.describe(key), "models_used": spent.pop(key.name, {})})
        for name, models in sorted(spent.items()):  # admin, and keys removed from the file since
            keys.append({"key": name, "models_used": models})
        return {"object": "usage", "keys": keys}


def _unauthorized(message: str, code: str) -> ApiError:
    return ApiError(401, message, code=code, headers={"WWW-Authenticate": 'Bearer realm="infera"'})


def client_principal(conn: HTTPConnection) -> Principal | None:
    """FastAPI dependency for ``/v1/*`` control routes: the caller's key (401 without one);
    None when the server runs without ``--api-key-file``."""
    auth: ClientAuth | None = getattr(conn.app.state, CLIENT_STATE, None)
    if auth is None:
        return None
    return auth.authenticate(conn.scope)
