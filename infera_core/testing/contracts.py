"""Contract test suites for plugin authors: subclass one, set a class attribute, run pytest.

```python
from infera_core.testing.contracts import ScorerContract
from my_plugin.plugin import PREFER_LABEL

class TestPreferLabel(ScorerContract):
    factory = PREFER_LABEL
    params = {"key": "zone", "value": "a"}
```

The base classes are not named ``Test*`` so pytest only collects your subclasses. For many
policies of one registry with default parameters, :func:`policy_suites` makes the subclasses:
``globals().update(policy_suites(registry, "scorer:load", "filter:health"))``.
Every check is a plain method without fixture arguments, so the suites also run
under ``unittest``-style callers. Importing this module has no side effects.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import math
import os
import random
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar
from unittest import mock

from infera_core.request import RequestContext
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, Filter, Picker, PolicyFactory, SchedulerDeps, Scorer
from infera_core.testing.engine_contract import (
    ENGINE_MODULES,
    EngineAdapterContract,
    launch_record,
    sample_launch_context,
)
from infera_core.testing.transport_contracts import (
    KvEventTransportContract,
    RequestTransportContract,
)
from infera_core.worker import KvEventsInfo, Role, Status, WorkerRecord

__all__ = [
    "ENGINE_MODULES",
    "EngineAdapterContract",
    "FilterContract",
    "KvEventTransportContract",
    "PickerContract",
    "RequestTransportContract",
    "ScorerContract",
    "launch_record",
    "no_io",
    "policy_suites",
    "random_record",
    "sample_launch_context",
]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class IOAttempted(AssertionError):
    """Raised by :func:`no_io` when the code under test opens a file or a socket."""


@contextlib.contextmanager
def no_io() -> Iterator[None]:
    """Fail any attempt to open a file or connect a socket inside the block.

    The attempt raises :class:`IOAttempted` at the call site and is also recorded,
    so code that swallows the exception still fails when the block ends.
    """
    attempts: list[str] = []

    def refuse(what: str) -> Any:
        def _raise(*args: Any, **kwargs: Any) -> Any:
            attempts.append(f"{what}{args[:2]!r}")
            raise IOAttempted(f"I/O attempted in a policy call: {what}{args[:2]!r}")

        return _raise

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(builtins, "open", refuse("open")))
        stack.enter_context(mock.patch.object(io, "open", refuse("io.open")))
        stack.enter_context(mock.patch.object(os, "open", refuse("os.open")))
        stack.enter_context(mock.patch.object(socket.socket, "connect", refuse("socket.connect")))
        stack.enter_context(mock.patch.object(socket.socket, "connect_ex", refuse("socket.connect_ex")))
        stack.enter_context(mock.patch.object(socket.socket, "sendto", refuse("socket.sendto")))
        stack.enter_context(mock.patch.object(socket, "getaddrinfo", refuse("socket.getaddrinfo")))
        yield
    if attempts:
        raise IOAttempted(f"I/O attempted in a policy call: {', '.join(attempts)}")


def random_record(rng: random.Random, index: int, model: str = "contract-model") -> WorkerRecord:
    """A random but valid worker record (role, status, labels, KV events, DP rank vary)."""
    kv = None
    if rng.random() < 0.7:
        kv = KvEventsInfo(
            endpoint=f"tcp://127.0.0.1:{5500 + index}", format="contract", block_size=rng.choice([16, 32])
        )
    return WorkerRecord(
        worker_id=f"w{index}",
        url=f"http://127.0.0.1:{8100 + index}",
        model=model if rng.random() < 0.85 else "other-model",
        engine="contract",
        role=rng.choice(list(Role)),
        status=Status.ACTIVE if rng.random() < 0.85 else Status.DRAINING,
        dp_rank=rng.choice([None, 0, 1]),
        dp_size=2,
        kv_events=kv,
        labels={"zone": rng.choice(["a", "b"]), "tier": rng.choice(["gold", "basic"])},
    )


class _PolicyContract:
    """Shared helpers for the policy suites."""

    kind: ClassVar[str] = ""
    factory: ClassVar[PolicyFactory]
    """The factory your plugin registers through ``infera_register_policies``."""
    params: ClassVar[Mapping[str, Any]] = {}
    """Raw parameters (as they would appear in config) used to build the policy."""
    seeds: ClassVar[Sequence[int]] = (0, 1, 2, 3, 4, 5, 6, 7)
    max_candidates: ClassVar[int] = 8

    def deps(self) -> SchedulerDeps:
        """Scheduler state handed to the factory; override to supply a KV index etc."""
        return SchedulerDeps(clock=lambda: 1000.0)

    def build(self) -> Any:
        parsed = self.factory.parse_params(self.params)
        return self.factory.build(parsed, self.deps())

    def make_candidates(self, rng: random.Random, n: int) -> list[Endpoint]:
        """``n`` random endpoints; override to add state your policy reads."""
        out = []
        for i in range(n):
            ep = Endpoint(random_record(rng, i))
            ep.in_flight = rng.randrange(0, 20)
            ep.in_flight_prompt_tokens = ep.in_flight * rng.randrange(0, 500)
            ep.picks = rng.randrange(0, 100)
            ep.stats = {"running": float(rng.randrange(0, 10)), "kv_usage": rng.random()}
            out.append(ep)
        return out

    def make_context(self, rng: random.Random) -> RequestContext:
        """A random chat request for ``contract-model`` with token ids."""
        tokens = [rng.randrange(0, 32000) for _ in range(rng.randrange(0, 200))]
        ctx = RequestContext(
            request_id=f"req-{rng.randrange(1 << 30)}",
            model="contract-model",
            route="/v1/chat/completions",
            body={"model": "contract-model", "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-session-id": f"s{rng.randrange(4)}"},
            token_ids=tokens,
        )
        ctx.session_key = ctx.headers["x-session-id"]
        return ctx

    def cases(self) -> Iterator[tuple[RequestContext, list[Endpoint]]]:
        """Random (context, candidates) pairs, candidate counts from 0 to ``max_candidates``."""
        for seed in self.seeds:
            rng = random.Random(seed)
            n = (seed % (self.max_candidates + 1)) if seed else 0
            yield self.make_context(rng), self.make_candidates(rng, n)

    def test_factory_metadata(self) -> None:
        f = self.factory
        assert isinstance(f, PolicyFactory), f"factory must be a PolicyFactory, got {type(f).__name__}"
        assert f.kind == self.kind, f"factory kind is {f.kind!r}, this suite checks {self.kind!r}"
        assert isinstance(f.name, str) and _NAME_RE.match(f.name), f"bad policy name {f.name!r}"
        assert f.description.strip(), f"{f.kind} {f.name!r} needs a description"
        if f.params is not None:
            f.params.model_json_schema()  # must be serialisable for `infera-run policies`

    def test_params_parse(self) -> None:
        parsed = self.factory.parse_params(self.params)
        if self.factory.params is not None:
            assert isinstance(parsed, self.factory.params)

    def test_builds_the_right_type(self) -> None:
        expected = {"filter": Filter, "scorer": Scorer, "picker": Picker}[self.kind]
        obj = self.build()
        assert isinstance(obj, expected), f"factory built {type(obj).__name__}, not a {expected.__name__}"


class ScorerContract(_PolicyContract):
    """A scorer: one float in ``[0, 1]`` per candidate, deterministic, no I/O."""

    kind = "scorer"

    def test_one_score_per_candidate_in_unit_range(self) -> None:
        scorer = self.build()
        for ctx, cands in self.cases():
            with no_io():
                scores = scorer.score(ctx, cands)
            assert len(scores) == len(cands), f"{len(scores)} scores for {len(cands)} candidates"
            for s in scores:
                assert isinstance(s, float | int) and not isinstance(s, bool), f"score {s!r} is not a float"
                assert not math.isnan(s) and 0.0 <= s <= 1.0, f"score {s!r} outside [0, 1]"

    def test_deterministic_for_same_input(self) -> None:
        first, second = self.build(), self.build()
        for ctx, cands in self.cases():
            with no_io():
                a = list(first.score(ctx, cands))
                b = list(first.score(ctx, cands))
                c = list(second.score(ctx, cands))
            assert a == b == c, f"scores differ for the same input: {a} / {b} / {c}"

    def test_no_io_while_scoring(self) -> None:
        scorer = self.build()
        for ctx, cands in self.cases():
            with no_io():
                scorer.score(ctx, cands)
                if cands:
                    scorer.on_routed(ctx, cands[0])
                    scorer.on_finished(ctx, cands[0], True)


class PickerContract(_PolicyContract):
    """A picker: returns one of the candidates it was given, no I/O."""

    kind = "picker"

    def test_picks_a_candidate(self) -> None:
        picker = self.build()
        for seed, (ctx, cands) in enumerate(self.cases()):
            if not cands:
                continue
            rng = random.Random(seed)
            scores = [rng.random() for _ in cands]
            with no_io():
                chosen = picker.pick(ctx, cands, scores)
            assert any(chosen is c for c in cands), f"picked {chosen!r}, not one of the candidates"

    def test_single_candidate_is_picked(self) -> None:
        picker = self.build()
        ctx, cands = next(c for c in self.cases() if c[1])
        with no_io():
            assert picker.pick(ctx, cands[:1], [0.0]) is cands[0]


class FilterContract(_PolicyContract):
    """A filter: an order-preserving subset of its input, deterministic, no I/O."""

    kind = "filter"

    def test_returns_ordered_subset(self) -> None:
        flt = self.build()
        for ctx, cands in self.cases():
            with no_io():
                kept = flt.filter(ctx, list(cands))
            assert isinstance(kept, list), "filter must return a list"
            ids = [id(c) for c in cands]
            positions = [ids.index(id(k)) for k in kept if id(k) in ids]
            assert len(positions) == len(kept), "filter returned endpoints that were not candidates"
            assert positions == sorted(set(positions)), "filter reordered or duplicated candidates"

    def test_deterministic_for_same_input(self) -> None:
        flt = self.build()
        for ctx, cands in self.cases():
            with no_io():
                a = [e.worker_id for e in flt.filter(ctx, list(cands))]
                b = [e.worker_id for e in flt.filter(ctx, list(cands))]
            assert a == b, f"filter results differ for the same input: {a} / {b}"


def policy_suites(registry: PolicyRegistry, *policies: str) -> dict[str, type[_PolicyContract]]:
    """One contract suite per ``kind:name`` (``"scorer:load"``) of ``registry``, with default
    parameters: ``Test<Name><Kind>`` classes (``TestLoadScorer``) for a test module's globals."""
    suites: dict[str, type[_PolicyContract]] = {
        "filter": FilterContract,
        "scorer": ScorerContract,
        "picker": PickerContract,
    }
    out: dict[str, type[_PolicyContract]] = {}
    for policy in policies:
        kind, _, name = policy.partition(":")
        title = "".join(part.capitalize() for part in re.split(r"[^a-zA-Z0-9]", name))
        cls = f"Test{title}{kind.capitalize()}"
        out[cls] = type(cls, (suites[kind],), {"factory": registry.factory(kind, name)})
    return out
