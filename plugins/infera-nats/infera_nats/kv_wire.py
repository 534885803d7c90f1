"""The NATS KV-event transport's subjects, stream and message framing (relay → stream → routers).

The launcher's relay reads the engine's ZMQ frames ``[topic, seq, payload]``
(``reference/WIRE_FORMATS.md``) and publishes them to the JetStream stream ``INFERA_KV``
(subjects ``<prefix>.kv.>``), one subject per publisher:
``<prefix>.kv.<model>.<worker>`` — with ``.r<rank>`` appended for each DP rank of a worker
that publishes per rank — (tokens escaped as in :mod:`infera_nats.transport_wire`).

One message carries one or more consecutive batches of that publisher, each
``<seq:8 signed BE><length:4 BE><payload>``: the engine's own sequence numbers go through
unchanged, so routers detect gaps and engine restarts exactly as on the ZMQ path.
"""

from __future__ import annotations

import contextlib

import nats.js.errors
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StorageType

# the stream and subject names are the permission layout's (one definition for both)
from infera_core.util.nats_layout import KV_STREAM, subject_token
from infera_core.util.nats_layout import kv_subject as kv_subject

STREAM = KV_STREAM
_HEAD = 12


def names_worker(subject: str, prefix: str, worker_id: str) -> bool:
    """``subject`` is one of ``worker_id``'s KV subjects: ``<prefix>.kv.<model>.<worker>``."""
    parts = subject.split(".")
    return (
        len(parts) == len(prefix.split(".")) + 3
        and subject.startswith(f"{prefix}.kv.")
        and parts[-1] == subject_token(worker_id)
        and all(parts)
    )


def rank_subject(base: str, rank: int | None) -> str:
    return base if rank is None else f"{base}.r{rank}"


def pack(batches: list[tuple[int, bytes]]) -> bytes:
    parts = []
    for seq, payload in batches:
        parts.append(seq.to_bytes(8, "big", signed=True) + len(payload).to_bytes(4, "big"))
        parts.append(payload)
    return b"".join(parts)


def unpack(data: bytes) -> list[tuple[int, bytes]]:
    """The batches of one message; ``ValueError`` when it is truncated."""
    out = []
    i, n = 0, len(data)
    while i < n:
        if i + _HEAD > n:
            raise ValueError(f"truncated batch header at byte {i}")
        seq = int.from_bytes(data[i : i + 8], "big", signed=True)
        length = int.from_bytes(data[i + 8 : i + _HEAD], "big")
        end = i + _HEAD + length
        if end > n:
            raise ValueError(f"batch seq {seq} claims {length} bytes, {n - i - _HEAD} left")
        out.append((seq, data[i + _HEAD : end]))
        i = end
    return out


MAX_AGE_S = 3600.0
"""Default retention of KV events in the stream: what routers replay when they start. Events
hold prompt token ids, so they are not kept longer than needed."""
MAX_BYTES = 1 << 30
"""Default size bound of the stream (oldest events go first)."""


async def ensure_stream(
    nc: Client,
    prefix: str,
    *,
    max_msgs_per_subject: int = 10_000,
    memory: bool = False,
    max_age: float = MAX_AGE_S,
    max_bytes: int = MAX_BYTES,
) -> None:
    """Create the KV event stream unless it exists (an existing one is left as configured),
    bounded in age, size and messages per publisher."""
    js = nc.jetstream()
    try:
        await js.stream_info(STREAM)
        return
    except nats.js.errors.NotFoundError:
        pass
    with contextlib.suppress(nats.js.errors.BadRequestError):  # created concurrently by another relay
        await js.add_stream(
            name=STREAM,
            subjects=[f"{prefix}.kv.>"],
            max_msgs_per_subject=max_msgs_per_subject,
            max_age=max_age,
            max_bytes=max_bytes,
            discard=DiscardPolicy.OLD,
            storage=StorageType.MEMORY if memory else StorageType.FILE,
        )
