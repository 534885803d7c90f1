"""PD fleets of real sim processes for tests.

    with sim_pd_fleet("vllm-nixl", prefill=2, decode=2) as fleet:
        store.put(*fleet.records)       # or: for r in fleet.records: store.put(r)

Each sim is ``python -m infera_sim.server`` on a free loopback port (KV events on), started
with ``--role prefill|decode --pd-protocol P``; :func:`sim_record` writes the worker record a
launcher would publish for it (``pd.protocol`` + ``engine_id``/bootstrap address).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from infera_core.worker import KvEventsInfo, PdInfo, Role, WorkerRecord

MODEL = "sim-model"


@dataclass
class SimWorker:
    worker_id: str
    role: Role
    handle: Any
    """The :class:`infera_sim.testing.SimHandle` (``url``, ``proc``, ``bootstrap_port``…)."""
    record: WorkerRecord


@dataclass
class SimPdFleet:
    workers: list[SimWorker] = field(default_factory=list)

    @property
    def records(self) -> list[WorkerRecord]:
        return [w.record for w in self.workers]

    def by_id(self, worker_id: str) -> SimWorker:
        return next(w for w in self.workers if w.worker_id == worker_id)

    def role(self, role: Role) -> list[SimWorker]:
        return [w for w in self.workers if w.role is role]


def sim_record(
    worker_id: str,
    handle: Any,
    role: Role,
    protocol: str | None,
    *,
    model: str = MODEL,
    engine: str = "sim",
    block_size: int = 16,
) -> WorkerRecord:
    """The record a launcher would publish for a running sim."""
    pd = None
    if role is not Role.MIXED and protocol is not None:
        params: dict[str, Any] = {"engine_id": worker_id}
        if handle.bootstrap_port is not None and role is Role.PREFILL:
            params.update(bootstrap_host="127.0.0.1", bootstrap_port=handle.bootstrap_port)
        pd = PdInfo(protocol=protocol, params=params)
    kv = None
    if handle.kv_events_endpoint:
        from infera_sim.tokenizer import make_tokenizer

        kv = KvEventsInfo(
            endpoint=handle.kv_events_endpoint,
            format="vllm",
            block_size=block_size,
            replay_endpoint=handle.replay_endpoint,
            fingerprint=make_tokenizer().fingerprint,
        )
    return WorkerRecord(
        worker_id=worker_id,
        url=handle.url,
        model=model,
        engine=engine,
        role=role,
        pd=pd,
        kv_events=kv,
        labels={"engine": "sim"},
    )


@contextlib.contextmanager
def sim_pd_fleet(
    protocol: str,
    prefill: int = 1,
    decode: int = 1,
    mixed: int = 0,
    *,
    flags: dict[str, Any] | None = None,
    per_worker: dict[str, dict[str, Any]] | None = None,
) -> Iterator[SimPdFleet]:
    """Start ``prefill`` + ``decode`` (+ ``mixed``) sims; ids ``p0…``, ``d0…``, ``m0…``.

    ``flags`` go to every sim (``speedup``, ``block_size``…); ``per_worker[id]`` adds flags to one.
    """
    from infera_sim.testing import start_sim

    common = {"speedup": 50, "block_size": 16, **(flags or {})}
    plan = [("p", Role.PREFILL, prefill), ("d", Role.DECODE, decode), ("m", Role.MIXED, mixed)]
    fleet = SimPdFleet()
    with contextlib.ExitStack() as stack:
        for prefix, role, count in plan:
            for i in range(count):
                wid = f"{prefix}{i}"
                extra: dict[str, Any] = {"role": str(role), "engine_id": wid, "model": MODEL}
                if role is not Role.MIXED:
                    extra["pd_protocol"] = protocol
                if role is Role.PREFILL:
                    extra["bootstrap_port"] = 0
                extra.update(common)
                extra.update((per_worker or {}).get(wid, {}))
                handle = stack.enter_context(start_sim(**extra))
                record = sim_record(wid, handle, role, protocol, block_size=int(common["block_size"]))
                fleet.workers.append(SimWorker(wid, role, handle, record))
        yield fleet


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus samples in ``text`` whose line starts with ``name`` and has ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
