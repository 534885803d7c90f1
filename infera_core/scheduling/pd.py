"""The PD profile handler: topology per model, then a prefill pick and a decode pick.

Topology is automatic: a model whose active fleet holds a prefill and a decode worker
that can pair (:func:`infera_core.engines.pd.check_pair`, and a PD transport installed for their
protocol) is served by pairs; otherwise by mixed workers. When it holds both pairs and mixed
workers, ``mode: auto`` decides per request from the predicted TTFT of each way
(:mod:`infera_core.scheduling.pd_auto`, settings in ``pd.auto``). A fleet with only one PD side
(or sides that cannot pair) and no mixed worker answers 503 with the reason. The router
config's ``pd:`` section can force ``mode: mixed`` or ``mode: pd`` per model::

    pd:
      mode: auto                      # auto | mixed | pd
      prefill: {preset: kv-aware-prefill}
      decode: {preset: least-load}
      max_pair_retries: 2
      max_decode_retries: 1
      auto: {min_pd_tokens: 256, overhead_ms: 5}
      models:
        big-model: {mode: pd, decode: {scorers: [{name: least-load}], filters: [{name: health}, {name: role}]}}

The prefill profile is cache-seeking (``kv-aware-prefill`` when a plugin provides it),
the decode profile load-driven (``kv-aware-decode`` or ``least-load``), each built once
like any profile. Only pairs that pass ``check_pair`` are ever formed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Container, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infera_core.engines.pd import PdPairError, check_pair
from infera_core.errors import ConfigError
from infera_core.request import RequestContext
from infera_core.scheduling.dp import DpRanks
from infera_core.scheduling.explain import Decision
from infera_core.scheduling.pd_auto import PdAutoParams, PdChoice, PdPredictor
from infera_core.scheduling.profile import Profile, build_profile
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.router_config import ProfileChoice
from infera_core.scheduling.scheduler import CandidateSource, NoWorkerError, OverloadedError, under_cap
from infera_core.scheduling.types import Endpoint, KvIndexView, LatencyStats, RoutedEvent, SchedulerDeps
from infera_core.worker import Role, WorkerRecord

PREFILL_PRESETS = ("kv-aware-prefill", "kv-aware", "least-load", "round-robin")
DECODE_PRESETS = ("kv-aware-decode", "least-load", "round-robin")


class PdMode(StrEnum):
    AUTO = "auto"
    MIXED = "mixed"
    PD = "pd"


class PdModelConfig(BaseModel):
    """PD settings of one model (or the defaults)."""

    model_config = ConfigDict(extra="forbid")

    mode: PdMode | None = None
    prefill: ProfileChoice | None = None
    decode: ProfileChoice | None = None


class PdConfig(PdModelConfig):
    """The router config's ``pd:`` section."""

    max_pair_retries: int = Field(2, ge=0, description="New pairs tried after a prefill failure.")
    max_decode_retries: int = Field(1, ge=0, description="Other decode workers tried (serial pull only).")
    auto: PdAutoParams = Field(default_factory=PdAutoParams)
    models: dict[str, PdModelConfig] = Field(default_factory=dict)


def parse_pd_config(raw: dict[str, Any] | None) -> PdConfig:
    try:
        return PdConfig.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise ConfigError(f"--router-config: pd.{loc}: {err.get('msg')}") from None


class Topology:
    """How one model is served right now: ``pd`` True/False, or ``error`` (a 503 message);
    ``per_request``: pairs and mixed workers both serve it, each request decides (``mode: auto``)."""

    __slots__ = ("error", "pd", "per_request")

    def __init__(self, pd: bool, error: str | None = None, per_request: bool = False) -> None:
        self.pd = pd
        self.error = error
        self.per_request = per_request


