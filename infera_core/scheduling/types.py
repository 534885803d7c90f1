"""Hot-path scheduling types: endpoints, request context, and policy building blocks.

Filters, scorers and pickers are plain objects built once from configuration by a
:class:`PolicyFactory`; the scheduler calls them directly per request (no pluggy).
Scorers return one score in ``[0, 1]`` per candidate and never do I/O: the state
they read (KV index, load) is kept current by background tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, overload

from pydantic import BaseModel

from infera_core.request import RequestContext as RequestContext
from infera_core.scheduling import arrays as _arrays
from infera_core.worker import Role, WorkerRecord

if TYPE_CHECKING:
    from infera_core.transports.upstreams import Upstream

PolicyKind = Literal["filter", "scorer", "picker"]


T = TypeVar("T", int, float)


class _Column(Generic[T]):
    """An :class:`Endpoint` attribute stored in its row of one of the shared arrays' columns."""

    __slots__ = ("column", "convert", "counted")

    def __init__(self, column: str, convert: Callable[[Any], T], counted: bool = False) -> None:
        self.column = column
        self.convert: Callable[[Any], T] = convert
        self.counted = counted
        """Writes bump ``recent_writes`` (what is derived from the column is cached)."""

    @overload
    def __get__(self, obj: None, owner: type) -> _Column[T]: ...

    @overload
    def __get__(self, obj: Endpoint, owner: type) -> T: ...

    def __get__(self, obj: Endpoint | None, owner: type) -> _Column[T] | T:
        if obj is None:
            return self
        # an endpoint exists only once the arrays do (its row came from them); ``item``
        # gives the column's Python type (int / float) already: this runs per request
        return getattr(_arrays._STATE, self.column).item(obj.row)  # type: ignore[no-any-return]

    def __set__(self, obj: Endpoint, value: T) -> None:
        getattr(_arrays._STATE, self.column)[obj.row] = value
        if self.counted:
            _arrays.state().recent_writes += 1


class _InFlight(_Column[int]):
    """``Endpoint.in_flight``: also stored as this process's count in the router-wide table
    (:mod:`infera_core.scheduling.shared_load`) when the endpoint has a word there."""

    __slots__ = ()

    def __set__(self, obj: Endpoint, value: int) -> None:
        state = _arrays._STATE
        assert state is not None
        state.in_flight[obj.row] = value
        word = obj.load_word
        if word >= 0:
            state.shared.q[word] = value  # type: ignore[union-attr]


class Endpoint:
    """A routable worker as the scheduler sees it, with the router's own load accounting.

    The load counters (``in_flight``, ``in_flight_prompt_tokens``, ``recent_dispatch``,
    ``recent_dispatch_ts``, the engine's ``waiting`` from ``stats``) live in this endpoint's
    row of :func:`infera_core.scheduling.arrays.state` so policies can read them for a whole
    fleet at once; replacing ``record`` or moving the breaker marks cached filter results stale.
    """

    __slots__ = (
        "_breaker_open",
        "_breaker_retry_at",
        "_record",
        "_stats",
        "dp_rank",
        "load_word",
        "picks",
        "row",
        "upstream",
        "worker_id",
    )

    def __init__(self, record: WorkerRecord, dp_rank: int | None = None) -> None:
        self.row = _arrays.state().alloc()
        self._record = record
        self.worker_id = record.worker_id
        self.dp_rank = dp_rank if dp_rank is not None else record.dp_rank
        self.picks = 0
        self.load_word = -1
        """This process's count for the worker in the router-wide in-flight table (-1: none)."""
        self._breaker_open = False
        self._breaker_retry_at = 0.0
        self._stats: dict[str, float] = {}
        self.upstream: Upstream = None  # type: ignore[assignment]
        """The client of the request transport that reaches this worker
        (:class:`infera_core.transports.upstreams.Upstream`), set by the server's endpoint table
        from ``record.request_transport``; requests go through ``ep.upstream.open(...)``."""

    def __del__(self) -> None:
        try:
            _arrays.state().release(self.row)
        except Exception:  # interpreter shutdown, or __init__ failed before the row existed
            pass

    # -- counters in the shared arrays ------------------------------------------------
    in_flight = _InFlight("in_flight", int)
    in_flight_prompt_tokens = _Column("prompt_tokens", int)
    recent_dispatch = _Column("recent", float, counted=True)
    recent_dispatch_ts = _Column("recent_ts", float, counted=True)

    @property
    def stats(self) -> dict[str, float]:
        """Engine-reported gauges (``running``, ``waiting``, ``kv_usage``…) when scraped.
        Assign a new dict to update them (``waiting`` is copied into the arrays)."""
        return self._stats

    @stats.setter
    def stats(self, value: dict[str, float]) -> None:
        self._stats = value
        _arrays.state().waiting[self.row] = value.get("waiting", 0.0) if value else 0.0

    # -- what the cached filters read ----------------------------------------------------
    @property
    def record(self) -> WorkerRecord:
        return self._record

    @record.setter
    def record(self, value: WorkerRecord) -> None:
        self._record = value
        _arrays.state().changed()

    @property
    def breaker_open(self) -> bool:
        return self._breaker_open

    @breaker_open.setter
    def breaker_open(self, value: bool) -> None:
        if value is not self._breaker_open:
            self._breaker_open = value
            _arrays.state().changed()

    @property
    def breaker_retry_at(self) -> float:
        """While the breaker is open: ``time.monotonic()`` after which one probe may go."""
        return self._breaker_retry_at

    @breaker_retry_at.setter
    def breaker_retry_at(self, value: float) -> None:
        self._breaker_retry_at = value
        _arrays.state().changed()

    @property
    def url(self) -> str:
        return self._record.url

    @property
    def role(self) -> Role:
        return self._record.role

    def __repr__(self) -> str:
        return f"Endpoint({self.worker_id!r}, in_flight={self.in_flight})"


