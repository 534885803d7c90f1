"""The native hot loops (infera-kv-native) give exactly what the pure-Python specification gives."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_stores import dumps

from infera_core.kv import accel
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import BlockRemoved, BlockStored, KvDecodeError, KvEventBatch
from infera_core.kv.hashing import ROUTER_HASH_SEED, py_chain_hashes, py_chain_hashes_msgpack, root_hash
from infera_core.kv.index import KvIndex
from infera_core.kv.store import TIERS

NATIVE = accel.native_ops()
I64 = st.integers(-(2**63), 2**63 - 1)
# token ids as engines send them, plus values that exercise every msgpack int width and
# CPython's int-hash reduction modulo 2**61 - 1
TOKEN = st.one_of(
    st.integers(0, 127),
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), -1),
    st.sampled_from([2**61 - 2, 2**61 - 1, 2**61, 2**62, 2**64 - 1, -1, -2, -(2**61) + 1, -(2**63)]),
)


def native() -> accel.Ops:
    assert NATIVE is not None, "infera-kv-native is not built (it needs a C compiler when installed)"
    return NATIVE


def test_the_native_extension_is_built_and_in_use_by_default() -> None:
    assert native().name == "native"
    assert accel.ops.name == "native"  # what the server runs unless INFERA_KV_NATIVE=0
    assert KvIndex().stats()["hot_loops"] == "native"


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(TOKEN, max_size=80), block_size=st.sampled_from([1, 2, 3, 16, 32]), parent=I64)
def test_chain_hashes_equal_the_tuple_hash_specification(
    tokens: list[int], block_size: int, parent: int
) -> None:
    want = []
    h = parent
    for i in range(0, len(tokens) // block_size * block_size, block_size):
        h = hash((h, *tokens[i : i + block_size]))
        want.append(h)
    assert py_chain_hashes(tokens, block_size, parent) == want
    assert native().chain_hashes(tokens, block_size, parent) == want
    packed = msgspec.msgpack.encode(tokens)
    assert native().chain_hashes_msgpack(packed, block_size, parent) == want
    if all(0 <= t < 2**64 for t in tokens):
        assert py_chain_hashes_msgpack(packed, block_size, parent) == want


def test_chain_roots_and_msgspec_raw_input() -> None:
    tokens = list(range(1000, 1000 + 96))
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode({"t": tokens}), type=dict[str, msgspec.Raw])["t"]
    for parent in (ROUTER_HASH_SEED, root_hash(3)):
        assert native().chain_hashes_msgpack(raw, 32, parent) == py_chain_hashes(tokens, 32, parent)


@pytest.mark.parametrize(
    "packed",
    [
        msgspec.msgpack.encode(["a", "b"]),  # not ints
        msgspec.msgpack.encode([[1, 2], [2, 3]]),  # bigram pairs
        msgspec.msgpack.encode(1.5),  # not an array
        msgspec.msgpack.encode([1, 2, 3])[:-1],  # truncated
        b"",
    ],
)
def test_packed_token_ids_that_are_not_ints_raise_value_error(packed: bytes) -> None:
    with pytest.raises(ValueError):
        native().chain_hashes_msgpack(packed, 1, 0)
    with pytest.raises(ValueError):
        py_chain_hashes_msgpack(packed, 1, 0)


def test_bad_arguments_are_type_and_value_errors_not_crashes() -> None:
    with pytest.raises(ValueError, match="block_size"):
        native().chain_hashes([1, 2], 0, 0)
    with pytest.raises(TypeError):
        native().chain_hashes(5, 1, 0)  # type: ignore[arg-type]
    store = native().new_store()
    with pytest.raises(TypeError):
        store.store(0, 0, 5, [2])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.store(0, 0, [1.5], [2])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="tier"):
        store.remove(0, 3, [1])
    with pytest.raises(ValueError, match="slot"):
        store.lookup(-1, 1)


@pytest.mark.parametrize("impl", ["native", "python"])
def test_bigram_token_ids_from_the_fast_decoder_index_like_plain_ids(impl: str) -> None:
    """SGLang EAGLE sends [[t0, t1], [t1, t2], …]: the index falls back to the tolerant decoder."""
    before = accel.ops
    accel.ops = native() if impl == "native" else accel.PYTHON
    try:
        toks = list(range(500, 564))
        bigrams = [[t, t + 1] for t in toks]
        dec = MsgpackEventDecoder("sglang", signed_hashes=True)
        payload = msgspec.msgpack.encode(
            [0.0, [{"type": "BlockStored", "block_hashes": [-5, 6], "parent_block_hash": None,
                    "token_ids": bigrams, "block_size": 32}], None]
        )  # fmt: skip
        index = KvIndex()
        view = index.add_view("w", None, 32)
        index.apply(view, dec.decode_raw(payload), 0)
        assert index.match(index.hash_prompt(toks, 32), [view]) == [2.0]
        assert {k for k, _ in index.blocks.dump(view.slot, 0)[0]} == {2**64 - 5, 6}
        garbage = msgspec.msgpack.encode(
            [0.0, [{"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
                    "token_ids": ["x"] * 32, "block_size": 32}], None]
        )  # fmt: skip
        with pytest.raises(KvDecodeError):
            index.apply(view, dec.decode_raw(garbage), 1)
    finally:
        accel.ops = before


def test_index_built_natively_equals_the_python_one() -> None:
    rng = random.Random(7)
    batches = []
    lives: tuple[list[int], list[int]] = ([], [])
    for i in range(300):
        live = lives[i % 2]  # batches alternate between two workers
        events: list[BlockStored | BlockRemoved] = []
        if live and rng.random() < 0.5:
            for h in rng.sample(live, min(len(live), rng.randrange(1, 6))):
                events.append(BlockRemoved([h], "GPU"))
                live.remove(h)
        n = rng.randrange(1, 5)
        hashes = [i * 10 + j for j in range(n)]
        parent = rng.choice([*live, None]) if live else None
        toks = [rng.randrange(3) for _ in range(n * 16)]
        events.append(BlockStored(list(hashes), parent, toks, 16, None, rng.choice(["GPU", "CPU"])))
        live += hashes
        batches.append(msgspec.msgpack.encode(KvEventBatch(0.0, list(events))))
    built = []
    for ops, whole in ((accel.PYTHON, False), (native(), False), (native(), True)):
        before = accel.ops
        accel.ops = ops
        try:
            index = KvIndex()
            views = [index.add_view(w, None, 16) for w in ("a", "b")]
            dec = MsgpackEventDecoder()
            for k, payload in enumerate(batches):
                if whole:  # the event hub's way: the native parser applies the payload
                    assert index.apply_payload(views[k % 2], payload, k) is not None
                else:
                    index.apply(views[k % 2], dec.decode_raw(payload), k)
        finally:
            accel.ops = before
        b = index.blocks
        masks = [b.masks(t) for t in TIERS]
        built.append(
            (masks, [(dumps(b, v.slot), v.nblocks, v.unknown_parent, v.events_applied) for v in views])
        )
    assert built[0] == built[1] == built[2]
    assert sum(len(m) for m in built[1][0]) > 100
    assert all(v[2] == 0 for v in built[1][1])  # every parent was known
