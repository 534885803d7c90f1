"""The engine adapter contract: how the launcher starts and watches one engine.

An adapter is a small object registered by an engine plugin through
``infera_register_engines``. The launcher runtime (engine-agnostic) asks it for the
argv/env to spawn, polls its readiness check, asks it for the in-flight count while
draining, and asks it which worker-record fields (KV events, PD) to publish.
Adapters never import their engine package.

Adapters keep no state of their own: everything about one launch lives in its
:class:`LaunchContext` (``ctx.ports`` holds the ports the adapter picked, so
``build_launch``, ``record_fields`` and the checks agree), what ``build_launch`` found
goes in the :class:`LaunchSpec` (``engine_version``), and the checks on the running
engine (``is_ready``, ``in_flight``, ``health_generate``, ``served_block_size``) get one
:class:`RunningEngine` carrying that context, the launcher's HTTP client and the base URL.

An adapter may also implement :class:`HealthGenerate` (a one-token generation the
launcher sends at an interval to prove the engine still answers); without it the
launcher POSTs a ``max_tokens=1`` completion to ``/v1/completions``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from infera_core.errors import PluginError
from infera_core.registry import Registry
from infera_core.worker import KvEventsInfo, PdInfo, PriorityOrder, Role

if TYPE_CHECKING:  # httpx costs ~0.4 s to import: only the launcher's probes need it
    import httpx


@dataclass(frozen=True, slots=True)
class EngineOption:
    """An engine-specific Infera flag (e.g. ``--block-size`` for vLLM).

    Shown by ``infera-run worker <engine> --help`` and ``infera-run engines``; parsed
    by the launcher and handed to the adapter in ``LaunchContext.options[name]``.
    ``name`` is the python identifier (``block_size``); the flag is ``--block-size``
    and the env var ``INFERA_<NAME>``.
    """

    name: str
    type: type = str
    default: Any = None
    help: str = ""
    is_flag: bool = False
    choices: Sequence[str] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def envvar(self) -> str:
        return "INFERA_" + self.name.upper()


@dataclass(frozen=True, slots=True)
class FlagAlias:
    """An engine's own spelling of a setting Infera manages (e.g. vLLM ``--tensor-parallel-size``).

    ``target`` is the Infera flag it stands for (``--tp``, ``--port``, ``--role``), or ``""``
    when Infera always does it (the flag is accepted and dropped, e.g. ``--enable-kv-events``).
    ``values`` translates engine values to Infera's (SGLang ``--disaggregation-mode null``
    → ``--role mixed``). Adapters list them in :meth:`FlagAliases.flag_aliases`; the
    ``python -m infera.engine.<name>`` form and flags after ``--`` accept them.
    """

    target: str
    takes_value: bool = True
    values: Mapping[str, str] | None = None


@dataclass(slots=True)
class LaunchContext:
    """Everything an adapter needs to build the engine command line."""

    worker_id: str
    model: str
    """Served model name (what clients send as ``model``)."""
    model_path: str | None
    """Weights path or hub id; defaults to ``model`` when not given."""
    role: Role
    host: str
    """Address the engine binds to."""
    port: int
    advertise_host: str
    """Address other machines use to reach this worker."""
    engine_args: list[str] = field(default_factory=list)
    """Flags after ``--``, passed through to the engine unchanged."""
    options: dict[str, Any] = field(default_factory=dict)
    """Values of the adapter's own :class:`EngineOption` flags."""
    engine_python: str | None = None
    """Interpreter of the engine's own venv (``--engine-python``), if any."""
    free_port: Callable[[], int] = lambda: 0
    """Returns a free TCP port on this machine (for KV events, bootstrap…)."""
    dp_rank: int | None = None
    dp_size: int = 1
    discovery: str | None = None
    """Name of the discovery backend the launcher registers with (``etcd``, ``memory``…), if known."""
    ports: dict[str, int] = field(default_factory=dict)
    """Ports the adapter picked for this launch, by name (``{"kv": 5557, …}``): pick them once,
    on first use, and read them from here, so ``build_launch``, ``record_fields`` and the
    checks on the running engine agree. Empty at the start of each launch."""
    hooks: TransferHooks | None = None
    """The loaded plugins (the launcher sets it): adapters ask them for KV transfer connectors
    and let them amend the transfer plan (:mod:`infera_core.engines.transfer`). None: built-ins only."""
    kv_transfer: TransferPlan | None = None
    """This launch's KV transfer plan once built (:func:`infera_core.engines.transfer.resolve_plan`)."""

    @property
    def url(self) -> str:
        host = self.advertise_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 literal
        return f"http://{host}:{self.port}"

    @property
    def served_path(self) -> str:
        return self.model_path or self.model


