"""KV event payloads are untrusted input: random, truncated and forged ones never crash the
index and never make it allocate more than a small multiple of their size.

A msgpack count is the sender's claim. The native batch parser used to allocate
``count × 96`` bytes of event descriptors before reading a single event, so a 20-byte
payload claiming 100 million events asked for 9.6 GB. Every payload here goes through
both ingestion paths (the native parser, and the Python decoder it hands back to), with
the traced allocation peak and the process' peak virtual size checked.
"""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera_core.kv import accel
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import KvDecodeError
from infera_core.kv.index import KvIndex

BS = 4
SLACK = 64 * 1024
"""Fixed allowance over the per-byte bound (interpreter noise, a first table chunk)."""
PER_BYTE = 16
"""Most bytes allocated per payload byte (the descriptors are 96 bytes per >= 8 bytes of event)."""
DECODER = MsgpackEventDecoder("vllm")


def _vm_peak() -> int:
    """The process' peak virtual size in bytes (an unused giant malloc shows here too)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmPeak:"):
            return int(line.split()[1]) * 1024
    return 0


def ingest(index: KvIndex, payload: bytes) -> None:
    """What the hub does with one payload: the native parser, else the Python decoder."""
    view = index.add_view("w", None, BS)
    if index.apply_payload(view, payload, 0) is None:
        with contextlib.suppress(KvDecodeError):  # the hub counts it (packed token ids decode late)
            index.apply(view, DECODER.decode_raw(payload), 0)


def check_bounded(index: KvIndex, payload: bytes) -> None:
    """Ingest ``payload``; it must not raise and not allocate more than a small multiple of it."""
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    ingest(index, payload)
    _, peak = tracemalloc.get_traced_memory()
    assert peak - before <= PER_BYTE * len(payload) + SLACK, (len(payload), peak - before, payload[:64])


@pytest.fixture
def traced() -> Iterator[KvIndex]:
    index = KvIndex()
    ingest(index, _batch([["AllBlocksCleared"]]))  # first use sets up the tables, outside the measure
    tracemalloc.start()
    try:
        yield index
    finally:
        tracemalloc.stop()


def _batch(events: list[Any], rank: Any = 0) -> bytes:
    return msgspec.msgpack.encode([0.0, events, rank])


_hashes = st.lists(st.integers(0, 2**64 - 1), max_size=4)
_stored = st.builds(
    lambda hs, parent, extra: {
        "type": "BlockStored",
        "block_hashes": hs,
        "parent_block_hash": parent,
        "token_ids": list(range(len(hs) * BS + extra)),
        "block_size": BS,
    },
    _hashes,
    st.none() | st.integers(0, 2**64 - 1),
    st.sampled_from([0, 0, 1]),
)
_removed = st.builds(lambda hs: {"type": "BlockRemoved", "block_hashes": hs}, _hashes)
_cleared = st.just({"type": "AllBlocksCleared"})
_event = st.one_of(_stored, _removed, _cleared) | st.one_of(_stored, _removed).map(
    lambda ev: [ev["type"], *[v for k, v in ev.items() if k != "type"]]
)
_valid = st.lists(_event, min_size=1, max_size=6).map(_batch)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=512))
def test_random_bytes_never_crash_and_stay_bounded(
    native: accel.Ops, traced: KvIndex, payload: bytes
) -> None:
    check_bounded(traced, payload)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_valid, data=st.data())
def test_truncated_and_mutated_batches_never_crash_and_stay_bounded(
    native: accel.Ops, traced: KvIndex, payload: bytes, data: st.DataObject
) -> None:
    check_bounded(traced, payload)
    cut = data.draw(st.integers(0, len(payload) - 1))
    check_bounded(traced, payload[:cut])
    mutated = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = data.draw(st.integers(0, 255))
    check_bounded(traced, bytes(mutated))


def _forged(count: int, real: int = 3) -> bytes:
    """``[0.0, <array32 claiming count events>]`` holding ``real`` events, padded with zero
    bytes so the claim passes the one-byte-per-item sanity check of the msgpack reader."""
    events = b"\x91\xb0AllBlocksCleared" * real
    pad = max(0, count - len(events))
    return b"\x92\xcb" + struct.pack(">d", 0.0) + b"\xdd" + struct.pack(">I", count) + events + b"\x00" * pad


@pytest.mark.parametrize("count", [4, 1000, 100_000, 1_000_000, 4_000_000])
def test_forged_event_counts_are_refused_before_allocating(
    native: accel.Ops, traced: KvIndex, count: int
) -> None:
    vm = _vm_peak()
    payload = _forged(count)
    check_bounded(traced, payload)
    # 96 bytes of descriptors per claimed event would reserve 96 x the payload (384 MB at 4 M)
    assert _vm_peak() - vm < 16 * len(payload) + 32 * 1024 * 1024
    view = traced.add_view("w", None, BS)
    assert traced.apply_payload(view, payload, 0) is None  # refused: not a batch of that many events


def test_forged_inner_counts_are_refused(native: accel.Ops, traced: KvIndex) -> None:
    hashes32 = b"\xdd" + struct.pack(">I", 50_000_000)
    event = b"\x82\xa4type\xacBlockRemoved\xacblock_hashes" + hashes32 + b"\x01\x02"
    payload = b"\x93\xcb" + struct.pack(">d", 0.0) + b"\x91" + event + b"\x00"
    check_bounded(traced, payload)


def test_a_valid_batch_still_goes_through_the_native_parser(native: accel.Ops) -> None:
    index = KvIndex()
    view = index.add_view("w", None, BS)
    payload = _batch([{"type": "AllBlocksCleared"}] * 5 + [["AllBlocksCleared"]] * 3)
    assert index.apply_payload(view, payload, 0) == 8
