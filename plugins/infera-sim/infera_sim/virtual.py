"""The sim engine on a virtual clock, for ``infera-run plan`` (:class:`VirtualEngines`).

The same :class:`SimEngine` scheduler, prefix cache and timing model as the served sim; the
caller advances time: :meth:`start_step` plans a step and says when it ends, :meth:`end_step`
runs it at that time. Nothing sleeps and no socket is opened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from infera_core.engines.timing import Finished, Publish, TimingProfile
from infera_sim.config import SimConfig, profile_defaults
from infera_sim.engine import SimEngine
from infera_sim.request import SimRequest
from infera_sim.tokenizer import SimTokenizer

_TOKENIZER: SimTokenizer | None = None


def _tokenizer() -> SimTokenizer:
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = SimTokenizer()
    return _TOKENIZER


def virtual_config(profile: TimingProfile, block_size: int, cache_blocks: int) -> SimConfig:
    """The sim configuration a profile describes, with ``block_size`` and ``cache_blocks`` as
    given (prompts of any length are accepted)."""
    names = {f.name for f in fields(SimConfig)}
    values = {k: v for k, v in profile_defaults(profile).items() if k in names}
    values.update(
        block_size=block_size, cache_blocks=cache_blocks, max_model_len=1 << 24, speedup=float("inf")
    )
    return SimConfig(**values)  # type: ignore[arg-type]


class VirtualSim:
    """One sim replica stepped by the caller."""

    __slots__ = ("_plan", "engine")

    def __init__(self, cfg: SimConfig, publish: Publish | None) -> None:
        self.engine = SimEngine(cfg, _tokenizer(), publish=publish)
        self._plan: list[tuple[SimRequest, int]] = []

    def submit(
        self, request_id: str, prompt: Sequence[int], max_tokens: int, now: float, received: int = 0
    ) -> None:
        eng = self.engine
        eng.sim_time = max(eng.sim_time, now)
        req = SimRequest(request_id, list(prompt), max_tokens, ignore_eos=True)
        req.stream = False
        if received:
            req.pd = {"received": received}
        eng.add(req)

    def start_step(self, now: float) -> float | None:
        eng = self.engine
        eng.sim_time = max(eng.sim_time, now)
        plan, duration = eng._plan()
        self._plan = plan
        return eng.sim_time + duration if plan else None

    def end_step(self, t: float) -> list[Finished]:
        eng = self.engine
        eng.sim_time = t
        plan, self._plan = self._plan, []
        eng._execute(plan, t)
        eng._flush_events()
        return [
            Finished(
                r.request_id,
                r.arrival,
                r.first_token_at if r.first_token_at is not None else t,
                t,
                r.num_generated,
                len(r.prompt),
                r.num_cached,
            )
            for r, _ in plan
            if r.done
        ]
