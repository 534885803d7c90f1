"""The example plugin passes Infera's scorer contract and scores labels as documented."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from infera_example_policy.plugin import PREFER_LABEL, PreferLabelParams, build_prefer_label
from pydantic import ValidationError

from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint, SchedulerDeps
from infera_core.testing.contracts import ScorerContract
from infera_core.worker import WorkerRecord


class TestPreferLabelContract(ScorerContract):
    factory = PREFER_LABEL
    params = {"key": "zone", "value": "a"}


class TestPreferLabelDefaultsContract(ScorerContract):
    factory = PREFER_LABEL


def _endpoint(worker_id: str, **labels: str) -> Endpoint:
    record = WorkerRecord(
        worker_id=worker_id, url=f"http://127.0.0.1/{worker_id}", model="m", engine="sim", labels=labels
    )
    return Endpoint(record)


def test_scores_matching_label_one_and_others_zero() -> None:
    scorer = build_prefer_label(PreferLabelParams(key="zone", value="a"), SchedulerDeps())
    ctx = RequestContext("r1", "m", "/v1/completions", {"model": "m", "prompt": "hi"})
    cands = [_endpoint("w1", zone="a"), _endpoint("w2", zone="b"), _endpoint("w3"), _endpoint("w4", zone="a")]
    assert scorer.score(ctx, cands) == [1.0, 0.0, 0.0, 1.0]


def test_params_are_validated() -> None:
    with pytest.raises(ValidationError):
        PREFER_LABEL.parse_params({"key": ""})
    with pytest.raises(ValidationError):
        PREFER_LABEL.parse_params({"colour": "red"})


def test_preset_is_registered(infera_hooks: Callable[..., InferaHooks]) -> None:
    hooks = infera_hooks(("example_policy", "infera_example_policy.plugin"), installed=False)
    preset = hooks.catalog().policies.preset("example-labelled")
    assert [f.name for f in preset.profile.filters] == ["health", "role"]
    assert [s.name for s in preset.profile.scorers] == ["prefer-label"]
    assert preset.profile.picker.name == "max-score"
