"""The router's fair queue: priority tiers, then weighted fair share between keys.

A pure data structure (no I/O, no asyncio, the clock passed in), shared by the live server
(:mod:`infera_core.server.queue`) and the virtual-time bench (``bench/fleet/fairness.py``),
so both measure the same code.

* **Tiers** — an integer priority, higher first: ``critical`` is 1, ``standard`` 0,
  ``sheddable`` -1 (any integer may be used; a negative tier is *sheddable*, as in the
  Gateway API Inference Extension). A tier is served only when every higher tier is empty.
* **Weighted fair queuing inside a tier** — start-time fair queuing (Goyal et al., SFQ):
  a waiter of key *k* with cost *c* gets ``start = max(V, finish[k])`` and
  ``finish[k] = start + c / weight[k]``; the tier serves the smallest start tag, and its
  virtual time ``V`` is the start tag of the waiter served last. A key that floods only
  pushes its own tags into the future, so a light key is served next whatever the
  flood's length. The cost of a request is what it will take from the fleet: its uncached
  prompt tokens plus its expected output (:func:`request_cost`).
* **Bounded** — at most ``max_len`` waiters. When full, an arrival of a higher tier evicts
  the newest waiter of the lowest sheddable tier below its own (reason ``priority``); else,
  inside its own tier, the newest waiter of the key with the most waiters when that is
  another key (reason ``fair_share``: a flood loses its own newest request, never a light
  key's); else the arrival is refused.
* **Wait estimate** — the mean interval between two dispatches while the queue stayed
  non-empty (an EWMA: the fleet's recent service rate as the queue sees it) times the
  waiters ahead; a deadline that cannot be met is refused on arrival.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from infera_core.worker import PriorityOrder

TIERS: dict[str, int] = {"critical": 1, "standard": 0, "sheddable": -1}
"""Named priority tiers (higher is served first; negative is sheddable)."""
TIER_NAMES: dict[int, str] = {v: k for k, v in TIERS.items()}


def tier_of(value: str | int) -> int:
    """A tier from a name (``critical|standard|sheddable``) or an integer (ValueError else)."""
    if isinstance(value, bool):
        raise ValueError(f"priority must be one of {', '.join(TIERS)} or an integer, not {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text in TIERS:
        return TIERS[text]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"priority must be one of {', '.join(TIERS)} or an integer, not {value!r}") from None


def engine_priority(tier: int, order: PriorityOrder) -> int:
    """The body ``priority`` a worker scheduling by priority gets for a request of ``tier`` —
    the one place tiers meet engine values. An engine serving lower values first (vLLM
    ``--scheduling-policy priority``, SGLang with ``--schedule-low-priority-values-first``, the
    sim) gets ``-tier``: critical -1, standard 0 (the engines' default), sheddable 1; SGLang's
    default order (larger first) gets the tier itself."""
    return -tier if order is PriorityOrder.LOWER_FIRST else tier


def tier_label(tier: int) -> str:
    """The metrics label of a tier: its name, or the number."""
    return TIER_NAMES.get(tier, str(tier))


def request_cost(prompt_tokens: int, cached_tokens: int, max_tokens: int, output_cap: int) -> float:
    """A request's cost in the fair share: uncached prompt tokens + expected output
    (``max_tokens`` capped at ``output_cap``, so an absurd limit does not price a key out)."""
    return float(max(0, prompt_tokens - cached_tokens) + max(1, min(max_tokens, output_cap)))


class Shares:
    """Requests in flight per key (of one model), to tell whether a key holds more than its
    fair share of the model's slots: ``slots × weight / Σ weights`` of the keys that have
    requests in flight or waiting. The router keeps ``--queue-headroom`` slots of each worker
    away from a key over its share (and from sheddable tiers), so a light key finds a slot at
    once instead of waiting for a flood's request to end."""

    __slots__ = ("_weight_sum", "in_flight", "weights")

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.weights: dict[str, float] = {}
        self._weight_sum = 0.0

    def started(self, key: str, weight: float) -> None:
        n = self.in_flight.get(key, 0)
        if not n:
            self.weights[key] = weight
            self._weight_sum += weight
        self.in_flight[key] = n + 1

    def ended(self, key: str) -> None:
        n = self.in_flight.get(key, 0) - 1
        if n > 0:
            self.in_flight[key] = n
        elif n == 0:
            del self.in_flight[key]
            self._weight_sum -= self.weights.pop(key)

    def over(self, key: str, weight: float, slots: int, queue: FairQueue | None = None) -> bool:
        """Whether ``key`` holds at least its fair share of ``slots`` (weights of the keys in
        flight, plus ``key`` and the keys waiting in ``queue``)."""
        mine = self.in_flight.get(key, 0)
        if not mine:
            return False
        total = self._weight_sum
        if queue is not None and len(queue):
            for k, w in queue.waiting_keys().items():
                if k not in self.in_flight:
                    total += w
        return mine * total >= slots * weight


@dataclass(slots=True, eq=False)
class Waiter:
    """One queued request. ``deadline``: the absolute time (same clock) its first token is
    due by, None for none; ``payload``: the caller's (a future, a request record)."""

    key: str
    tier: int
    cost: float
    arrived: float
    deadline: float | None = None
    weight: float = 1.0
    payload: Any = None
    start: float = 0.0
    finish: float = 0.0
    seq: int = 0
    queued: bool = False


@dataclass(slots=True)
class _Tier:
    heap: list[tuple[float, int, Waiter]] = field(default_factory=list)
    members: dict[Waiter, None] = field(default_factory=dict)
    """Queued waiters in arrival order (the newest is evicted first)."""
    vtime: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)
    """Queued waiters per key."""
    weights: dict[str, float] = field(default_factory=dict)
    """The weight of each key with waiters."""
    per_key: dict[str, deque[Waiter]] = field(default_factory=dict)
    """Each key's waiters in arrival order (= start-tag order; gone ones skipped lazily)."""

    def head(self) -> Waiter | None:
        heap = self.heap
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)
        return heap[0][2] if heap else None


