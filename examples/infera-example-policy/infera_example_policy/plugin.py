"""Hook implementations of the example plugin (entry point ``example_policy``)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from infera_core.plugin.spec import hookimpl
from infera_core.request import RequestContext
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, PolicyFactory, SchedulerDeps, Scorer


class PreferLabelParams(BaseModel):
    """Parameters of ``prefer-label``."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field("preferred", min_length=1, description="Worker label to look at.")
    value: str = Field("true", description="Label value that earns the full score.")


class PreferLabelScorer(Scorer):
    """1.0 for workers labelled ``key=value``, else 0.0. Reads the record only: no I/O."""

    name = "prefer-label"
    __slots__ = ("key", "value")

    def __init__(self, key: str, value: str) -> None:
        self.key = key
        self.value = value

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        key, value = self.key, self.value
        return [1.0 if ep.record.labels.get(key) == value else 0.0 for ep in candidates]


def build_prefer_label(params: PreferLabelParams, deps: SchedulerDeps) -> PreferLabelScorer:
    return PreferLabelScorer(params.key, params.value)


PREFER_LABEL = PolicyFactory(
    name="prefer-label",
    kind="scorer",
    build=build_prefer_label,
    params=PreferLabelParams,
    description="Prefer workers whose labels contain key=value (1.0), others 0.0.",
)

EXAMPLE_LABELLED = ProfileConfig(
    filters=[PluginRef(name="health"), PluginRef(name="role")],
    scorers=[ScorerRef(name="prefer-label", weight=1.0)],
    picker=PluginRef(name="max-score"),
)


@hookimpl
def infera_register_policies(registry: PolicyRegistry) -> None:
    registry.add(PREFER_LABEL)
    registry.add_preset(
        "example-labelled",
        EXAMPLE_LABELLED,
        "Healthy serving workers of the model (no prefill/decode-only); prefer those labelled preferred=true.",
    )