@dataclass(slots=True)
class LaunchSpec:
    """The engine subprocess to spawn. Broadcast hooks may mutate it in place."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables (merged over the launcher's environment)."""
    cwd: str | None = None
    engine_version: str | None = None
    """The engine's version, when ``build_launch`` learned it (e.g. by probing the engine's
    interpreter); the worker record carries it unless ``record_fields`` names one."""


@dataclass(frozen=True, slots=True)
class RunningEngine:
    """One launched engine, as the adapter's checks on it see it.

    ``is_ready``, ``in_flight``, ``health_generate`` and ``served_block_size`` receive one:
    ``engine.client`` (the launcher's ``httpx.AsyncClient``, 5 s timeout), ``engine.url``
    (the engine's base URL, ``ctx.url`` unless given) and ``engine.ctx`` (the launch
    context: options, ports the adapter picked, role…).
    """

    ctx: LaunchContext
    client: httpx.AsyncClient
    url: str = ""

    def __post_init__(self) -> None:
        if not self.url:
            object.__setattr__(self, "url", self.ctx.url)

    @property
    def model(self) -> str:
        """The served model name (what a generation check sends as ``model``)."""
        return self.ctx.model


@dataclass(slots=True)
class RecordFields:
    """Worker-record fields an adapter fills after building the launch."""

    engine_version: str | None = None
    kv_events: KvEventsInfo | None = None
    pd: PdInfo | None = None
    dp_rank: int | None = None
    dp_size: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    tasks: list[str] | None = None
    """What the model serves (``WorkerRecord.tasks``) when the launch says so; None: the
    launcher learns it from the engine (its routes), else ``generate``."""
    priority: PriorityOrder | None = None
    """How the engine schedules by the body's ``priority`` (None: it does not)."""


@runtime_checkable
class EngineAdapter(Protocol):
    """What an engine plugin provides. See ``docs/reference/hooks.md`` for a full example."""

    @property
    def name(self) -> str:
        """Engine name used on the command line (``vllm``, ``sglang``, ``sim``…)."""
        ...

    @property
    def description(self) -> str: ...

    @property
    def package_hint(self) -> str:
        """What to install when the engine binary is missing (e.g. ``pip install vllm``)."""
        ...

    def options(self) -> Sequence[EngineOption]:
        """Engine-specific Infera flags."""
        ...

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        """Return the argv/env that starts the engine. Raise ``EngineError`` for bad input."""
        ...

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        """Worker-record fields (KV events endpoint, PD params…) for this launch."""
        ...

    async def is_ready(self, engine: RunningEngine) -> bool:
        """True once the engine serves requests (usually ``GET /health`` is 200).

        Polled every 0.2 s until ready, then every ``--health-interval`` while serving; an
        exception counts as not ready."""
        ...

    async def in_flight(self, engine: RunningEngine) -> int | None:
        """Requests running or waiting in the engine, or None when unknown.

        Polled while draining: the engine stops once it is 0. None (or an exception) means
        unknown, and the drain then waits the whole ``--drain-timeout``."""
        ...


@runtime_checkable
class HealthGenerate(Protocol):
    """Optional adapter method: prove the engine still generates (like SGLang's ``/health_generate``).

    The launcher calls it every ``--health-generate-interval`` seconds under a
    ``--health-generate-timeout`` deadline; adapters without it get
    :func:`infera_core.launcher.health.default_health_generate`.
    """

    async def health_generate(self, engine: RunningEngine) -> bool:
        """True when the engine answered a one-token generation (False or an exception: it failed)."""
        ...


@runtime_checkable
class KvEventPoller(Protocol):
    """Optional adapter method: the engine hands out its KV events when asked, instead of
    publishing them (TensorRT-LLM's ``POST /kv_cache_events``, which takes what it returns).

    The launcher — the engine's one reader — calls it in a loop once the engine serves and
    publishes each payload on the ZMQ endpoints of ``record_fields().kv_events`` (which must
    name free ports the engine does not bind), with sequence numbers and a replay buffer
    (:mod:`infera_core.launcher.kv_poll`); routers subscribe as to any publisher and decode
    with the ``kv_events.format`` decoder.
    """

    async def poll_kv_events(self, engine: RunningEngine) -> list[bytes]:
        """The batches new since the last call, each one payload for the ``kv_events.format``
        decoder; ``[]`` when there is none. An exception is logged and the poll retried."""
        ...


@runtime_checkable
class FlagAliases(Protocol):
    """Optional adapter method: engine spellings of what Infera manages (see :class:`FlagAlias`)."""

    def flag_aliases(self) -> Mapping[str, FlagAlias]: ...


@runtime_checkable
class ServedBlockSize(Protocol):
    """Optional adapter method: the KV block size the running engine really uses.

    Called once the engine is ready, before the worker registers; the answer replaces
    ``kv_events.block_size`` in the worker record (None: keep what ``record_fields`` said).
    """

    async def served_block_size(self, engine: RunningEngine) -> int | None: ...


