"""How the router routes each model's prompts, said once per model and kept visible.

A model's routing mode comes from its profile and whether the router has a routing
tokenizer for it (:meth:`~infera_core.scheduling.profile.Profile.routing_mode`):

* ``tokens`` — by token ids (the KV index: the engines' own cache);
* ``text`` — no routing tokenizer: by text prefix (``kv-aware``'s ``approximate-prefix``
  fallback, a prefix tree of this server's own decisions);
* ``load`` — no routing tokenizer and no text fallback in the profile: by load only.

When a model's mode is first known (its first worker joined) or changes, one log line
says so (WARNING when it is not ``tokens``, with what to do). The mode is on
``/v1/workers`` (``routing_mode`` per worker), in ``/v1/admin/stats`` (the dashboard) and
the gauge ``infera_routing_mode{model,mode}`` (1 for the current mode, 0 for the others).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from infera_core.scheduling.profile import Profile
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.server")

MODES = ("tokens", "text", "load")
_HOW = {
    "tokens": "by token ids (KV cache)",
    "text": "by text prefix (approximate: no routing tokenizer)",
    "load": "by load only (no routing tokenizer, and the policy has no text fallback)",
}


class RoutingModes(Collector):
    """See the module docstring. ``profile_for``: the scheduler's; ``missing``: why a model
    has no routing tokenizer (None: it has one), e.g. ``KvComponent.tokenizer_missing``."""

    def __init__(
        self,
        profile_for: Callable[[str], Profile],
        missing: Callable[[str], str | None] | None,
        models: Callable[[], Iterable[str]],
    ) -> None:
        self._profile_for = profile_for
        self._missing = missing
        self._models = models
        self.said: dict[str, str | None] = {}
        """model → the mode last logged."""

    def mode(self, model: str) -> str | None:
        """``tokens`` | ``text`` | ``load``, or None when the model's policy ignores the prompt."""
        profile = self._profile_for(model)
        if not profile.needs_tokens and not profile.text_fallback:
            return None
        tokenized = self._missing is not None and self._missing(model) is None
        return profile.routing_mode(tokenized)

    def on_worker_added(self, record: WorkerRecord) -> None:
        """Log the model's mode when it is first known or has changed (one line)."""
        model = record.model
        mode = self.mode(model)
        if model in self.said and self.said[model] == mode:
            return
        self.said[model] = mode
        if mode is None:
            return
        policy = self._profile_for(model).name
        if mode == "tokens":
            log.info("model %s: policy %s routes %s", model, policy, _HOW[mode])
            return
        why = self._missing(model) if self._missing is not None else "no KV routing on this server"
        log.warning(
            "model %s: policy %s routes %s (%s); give the router one: --tokenizer %s=hf:/path/to/model",
            model,
            policy,
            _HOW[mode],
            why,
            model,
        )

    def summary(self) -> str:
        """``tiny by text prefix`` for each served model not routed by tokens ('' if none)."""
        how = {"text": "by text prefix", "load": "by load only"}
        modes = self.snapshot()
        return ", ".join(f"{model} {how[mode]}" for model, mode in modes.items() if mode in how)

    def snapshot(self) -> dict[str, str | None]:
        """model → mode, for every served model."""
        return {model: self.mode(model) for model in sorted(self._models())}

    def collect(self) -> Iterable[Any]:
        gauge = GaugeMetricFamily(
            "infera_routing_mode",
            "How the router routes each model's prompts (1 for the current mode): tokens (by token ids, "
            "the KV cache), text (approximate prefix: no routing tokenizer), load (load only)",
            labels=["model", "mode"],
        )
        for model, mode in self.snapshot().items():
            if mode is None:
                continue
            for m in MODES:
                gauge.add_metric([model, m], 1.0 if m == mode else 0.0)
        yield gauge
