"""Property-based: for random workloads, the published KV events rebuild the sim's cache exactly.

In-process: the real engine step loop (``--speedup inf``) over the real cache model; each
step's events are encoded to the wire (map or array layout) and decoded by core's vLLM
decoder, then applied to a mirror. Also checked on every step: blocks held by running
requests are never evicted, and an idle engine holds no blocks.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from infera_sim.config import SimConfig
from infera_sim.engine import SimEngine
from infera_sim.kv_publisher import encode_batch
from infera_sim.request import SimRequest
from infera_sim.tokenizer import SimTokenizer

from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

PREFIXES = [[1, *range(10 + 40 * i, 10 + 40 * i + 37)] for i in range(4)]

request_st = st.tuples(
    st.integers(0, len(PREFIXES) - 1),  # shared prefix
    st.lists(st.integers(4, 60), max_size=30),  # own suffix
    st.integers(1, 20),  # max_tokens
)
workload_st = st.lists(
    st.one_of(st.lists(request_st, min_size=1, max_size=6), st.just("reset")),
    min_size=1,
    max_size=8,
)


class Mirror:
    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.decoder = MsgpackEventDecoder("vllm")
        self.blocks: set[int | bytes] = set()
        self.removed = 0
        self.errors: list[str] = []

    def __call__(self, ts: float, events: list[KvEvent]) -> None:
        for ev in self.decoder.decode(encode_batch(ts, events, 0, self.layout)).events:
            if isinstance(ev, BlockStored):
                if ev.parent_block_hash is not None and ev.parent_block_hash not in self.blocks:
                    self.errors.append(f"BlockStored with an unknown parent {ev.parent_block_hash!r}")
                self.blocks.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                if not set(ev.block_hashes) <= self.blocks:
                    self.errors.append(f"BlockRemoved of unknown blocks {ev.block_hashes}")
                self.removed += 1
                self.blocks.difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                self.blocks.clear()


def _check_running(engine: SimEngine) -> None:
    for r in engine.running:
        for block, h in zip(r.blocks[: r.committed], r.hashes, strict=False):
            assert block.ref > 0
            # a held block is never evicted: it is either cached under its hash or a private duplicate
            assert block.hash in (h, None)


async def _run(
    workload: list[list[tuple[int, list[int], int]] | str], cache_blocks: int, layout: str
) -> tuple[Mirror, SimEngine]:
    cfg = SimConfig(speedup=float("inf"), cache_blocks=cache_blocks, block_size=8, max_num_batched_tokens=64)
    mirror = Mirror(layout)
    engine = SimEngine(cfg, SimTokenizer(1000), mirror)
    original = engine._execute

    def checked(plan: list[tuple[SimRequest, int]], now: float) -> None:
        original(plan, now)
        _check_running(engine)

    engine._execute = checked  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(engine.run())
    done: list[SimRequest] = []
    try:
        for wave in workload:
            if isinstance(wave, str):
                engine.reset_prefix_cache()
                continue
            reqs = []
            for n, (prefix, suffix, max_tokens) in enumerate(wave):
                prompt = PREFIXES[prefix] + suffix
                if engine.blocks_needed(len(prompt), max_tokens) > cache_blocks:
                    continue
                r = SimRequest(f"r{n}", prompt, max_tokens, seed=n)
                reqs.append(r)
                done.append(r)
                engine.add(r)
            for r in reqs:
                while not r.done:
                    waiter = asyncio.ensure_future(r.wake.wait())
                    await asyncio.wait({waiter, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if task.done():
                        task.result()  # the step loop died: raise its error
                        raise AssertionError("the step loop stopped")
                    assert waiter.done() or r.done, "no progress for 30 s"
                    r.wake.clear()
            await asyncio.sleep(0)
        assert not engine.running and not engine.waiting
        assert len(engine.cache.free) == cache_blocks
        assert all(len(r.choices[0].tokens) == r.max_tokens for r in done)
        assert mirror.errors == []
        assert mirror.blocks == engine.cache.contents()
        return mirror, engine
    finally:
        task.cancel()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workload_st, cache_blocks=st.integers(12, 40), layout=st.sampled_from(["map", "array"]))
def test_events_rebuild_the_cache(
    workload: list[list[tuple[int, list[int], int]] | str], cache_blocks: int, layout: str
) -> None:
    asyncio.run(_run(workload, cache_blocks, layout))


def test_eviction_happens_when_the_cache_is_full() -> None:
    """A fixed workload larger than the cache: some blocks must be removed, mirror still exact."""
    workload: list[list[tuple[int, list[int], int]] | str] = [
        [(i % 4, list(range(5, 5 + 8 * i)), 4)] for i in range(1, 8)
    ]
    mirror, _ = asyncio.run(_run(workload, 14, "map"))
    assert mirror.removed > 0 and mirror.blocks


def test_preemption_when_decodes_outgrow_the_cache() -> None:
    """Lazy block allocation: more requests run than could finish together; some are preempted
    (blocks freed, recomputed later) and every one still produces all its tokens."""
    wave = [(i, list(range(100 + 7 * i, 104 + 7 * i)), 40) for i in range(4)]
    mirror, engine = asyncio.run(_run([wave], 22, "map"))
    assert engine.metrics.preemptions > 0
    assert mirror.removed > 0