class FairQueue:
    """One model's queue (see the module docstring). Not thread-safe: one event loop."""

    def __init__(self, max_len: int, ewma: float = 0.2) -> None:
        if max_len < 1:
            raise ValueError("max_len must be at least 1")
        self.max_len = max_len
        self._tiers: dict[int, _Tier] = {}
        self._order: list[int] = []  # tiers, highest first
        self._len = 0
        self._seq = 0
        self._ewma = ewma
        self.interval: float | None = None
        """Mean seconds between two dispatches while backlogged (None: not measured yet)."""
        self._last_pop: float | None = None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Waiter]:
        for t in self._order:
            yield from self._tiers[t].members

    def waiting_keys(self) -> dict[str, float]:
        """Keys with waiters, and their weights."""
        out: dict[str, float] = {}
        for t in self._order:
            out.update(self._tiers[t].weights)
        return out

    def depth(self) -> dict[int, int]:
        """Waiters per tier."""
        return {t: len(self._tiers[t].members) for t in self._order if self._tiers[t].members}

    def _tier(self, tier: int) -> _Tier:
        q = self._tiers.get(tier)
        if q is None:
            q = self._tiers[tier] = _Tier()
            self._order = sorted(self._tiers, reverse=True)
        return q

    # -- arrivals ----------------------------------------------------------------------
    def victim(self, tier: int, key: str) -> tuple[Waiter, str] | None:
        """The waiter a full queue gives up for an arrival of ``key`` at ``tier``, and why
        (``priority`` or ``fair_share``); None: the arrival is the one refused."""
        for t in reversed(self._order):
            if t >= tier or t >= 0:
                break
            members = self._tiers[t].members
            if members:
                return next(reversed(members)), "priority"
        q = self._tiers.get(tier)
        if q is None or not q.backlog:
            return None
        top = max(q.backlog, key=q.backlog.__getitem__)
        if top == key or q.backlog[top] <= q.backlog.get(key, 0) + 1:
            return None
        for w in reversed(q.members):
            if w.key == top:
                return w, "fair_share"
        return None

    def push(self, w: Waiter) -> None:
        """Queue ``w`` (the caller made room: ``len(self) < max_len``)."""
        if self._len >= self.max_len:
            raise OverflowError("the queue is full")
        q = self._tier(w.tier)
        start = q.finish.get(w.key, q.vtime)
        if start < q.vtime:
            start = q.vtime
        w.start = start
        w.finish = start + w.cost / (w.weight if w.weight > 0 else 1.0)
        q.finish[w.key] = w.finish
        self._seq += 1
        w.seq = self._seq
        w.queued = True
        heapq.heappush(q.heap, (start, w.seq, w))
        q.members[w] = None
        q.backlog[w.key] = q.backlog.get(w.key, 0) + 1
        q.weights[w.key] = w.weight
        mine = q.per_key.get(w.key)
        if mine is None:
            mine = q.per_key[w.key] = deque()
        mine.append(w)
        self._len += 1

    def ahead(self, w: Waiter) -> int:
        """Waiters that would be served before ``w`` as the queue stands."""
        n = 0
        for t in self._order:
            q = self._tiers[t]
            if t > w.tier:
                n += len(q.members)
            elif t == w.tier:
                n += sum(1 for o in q.members if (o.start, o.seq) < (w.start, w.seq))
        return n

    def estimated_wait(self, w: Waiter) -> float | None:
        """Seconds until ``w`` is dispatched at the recent rate (None: no rate measured yet)."""
        if self.interval is None:
            return None
        return (self.ahead(w) + 1) * self.interval

    def offer(self, w: Waiter, now: float) -> tuple[str | None, tuple[Waiter, str] | None]:
        """Admit ``w`` arriving at ``now``: (None, evicted) when queued — ``evicted`` the waiter
        (and why) it displaced from a full queue, which the caller answers — or (reason, None)
        when refused: ``queue_full``, or ``deadline`` (the estimated wait passes its deadline)."""
        evicted = None
        if self._len >= self.max_len:
            evicted = self.victim(w.tier, w.key)
            if evicted is None:
                return "queue_full", None
            self.remove(evicted[0])
        self.push(w)
        if w.deadline is not None:
            est = self.estimated_wait(w)
            if est is not None and now + est >= w.deadline:
                self.remove(w)
                return "deadline", evicted
        return None, evicted

    def expiry(self, w: Waiter, timeout: float, now: float) -> tuple[float, str]:
        """Seconds from ``now`` until ``w`` must be answered if still queued, and why:
        ``timeout`` (the queue's bound) or ``deadline`` — a margin (10 % of its budget, 5 ms
        to 250 ms) before its deadline, so the refusal reaches the client before it."""
        delay, reason = timeout - (now - w.arrived), "timeout"
        if w.deadline is not None:
            margin = min(0.25, max(0.005, 0.1 * (w.deadline - w.arrived)))
            until = w.deadline - margin - now
            if until < delay:
                delay, reason = until, "deadline"
        return max(0.0, delay), reason

    # -- departures ----------------------------------------------------------------------
    def peek(self) -> Waiter | None:
        """The next waiter to serve (highest tier, then smallest start tag)."""
        for t in self._order:
            w = self._tiers[t].head()
            if w is not None:
                return w
        return None

    def heads(self) -> list[Waiter]:
        """Each key's first waiter, in service order (tier, then start tag)."""
        out: list[Waiter] = []
        for t in self._order:
            heads = []
            for mine in self._tiers[t].per_key.values():
                while mine and not mine[0].queued:
                    mine.popleft()
                if mine:
                    heads.append(mine[0])
            heads.sort(key=lambda w: (w.start, w.seq))
            out.extend(heads)
        return out

    def serve(self, now: float, place: Callable[[Waiter], bool]) -> int:
        """Dispatch waiters while ``place(w)`` takes them (True: it did, and ``w`` leaves the
        queue), trying each key's first waiter in service order: a key that ``place`` holds
        back (the headroom kept from a key over its share, or from a sheddable tier) does not
        block the keys behind it. ``place`` must not change the queue. How many were placed."""
        n = 0
        while self._len:
            for w in self.heads():
                if place(w):
                    self.take(w, now)
                    n += 1
                    break
            else:
                break
        return n

    def pop(self, now: float) -> Waiter | None:
        """Take the next waiter to serve; ``now`` feeds the service-rate estimate."""
        w = self.peek()
        if w is None:
            return None
        self.take(w, now)
        return w

    def take(self, w: Waiter, now: float) -> None:
        """Serve the queued waiter ``w`` (moves the tier's virtual time to its start tag)."""
        q = self._tiers[w.tier]
        q.vtime = max(q.vtime, w.start)
        self._unlink(w, q)
        if self._last_pop is not None:
            sample = now - self._last_pop
            self.interval = (
                sample if self.interval is None else self.interval + self._ewma * (sample - self.interval)
            )
        self._last_pop = now if self._len else None

    def remove(self, w: Waiter) -> bool:
        """Take ``w`` out (timed out, shed, its client left); False when it was not queued."""
        if not w.queued:
            return False
        q = self._tiers[w.tier]
        if q.finish.get(w.key) == w.finish:  # its key's newest: the key's tag goes back
            q.finish[w.key] = w.start
        self._unlink(w, q)
        if not self._len:
            self._last_pop = None
        return True

    def _unlink(self, w: Waiter, q: _Tier) -> None:
        w.queued = False
        del q.members[w]
        left = q.backlog[w.key] - 1
        if left:
            q.backlog[w.key] = left
        else:
            del q.backlog[w.key]
            del q.weights[w.key]
            del q.per_key[w.key]
        self._len -= 1
        if not q.members:
            # idle tier: keys start afresh from the largest tag handed out (SFQ's idle reset)
            if q.finish:
                q.vtime = max(q.vtime, max(q.finish.values()))
            q.finish.clear()
            q.heap.clear()
