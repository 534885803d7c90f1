"""The worker record: what a launcher publishes about its engine, and what routers read.

Stored as JSON at ``<prefix><worker_id>`` (default prefix ``/infera/workers/``).
Versioned with ``schema_version``; readers ignore unknown fields so newer launchers
can add fields without breaking older routers.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
DEFAULT_PREFIX = "/infera/workers/"


DP_RANK_HEADER = "X-Data-Parallel-Rank"
"""The header that sends a request to one data-parallel rank of a worker that fronts several."""

GENERATE = "generate"
TASKS = (GENERATE, "embed", "score", "classify")
"""What a worker's model can serve (``WorkerRecord.tasks``), as vLLM names its supported tasks."""

TASK_ROUTES: dict[str, tuple[str, ...]] = {
    GENERATE: ("/v1/chat/completions", "/v1/completions"),
    "embed": ("/v1/embeddings",),
    "score": ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"),
    "classify": ("/classify",),
}
"""The routes an engine serves for each task (vLLM 0.32 mounts exactly these per supported task)."""


def tasks_of_routes(paths: Iterable[str]) -> list[str]:
    """The tasks an engine serving ``paths`` (its OpenAPI route list) offers, in :data:`TASKS` order."""
    have = set(paths)
    return [task for task in TASKS if any(route in have for route in TASK_ROUTES[task])]


def with_port_offset(endpoint: str, offset: int) -> str:
    """``endpoint`` (``tcp://host:port``) with its port moved by ``offset``: where DP rank
    ``offset`` of a worker publishes its KV events when ranks publish on consecutive ports."""
    if not offset:
        return endpoint
    head, _, port = endpoint.rpartition(":")
    return f"{head}:{int(port) + offset}"


class Role(StrEnum):
    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"


class Status(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"


class PriorityOrder(StrEnum):
    """How an engine orders its waiting requests by the body's integer ``priority`` (the worker
    record's ``priority``; None there: the engine does not schedule by priority, and the router
    never sends the field)."""

    LOWER_FIRST = "lower_first"
    """Smaller values first: vLLM ``--scheduling-policy priority``; SGLang
    ``--enable-priority-scheduling --schedule-low-priority-values-first``; the sim's
    ``--scheduling-policy priority``."""
    HIGHER_FIRST = "higher_first"
    """Larger values first: SGLang ``--enable-priority-scheduling`` alone."""


class KvEventsInfo(BaseModel):
    """Where and how a worker publishes KV cache events."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    endpoint: str
    """ZMQ endpoint a subscriber connects to, e.g. ``tcp://10.0.0.5:5557``."""
    format: str
    """Name of the KV event decoder plugin (``vllm``, ``sglang``…)."""
    block_size: int = Field(gt=0)
    replay_endpoint: str | None = None
    topic: str = "kv-events"
    fingerprint: str | None = None
    """Hash/tokenizer fingerprint, compared with the router's for that model."""
    port_per_dp_rank: bool = False
    """True when DP rank ``r`` of this endpoint publishes on ``endpoint``'s port + ``r``
    (SGLang DP-attention: one server, ``dp_size`` publishers); ``dp_rank`` in each batch says
    which rank sent it."""
    seq_frames: bool = True
    """False when the publisher sends ``[topic, payload]`` (or ``[payload]``) without vLLM's
    sequence frame (ATOM): the subscriber numbers batches itself, cannot see or replay a gap,
    and clears the view when the connection drops."""

    def endpoints(self, rank: int | None) -> tuple[str, str | None]:
        """The publisher and replay endpoints of DP rank ``rank`` (None: the worker's one
        publisher): rank ``r`` publishes on the ports ``r`` above ``endpoint``'s and
        ``replay_endpoint``'s when ``port_per_dp_rank``."""
        off = rank or 0
        replay = with_port_offset(self.replay_endpoint, off) if self.replay_endpoint else None
        return with_port_offset(self.endpoint, off), replay


class PdInfo(BaseModel):
    """Prefill/decode disaggregation: the transport protocol and its parameters."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    protocol: str
    """Name of the PD transport plugin (``vllm-nixl``, ``sglang-bootstrap``…)."""
    params: dict[str, Any] = Field(default_factory=dict)


class ModelCardRef(BaseModel):
    """Where a worker's model card is (:mod:`infera_core.tokenize.card`): its digest names it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    """``sha256:<hex>`` of the card's bytes; a router verifies what it fetches against it."""
    size: int = Field(ge=0)
    """The card's size in bytes (a router refuses one over its ``--card-max-bytes``)."""
    source: str = ""
    """Where the card is kept: ``etcd``, ``nats``, ``memory`` (the discovery backend that
    carries it), or ``engine`` when there is no card and the engine's ``/tokenize`` is the source."""


class WorkerRecord(BaseModel):
    """One engine endpoint in the fleet."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
    worker_id: str = Field(min_length=1)
    url: str = Field(min_length=1)
    """Base URL of the engine's OpenAI-compatible server, e.g. ``http://10.0.0.5:8000``."""
    model: str = Field(min_length=1)
    """The served model name clients put in ``model``."""
    engine: str
    engine_version: str | None = None
    role: Role = Role.MIXED
    status: Status = Status.ACTIVE
    dp_rank: int | None = None
    dp_size: int = 1
    kv_events: KvEventsInfo | None = None
    pd: PdInfo | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    started_at: float = Field(default_factory=time.time)
    request_transport: str = "http"
    """Name of the request transport that reaches this worker (``http``, ``nats``…; see
    :mod:`infera_core.transports.base`). A router without that transport logs it and does not
    route here."""
    request_params: dict[str, Any] = Field(default_factory=dict)
    """Parameters of the request transport (e.g. a NATS subject); empty for ``http``."""
    kv_event_transport: str = "zmq"
    """Name of the KV-event transport that carries this worker's ``kv_events`` (``zmq``,
    ``nats``…). A router without it logs it and routes the worker without KV events."""
    kv_event_params: dict[str, Any] = Field(default_factory=dict)
    """Parameters of the KV-event transport (e.g. a JetStream subject); empty for ``zmq``."""
    model_card: ModelCardRef | None = None
    """The model card the launcher published (tokenizer files, block size…); None when none."""
    lora_adapters: list[str] = Field(default_factory=list)
    """LoRA adapters the engine serves besides ``model`` (vLLM's ``--lora-modules`` names, its
    ``/v1/models`` entries with a ``parent``): requests naming one are routed here, hashed from
    the adapter's own KV root (:func:`infera_core.kv.hashing.namespace_root`)."""
    priority: PriorityOrder | None = None
    """Whether (and which way) the engine schedules its waiting requests by the request body's
    ``priority``: the router forwards the request's tier as that field to this worker only
    (a vLLM without ``--scheduling-policy priority`` refuses a non-zero one in older releases)."""

    tasks: list[str] = Field(default_factory=lambda: [GENERATE])
    """What the worker's model serves (:data:`TASKS`): ``generate`` (chat, completions,
    messages, responses), ``embed`` (``/v1/embeddings``), ``score`` (``/score``, ``/rerank``),
    ``classify`` (``/classify``). The launcher learns them from the engine's routes; a record
    without the field (an older launcher) generates only."""

    @property
    def generates(self) -> bool:
        """True when the worker serves generation (chat, completions…)."""
        return GENERATE in self.tasks

    @property
    def routable(self) -> bool:
        """True when the router may send new work here (active, not draining)."""
        return self.status is Status.ACTIVE

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> WorkerRecord:
        return cls.model_validate_json(data)
