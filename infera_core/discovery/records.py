"""Helpers every discovery backend shares: parse a stored record, diff two fleet snapshots."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from infera_core.discovery.base import ChangeKind, FleetChange
from infera_core.errors import DiscoveryError
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.discovery")


def parse_record(key: str, data: bytes | str) -> WorkerRecord | None:
    """The record stored at ``key``, or None (logged with the key) when it is malformed."""
    try:
        return WorkerRecord.from_json(data)
    except (ValidationError, ValueError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else None
        why = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(exc)
        log.warning("discovery: skipping malformed worker record at %s (%s)", key, why)
        return None


def diff(known: dict[str, WorkerRecord], fresh: dict[str, WorkerRecord]) -> list[FleetChange]:
    """Changes that turn ``known`` into ``fresh`` (DELETEs first, then PUTs); updates ``known``."""
    changes = [FleetChange(ChangeKind.DELETE, wid, known.pop(wid)) for wid in sorted(set(known) - set(fresh))]
    for wid, record in sorted(fresh.items()):
        if known.get(wid) != record:
            known[wid] = record
            changes.append(FleetChange(ChangeKind.PUT, wid, record))
    return changes


def check_update(live: bool, current: WorkerRecord, record: WorkerRecord) -> None:
    """What every ``Registration.update`` checks first: still registered, same worker id."""
    if not live:
        raise DiscoveryError(f"worker {current.worker_id!r} is no longer registered")
    if record.worker_id != current.worker_id:
        raise DiscoveryError(f"cannot change worker_id {current.worker_id!r} → {record.worker_id!r}")


SYNCED = FleetChange(ChangeKind.SYNCED, "", None)
