"""What the KV-routing runtime reads from the plugin catalog.

The catalog itself (:class:`infera_core.plugin.hooks.Catalog`) lives in the plugin layer,
above ``kv/*``: this is the part of it the KV hub, its sources and the routing
tokenizers use, named as a Protocol so the lower layer never imports the higher one.
"""

from __future__ import annotations

from typing import Protocol

from infera_core.kv.events import KvDecoderRegistry
from infera_core.tokenize.base import TokenizerRegistry
from infera_core.transports.base import KvEventTransportRegistry


class KvCatalog(Protocol):
    """KV-event decoders and transports, and routing tokenizers, by name."""

    @property
    def kv_decoders(self) -> KvDecoderRegistry: ...

    @property
    def kv_event_transports(self) -> KvEventTransportRegistry: ...

    @property
    def tokenizers(self) -> TokenizerRegistry: ...
