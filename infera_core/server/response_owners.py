"""Which worker stored each Responses API response: ``response id → worker id``.

vLLM keeps stored responses in its server process (``VLLM_ENABLE_RESPONSES_API_STORE=1``), so
a request naming one (``previous_response_id``, ``GET``/``DELETE /v1/responses/{id}``…) must
reach that worker. The router notes the worker of every response it relays and looks it up
later. The map is bounded (least recently used entries go first, ``max_entries``) and kept
per router process: an id it does not know (evicted, answered by another process of
``serve --processes N`` or another router replica, or before a restart) is found by asking
the model's workers, which only the holder answers (:mod:`infera_core.server.responses_routes`).
"""

from __future__ import annotations

import re
from collections import OrderedDict

MAX_ENTRIES = 100_000
"""Response ids remembered per router process (about 150 bytes each)."""

_ID_RE = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')


def response_id_of(data: bytes) -> str | None:
    """The response id in the first ``"id"`` of a Responses answer or of its stream's first
    event (``response.created`` carries the response object), None when there is none."""
    m = _ID_RE.search(data)
    return m.group(1).decode("utf-8", "replace") if m is not None else None


class ResponseOwners:
    """A bounded LRU map of response id → (worker id, model)."""

    __slots__ = ("_map", "max_entries")

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._map: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def note(self, response_id: str, worker_id: str, model: str) -> None:
        """``worker_id`` (serving ``model``) holds ``response_id``."""
        m = self._map
        m[response_id] = (worker_id, model)
        m.move_to_end(response_id)
        while len(m) > self.max_entries:
            m.popitem(last=False)

    def owner(self, response_id: str) -> tuple[str, str] | None:
        """(worker id, model) of ``response_id``, None when this process does not know it."""
        hit = self._map.get(response_id)
        if hit is not None:
            self._map.move_to_end(response_id)
        return hit

    def forget(self, response_id: str) -> None:
        self._map.pop(response_id, None)