class Filter:
    """Removes candidates. Must keep order and never return an empty list on a whim."""

    name = "filter"

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        raise NotImplementedError


class Scorer:
    """Scores candidates in ``[0, 1]`` (higher is better). No I/O."""

    name = "scorer"
    needs_tokens = False
    """Reads ``ctx.token_ids`` (the router tokenizes the request for it first)."""
    text_fallback = False
    """Scores requests that carry no token ids from their text (a model without a routing
    tokenizer is then routed by text prefix, routing mode ``text``, not by load only)."""
    bounded = False
    """Its ``score_rows`` arrays are within ``[0, 1]`` (or NaN) by construction: the profile
    weighs them without clipping them first (the same sums, one pass fewer per decision)."""

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        raise NotImplementedError

    def explain(
        self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]
    ) -> list[dict[str, Any]] | None:
        """Per candidate, the inputs behind its score (e.g. ``overlap_blocks``) for a routing
        explanation; called only when one was asked for. None: the score says it all."""
        return None

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        """Called after the pick (e.g. to remember decisions). Must be cheap."""

    def on_finished(self, ctx: RequestContext, endpoint: Endpoint, ok: bool) -> None:
        """Called when the request to ``endpoint`` ended."""

    def on_first_token(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        """Called when the first token of a stream from ``endpoint`` reached the router (now, on
        the scheduler's clock). Must be cheap: it runs on the relay's path."""

    def on_timing(
        self, ctx: RequestContext, endpoint: Endpoint, since_first_token: float, mean_itl: float | None
    ) -> None:
        """Called when a stream from ``endpoint`` was relayed whole, before :meth:`on_finished`:
        its first token came ``since_first_token`` seconds ago, ``mean_itl`` is the mean gap
        between its later chunks (None: one chunk). Must be cheap."""


class Picker:
    """Chooses one candidate given the combined scores."""

    name = "picker"

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        raise NotImplementedError


class KvView(Protocol):
    """One worker's (one DP rank's) mirrored KV cache, as scorers read it
    (``infera_core.kv.index.WorkerView`` is one)."""

    @property
    def worker_id(self) -> str: ...

    @property
    def dp_rank(self) -> int | None: ...

    @property
    def block_size(self) -> int: ...

    @property
    def slot(self) -> int:
        """The view's column in the index's block store (:meth:`KvIndexView.match_slots`)."""
        ...


class KvIndexView(Protocol):
    """The router's KV index as scorers use it: exactly what they call
    (``infera_core.kv.index.KvIndex`` is one). Never does I/O."""

    @property
    def views_by_key(self) -> Mapping[tuple[str, int | None], KvView]:
        """``(worker_id, dp_rank)`` → view, stale views left out."""
        ...

    @property
    def untrusted(self) -> Set[str]:
        """Workers whose views are not to be credited (the agreement check flagged them)."""
        ...

    @property
    def ranked_workers(self) -> Set[str]:
        """Workers with per-DP-rank views (scored by their best rank)."""
        ...

    @property
    def version(self) -> int:
        """Changes whenever a view is added, dropped, re-sized or (un)credited."""
        ...

    @property
    def routed_at(self) -> MutableMapping[str, float]:
        """worker_id → wall time a KV-scored request was last routed there (scorers write it)."""
        ...

    def hash_prompt(self, token_ids: list[int], block_size: int, root: int | None = None) -> list[int]:
        """Router hashes of a prompt's full blocks, chained from ``root`` (None: the base root)."""
        ...

    def match(
        self, hashes: Sequence[int], views: Sequence[KvView | None], tier_weights: Iterable[float] = ...
    ) -> list[float]:
        """Tier-weighted length (in blocks) of the cached prefix of ``hashes`` on each view."""
        ...

    def match_slots(
        self, hashes: Sequence[int], slots: _arrays.Rows, tier_weights: tuple[float, float, float]
    ) -> _arrays.Floats:
        """:meth:`match` for an array of view slots (-1: no view)."""
        ...


DEFAULT_SESSION_HEADERS = (
    "x-session-id",
    "session_id",
    "session-id",
    "x-session-affinity",
    "x-claude-code-session-id",
    "conversation_id",
)
"""Request headers naming a conversation, first present wins: the generic ones and those agent
clients send (Codex: ``session_id`` / ``conversation_id``; Claude Code: ``X-Claude-Code-Session-Id``)."""


@dataclass(slots=True)
class SchedulerDeps:
    """Shared state handed to policy factories (never I/O handles)."""

    kv_index: KvIndexView | None = None
    """The router's KV index (``infera_core.kv.index``), or None when KV routing is off."""
    clock: Callable[[], float] | None = None
    session_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    """Request headers naming a conversation (``--session-header``), for session affinity."""
    extra: dict[str, Any] = field(default_factory=dict)
    latency: LatencyStats = field(default_factory=lambda: LatencyStats())
    """Predicted against observed TTFT per worker, written by a latency-predicting scorer and
    read by the server's ``/metrics`` and dashboard."""


TTFT_TARGET_HEADER = "x-infera-ttft-target-ms"
"""A request's time-to-first-token target (milliseconds), for SLO-aware scorers (``predicted-latency``)."""
TPOT_TARGET_HEADER = "x-infera-tpot-target-ms"
"""A request's time-per-output-token target (milliseconds)."""

PREDICTION_ERROR_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the absolute TTFT prediction error histogram."""


class LatencyStats:
    """What a latency-predicting scorer reports: per worker its latest predicted and observed
    TTFT (seconds), its learned prefill rate and queue, and a histogram of absolute prediction
    errors (``|observed − predicted|``). The per-request PD decision reads the rates and queues."""

    __slots__ = ("busy", "counts", "error_sum", "observed", "predicted", "rates")

    def __init__(self) -> None:
        self.predicted: dict[str, float] = {}
        """worker_id → TTFT predicted for the last request routed there."""
        self.observed: dict[str, float] = {}
        """worker_id → TTFT observed for the last request whose first token came back."""
        self.rates: dict[str, float] = {}
        """worker_id → learned prefill rate (tokens/s)."""
        self.busy: dict[str, float] = {}
        """worker_id → when its predicted prefill queue is empty (the scheduler's clock)."""
        self.counts = [0] * (len(PREDICTION_ERROR_BUCKETS) + 1)
        """Non-cumulative counts per bucket of :data:`PREDICTION_ERROR_BUCKETS`, then +Inf."""
        self.error_sum = 0.0

    def error(self, seconds: float) -> None:
        """Record one absolute prediction error."""
        i = 0
        for bound in PREDICTION_ERROR_BUCKETS:
            if seconds <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.error_sum += seconds

    @property
    def mae(self) -> float | None:
        """The mean absolute error so far (None: no prediction checked yet)."""
        n = sum(self.counts)
        return self.error_sum / n if n else None


@dataclass(frozen=True, slots=True)
class PolicyFactory:
    """Registered through ``infera_register_policies``; builds a filter/scorer/picker."""

    name: str
    kind: PolicyKind
    build: Callable[[Any, SchedulerDeps], Filter | Scorer | Picker]
    """Called as ``build(params_model_instance, deps)``."""
    params: type[BaseModel] | None = None
    description: str = ""

    def parse_params(self, raw: Mapping[str, Any]) -> BaseModel | None:
        if self.params is None:
            if raw:
                raise ValueError(f"{self.kind} {self.name!r} takes no parameters, got {sorted(raw)}")
            return None
        return self.params.model_validate(dict(raw))


@dataclass(slots=True)
class RoutedEvent:
    """Payload of the ``infera_request_routed`` notification."""

    request_id: str
    model: str
    worker_id: str
    decode_worker_id: str | None = None
    policy: str = ""
    decision_seconds: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
