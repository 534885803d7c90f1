"""Client API keys (``--api-key-file``): the file, its hot reload, and per-key admission.

The file (YAML or JSON)::

    keys:
      - name: team-a                 # the label in metrics and usage
        key: sk-team-a-123           # or key_sha256: <hex>, so the file holds no secret
        models: [qwen]               # optional allow-list
        requests_per_minute: 600     # optional
        tokens_per_day: 2000000      # optional, prompt + completion
        cached_prompt_price: 0.25    # optional: a cached prompt token counts as this much of one
        priority: standard           # critical | standard | sheddable | an integer (higher first)
        weight: 1                    # its share against the other keys of its tier
        allow_priority_header: false # may X-Infera-Priority lower (never raise) its tier
        ttft_deadline_ms: 2000       # optional default time-to-first-token deadline
        team: research               # optional: the tenant under cache_isolation: team
    cache_isolation: key             # none (default) | key | team: tenants never share KV
    cache_salt_secret: <random>      # optional HMAC key of the tenants' cache salts
        explain: true                # optional: may ask for routing explanations
        ttft_target_ms: 500          # optional latency targets for predicted-latency routing
        tpot_target_ms: 50           #   (X-Infera-TTFT-Target-Ms / -TPOT- override them)

Per request the check is one ``sha256`` of the presented key and one dict lookup;
the file's ``mtime`` is looked at most once a second and the file re-read only when
it changed (a broken edit is logged and the previous keys stay in force). Budgets
live per key *name*, so a reload keeps what each key has spent. Under
``serve --processes N`` they live in memory the processes share
(:mod:`infera_core.server.budgets`, :meth:`KeyRing.share`): one budget for the router;
with etcd or NATS discovery, in that store (:mod:`infera_core.server.global_budgets`):
one budget for the cluster's router replicas.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from infera_core.config.settings import read_data_file
from infera_core.errors import ConfigError
from infera_core.scheduling.fairqueue import tier_of
from infera_core.server.budgets import SharedBudgets
from infera_core.server.errors import ApiError
from infera_core.server.global_budgets import GlobalBudgets
from infera_core.server.reserve import Charge
from infera_core.server.tenancy import CacheIsolation, default_secret, tenant_salt

log = logging.getLogger("infera.server.keys")

DAY = 86400.0
RELOAD_CHECK_S = 1.0


class KeySpec(BaseModel):
    """One entry of the key file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="The key's label in metrics and usage.")
    key: SecretStr | None = Field(None, description="The key itself.")
    key_sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="Hex sha256 of the key instead of the key."
    )
    models: list[str] | None = Field(None, description="Models this key may use (absent: all).")
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_day: int | None = Field(None, gt=0, description="Prompt + completion tokens per UTC day.")
    cached_prompt_price: float = Field(
        1.0, ge=0, le=1, description="What a cached prompt token counts against tokens_per_day (1: a token)."
    )
    priority: int | str = Field(
        "standard", description="Queue tier: critical, standard, sheddable or an integer (higher first)."
    )
    weight: float = Field(1.0, gt=0, description="Weighted fair share against the other keys of its tier.")
    allow_priority_header: bool = Field(
        False, description="X-Infera-Priority may set the request's tier, capped at the key's own."
    )
    ttft_deadline_ms: float | None = Field(
        None, gt=0, description="Default time-to-first-token deadline of its requests (milliseconds)."
    )
    team: str | None = Field(None, min_length=1, description="The key's tenant under cache_isolation: team.")
    explain: bool = Field(False, description="May ask for routing explanations (X-Infera-Explain).")
    ttft_target_ms: float | None = Field(
        None, gt=0, description="Default TTFT target of its requests for predicted-latency routing (ms)."
    )
    tpot_target_ms: float | None = Field(
        None, gt=0, description="Default time-per-output-token target for predicted-latency routing (ms)."
    )

    @field_validator("priority")
    @classmethod
    def _tier(cls, value: int | str) -> int:
        return tier_of(value)

    @model_validator(mode="after")
    def _one_secret(self) -> KeySpec:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError(f"key {self.name!r}: give exactly one of 'key' and 'key_sha256'")
        return self

    def digest(self) -> bytes:
        if self.key is not None:
            return hashlib.sha256(self.key.get_secret_value().encode()).digest()
        assert self.key_sha256 is not None
        return bytes.fromhex(self.key_sha256)


class KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[KeySpec] = Field(default_factory=list)
    cache_isolation: CacheIsolation = Field(
        CacheIsolation.NONE, description="Whose requests may share cached prefixes: none, key or team."
    )
    cache_salt_secret: SecretStr | None = Field(
        None,
        min_length=16,
        description="HMAC key of the tenants' cache salts (default: derived from the keys).",
    )

    def salt_secret(self) -> bytes:
        if self.cache_salt_secret is not None:
            return self.cache_salt_secret.get_secret_value().encode()
        return default_secret(spec.digest() for spec in self.keys)

    @model_validator(mode="after")
    def _unique(self) -> KeyFile:
        names: set[str] = set()
        digests: set[bytes] = set()
        for spec in self.keys:
            if spec.name in names:
                raise ValueError(f"two keys are named {spec.name!r}")
            d = spec.digest()
            if d in digests:
                raise ValueError(f"key {spec.name!r} is the same key as an earlier entry")
            names.add(spec.name)
            digests.add(d)
        return self


def read_key_file(path: Path) -> KeyFile:
    """Parse and validate ``path``; :class:`ConfigError` naming the flag and the problem."""
    data = read_data_file(path, "--api-key-file")
    try:
        return KeyFile.model_validate(data if data is not None else {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise ConfigError(f"--api-key-file {path}: {where}: {err.get('msg')}") from None


_SEEN_MAX = 4096
"""Most presented keys remembered (valid ones; past it, the others are hashed per request)."""


class ApiKey:
    """A key's limits and its running budgets (kept across reloads, by name)."""

    __slots__ = (
        "allow_priority_header",
        "allowed",
        "bucket",
        "cached_price",
        "day",
        "day_tokens",
        "explain",
        "name",
        "priority",
        "refilled",
        "rpm",
        "slot",
        "tpd",
        "tpot_target_ms",
        "ttft_deadline_ms",
        "ttft_target_ms",
        "weight",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.allowed: frozenset[str] | None = None
        self.rpm: int | None = None
        self.tpd: int | None = None
        self.explain = False
        self.bucket = 0.0
        self.refilled = 0.0
        self.day = -1
        self.day_tokens = 0
        self.slot: int | None = None
        self.cached_price = 1.0
        """Its slot in the processes' shared budgets (None: the budgets above, this process's)."""
        self.priority = 0
        self.weight = 1.0
        self.allow_priority_header = False
        self.ttft_deadline_ms: float | None = None
        self.ttft_target_ms: float | None = None
        self.tpot_target_ms: float | None = None

    def configure(self, spec: KeySpec, now: float) -> None:
        self.allowed = frozenset(spec.models) if spec.models is not None else None
        if spec.requests_per_minute != self.rpm:
            self.rpm = spec.requests_per_minute
            self.bucket = float(self.rpm or 0)
            self.refilled = now
        self.tpd = spec.tokens_per_day
        self.cached_price = spec.cached_prompt_price
        self.priority = tier_of(spec.priority)
        self.weight = spec.weight
        self.allow_priority_header = spec.allow_priority_header
        self.ttft_deadline_ms = spec.ttft_deadline_ms
        self.explain = spec.explain
        self.ttft_target_ms, self.tpot_target_ms = spec.ttft_target_ms, spec.tpot_target_ms


class Principal:
    """Who a request runs as: a key, or the admin (admin token as the key: no limits)."""

    __slots__ = ("cache_salt", "key", "name")

    def __init__(self, name: str, key: ApiKey | None, cache_salt: str | None = None) -> None:
        self.name = name
        self.key = key
        self.cache_salt = cache_salt
        """The tenant's ``cache_salt`` under ``cache_isolation`` (:mod:`infera_core.server.tenancy`)."""


ADMIN = Principal("admin", None)


class KeyRing:
    """The keys of ``--api-key-file``, looked up by the sha256 of what a client presents."""

    def __init__(
        self,
        path: Path,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._clock = clock
        self._wall = wall
        self._by_digest: dict[bytes, Principal] = {}
        self._seen: dict[bytes, Principal] = {}
        """Keys presented before, as received → their principal (no sha256 per request)."""
        self._by_name: dict[str, ApiKey] = {}
        self._shared: SharedBudgets | GlobalBudgets | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        self._apply(read_key_file(path), self._stat())

    # -- the file ------------------------------------------------------------------
    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _apply(self, spec: KeyFile, stamp: tuple[int, int, int] | None) -> None:
        now = self._clock()
        by_digest: dict[bytes, Principal] = {}
        by_name: dict[str, ApiKey] = {}
        secret = spec.salt_secret() if spec.cache_isolation is not CacheIsolation.NONE else b""
        for s in spec.keys:
            key = self._by_name.get(s.name) or ApiKey(s.name)
            key.configure(s, now)
            if self._shared is not None:
                self._bind(key, self._shared)
            by_name[s.name] = key
            salt = tenant_salt(secret, spec.cache_isolation, s.name, s.team)
            by_digest[s.digest()] = Principal(s.name, key, salt)
        self._by_digest, self._by_name, self._stamp = by_digest, by_name, stamp
        self._seen = {}

    def share(self, budgets: SharedBudgets | GlobalBudgets) -> None:
        """Keep every key's budgets in ``budgets``: the router's processes' (shared memory),
        or the cluster's (:mod:`~infera_core.server.global_budgets`, replacing the former)."""
        self._shared = budgets
        for key in self._by_name.values():
            key.slot = None
            self._bind(key, budgets)

    def _bind(self, key: ApiKey, budgets: SharedBudgets | GlobalBudgets) -> None:
        if key.slot is None:
            key.slot = budgets.slot(key.name)
            if key.slot is None:
                log.error(
                    "API key %r: the shared budget table is full (%d keys); its budgets are per process",
                    key.name,
                    budgets.capacity,
                )
                return
        budgets.set_rate(key.slot, key.rpm, self._clock)

    def maybe_reload(self) -> None:
        """Re-read the file when its mtime/size/inode changed (looked at most once a second)."""
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + RELOAD_CHECK_S
        stamp = self._stat()
        if stamp == self._stamp:
            return
        if stamp is None:
            log.error("--api-key-file %s is gone; keeping the %d keys loaded", self.path, len(self._by_name))
            self._stamp = None
            return
        try:
            spec = read_key_file(self.path)
        except ConfigError as exc:
            log.error("%s; keeping the %d keys loaded before", exc, len(self._by_name))
            self._stamp = stamp
            return
        self._apply(spec, stamp)
        log.info("--api-key-file %s reloaded: %d keys", self.path, len(spec.keys))

    def lookup(self, token: bytes) -> Principal | None:
        if self._clock() >= self._next_check:
            self.maybe_reload()
        principal = self._seen.get(token)
        if principal is None:
            principal = self._by_digest.get(hashlib.sha256(token).digest())
            if principal is not None and len(self._seen) < _SEEN_MAX:
                self._seen[token] = principal  # valid keys only: unknown ones cannot grow it
        return principal

    def all_keys(self) -> list[ApiKey]:
        return list(self._by_name.values())

    # -- admission and spending ------------------------------------------------------
    def admit(self, principal: Principal, model: str, tokens: int = 0, prompt: int = 0) -> Charge | None:
        """403 for a model off the key's list, 429 over a budget (both with a clear message).

        ``tokens`` is the most the request may cost (:func:`~infera_core.server.reserve.reservation`):
        it must fit what is left of the key's ``tokens_per_day`` and is reserved until
        :meth:`settle`. None for the admin (no limits)."""
        key = principal.key
        if key is None:
            return None
        if key.allowed is not None and model not in key.allowed:
            raise ApiError(
                403,
                f"The API key {key.name!r} may not use the model {model!r}.",
                param="model",
                code="model_not_allowed",
                type="permission_error",
            )
        charge = self._reserve(key, tokens, prompt)
        try:
            self._take_request(key)
        except ApiError:
            self._settle(key, charge, 0)
            raise
        return charge

    def _reserve(self, key: ApiKey, tokens: int, prompt: int) -> Charge:
        """Reserve ``tokens`` of today's budget (429 when they do not fit); a key without a
        token budget gets an empty charge (settled as plain spending)."""
        tpd = key.tpd
        if tpd is None:
            return Charge(-1, 0, prompt)
        day = int(self._wall() // DAY)
        slot, shared = key.slot, self._shared
        if slot is not None and shared is not None:
            used = shared.reserve(slot, day, tokens, tpd)
            if used >= 0:
                raise self._out_of_tokens(key, used, tokens)
        else:
            if key.day != day:
                key.day = day
                key.day_tokens = 0
            used = key.day_tokens
            if used >= tpd or used + tokens > tpd:
                raise self._out_of_tokens(key, used, tokens)
            key.day_tokens = used + tokens
        return Charge(day, tokens, prompt)

    def _take_request(self, key: ApiKey) -> None:
        """One request from the key's ``requests_per_minute`` bucket (429 when empty)."""
        rpm = key.rpm
        if rpm is None:
            return
        slot, shared = key.slot, self._shared
        if slot is not None and shared is not None:
            level = shared.take(slot, rpm, self._clock)
            if level >= 0.0:
                raise _over_rate(key, level, rpm / 60.0)
            return
        now = self._clock()
        rate = rpm / 60.0
        bucket = key.bucket + (now - key.refilled) * rate
        key.bucket = bucket = bucket if bucket < rpm else float(rpm)
        key.refilled = now
        if bucket < 1.0:
            raise _over_rate(key, bucket, rate)
        key.bucket -= 1.0

    def _out_of_tokens(self, key: ApiKey, used: int, tokens: int) -> ApiError:
        tpd = key.tpd
        assert tpd is not None
        if tokens > tpd:  # never fits: waiting for the reset would not help
            return ApiError(
                429,
                f"This request may use up to {tokens} tokens (prompt + max_tokens × n), more than the "
                f"{tpd} tokens per day of the API key {key.name!r}; lower max_tokens (or n).",
                code="token_budget_exceeded",
            )
        wall = self._wall()
        reset = math.ceil((math.floor(wall / DAY) + 1) * DAY - wall)
        if used >= tpd:
            message = f"The API key {key.name!r} has used its {tpd} tokens for today (UTC)."
        else:
            message = (
                f"This request may use up to {tokens} tokens (prompt + max_tokens × n); the API key "
                f"{key.name!r} has {tpd - used} of its {tpd} tokens left today (UTC). Lower max_tokens "
                "(or n), or retry after the reset."
            )
        return ApiError(
            429, message, code="token_budget_exceeded", headers={"Retry-After": str(max(1, reset))}
        )

    def _today_tokens(self, key: ApiKey) -> int:
        day = int(self._wall() // DAY)
        if key.slot is not None and self._shared is not None:
            return self._shared.tokens(key.slot, day)
        if key.day != day:
            key.day = day
            key.day_tokens = 0
        return key.day_tokens

    def settle(self, principal: Principal, charge: Charge | None, tokens: int) -> None:
        """The request that reserved ``charge`` ended having cost ``tokens``: replace the
        reservation by them (once; a second call is a no-op)."""
        key = principal.key
        if key is None or charge is None or charge.settled:
            return
        self._settle(key, charge, tokens)

    def _settle(self, key: ApiKey, charge: Charge, tokens: int) -> None:
        charge.settled = True
        if charge.day < 0:
            self._spend(key, tokens)
            return
        delta = tokens - charge.tokens
        if not delta:
            return
        if key.slot is not None and self._shared is not None:
            self._shared.settle(key.slot, charge.day, delta)
        elif key.day == charge.day:  # after a UTC midnight the reservation went with the old day
            key.day_tokens += delta

    def spent(self, principal: Principal, tokens: int) -> None:
        """``tokens`` spent outside any reservation."""
        key = principal.key
        if key is not None and tokens:
            self._spend(key, tokens)

    def _spend(self, key: ApiKey, tokens: int) -> None:
        if not tokens:
            return
        day = int(self._wall() // DAY)
        if key.slot is not None and self._shared is not None:
            self._shared.add_tokens(key.slot, day, tokens)
            return
        if key.day != day:
            key.day = day
            key.day_tokens = 0
        key.day_tokens += tokens

    def describe(self, key: ApiKey) -> dict[str, Any]:
        """A key's limits and today's spending (``GET /v1/admin/usage``)."""
        return {
            "models": sorted(key.allowed) if key.allowed is not None else None,
            "requests_per_minute": key.rpm,
            "tokens_per_day": key.tpd,
            "tokens_today": self._today_tokens(key),
        }


def _over_rate(key: ApiKey, bucket: float, rate: float) -> ApiError:
    wait = math.ceil((1.0 - bucket) / rate)
    return ApiError(
        429,
        f"The API key {key.name!r} is over its limit of {key.rpm} requests per minute.",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(max(1, wait))},
    )
