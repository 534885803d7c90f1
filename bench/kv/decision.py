"""The router's own cost of one routing decision (filters + scorers + picker), per preset.

A fleet of N workers whose KV views each hold ``--prefixes`` cached prompt prefixes (fed
through the real ``KvIndex``), a few requests in flight on each; each decision routes a
prompt that shares a prefix with one worker's cache. Tokenization is excluded (the prompt
comes as token ids, hashed once per request as the server does). The candidates are one
list per model, as the server's endpoint table hands them to the scheduler. Reports the
mean and p99 µs per decision for ``round-robin``, ``least-load`` and ``kv-aware`` (and any
``--presets``, e.g. ``predicted-latency``, whose first tokens are fed back as they come), side by
side in one run, and the KV index's size (blocks, bytes per block, blocks evicted).
``--interleave`` builds one fleet and routes through the presets in turn, 50 decisions each,
so a neighbour's load on a shared machine hits them alike (mean / median / p99 wall µs).

    .venv/bin/python -m bench.kv.decision [--workers 8,64,256] [--tokens 1024,8192] [--requests 2000]
        [--prefixes 32] [--max-blocks 4000000] [--shared-prefix]
        [--presets round-robin,least-load,kv-aware,predicted-latency] [--interleave]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from array import array

from infera_policies.basic import register_basic
from infera_policies.kv import register_kv
from infera_policies.predicted import register_predicted

from infera_core.kv.events import BlockStored, KvEventBatch
from infera_core.kv.index import KvIndex
from infera_core.request import RequestContext
from infera_core.scheduling.profile import build_profile
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, SchedulerDeps
from infera_core.testing.policies import kv_worker_record, policy_registry

BS = 32
VOCAB = range(32000)
PRESETS = ("round-robin", "least-load", "kv-aware")


def registry() -> PolicyRegistry:
    return policy_registry(register_basic, register_kv, register_predicted)


def fleet(
    n: int, tokens: int, prefixes: int, max_blocks: int, rng: random.Random
) -> tuple[KvIndex, list[Endpoint], list[list[int]]]:
    index = KvIndex(max_blocks)
    endpoints = []
    prompts = []
    nblocks = tokens // BS
    for i in range(n):
        ep = Endpoint(kv_worker_record(f"w{i}", BS))
        ep.in_flight = rng.randrange(4)
        endpoints.append(ep)
        view = index.add_view(ep.worker_id, None, BS)
        if SYSTEM:  # every worker caches the shared system prompt
            hs: list[int | bytes] = [(1 << 62) + (i << 20) + k for k in range(len(SYSTEM) // BS)]
            index.apply(view, KvEventBatch(0.0, [BlockStored(hs, None, SYSTEM, BS)]))
        for j in range(prefixes):
            # distinct prompts per worker: a random first block, then a shared random tail
            toks = rng.choices(VOCAB, k=BS) + TAIL[: (nblocks - 1) * BS]
            hashes: list[int | bytes] = [(i << 40) + (j << 20) + k for k in range(nblocks)]
            if not SYSTEM:
                index.apply(view, KvEventBatch(0.0, [BlockStored(hashes, None, toks, BS)]))
                if j == 0:
                    prompts.append(toks[: tokens // 2] + rng.choices(VOCAB, k=tokens // 2))
                continue
            # after the system prompt: the worker's own half, then the request's own quarter
            toks = toks[: len(toks) // 2]
            hashes = hashes[: len(toks) // BS]
            parent = (1 << 62) + (i << 20) + len(SYSTEM) // BS - 1
            index.apply(view, KvEventBatch(0.0, [BlockStored(hashes, parent, toks, BS)]))
            if j == 0:
                prompts.append(SYSTEM + toks[: tokens // 4] + rng.choices(VOCAB, k=tokens // 4))
    return index, endpoints, prompts


TAIL: list[int] = []
SYSTEM: list[int] = []


def seeded_fleet(
    n: int, tokens: int, prefixes: int, max_blocks: int, shared: bool = False
) -> tuple[KvIndex, list[Endpoint], list[list[int]]]:
    """:func:`fleet` from the bench's fixed seeds (the same fleet in every run)."""
    TAIL[:] = random.Random(2).choices(VOCAB, k=tokens)
    SYSTEM[:] = random.Random(3).choices(VOCAB, k=tokens // 2) if shared else []
    return fleet(n, tokens, prefixes, max_blocks, random.Random(1))


def request(prompts: list[list[int]], r: int) -> RequestContext:
    """Request ``r``: one worker's prompt as fresh ints, as a tokenizer hands them over (not the
    bench's long-lived, cold ones)."""
    toks = array("i", prompts[r % len(prompts)]).tolist()
    return RequestContext(f"r{r}", "m", "/v1/completions", {"prompt": "x"}, token_ids=toks)


def measure(
    preset: str,
    n: int,
    tokens: int,
    requests: int,
    prefixes: int,
    max_blocks: int,
    reg: PolicyRegistry,
    shared: bool = False,
) -> tuple[list[float], list[float], dict[str, object]]:
    index, endpoints, prompts = seeded_fleet(n, tokens, prefixes, max_blocks, shared)
    # the bench keeps a prompt per worker (n × tokens ints) that a server never holds: out of
    # the collector's way, so its full passes do not walk them inside the timed decisions
    gc.collect()
    gc.freeze()
    deps = SchedulerDeps(kv_index=index, clock=time.monotonic)
    profile = build_profile(preset, reg.preset(preset).profile, reg, deps)
    out: list[float] = []
    cpu: list[float] = []
    for r in range(requests):
        ctx = request(prompts, r)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        cands = profile.filter(ctx, endpoints)
        ep = profile.pick(ctx, cands)
        out.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        profile.first_token(ctx, ep)  # outside the timed decision, as in the server
        profile.finished(ctx, ep, True)
    gc.unfreeze()
    return out, cpu, index.stats()


def interleaved(
    presets: list[str],
    n: int,
    tokens: int,
    requests: int,
    prefixes: int,
    max_blocks: int,
    reg: PolicyRegistry,
) -> dict[str, list[float]]:
    """Per preset, wall seconds per decision: one fleet, the presets in turn, 50 decisions each
    (each preset keeps its own state: built with its own deps, over the same endpoints)."""
    index, endpoints, prompts = seeded_fleet(n, tokens, prefixes, max_blocks)
    profiles = []
    for preset in presets:
        deps = SchedulerDeps(kv_index=index, clock=time.monotonic)
        profiles.append(build_profile(preset, reg.preset(preset).profile, reg, deps))
    gc.collect()
    gc.freeze()
    out: dict[str, list[float]] = {p: [] for p in presets}
    r = 0
    for block in range(len(presets) * requests // 50):
        preset, profile = presets[block % len(presets)], profiles[block % len(presets)]
        for _ in range(50):
            ctx = request(prompts, r)
            r += 1
            t0 = time.perf_counter()
            ep = profile.pick(ctx, profile.filter(ctx, endpoints))
            out[preset].append(time.perf_counter() - t0)
            profile.first_token(ctx, ep)  # outside the timed decision, as in the server
            profile.finished(ctx, ep, True)
    gc.unfreeze()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="8,64,256")
    ap.add_argument("--tokens", default="1024,8192")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--prefixes", type=int, default=32, help="cached prompt prefixes per worker")
    ap.add_argument("--max-blocks", type=int, default=KvIndex().max_blocks, help="the index's block cap")
    ap.add_argument(
        "--shared-prefix",
        action="store_true",
        help="every worker also caches one system prompt (half the tokens) that every request starts with",
    )
    ap.add_argument("--presets", default=",".join(PRESETS), help="the presets to measure, side by side")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="one fleet, the presets in turn (50 decisions each): mean / median / p99 wall µs",
    )
    a = ap.parse_args()
    presets = a.presets.split(",")
    reg = registry()
    if a.interleave:
        print(f"{'workers':>7} {'tokens':>6} " + " ".join(f"{p + ' µs':>26}" for p in presets))
        for tokens in map(int, a.tokens.split(",")):
            for n in map(int, a.workers.split(",")):
                got = interleaved(presets, n, tokens, a.requests, a.prefixes, a.max_blocks, reg)
                cells = [
                    f"{statistics.fmean(t) * 1e6:.0f} / {statistics.median(t) * 1e6:.0f} / "
                    f"{statistics.quantiles(t, n=100)[98] * 1e6:.0f}"
                    for t in got.values()
                ]
                print(f"{n:7d} {tokens:6d} " + " ".join(f"{c:>26}" for c in cells), flush=True)
        return
    print(
        f"{'workers':>7} {'tokens':>6} "
        + " ".join(f"{p + ' µs':>26}" for p in presets)
        + f" {'index blocks':>12} {'B/block':>7} {'evicted':>9}"
    )
    for tokens in map(int, a.tokens.split(",")):
        for n in map(int, a.workers.split(",")):
            cells = []
            stats: dict[str, object] = {}
            for preset in presets:
                t, cpu, stats = measure(
                    preset, n, tokens, a.requests, a.prefixes, a.max_blocks, reg, a.shared_prefix
                )
                p99 = statistics.quantiles(t, n=100)[98]
                cpu99 = statistics.quantiles(cpu, n=100)[98]
                cells.append(f"{statistics.fmean(t) * 1e6:.0f} / {p99 * 1e6:.0f} / {cpu99 * 1e6:.0f}")
            blocks = int(str(stats["blocks"]))
            per_block = int(str(stats["memory_bytes"])) / max(1, blocks)
            print(
                f"{n:7d} {tokens:6d} "
                + " ".join(f"{c:>26}" for c in cells)
                + f" {blocks:12d} {per_block:7.0f} {stats['evicted_for_memory']!s:>9}",
                flush=True,
            )


if __name__ == "__main__":
    main()
