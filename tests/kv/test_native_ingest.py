"""The native batch parser (``KvIndex.apply_payload``, what the event hub runs) builds exactly
the index the Python decoder + ``KvIndex.apply`` build, and hands back, untouched, every
payload it does not handle."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from kv_recorded import RECORDINGS, frames
from kv_stores import snapshot

from infera_core.kv import accel
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import KvDecodeError
from infera_core.kv.index import KvIndex, WorkerView

BS = 4


def _python_index() -> KvIndex:
    before = accel.ops
    accel.ops = accel.PYTHON
    try:
        return KvIndex()
    finally:
        accel.ops = before


def _counters(v: WorkerView) -> tuple[Any, ...]:
    return (
        v.events_applied,
        v.unknown_parent,
        v.unknown_removed,
        v.bad_block_size,
        v.skipped_groups,
        v.last_seq,
    )


def _state(index: KvIndex, views: list[WorkerView]) -> tuple[Any, ...]:
    return snapshot(index.blocks, [v.slot for v in views]), [_counters(v) for v in views]


class _Gen:
    """Random vLLM/SGLang-style map-layout batches, every optional field and odd value included."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.stored: list[Any] = []

    def hash(self) -> Any:
        r = self.rng.random()
        if r < 0.75:
            return self.rng.randrange(2**40, 2**40 + 300)
        if r < 0.85:
            return -self.rng.randrange(1, 50)  # SGLang's signed int64 hashes
        return bytes([self.rng.randrange(8)]) * 32  # digests

    def maybe(self, ev: dict[str, Any], key: str, values: list[Any]) -> None:
        if self.rng.random() < 0.5:
            ev[key] = self.rng.choice(values)

    def event(self) -> dict[str, Any]:
        rng = self.rng
        r = rng.random()
        if r < 0.03:
            ev: dict[str, Any] = {"type": "AllBlocksCleared"}
        elif r < 0.45 and self.stored:
            ev = {
                "type": "BlockRemoved",
                "block_hashes": [
                    rng.choice(self.stored) if rng.random() < 0.9 else self.hash()
                    for _ in range(rng.randrange(1, 4))
                ],
            }
        else:  # fmt: skip
            n = rng.randrange(0, 5)
            hashes = [self.hash() for _ in range(n)]
            parent = None
            if self.stored and rng.random() < 0.6:
                parent = rng.choice(self.stored) if rng.random() < 0.9 else self.hash()
            ntok = n * BS + rng.choice([0, 0, 1, 3, -BS if n else 0])
            ev = {
                "type": "BlockStored",
                "block_hashes": hashes,
                "parent_block_hash": parent,
                "token_ids": [rng.choice([rng.randrange(50), rng.randrange(2**64), -rng.randrange(2**63)])
                              for _ in range(ntok)],
                "block_size": BS if rng.random() < 0.93 else 2 * BS,
            }  # fmt: skip
            self.maybe(ev, "lora_id", [None, 0, 3, -7, 2**40])
            self.maybe(
                ev, "kv_cache_spec_kind", [None, "full_attention", "mla_attention", "sliding_window", "mamba"]
            )
            self.stored += hashes
        if ev["type"] != "AllBlocksCleared":
            self.maybe(
                ev, "medium", [None, "GPU", "cpu", "", "CPU_PINNED", "disk", "external", "weird", "Hbm"]
            )
            self.maybe(ev, "group_idx", [None, 0, 1, 2])
        # keyed fields saying nothing (a salt, a LoRA name… go to Python: test_salted_events.py)
        self.maybe(ev, "lora_name", [None, 7])
        self.maybe(ev, "extra_keys", [[None, None], None, "junk"])
        if self.rng.random() < 0.2:
            return self.as_array(ev)  # the older layout, positional
        items = list(ev.items())
        rng.shuffle(items)  # the tag need not come first
        return dict(items)

    def as_array(self, ev: dict[str, Any]) -> list[Any]:
        kind = ev["type"]
        if kind == "BlockStored":
            fields = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"]
            ev.setdefault("lora_id", None)
            ev.setdefault("medium", None)
            ev.pop("kv_cache_spec_kind", None)  # not in this layout
            ev.pop("group_idx", None)
        elif kind == "BlockRemoved":
            fields = ["block_hashes", "medium"]
            ev.setdefault("medium", None)
            ev.pop("group_idx", None)
        else:
            fields = []
        out = [kind, *(ev[f] for f in fields)]
        if kind == "BlockStored" and out[-1] is None and self.rng.random() < 0.5:
            out.pop()  # trailing optional fields may be left out
        return out + ([None, None, "extra"] if self.rng.random() < 0.2 else [])  # 7: lora_name

    def payload(self) -> bytes:
        events = [self.event() for _ in range(self.rng.randrange(1, 7))]
        top: list[Any] = [self.rng.choice([1.5, 7]), events]
        if self.rng.random() < 0.7:
            top.append(self.rng.choice([None, 0]))
        return msgspec.msgpack.encode(top)


