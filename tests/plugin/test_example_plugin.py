"""The out-of-tree example plugin is discovered, listed and usable like any third-party plugin."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, distribution

import pytest

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint, Filter, Picker, SchedulerDeps, Scorer
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.plugins import run_infera
from infera_core.worker import Role, WorkerRecord


@pytest.fixture(scope="module", autouse=True)
def _installed() -> None:
    try:
        distribution("infera-example-policy")
    except PackageNotFoundError:
        pytest.fail("infera-example-policy is not installed: run `bash scripts/setup-dev.sh`")


def test_listed_by_infera_run_plugins_with_distribution_and_version() -> None:
    proc = run_infera(["plugins", "--json"])
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    row = rows["example_policy"]
    assert row["status"] == "ok"
    assert row["distribution"] == "infera-example-policy" and row["version"] == "0.1.0"
    assert row["provides"] == {"policies": ["scorer:prefer-label"], "presets": ["example-labelled"]}


def test_policies_command_shows_scorer_schema_and_preset() -> None:
    proc = run_infera(["policies", "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    scorer = next(s for s in data["scorers"] if s["name"] == "prefer-label")
    assert scorer["distribution"] == "infera-example-policy"
    assert set(scorer["params_schema"]["properties"]) == {"key", "value"}
    preset = next(p for p in data["presets"] if p["name"] == "example-labelled")
    assert preset["profile"]["picker"]["name"] == "max-score"


def _endpoint(worker_id: str, role: Role = Role.MIXED, **labels: str) -> Endpoint:
    record = WorkerRecord(
        worker_id=worker_id,
        url=f"http://127.0.0.1/{worker_id}",
        model="m",
        engine="sim",
        role=role,
        labels=labels,
    )
    return Endpoint(record)


def test_preset_is_selectable_and_routes_to_the_labelled_worker() -> None:
    hooks = make_hooks(load_only=["example_policy"])  # core + the example, like a lean router
    preset = hooks.catalog().policies.preset("example-labelled")
    profile = preset.profile
    deps = SchedulerDeps()
    # every building block the preset names resolves, from core or the example plugin
    filters = [hooks.require("filter", f.name) for f in profile.filters]
    scorers = [(hooks.require("scorer", s.name), s) for s in profile.scorers]
    picker_factory = hooks.require("picker", profile.picker.name)
    built_filters: list[Filter] = []
    for factory in filters:
        obj = factory.build(factory.parse_params({}), deps)
        assert isinstance(obj, Filter)
        built_filters.append(obj)
    built_scorers: list[tuple[Scorer, float]] = []
    for factory, ref in scorers:
        obj = factory.build(factory.parse_params(ref.params), deps)
        assert isinstance(obj, Scorer)
        built_scorers.append((obj, ref.weight))
    picker = picker_factory.build(picker_factory.parse_params(profile.picker.params), deps)
    assert isinstance(picker, Picker)

    cands = [
        _endpoint("plain-1"),
        _endpoint("fav", preferred="true"),
        _endpoint("prefill-only", Role.PREFILL, preferred="true"),  # the role filter drops it
    ]
    ctx = RequestContext("r1", "m", "/v1/chat/completions", {"model": "m", "messages": []})
    for _ in range(5):
        kept = list(cands)
        for flt in built_filters:
            kept = flt.filter(ctx, kept)
        assert [e.worker_id for e in kept] == ["plain-1", "fav"]
        totals = [0.0] * len(kept)
        for scorer, weight in built_scorers:
            for i, s in enumerate(scorer.score(ctx, kept)):
                totals[i] += s * weight
        assert picker.pick(ctx, kept, totals).worker_id == "fav"