class Pair:
    __slots__ = ("decode", "decode_rank", "prefill", "prefill_rank")

    def __init__(
        self, prefill: Endpoint, decode: Endpoint, prefill_rank: int | None, decode_rank: int | None
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.prefill_rank = prefill_rank
        self.decode_rank = decode_rank


class _Plan:
    __slots__ = ("decode", "mode", "prefill")

    def __init__(self, mode: PdMode, prefill: Profile, decode: Profile) -> None:
        self.mode = mode
        self.prefill = prefill
        self.decode = decode


_Key = tuple[str, str | None, str]


def _key(rec: WorkerRecord) -> _Key:
    return rec.engine, rec.pd.protocol if rec.pd else None, rec.model


class PdScheduler:
    """Decides topology and picks prefill/decode pairs (no I/O)."""

    def __init__(
        self,
        source: CandidateSource,
        plans: dict[str, _Plan],
        default: _Plan,
        transports: Container[str],
        *,
        max_inflight: int = 0,
        kv_index: KvIndexView | None = None,
        observe: Callable[[str, float], None] | None = None,
        notify: Callable[[RoutedEvent], None] | None = None,
        predictor: PdPredictor | None = None,
    ) -> None:
        self.source = source
        self.plans = plans
        self.default = default
        self.transports = transports
        self.max_inflight = max_inflight
        self.kv_index = kv_index
        self._observe = observe
        self._notify = notify
        self._topo: dict[str, tuple[list[Endpoint], Topology]] = {}
        self._compat: dict[tuple[_Key, _Key], str | None] = {}
        self.dp = DpRanks(kv_index)
        self.predictor = predictor or PdPredictor(PdAutoParams(), LatencyStats(), kv_index, time.monotonic)

    def plan(self, model: str) -> _Plan:
        return self.plans.get(model, self.default)

    def needs_tokens(self, model: str) -> bool:
        plan = self.plan(model)
        return plan.prefill.needs_tokens or plan.decode.needs_tokens

    # -- topology ----------------------------------------------------------------
    def incompatibility(self, prefill: WorkerRecord, decode: WorkerRecord) -> str | None:
        """Why these two cannot pair (None when they can). Cached per engine/protocol/model."""
        key = (_key(prefill), _key(decode))
        if key in self._compat:
            return self._compat[key]
        reason: str | None
        try:
            check_pair(prefill, decode)
            proto = prefill.pd.protocol if prefill.pd else ""
            reason = None if proto in self.transports else f"no PD transport {proto!r} is installed"
        except PdPairError as exc:
            reason = str(exc)
        self._compat[key] = reason
        return reason

    def topology(self, model: str) -> Topology:
        """Cached until the fleet of ``model`` changes (the table rebuilds its lists)."""
        candidates = self.source.candidates(model)
        hit = self._topo.get(model)
        if hit is not None and hit[0] is candidates:
            return hit[1]
        topo = self._compute(model, candidates)
        self._topo[model] = (candidates, topo)
        return topo

    def _compute(self, model: str, candidates: list[Endpoint]) -> Topology:
        mode = self.plan(model).mode
        if mode is PdMode.MIXED:
            return Topology(False)
        prefill = [ep for ep in candidates if ep.record.routable and ep.role is Role.PREFILL]
        decode = [ep for ep in candidates if ep.record.routable and ep.role is Role.DECODE]
        mixed = any(ep.record.routable and ep.role is Role.MIXED for ep in candidates)
        why = self._why_no_pair(prefill, decode)
        if why is None:
            return Topology(True, per_request=mode is PdMode.AUTO and mixed)
        if mode is PdMode.PD:
            return Topology(True, f"model {model!r} is set to PD (router config pd.mode) but {why}")
        if mixed or not (prefill or decode):
            return Topology(False)
        return Topology(True, f"model {model!r} has no mixed worker and {why}")

    def _why_no_pair(self, prefill: list[Endpoint], decode: list[Endpoint]) -> str | None:
        if not prefill:
            shown = ", ".join(ep.worker_id for ep in decode)
            return "no prefill worker is active" + (f" (decode workers: {shown})" if shown else "")
        if not decode:
            shown = ", ".join(ep.worker_id for ep in prefill)
            return f"no decode worker is active (prefill workers: {shown})"
        groups = self._groups(decode)
        reason = ""
        for p in prefill:
            for rep in groups.values():
                r = self.incompatibility(p.record, rep[0].record)
                if r is None:
                    return None
                reason = r
        return f"no prefill/decode pair can be formed: {reason}"

    @staticmethod
    def _groups(eps: Sequence[Endpoint]) -> dict[_Key, list[Endpoint]]:
        out: dict[_Key, list[Endpoint]] = {}
        for ep in eps:
            out.setdefault(_key(ep.record), []).append(ep)
        return out

    # -- per request: a pair or local prefill ----------------------------------------
    def choose(self, ctx: RequestContext) -> PdChoice:
        """For a model served by both (:attr:`Topology.per_request`): the pair when its
        predicted TTFT beats the best mixed worker's (recorded in ``ctx.explain`` as ``pd``)."""
        candidates = self.source.candidates(ctx.model)
        mixed = [ep for ep in candidates if ep.record.routable and ep.role is Role.MIXED]
        groups = self._groups([ep for ep in candidates if ep.record.routable and ep.role is Role.DECODE])
        prefill = [
            ep
            for ep in candidates
            if ep.record.routable
            and ep.role is Role.PREFILL
            and any(self.incompatibility(ep.record, g[0].record) is None for g in groups.values())
        ]
        choice = self.predictor.decide(ctx, mixed, prefill)
        if isinstance(ctx.explain, Decision):
            ctx.explain.pd = choice.as_dict()
        return choice

    def transferred(self, ctx: RequestContext, seconds: float) -> None:
        """The transfer phase of a PD request (prefill answered → decode's headers), to learn its cost."""
        self.predictor.transferred(ctx, seconds)

    # -- picks ---------------------------------------------------------------------
    def pick_pair(
        self, ctx: RequestContext, exclude_prefill: Collection[str] = (), exclude_decode: Collection[str] = ()
    ) -> Pair:
        """A compatible (prefill, decode) pair; :class:`NoWorkerError` / :class:`OverloadedError`."""
        t0 = time.perf_counter()
        plan = self.plan(ctx.model)
        candidates = self.source.candidates(ctx.model)
        decode_all = [
            ep for ep in candidates if ep.role is Role.DECODE and ep.worker_id not in exclude_decode
        ]
        groups = self._groups(decode_all)
        prefill = [
            ep
            for ep in candidates
            if ep.role is Role.PREFILL
            and ep.worker_id not in exclude_prefill
            and any(self.incompatibility(ep.record, g[0].record) is None for g in groups.values())
        ]
        skip: list[str] = []
        decode_error: NoWorkerError | OverloadedError | None = None
        while True:
            ctx.role = Role.PREFILL
            try:
                p = self._pick(
                    plan.prefill, ctx, [ep for ep in prefill if ep.worker_id not in skip], "prefill"
                )
            except (NoWorkerError, OverloadedError):
                if decode_error is not None:
                    raise decode_error from None
                raise
            ctx.role = Role.DECODE
            compatible = [
                ep for g in groups.values() if self.incompatibility(p.record, g[0].record) is None for ep in g
            ]
            try:
                d = self._pick(plan.decode, ctx, compatible, "decode")
            except (NoWorkerError, OverloadedError) as exc:
                plan.prefill.finished(ctx, p, False)  # picked (on_routed) but never sent
                decode_error = exc
                skip.append(p.worker_id)
                continue
            break
        pair = Pair(p, d, self._rank(p, ctx), self._rank(d, ctx))
        self.predictor.routed(ctx, p)
        p.picks += 1
        d.picks += 1
        elapsed = time.perf_counter() - t0
        if self._observe is not None:
            self._observe("pd", elapsed)
        if self._notify is not None:
            self._notify(RoutedEvent(ctx.request_id, ctx.model, p.worker_id, d.worker_id, "pd", elapsed))
        return pair

    def pick_decode(
        self, ctx: RequestContext, prefill: Endpoint, exclude: Collection[str]
    ) -> tuple[Endpoint, int | None]:
        """Another decode worker compatible with ``prefill`` (serial-pull retries)."""
        ctx.role = Role.DECODE
        compatible = [
            ep
            for ep in self.source.candidates(ctx.model)
            if ep.role is Role.DECODE
            and ep.worker_id not in exclude
            and self.incompatibility(prefill.record, ep.record) is None
        ]
        d = self._pick(self.plan(ctx.model).decode, ctx, compatible, "decode")
        d.picks += 1
        return d, self._rank(d, ctx)

    def _pick(self, profile: Profile, ctx: RequestContext, eps: list[Endpoint], side: str) -> Endpoint:
        eps = profile.filter(ctx, eps) if eps else eps
        if not eps:
            raise NoWorkerError(f"no routable {side} worker for model {ctx.model!r}")
        cap = self.max_inflight
        if cap > 0:
            eps = under_cap(eps, cap)
            if not eps:
                raise OverloadedError(f"every {side} worker for model {ctx.model!r} is at its in-flight cap")
        return profile.pick(ctx, eps)

    def _rank(self, ep: Endpoint, ctx: RequestContext | None) -> int | None:
        """The DP rank to steer to on a DP-attention endpoint (one URL, ``dp_size`` ranks): the
        rank holding the longest prefix, else in turn (:class:`DpRanks`). Decode ranks too: an
        SGLang decode worker with its radix cache (``--disaggregation-decode-enable-radix-cache``)
        reuses what it holds and the prefill sends only the rest."""
        return self.dp.choose(ep, ctx)

    def finished(self, ctx: RequestContext, ep: Endpoint, ok: bool) -> None:
        plan = self.plan(ctx.model)
        if ep.role is Role.PREFILL:
            self.predictor.prefill_done(ctx, ep, ok)
        else:
            self.predictor.forget(ctx)
        (plan.prefill if ep.role is Role.PREFILL else plan.decode).finished(ctx, ep, ok)


def _first_preset(registry: PolicyRegistry, names: Sequence[str]) -> ProfileChoice:
    installed = set(registry.preset_names())
    for name in names:
        if name in installed:
            return ProfileChoice(preset=name)
    return ProfileChoice(preset=names[-1])


def build_pd_scheduler(
    source: CandidateSource,
    raw_config: dict[str, Any] | None,
    registry: PolicyRegistry,
    deps: SchedulerDeps,
    transports: Container[str],
    *,
    max_inflight: int = 0,
    observe: Callable[[str, float], None] | None = None,
    notify: Callable[[RoutedEvent], None] | None = None,
) -> tuple[PdScheduler, PdConfig]:
    """Build the PD profiles once (bad names/params raise :class:`ConfigError` at start-up)."""
    cfg = parse_pd_config(raw_config)
    prefill_default = cfg.prefill or _first_preset(registry, PREFILL_PRESETS)
    decode_default = cfg.decode or _first_preset(registry, DECODE_PRESETS)

    def plan(where: str, m: PdModelConfig) -> _Plan:
        pchoice, dchoice = m.prefill or prefill_default, m.decode or decode_default
        plabel, pcfg = pchoice.resolve(registry, f"{where}.prefill")
        dlabel, dcfg = dchoice.resolve(registry, f"{where}.decode")
        return _Plan(
            m.mode or cfg.mode or PdMode.AUTO,
            build_profile(f"pd-prefill:{plabel}", pcfg, registry, deps, f"{where}.prefill"),
            build_profile(f"pd-decode:{dlabel}", dcfg, registry, deps, f"{where}.decode"),
        )

    default = plan("router pd", cfg)
    plans = {model: plan(f"router pd.models.{model}", m) for model, m in cfg.models.items()}
    clock = deps.clock or time.monotonic
    sched = PdScheduler(
        source,
        plans,
        default,
        transports,
        max_inflight=max_inflight,
        kv_index=deps.kv_index,
        observe=observe,
        notify=notify,
        predictor=PdPredictor(cfg.auto, deps.latency, deps.kv_index, clock),
    )
    return sched, cfg