@pytest.mark.parametrize("seed", range(10))
def test_random_batches_build_the_same_index_as_the_python_path(native: accel.Ops, seed: int) -> None:
    gen = _Gen(seed)
    payloads = [gen.payload() for _ in range(150)]
    dec = MsgpackEventDecoder("sglang", signed_hashes=True)
    py = _python_index()
    py_views = [py.add_view(w, None, BS) for w in "ab"]
    nat = KvIndex()
    nat_views = [nat.add_view(w, None, BS) for w in "ab"]
    for seq, payload in enumerate(payloads):
        py.apply(py_views[seq % 2], dec.decode_raw(payload), seq)
        assert nat.apply_payload(nat_views[seq % 2], payload, seq) is not None, msgspec.msgpack.decode(
            payload
        )
        if seq % 25 == 24:
            assert _state(nat, nat_views) == _state(py, py_views), f"after batch {seq}"
    assert _state(nat, nat_views) == _state(py, py_views)
    counters = [_counters(v) for v in nat_views]
    assert all(c[0] > 100 for c in counters)  # events applied
    assert any(c[1] for c in counters) and any(c[2] for c in counters) and any(c[3] for c in counters)
    assert any(c[4] for c in counters)  # a non-full-attention group was skipped


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_recorded_vllm_frames_build_the_same_index(native: accel.Ops, name: str) -> None:
    dec = MsgpackEventDecoder()
    py, nat = _python_index(), KvIndex()
    pv, nv = py.add_view("w", None, 32), nat.add_view("w", None, 32)
    for rec in frames(name):
        py.apply(pv, dec.decode_raw(rec["payload"]), rec["seq"])
        assert nat.apply_payload(nv, rec["payload"], rec["seq"]) is not None
    assert _state(nat, [nv]) == _state(py, [pv])


def _batch(*events: Any, top: list[Any] | None = None) -> bytes:
    return msgspec.msgpack.encode(top if top is not None else [0.0, list(events), None])


STORED = {"type": "BlockStored", "block_hashes": [9], "parent_block_hash": None, "token_ids": [1] * BS,
          "block_size": BS}  # fmt: skip
HANDED_BACK = {
    "array layout, unknown tag": _batch(["BlockMoved", [9]]),
    "array layout, short": _batch(["BlockStored", [9], None, [1] * BS]),
    "array layout, str lora_id": _batch(["BlockStored", [9], None, [1] * BS, BS, "a"]),
    "unknown event tag": _batch(STORED, {"type": "BlockMoved", "block_hashes": [9]}),
    "bigram token ids": _batch({**STORED, "token_ids": [[1, 2]] * BS}),
    "str block hash": _batch({**STORED, "block_hashes": ["9"]}),
    "str lora_id": _batch({**STORED, "lora_id": "a"}),
    "float block_size": _batch({**STORED, "block_size": 4.0}),
    "missing token_ids": _batch({k: v for k, v in STORED.items() if k != "token_ids"}),
    "non-ASCII medium": _batch({**STORED, "medium": "dıſk"}),
    "event not a map": _batch(7),
    "short top level": _batch(top=[0.0]),
    "long top level": _batch(top=[0.0, [STORED], None, 1]),
    "trailing bytes": _batch(STORED) + b"\x00",
    "truncated": _batch(STORED)[:-3],
    "not msgpack": b"\xc1\xc1",
}


@pytest.mark.parametrize("case", sorted(HANDED_BACK))
def test_payloads_it_does_not_handle_are_handed_back_untouched(native: accel.Ops, case: str) -> None:
    index = KvIndex()
    view = index.add_view("w", None, BS)
    index.apply_payload(view, _batch(STORED), 0)
    before = _state(index, [view])
    assert index.apply_payload(view, HANDED_BACK[case], 1) is None
    assert _state(index, [view]) == before
    try:  # …and the Python decoder deals with it as before
        index.apply(view, MsgpackEventDecoder().decode_raw(HANDED_BACK[case]), 1)
    except KvDecodeError:
        pass


def test_mutated_payloads_never_crash_and_never_disagree_with_the_python_path(native: accel.Ops) -> None:
    rng = random.Random(3)
    gen = _Gen(11)
    dec = MsgpackEventDecoder("sglang", signed_hashes=True)
    accepted = 0
    for _ in range(3000):
        data = bytearray(gen.payload())
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(data))
            r = rng.random()
            if r < 0.6:
                data[i] = rng.randrange(256)
            elif r < 0.8:
                del data[i]
            else:
                data.insert(i, rng.randrange(256))
        payload = bytes(data)
        nat = KvIndex()
        nv = nat.add_view("w", None, BS)
        if nat.apply_payload(nv, payload, 0) is None:
            continue
        accepted += 1
        py = _python_index()
        pv = py.add_view("w", None, BS)
        py.apply(pv, dec.decode_raw(payload), 0)  # must decode: the native parser took it
        assert _state(nat, [nv]) == _state(py, [pv]), payload
    assert accepted > 300  # many mutations keep a valid batch (token values, hashes…)


def test_dp_rank_is_read_without_decoding_the_events(native: accel.Ops) -> None:
    index = KvIndex()
    assert index.payload_dp_rank(_batch(STORED, top=[0.0, [STORED], 3])) == 3
    assert index.payload_dp_rank(_batch(top=[0.0, [STORED], None])) is None
    assert index.payload_dp_rank(_batch(top=[0.0, [STORED]])) is None
    with pytest.raises(ValueError):
        index.payload_dp_rank(b"\x93\x00")
    with pytest.raises(ValueError):
        _python_index().payload_dp_rank(_batch(STORED))
