"""Profiles built from presets and YAML, per-model overrides, core filters and pickers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from infera_core.errors import ConfigError
from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.scheduling.router_config import RouterConfig, load_router_config
from infera_core.scheduling.scheduler import (
    NoWorkerError,
    OverloadedError,
    Scheduler,
    UnknownModelError,
    build_scheduler,
)
from infera_core.scheduling.types import Endpoint, RoutedEvent, SchedulerDeps
from infera_core.server.fleet import EndpointTable
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import Role, Status, WorkerRecord


@pytest.fixture(scope="module")
def hooks() -> InferaHooks:
    return make_hooks()


def _table(*specs: tuple[str, str], **kw: object) -> EndpointTable:
    table = EndpointTable()
    for wid, model in specs:
        table.put(WorkerRecord(worker_id=wid, url=f"http://{wid}", model=model, engine="sim", **kw))  # type: ignore[arg-type]
    return table


def _ctx(model: str = "m", **headers: str) -> RequestContext:
    return RequestContext("r1", model, "/v1/chat/completions", {"model": model}, headers)


def _sched(hooks: InferaHooks, table: EndpointTable, config: RouterConfig, **kw: object) -> Scheduler:
    return build_scheduler(table, config, hooks.catalog().policies, SchedulerDeps(), **kw)  # type: ignore[arg-type]


def test_round_robin_preset_cycles_and_counts_picks(hooks: InferaHooks) -> None:
    table = _table(("a", "m"), ("b", "m"), ("c", "m"))
    s = _sched(hooks, table, RouterConfig(preset="round-robin"))
    picks = [s.schedule(_ctx()).worker_id for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]
    assert [ep.picks for ep in table.by_id.values()] == [2, 2, 2]


def test_unknown_model_and_empty_fleet(hooks: InferaHooks) -> None:
    s = _sched(hooks, _table(("a", "m"), ("b", "n")), RouterConfig(preset="round-robin"))
    with pytest.raises(UnknownModelError) as err:
        s.schedule(_ctx("zzz"))
    assert err.value.available == ["m", "n"]
    with pytest.raises(NoWorkerError):
        _sched(hooks, _table(), RouterConfig(preset="round-robin")).schedule(_ctx())


def test_health_filter_skips_draining_and_open_breakers_until_probe_time(hooks: InferaHooks) -> None:
    table = _table(("a", "m"), ("b", "m"))
    table.put(WorkerRecord(worker_id="c", url="http://c", model="m", engine="sim", status=Status.DRAINING))
    s = _sched(hooks, table, RouterConfig(preset="round-robin"))
    a = table.by_id["a"]
    a.breaker_open = True
    a.breaker_retry_at = 1e18
    assert {s.schedule(_ctx()).worker_id for _ in range(4)} == {"b"}
    a.breaker_retry_at = 0.0  # cool-down over: half-open, eligible again
    assert {s.schedule(_ctx()).worker_id for _ in range(4)} == {"a", "b"}
    table.by_id["b"].breaker_open = True
    table.by_id["b"].breaker_retry_at = 1e18
    a.breaker_retry_at = 1e18
    with pytest.raises(NoWorkerError):
        s.schedule(_ctx())


def test_role_filter_follows_the_request_role(hooks: InferaHooks) -> None:
    table = _table(("mix", "m"))
    table.put(WorkerRecord(worker_id="pre", url="http://p", model="m", engine="sim", role=Role.PREFILL))
    s = _sched(hooks, table, RouterConfig(preset="round-robin"))
    assert {s.schedule(_ctx()).worker_id for _ in range(4)} == {"mix"}
    ctx = _ctx()
    ctx.role = Role.PREFILL
    assert s.schedule(ctx).worker_id == "pre"


def test_admission_cap_raises_overloaded(hooks: InferaHooks) -> None:
    table = _table(("a", "m"), ("b", "m"))
    s = _sched(hooks, table, RouterConfig(preset="round-robin"), max_inflight=2)
    table.by_id["a"].in_flight = 2
    assert s.schedule(_ctx()).worker_id == "b"
    table.by_id["b"].in_flight = 2
    with pytest.raises(OverloadedError):
        s.schedule(_ctx())


def test_exclude_is_honoured_for_retries(hooks: InferaHooks) -> None:
    s = _sched(hooks, _table(("a", "m"), ("b", "m")), RouterConfig(preset="round-robin"))
    assert {s.schedule(_ctx(), exclude=["a"]).worker_id for _ in range(3)} == {"b"}
    with pytest.raises(NoWorkerError):
        s.schedule(_ctx(), exclude=["a", "b"])


def test_max_score_ties_go_to_fewer_in_flight_then_rotate(hooks: InferaHooks) -> None:
    table = _table(("a", "m"), ("b", "m"), ("c", "m"))
    config = RouterConfig(filters=[], picker={"name": "max-score"})  # type: ignore[arg-type]
    s = _sched(hooks, table, config)
    table.by_id["a"].in_flight = 3
    assert Counter(s.schedule(_ctx()).worker_id for _ in range(4)) == {"b": 2, "c": 2}


def test_yaml_profile_with_per_model_overrides(hooks: InferaHooks, tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        "filters: [{name: health}]\n"
        "scorers: [{name: least-load, weight: 2}]\n"
        "picker: {name: max-score}\n"
        "models:\n"
        "  rr-model: {preset: round-robin}\n"
    )
    table = _table(("a", "m"), ("b", "m"), ("x", "rr-model"), ("y", "rr-model"))
    seen: list[tuple[str, float]] = []
    s = _sched(hooks, table, load_router_config(path), observe=lambda p, t: seen.append((p, t)))
    table.by_id["a"].in_flight = 5
    assert {s.schedule(_ctx("m")).worker_id for _ in range(3)} == {"b"}
    table.by_id["x"].in_flight = 5  # round robin ignores load
    assert [s.schedule(_ctx("rr-model")).worker_id for _ in range(2)] == ["x", "y"]
    assert [p for p, _ in seen] == ["custom"] * 3 + ["round-robin"] * 2
    assert all(t >= 0 for _, t in seen)


def test_direct_mode_uses_header_else_policy(hooks: InferaHooks) -> None:
    table = _table(("a", "m"), ("b", "m"))
    s = _sched(hooks, table, RouterConfig(preset="round-robin"), direct=True)
    assert [s.schedule(_ctx(**{"x-worker-instance-id": "b"})).worker_id for _ in range(3)] == ["b"] * 3
    assert {s.schedule(_ctx(**{"x-worker-instance-id": "zz"})).worker_id for _ in range(2)} == {"a", "b"}


def test_routed_notification_carries_the_decision(hooks: InferaHooks) -> None:
    events: list[RoutedEvent] = []
    s = _sched(hooks, _table(("a", "m")), RouterConfig(preset="round-robin"), notify=events.append)
    s.schedule(_ctx())
    assert events[0].worker_id == "a" and events[0].policy == "round-robin" and events[0].request_id == "r1"


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("preset: nope\n", "unknown policy preset 'nope'"),
        ("picker: {name: nope}\n", "unknown picker 'nope'"),
        ("filters: [{name: role, params: {roles: [chef]}}]\n", "bad parameters for filter 'role'"),
        ("filters: [{name: health, params: {x: 1}}]\n", "takes no parameters"),
        ("preset: round-robin\npicker: {name: random}\n", "not both"),
        ("models: {m: {preset: nope}}\n", "models.m"),
        ("- a\n", "expected a mapping"),
        ("bogus: 1\n", "bogus"),
    ],
)
def test_bad_router_config_is_one_clear_error(
    hooks: InferaHooks, tmp_path: Path, yaml_text: str, needle: str
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as err:
        _sched(hooks, _table(("a", "m")), load_router_config(path))
    assert needle in str(err.value)


def test_endpoint_table_keeps_accounting_across_record_updates() -> None:
    table = _table(("a", "m"))
    ep: Endpoint = table.by_id["a"]
    ep.in_flight = 3
    table.put(WorkerRecord(worker_id="a", url="http://a", model="m", engine="sim", status=Status.DRAINING))
    assert table.by_id["a"] is ep and ep.in_flight == 3 and ep.record.status is Status.DRAINING
    table.remove("a")
    assert table.candidates("m") == [] and table.models() == []


def test_a_lora_adapter_is_routed_with_its_base_models_profile(hooks: InferaHooks, tmp_path: Path) -> None:
    """``models: {base: …}`` in the router config also routes the base model's LoRA adapters."""
    path = tmp_path / "router.yaml"
    path.write_text("scorers: [{name: least-load}]\nmodels:\n  rr-model: {preset: round-robin}\n")
    table = _table(("x", "rr-model"), ("y", "rr-model"), lora_adapters=["rr-lora"])
    s = _sched(hooks, table, load_router_config(path))
    table.by_id["x"].in_flight = 5  # least-load would always pick y; round robin ignores load

    def adapter_ctx() -> RequestContext:
        ctx = _ctx("rr-lora")
        ctx.lora, ctx.base_model = "rr-lora", table.base_of("rr-lora")
        return ctx

    assert [s.schedule(adapter_ctx()).worker_id for _ in range(2)] == ["x", "y"]


def test_a_continued_leg_keeps_the_adapter_and_the_kv_root() -> None:
    """A migration's or retry's new leg is hashed from the same root as the request it continues."""
    ctx = _ctx("rr-lora")
    ctx.lora, ctx.base_model, ctx.kv_root = "rr-lora", "rr-model", 1234
    ctx.session_key, ctx.client_request_id, ctx.token_ids = "s1", "c1", [1, 2, 3]
    leg = ctx.continued("r2", {"prompt": [1, 2, 3, 4]})
    assert (leg.request_id, leg.body, leg.token_ids) == ("r2", {"prompt": [1, 2, 3, 4]}, None)
    assert (leg.lora, leg.base_model, leg.kv_root) == ("rr-lora", "rr-model", 1234)
    assert (leg.model, leg.route, leg.session_key, leg.client_request_id) == (
        "rr-lora",
        ctx.route,
        "s1",
        "c1",
    )
