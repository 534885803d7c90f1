"""The server's table of endpoints, kept current from discovery (a ``FleetView`` subscriber).

Each worker record becomes one :class:`Endpoint` carrying the router's own
accounting (in-flight, picks, breaker). An updated record keeps its endpoint (and
its accounting); lists per model are rebuilt on change and never mutated in place,
so the hot path can iterate them without copying.

A worker's LoRA adapters (``record.lora_adapters``) are models too: ``candidates(adapter)``
is the workers serving it and ``lora_base[adapter]`` its base model (the routing tokenizer's
and the card's). An adapter named like a base model, or served on two different bases, is
reported once and not mixed in: the base model (or the first base) keeps the name.

Listeners (``on_added(record)`` / ``on_removed(record)``) see every change: the
plugin notifications and the optional KV component (the seam KV routing uses).

``upstream_for(record)`` gives each endpoint the client of the request transport its
record names (``Endpoint.upstream``); a record it has no client for (None: a transport
not installed here) is logged and not routed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from infera_core.discovery.base import ChangeKind, FleetChange
from infera_core.scheduling.arrays import state
from infera_core.scheduling.shared_load import SharedLoad
from infera_core.scheduling.types import Endpoint
from infera_core.util.redact import redact_url
from infera_core.worker import TASKS, Status, WorkerRecord

log = logging.getLogger("infera.server.fleet")

Listener = Callable[[WorkerRecord], None]
UpstreamFor = Callable[[WorkerRecord], Any]


class EndpointTable:
    """worker_id → Endpoint, and model → endpoints serving it."""

    __slots__ = (
        "_added",
        "_removed",
        "_shared",
        "_warned",
        "by_id",
        "by_model",
        "every",
        "lora_base",
        "upstream_for",
    )

    def __init__(self, upstream_for: UpstreamFor | None = None) -> None:
        self.upstream_for = upstream_for
        self.by_id: dict[str, Endpoint] = {}
        self.by_model: dict[str, list[Endpoint]] = {}
        """model → the workers that generate for it (chat, completions…): the scheduler's candidates."""
        self.every: dict[str, list[Endpoint]] = {}
        """model → all its workers, whatever they serve (pooling models too: :meth:`serving`)."""
        self.lora_base: dict[str, str] = {}
        """LoRA adapter → its base model (the adapters' names are keys of ``by_model`` too)."""
        self._warned: set[tuple[str, str]] = set()
        self._added: list[Listener] = []
        self._removed: list[Listener] = []
        self._shared: SharedLoad | None = None

    def add_listener(self, on_added: Listener | None = None, on_removed: Listener | None = None) -> None:
        if on_added is not None:
            self._added.append(on_added)
        if on_removed is not None:
            self._removed.append(on_removed)

    def share_load(self, shared: SharedLoad) -> None:
        """Count requests in flight with the sibling processes (``serve --processes N``): every
        endpoint, now and later, mirrors its count into ``shared`` and the cap reads the sum."""
        state().shared = self._shared = shared
        for ep in self.by_id.values():
            self._claim(ep, shared)

    @staticmethod
    def _claim(ep: Endpoint, shared: SharedLoad) -> None:
        slot = shared.claim(ep.worker_id, ep.in_flight)
        state().load_slot[ep.row] = slot
        if slot >= 0:
            ep.load_word = shared.word(slot)
        else:
            shared.unslotted += 1

    @staticmethod
    def _leave(ep: Endpoint, shared: SharedLoad) -> None:
        slot = int(state().load_slot[ep.row])
        state().load_slot[ep.row] = -1
        if slot >= 0:
            ep.load_word = -1  # its requests still in flight no longer count for the worker
            shared.leave(slot)
        else:
            shared.unslotted -= 1

    # -- reads (hot path) -------------------------------------------------------
    def candidates(self, model: str) -> list[Endpoint]:
        return self.by_model.get(model) or []

    def get(self, worker_id: str) -> Endpoint | None:
        return self.by_id.get(worker_id)

    def models(self) -> list[str]:
        return sorted(self.every)

    def serving(self, model: str, task: str) -> list[Endpoint]:
        """The workers of ``model`` whose record says they serve ``task`` (``embed``, ``score``…)."""
        return [ep for ep in self.every.get(model) or () if task in ep.record.tasks]

    def tasks_of(self, model: str) -> list[str]:
        """What the workers of ``model`` serve between them ([] for an unknown model)."""
        have = {task for ep in self.every.get(model) or () for task in ep.record.tasks}
        return [task for task in TASKS if task in have]

    def active_count(self) -> int:
        return sum(1 for ep in self.by_id.values() if ep.record.status is Status.ACTIVE)

    # -- writes ------------------------------------------------------------------
    def put(self, record: WorkerRecord) -> Endpoint | None:
        upstream = self.upstream_for(record) if self.upstream_for is not None else None
        if upstream is None and self.upstream_for is not None:
            log.warning(
                "worker %s: request transport %r is not installed in this router; not routed",
                record.worker_id,
                record.request_transport,
            )
            self.remove(record.worker_id)
            return None
        ep = self.by_id.get(record.worker_id)
        if ep is None:
            ep = Endpoint(record)
            self.by_id[record.worker_id] = ep
            if self._shared is not None:
                self._claim(ep, self._shared)
            log.info("worker %s joined: %s", record.worker_id, _describe(record))
        else:
            if ep.record.status != record.status:
                log.info("worker %s is %s: %s", record.worker_id, record.status, _describe(record))
            ep.record = record
            ep.dp_rank = record.dp_rank
        if upstream is not None:
            ep.upstream = upstream
        self._rebuild()
        self._notify(self._added, record)
        return ep

    def remove(self, worker_id: str) -> Endpoint | None:
        ep = self.by_id.pop(worker_id, None)
        if ep is not None:
            log.info("worker %s left: %s", worker_id, _describe(ep.record))
            if self._shared is not None:
                self._leave(ep, self._shared)
            self._rebuild()
            self._notify(self._removed, ep.record)
        return ep

    def apply(self, change: FleetChange) -> None:
        if change.kind is ChangeKind.PUT and change.record is not None:
            self.put(change.record)
        elif change.kind is ChangeKind.DELETE:
            self.remove(change.worker_id)

    def base_of(self, model: str) -> str:
        """The base model of LoRA adapter ``model``; ``model`` itself otherwise."""
        return self.lora_base.get(model, model)

    def _rebuild(self) -> None:
        by_model: dict[str, list[Endpoint]] = {}
        for ep in self.by_id.values():
            by_model.setdefault(ep.record.model, []).append(ep)
        lora_base: dict[str, str] = {}
        adapters: dict[str, list[Endpoint]] = {}
        for ep in sorted(self.by_id.values(), key=lambda e: e.worker_id):
            base = ep.record.model
            for name in ep.record.lora_adapters:
                if name in by_model:
                    self._warn_once(
                        (name, "\0model"),
                        f"worker {ep.worker_id}: LoRA adapter {name!r} has the name of a base model;"
                        f" requests for {name!r} go to that model's workers, not to the adapter",
                    )
                    continue
                known = lora_base.setdefault(name, base)
                if known != base:
                    self._warn_once(
                        (name, base),
                        f"worker {ep.worker_id}: LoRA adapter {name!r} is served on base model"
                        f" {base!r} here and on {known!r} elsewhere; routed to the {known!r} workers only",
                    )
                    continue
                adapters.setdefault(name, []).append(ep)
        by_model.update(adapters)
        self.every = by_model
        generating = by_model  # the same lists while every worker generates (the usual fleet)
        if any(not ep.record.generates for ep in self.by_id.values()):
            generating = {}
            for model, eps in by_model.items():
                gen = [ep for ep in eps if ep.record.generates]
                if gen:
                    generating[model] = gen
        self.by_model = generating
        self.lora_base = lora_base

    def _warn_once(self, key: tuple[str, str], message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)

    @staticmethod
    def _notify(listeners: list[Listener], record: WorkerRecord) -> None:
        for fn in listeners:
            try:
                fn(record)
            except Exception:
                log.exception("fleet listener %r failed for worker %s", fn, record.worker_id)


def _describe(record: WorkerRecord) -> str:
    """``model tiny, role mixed, vllm at http://127.0.0.1:8001`` (URL without a password)."""
    return f"model {record.model}, role {record.role}, {record.engine} at {redact_url(record.url)}"