def option_clashes(adapter: EngineAdapter, taken: Collection[str]) -> list[str]:
    """The adapter's options spelled like one of Infera's launcher flags (``taken``), as
    ``"--port (Infera's --port)"``: Infera's flag would win and the option could never be set."""
    out = []
    for opt in adapter.options():
        hit = next((f for f in (opt.flag, f"--no-{opt.flag[2:]}") if f in taken), None)
        if hit is not None:
            out.append(f"{opt.flag} (Infera's {hit})")
    return out


OPTION_CLASH_HINT = (
    "rename them (e.g. --engine-port) or read Infera's value from the LaunchContext "
    "(ctx.port, ctx.model, ctx.role…)"
)


class EngineRegistry(Registry[EngineAdapter]):
    kind = "engine"
    protocol = EngineAdapter

    def check_options(self, taken: Collection[str], distributions: Mapping[str, str | None]) -> None:
        """Refuse (:class:`PluginError`) an engine whose options are spelled like Infera's
        launcher flags ``taken`` (:func:`infera_core.launcher.flags.launcher_flags`), naming
        its plugin and ``distributions[plugin]``. Run once every plugin is collected, since
        discovery backends and transports add launcher flags of their own."""
        for entry in self.entries():
            try:
                clashes = option_clashes(entry.obj, taken)
            except Exception as exc:
                raise PluginError(
                    f"plugin {entry.owner!r}: engine {entry.name!r} options() failed: {type(exc).__name__}: {exc}"
                ) from exc
            if clashes:
                dist = distributions.get(entry.owner)
                raise PluginError(
                    f"plugin {entry.owner!r}{f' (distribution {dist})' if dist else ''} registered engine "
                    f"{entry.name!r} with options named like Infera's own flags: {', '.join(clashes)}; "
                    f"Infera's flag would win and the option could never be set: {OPTION_CLASH_HINT}"
                )


# The KV transfer contract (a connector builds a launch's plan; plugins amend it). It lives
# here because a LaunchContext carries its plan and the hooks that resolve it;
# infera_core.engines.transfer resolves plans and re-exports these names.


@dataclass(slots=True)
class TransferPlan:
    """The KV transfer setup of one launch, built by a connector and amended by plugins.

    The adapter renders it: ``config`` (when not empty) as the engine's
    ``--kv-transfer-config`` JSON (vLLM, ATOM), ``flags`` appended to the engine argv
    (SGLang's ``--disaggregation-*``), ``env`` merged into the engine environment, and
    ``pd`` published in the worker record (the router picks the PD transport by
    ``pd.protocol``; None on a mixed worker).
    """

    engine: str
    role: Role
    connector: str | None
    """Registry name of the connector (``nixl``, ``moriio``…); None: no PD connector."""
    config: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    pd: PdInfo | None = None

    def config_json(self) -> str:
        """``config`` as compact JSON (what ``--kv-transfer-config`` takes)."""
        return json.dumps(self.config, separators=(",", ":"))


@runtime_checkable
class TransferConnector(Protocol):
    """One way an engine moves KV for PD (registered per engine)."""

    @property
    def engine(self) -> str:
        """The engine adapter's name (``vllm``, ``sglang``, ``atom``…)."""
        ...

    @property
    def name(self) -> str:
        """Infera's name for it (``--pd-connector nixl``); unique per engine."""
        ...

    @property
    def native(self) -> tuple[str, ...]:
        """The engine's own spellings (vLLM ``kv_connector`` class names) that select it."""
        ...

    @property
    def description(self) -> str: ...

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        """The plan for ``ctx.role`` (prefill or decode), merged with the user's config.

        ``user`` is the user's ``--kv-transfer-config`` object ({} when none); raise
        :class:`~infera_core.errors.EngineError` (one line) when it contradicts the role.
        Reserve ports with ``ctx.free_port`` (``engine_support.free_ports``).
        """
        ...


class TransferConnectorRegistry(Registry[TransferConnector]):
    """Connectors keyed ``engine:name``; :meth:`for_engine` lists one engine's."""

    kind = "KV transfer connector"
    protocol = TransferConnector

    def add(self, obj: TransferConnector) -> None:
        self._check(obj)
        self._add(f"{obj.engine}:{obj.name}", obj)

    def for_engine(self, engine: str) -> dict[str, TransferConnector]:
        """``name → connector`` for one engine, sorted by name."""
        prefix = engine + ":"
        return {n.split(":", 1)[1]: self.get(n) for n in self.names() if n.startswith(prefix)}


class TransferHooks(Protocol):
    """What the transfer resolution needs from the loaded plugins (``InferaHooks``)."""

    def transfer_connectors(self, engine: str) -> dict[str, TransferConnector]: ...

    def amend_kv_transfer(self, context: LaunchContext, plan: TransferPlan) -> None: ...
