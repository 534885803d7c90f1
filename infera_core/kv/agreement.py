"""Registration-time agreement check: does a worker hash prompts the way the router does?

A worker whose ``kv_events.block_size`` differs from ``--kv-block-size MODEL=N``, whose
``kv_events.fingerprint`` differs from the router's routing tokenizer for that model, or
whose model card is not the one the router uses for that model (another digest), would be mis-scored silently (its blocks never match the router's hashes).
Such workers are flagged (log line, ``infera_kv_worker_mismatch`` gauge, the
``kv_mismatch`` field of ``/v1/workers``) and their KV view is not credited.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from infera_core.errors import ConfigError
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.kv.agreement")


def parse_block_sizes(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        model, sep, n = v.partition("=")
        if not sep or not model or not n.isdigit() or int(n) <= 0:
            raise ConfigError(f"--kv-block-size {v!r}: expected MODEL=N with N > 0, e.g. llama=32")
        out[model] = int(n)
    return out


class AgreementCheck:
    """Flags per worker id (``reason`` strings), kept current as records come and go."""

    def __init__(self, tokenizers: RoutingTokenizers, block_sizes: dict[str, int] | None = None) -> None:
        self.tokenizers = tokenizers
        self.block_sizes = dict(block_sizes or {})
        self.flags: dict[str, list[str]] = {}

    def check(self, record: WorkerRecord) -> list[str]:
        kv = record.kv_events
        reasons: list[str] = []
        if kv is not None:
            want_bs = self.block_sizes.get(record.model)
            if want_bs is not None and kv.block_size != want_bs:
                reasons.append(f"block_size {kv.block_size} != router's {want_bs} for model {record.model!r}")
            want_fp = self.tokenizers.fingerprint(record.model)
            if want_fp is not None and kv.fingerprint is not None and kv.fingerprint != want_fp:
                reasons.append(
                    f"tokenizer fingerprint {kv.fingerprint!r} != router's {want_fp!r} for model {record.model!r}"
                )
        card = self.tokenizers.cards.mismatch(record)
        if card is not None:
            reasons.append(card)
        old = self.flags.get(record.worker_id)
        if reasons:
            self.flags[record.worker_id] = reasons
            if old != reasons:
                log.warning(
                    "worker %s disagrees with the router's KV config (%s): its cache will not be credited",
                    record.worker_id,
                    "; ".join(reasons),
                )
        else:
            self.flags.pop(record.worker_id, None)
        return reasons

    def forget(self, worker_id: str) -> None:
        self.flags.pop(worker_id, None)

    def collect(self) -> Iterable[Any]:
        g = GaugeMetricFamily(
            "infera_kv_worker_mismatch",
            "1 for a worker whose KV block size or tokenizer disagrees with the router's config",
            labels=["worker", "reason"],
        )
        for worker_id, reasons in self.flags.items():
            for r in reasons:
                g.add_metric([worker_id, r.split(" ", 1)[0]], 1.0)
        yield g
