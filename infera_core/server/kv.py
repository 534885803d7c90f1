"""The server's KV seam: what KV-aware routing plugs into ``create_app(..., kv=…)``.

:class:`infera_core.kv.component.KvRouting` is the implementation (event hub, index,
routing tokenizers, agreement check); the server only knows this Protocol, so every
call it makes on the component is type-checked.
"""

from __future__ import annotations

from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from infera_core.kv.index import KvIndex
from infera_core.request import RequestContext
from infera_core.tokenize.base import Tokenizer
from infera_core.worker import WorkerRecord


class KvComponent(Protocol):
    """See the module docstring. ``index`` goes to policies as ``SchedulerDeps.kv_index``; fleet
    changes arrive through ``on_worker_added`` / ``on_worker_removed``; the lifespan runs
    ``start`` / ``stop``."""

    @property
    def index(self) -> KvIndex: ...

    def on_worker_added(self, record: WorkerRecord) -> None: ...

    def on_worker_removed(self, record: WorkerRecord) -> None: ...

    def use_card_store(self, store: object) -> None:
        """Fetch model cards from ``store`` (the discovery backend) when it keeps them."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def stop_following(self) -> None:
        """Stop following KV events (before the engines stop)."""
        ...

    async def start_transport(self, kind: str) -> None:
        """Start the router side of KV-event transport ``kind`` now (``serve --kv-event-transport``)."""
        ...

    async def prepare(self, ctx: RequestContext) -> None:
        """Tokenize ``ctx`` for routing before scheduling, when a scorer needs token ids."""
        ...

    def register_metrics(self, registry: CollectorRegistry) -> None: ...

    def tokenizer_missing(self, model: str) -> str | None:
        """Why ``model`` has no routing tokenizer (None: it has one)."""
        ...

    def tokenizer(self, model: str) -> Tokenizer | None:
        """``model``'s routing tokenizer (configured or from its model card), None without one."""
        ...

    def worker_fields(self, worker_id: str) -> dict[str, Any]:
        """Extra ``/v1/workers`` fields for one worker."""
        ...

    def cache_view(self, worker_id: str) -> dict[str, Any]:
        """``GET /v1/admin/cache-view/{worker_id}``: the worker's mirrored cache."""
        ...
