"""The plugin author's contract suites: good plugins pass, each kind of bad plugin fails."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from infera_core.engines.base import EngineOption, LaunchContext, LaunchSpec, RecordFields, RunningEngine
from infera_core.engines.support import http_ok, metrics_in_flight
from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint, Filter, Picker, PolicyFactory, Scorer
from infera_core.testing.contracts import (
    EngineAdapterContract,
    FilterContract,
    IOAttempted,
    PickerContract,
    ScorerContract,
    no_io,
)
from infera_core.worker import KvEventsInfo, PdInfo

# -- well-behaved plugins -----------------------------------------------------------


class GoodAdapter:
    name = "good"
    description = "A well-behaved adapter."
    package_hint = "pip install good-engine"

    def options(self) -> Sequence[EngineOption]:
        return [EngineOption("block_size", int, 16, "KV block size.")]

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        bs = str(ctx.options["block_size"])
        return LaunchSpec(
            argv=["good-engine", "--port", str(ctx.port), "--block-size", bs], env={"GOOD": "1"}
        )

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        port = ctx.ports.setdefault("kv", ctx.free_port())
        return RecordFields(
            kv_events=KvEventsInfo(
                endpoint=f"tcp://{ctx.advertise_host}:{port}", format="good", block_size=16
            ),
            pd=PdInfo(
                protocol="good-pd", params={"bootstrap_port": ctx.ports.setdefault("pd", ctx.free_port())}
            ),
        )

    async def is_ready(self, engine: RunningEngine) -> bool:
        return await http_ok(engine.client, f"{engine.url}/health")

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return await metrics_in_flight(engine.client, engine.url, ["vllm:num_requests_running"])


class LoadScorer(Scorer):
    name = "load"

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return [1.0 / (1.0 + ep.in_flight) for ep in candidates]


class MaxPicker(Picker):
    name = "max"

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        best = max(range(len(candidates)), key=lambda i: scores[i])
        return candidates[best]


class ZoneParams(BaseModel):
    zone: str = "a"


class ZoneFilter(Filter):
    name = "zone"

    def __init__(self, zone: str) -> None:
        self.zone = zone

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        return [ep for ep in candidates if ep.record.labels.get("zone") == self.zone]


def _factory(
    name: str, kind: Any, build: Callable[[], Any], params: type[BaseModel] | None = None
) -> PolicyFactory:
    return PolicyFactory(name, kind, lambda p, deps: build(), params, f"{name} for contract tests")


class TestGoodAdapter(EngineAdapterContract):
    adapter = GoodAdapter()


class TestLoadScorer(ScorerContract):
    factory = _factory("load", "scorer", LoadScorer)


class TestMaxPicker(PickerContract):
    factory = _factory("max", "picker", MaxPicker)


class TestZoneFilter(FilterContract):
    factory = PolicyFactory(
        "zone", "filter", lambda p, deps: ZoneFilter(p.zone), ZoneParams, "Keep one zone."
    )
    params = {"zone": "b"}


# -- each contract catches its violations --------------------------------------------


class OutOfRange(Scorer):
    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return [float(ep.in_flight) for ep in candidates]


class WrongCount(Scorer):
    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return [0.5] * (len(candidates) + 1)


class Jittery(Scorer):
    def __init__(self) -> None:
        self.rng = random.Random()

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return [self.rng.random() for _ in candidates]


class ReadsFile(Scorer):
    """Does I/O and swallows the failure: the contract must still notice."""

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        try:
            with open("/etc/hostname") as fh:
                fh.read()
        except Exception:
            pass
        return [0.5 for _ in candidates]


class Connects(Scorer):
    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        import socket

        if candidates:
            with socket.socket() as s:
                s.connect(("127.0.0.1", 9))
        return [0.5 for _ in candidates]


def _scorer_suite(cls: type[Scorer]) -> ScorerContract:
    class Suite(ScorerContract):
        factory = _factory("bad", "scorer", cls)

    return Suite()


@pytest.mark.parametrize(
    ("scorer", "check", "message"),
    [
        (OutOfRange, "test_one_score_per_candidate_in_unit_range", "outside [0, 1]"),
        (WrongCount, "test_one_score_per_candidate_in_unit_range", "scores for"),
        (Jittery, "test_deterministic_for_same_input", "differ for the same input"),
        (ReadsFile, "test_no_io_while_scoring", "I/O attempted"),
        (Connects, "test_no_io_while_scoring", "socket.connect"),
    ],
)
def test_scorer_contract_catches(scorer: type[Scorer], check: str, message: str) -> None:
    suite = _scorer_suite(scorer)
    with pytest.raises(AssertionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        getattr(suite, check)()


def test_scorer_contract_rejects_wrong_kind() -> None:
    suite = type("Suite", (ScorerContract,), {"factory": _factory("max", "picker", MaxPicker)})()
    with pytest.raises(AssertionError, match="kind is 'picker'"):
        suite.test_factory_metadata()


def test_picker_contract_rejects_invented_endpoint() -> None:
    class Inventive(Picker):
        def pick(
            self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]
        ) -> Endpoint:
            return Endpoint(candidates[0].record)

    suite = type("Suite", (PickerContract,), {"factory": _factory("inv", "picker", Inventive)})()
    with pytest.raises(AssertionError, match="not one of the candidates"):
        suite.test_picks_a_candidate()


def test_filter_contract_rejects_reordering() -> None:
    class Reverse(Filter):
        def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
            return list(reversed(candidates))

    suite = type("Suite", (FilterContract,), {"factory": _factory("rev", "filter", Reverse)})()
    with pytest.raises(AssertionError, match="reordered"):
        suite.test_returns_ordered_subset()


class EmptyArgv(GoodAdapter):
    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        return LaunchSpec(argv=[])


class IntEnv(GoodAdapter):
    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        return LaunchSpec(argv=["x"], env={"PORT": ctx.port})  # type: ignore[dict-item]


class DupOptions(GoodAdapter):
    def options(self) -> Sequence[EngineOption]:
        return [EngineOption("block_size"), EngineOption("block_size")]


class BadKv(GoodAdapter):
    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        return RecordFields(kv_events={"endpoint": "tcp://x:1"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("adapter", "check", "message"),
    [
        (EmptyArgv, "test_build_launch", "argv must be strings"),
        (IntEnv, "test_build_launch", "env must be str"),
        (DupOptions, "test_options", "duplicate option names"),
        (BadKv, "test_record_fields", "kv_events must be a KvEventsInfo"),
    ],
)
def test_adapter_contract_catches(adapter: type[GoodAdapter], check: str, message: str) -> None:
    suite = type("Suite", (EngineAdapterContract,), {"adapter": adapter()})()
    with pytest.raises(Exception, match=message):
        getattr(suite, check)()


def test_adapter_contract_catches_engine_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / "greedy_adapter.py").write_text("import vllm\n\nclass Adapter:\n    name = 'greedy'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import greedy_adapter  # type: ignore[import-not-found]

        suite = type("Suite", (EngineAdapterContract,), {"adapter": greedy_adapter.Adapter()})()
        with pytest.raises(AssertionError, match="imported vllm"):
            suite.test_module_imports_no_engine()
    finally:
        sys.modules.pop("greedy_adapter", None)
        sys.modules.pop("vllm", None)


def test_no_io_allows_pure_code_and_blocks_open() -> None:
    with no_io():
        assert sum(range(10)) == 45
    with pytest.raises(IOAttempted), no_io():
        open("/etc/hostname")  # noqa: SIM115
    # patches are undone afterwards
    with open(__file__) as fh:
        assert fh.readline()
