"""KV scoring latency: longest cached prefix of one prompt across many workers.

For prompts of 1k / 8k / 32k tokens and fleets of 8 / 64 / 256 workers (block size
32), fills a KvIndex so each worker holds a random-length prefix of the prompt plus
unrelated blocks, then times (a) hashing the prompt's blocks, (b) the one-pass match
over all workers (``KvIndex.match``), (c) a naive per-worker dict walk. Tokenization
is timed separately with a BPE tokenizer trained on the spot (``tokenizers``).

The multi-turn rows time the whole routing cost of one chat turn through the router's
tokenizer service (render the chat template, tokenize off the event loop, hash the
blocks, match them over 64 workers) for a conversation whose first turn has 32k
tokens and whose later turns each add an assistant reply and a user message: with
incremental tokenization (the default) and without (full tokenization every turn).

Run: ``.venv/bin/python -m bench.kv.score`` (``--multi-turn`` for those rows only)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infera_core.kv.events import BlockStored, KvEventBatch
from infera_core.kv.index import KvIndex, WorkerView

BS = 32


def _time(fn: Callable[[], object], reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def build(n_tokens: int, n_workers: int, rng: random.Random) -> tuple[KvIndex, list[int], list[WorkerView]]:
    index = KvIndex(max_blocks=0)
    prompt = [rng.randrange(32000) for _ in range(n_tokens)]
    nblocks = n_tokens // BS
    views = []
    for w in range(n_workers):
        view = index.add_view(f"w{w}", None, BS)
        keep = rng.randrange(nblocks + 1)
        toks = prompt[: keep * BS]
        if keep:
            index.apply(view, KvEventBatch(0.0, [BlockStored(list(range(keep)), None, toks, BS)]))
        other = [rng.randrange(32000) for _ in range(64 * BS)]
        index.apply(view, KvEventBatch(0.0, [BlockStored(list(range(10**6, 10**6 + 64)), None, other, BS)]))
        views.append(view)
    return index, prompt, views


def tokenization_ms(n_tokens: int) -> float | None:
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        return None
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(2000)]
    corpus = [" ".join(rng.choice(words) for _ in range(20)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=4096, show_progress=False))
    text = " ".join(rng.choice(words) for _ in range(n_tokens))
    while len(tok.encode(text).ids) > n_tokens:
        text = text[: int(len(text) * 0.95)]
    return _time(lambda: tok.encode(text).ids, 5) * 1e3


async def _conversation_costs(model_dir: Path, prefix_bytes: int, turns: int, first: str) -> list[float]:
    from infera_core.bench.workloads import WordSource
    from infera_core.plugin.hooks import InferaHooks
    from infera_core.request import RequestContext
    from infera_core.tokenize.service import RoutingTokenizers
    from infera_core.tokenize.specs import parse_model_specs

    tokens = RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers,
        parse_model_specs([f"m=hf:{model_dir}"]),
        cache_size=0,
        prefix_cache_bytes=prefix_bytes,
        prefix_wait_ms=0,  # time the whole prompt's tokenization
    )
    index, _, views = build(1024, 64, random.Random(5))
    words = WordSource(11)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    messages.append({"role": "user", "content": first})
    costs = []
    for t in range(turns):
        ctx = RequestContext(f"r{t}", "m", "/v1/chat/completions", {"messages": list(messages)})
        t0 = time.perf_counter()
        await tokens.fill(ctx)
        index.match(KvIndex.hash_prompt(ctx.token_ids or [], BS), views)
        costs.append(time.perf_counter() - t0)
        assert ctx.token_ids and not ctx.tokenize_failed
        messages.append({"role": "assistant", "content": words.text(60)})
        messages.append({"role": "user", "content": words.text(30)})
    return costs


def multi_turn(turns: int = 12, n_tokens: int = 32768) -> None:
    from infera_core.bench.workloads import WordSource
    from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
    from infera_core.tokenize.hf import HfTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model_dir(tmp, vocab=4096)
        tok = HfTokenizer(model_dir)
        words = WordSource(10)
        first = words.text(n_tokens // 8)
        while len(tok.encode(first)) < n_tokens:
            first += " " + words.text(128)
        n_first = len(tok.encode_chat([{"role": "user", "content": first}], {}))
        print(
            f"multi-turn chat, first turn {n_first} tokens, +~300 tokens a turn; routing cost per turn in ms"
        )
        print(f"{'tokenization':>12} {'turn 1':>7} {'later p50':>9} {'later max':>9}")
        for label, prefix_bytes in (("full", 0), ("incremental", 256 << 20)):
            costs = asyncio.run(_conversation_costs(model_dir, prefix_bytes, turns, first))
            later = costs[1:]
            print(
                f"{label:>12} {costs[0] * 1e3:7.2f} {statistics.median(later) * 1e3:9.2f} {max(later) * 1e3:9.2f}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--multi-turn", action="store_true", help="only the multi-turn chat rows")
    ap.add_argument("--turns", type=int, default=12, help="turns of the multi-turn conversation")
    args = ap.parse_args()
    if not args.multi_turn:
        single_prompt()
    multi_turn(args.turns)


def single_prompt() -> None:
    rng = random.Random(0)
    print(f"block size {BS}; median of repeated runs; times in ms")
    print(
        f"{'tokens':>7} {'workers':>7} {'hash':>7} {'match':>7} {'hash+match':>10} {'naive walk':>10} {'speedup':>7}"
    )
    for n_tokens in (1024, 8192, 32768):
        for n_workers in (8, 64, 256):
            index, prompt, views = build(n_tokens, n_workers, rng)
            hashes = KvIndex.hash_prompt(prompt, BS)
            held = [v.held() for v in views]  # a naive router's per-worker block sets
            assert index.match(hashes, views) == [float(x) for x in index.naive_match(hashes, held)]
            reps = 30 if n_tokens < 32768 else 10
            t_hash = _time(lambda p=prompt: KvIndex.hash_prompt(p, BS), reps)  # type: ignore[misc]
            t_match = _time(lambda h=hashes, v=views, i=index: i.match(h, v), reps)  # type: ignore[misc]
            t_naive = _time(lambda h=hashes, s=held: KvIndex.naive_match(h, s), reps)  # type: ignore[misc]
            print(
                f"{n_tokens:>7} {n_workers:>7} {t_hash * 1e3:7.3f} {t_match * 1e3:7.3f} "
                f"{(t_hash + t_match) * 1e3:10.3f} {t_naive * 1e3:10.3f} {t_naive / t_match:6.1f}x"
            )
    for n_tokens in (1024, 8192, 32768):
        ms = tokenization_ms(n_tokens)
        if ms is not None:
            print(f"tokenization (BPE, tokenizers) of {n_tokens} tokens: {ms:.2f} ms")


if __name__ == "__main__":
    main()
