"""KV-aware routing as one server component: event hub + routing tokenizers + agreement check.

Plugs into ``create_app(..., kv=KvRouting(...))`` (the server's ``KvComponent`` seam):
``index`` goes to policies as ``SchedulerDeps.kv_index``, fleet changes arrive through
``on_worker_added`` / ``on_worker_removed``, the lifespan runs ``start`` / ``stop``, and
``prepare(ctx)`` fills the request's token ids before scheduling when a scorer needs them.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from infera_core.config.backends import BackendOptions
from infera_core.discovery.base import CardStore
from infera_core.kv import accel
from infera_core.kv.agreement import AgreementCheck, parse_block_sizes
from infera_core.kv.catalog import KvCatalog
from infera_core.kv.hub import KvHub
from infera_core.kv.index import KvIndex
from infera_core.kv.settings import KvSettings
from infera_core.request import RequestContext
from infera_core.tokenize.base import Tokenizer
from infera_core.tokenize.cards import ModelCards
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.tokenize.specs import parse_model_specs
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.kv")


class KvRouting:
    """See the module docstring. Configuration errors raise ``ConfigError`` here."""

    def __init__(
        self,
        catalog: KvCatalog,
        settings: KvSettings | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings = settings or KvSettings()
        self.hub = KvHub(catalog, None, settings, thread=True)
        self.tokens = RoutingTokenizers(
            catalog.tokenizers,
            parse_model_specs(settings.tokenizer),
            cache_size=settings.tokenize_cache_size,
            offload_chars=settings.tokenize_offload_chars,
            prefix_cache_bytes=int(settings.tokenize_prefix_cache_mb * (1 << 20)),
            prefix_wait_ms=settings.tokenize_prefix_wait_ms,
            cache_bytes=int(settings.tokenize_cache_mb * (1 << 20)),
            max_chars=settings.tokenize_max_chars,
            max_tokens=settings.routing_max_tokens,
            warn_interval_s=settings.tokenize_warn_interval_s,
            cards=ModelCards(
                cache_dir=settings.card_cache_dir,
                max_bytes=settings.card_max_bytes,
                timeout_s=settings.card_fetch_timeout_s,
            ),
        )
        self.tokens.check_all()
        self.agreement = AgreementCheck(self.tokens, parse_block_sizes(settings.kv_block_size))
        self.hub.metrics.extra += [self.tokens, self.agreement]
        self.metrics = self.hub.metrics
        if registry is not None:
            self.register_metrics(registry)

    @property
    def index(self) -> KvIndex:
        return self.hub.index

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.hub.metrics.register(registry)

    async def start(self) -> None:
        if accel.ops.name == "native":
            log.debug("KV index hot loops: native (infera-kv-native)")
        else:
            log.warning(
                "KV index hot loops: pure Python (%s): KV event ingest runs about five times slower",
                "INFERA_KV_NATIVE=0"
                if accel.native_ops()
                else "infera-kv-native was built without a C compiler",
            )
        await self.hub.start()

    def use_card_store(self, store: object) -> None:
        """Fetch model cards from ``store`` (the server's discovery backend, when it keeps cards)."""
        self.tokens.cards.store = store if isinstance(store, CardStore) else None

    async def stop(self) -> None:
        await self.tokens.cards.close()
        await self.tokens.engine.close()
        await self.hub.close()

    async def stop_following(self) -> None:
        """Stop following KV events before the engines stop (see :meth:`KvHub.stop_following`)."""
        await self.hub.stop_following()

    async def start_transport(self, kind: str) -> None:
        """Start the router side of KV-event transport ``kind`` now (one error line if it cannot)."""
        await self.hub.start_source(kind)

    def on_worker_added(self, record: WorkerRecord) -> None:
        self.tokens.observe_worker(record)
        if self.agreement.check(record):
            self.index.untrusted.add(record.worker_id)
        else:
            self.index.untrusted.discard(record.worker_id)
        self.hub.worker_added(record)

    def on_worker_removed(self, record: WorkerRecord) -> None:
        self.tokens.forget_worker(record)
        self.agreement.forget(record.worker_id)
        self.index.untrusted.discard(record.worker_id)
        self.hub.worker_removed(record.worker_id)

    async def prepare(self, ctx: RequestContext) -> None:
        """Tokenize ``ctx`` for routing (once; failures leave it routable by load)."""
        await self.tokens.fill(ctx)

    def tokenizer_missing(self, model: str) -> str | None:
        """Why ``model`` has no routing tokenizer (None: it has one)."""
        return self.tokens.missing(model)

    def tokenizer(self, model: str) -> Tokenizer | None:
        """``model``'s routing tokenizer (configured or from its model card), None without one."""
        return self.tokens.tokenizer_for(model, quiet=True)

    def worker_fields(self, worker_id: str) -> dict[str, Any]:
        """Extra ``/v1/workers`` fields for one worker."""
        fields: dict[str, Any] = {"kv_mismatch": self.agreement.flags.get(worker_id, [])}
        card = self.tokens.card_info(worker_id)
        if card is not None:
            fields["model_card"] = card
        return fields

    def cache_view(self, worker_id: str) -> dict[str, Any]:
        view = self.hub.cache_view(worker_id)
        view["mismatch"] = self.agreement.flags.get(worker_id, [])
        return view


def make_kv_routing(settings: BaseModel, catalog: KvCatalog) -> KvRouting:
    """The KV component for a server whose settings carry the :class:`KvSettings` fields
    (``catalog``: the plugin catalog, ``InferaHooks.catalog()``)."""
    given = settings.model_dump(include=set(KvSettings.model_fields))
    routing = KvRouting(catalog, KvSettings(**given))
    routing.hub.sources.configure(  # KV-event transport plugins' settings
        options=BackendOptions(settings), connect_timeout=getattr(settings, "connect_timeout", 5.0)
    )
    return routing
