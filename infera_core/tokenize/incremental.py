"""Incremental tokenization: reuse the token ids of a previously seen text prefix.

In multi-turn chat each turn's rendered prompt is the previous turn's rendered prompt
plus a little, so most of its tokens are already known. :class:`PrefixTokenCache`
keeps recent texts with their token ids and token start offsets, finds the longest
previously seen prefix of a new text, and tokenizes only from a safe point before the
end of that prefix:

1. **Find**: the text is cut into ``chunk_chars`` pieces with a chained hash per
   piece boundary; every cached text is registered under all its boundary hashes, so
   the longest cached text sharing at least one whole piece is found with one dict
   probe per boundary (newest entry wins). The exact common prefix is then measured
   by comparing the two strings.
2. **Back off**: BPE merges and pre-tokenizer look-ahead can change the last tokens
   of a prefix once text follows it, so only tokens ending at least ``margin`` tokens
   before the end of the common prefix are reused.
3. **Verify**: the text is re-tokenized from the start offset of the first token not
   reused; the first ``margin // 2`` tokens of that must reproduce the cached tokens
   (ids and offsets), showing that offset is a stable token boundary (restarting
   there changes nothing), or the whole text is tokenized afresh
   (counted in ``fallbacks``). Tokenizers whose output depends on where the text
   starts (e.g. a SentencePiece ``Metaspace`` prepending ``▁``) therefore always fall
   back: correct, just not faster.

Thread-safe (one lock around the cache; tokenization runs outside it). Bounded by the
approximate bytes of what it holds (text + ids + offsets), least recently used first.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable

EncodeOffsets = Callable[[str], tuple[list[int], list[int]]]
"""text → (token ids, start character offset of each token), no special tokens added."""


class _Entry:
    __slots__ = ("ids", "keys", "size", "starts", "text")

    def __init__(self, text: str, ids: list[int], starts: array[int], keys: list[bytes], size: int) -> None:
        self.text = text
        self.ids = ids
        self.starts = starts
        self.keys = keys
        self.size = size


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search over slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi + 1] != b[:hi + 1] somewhere below
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


_STEP = 16384


def int_array(values: list[int]) -> array[int]:
    """``array("i", values)`` built a slice at a time: one call over 250,000 ints holds the
    interpreter for tens of ms (the event loop waits that long for it), a slice ~0.3 ms."""
    out = array("i")
    for lo in range(0, len(values), _STEP):
        out.extend(values[lo : lo + _STEP])
    return out


class PrefixTokenCache:
    """See the module docstring. ``encode(scope, text, encode_offsets)`` is the entry point."""

    def __init__(self, max_bytes: int = 256 << 20, chunk_chars: int = 1024, margin: int = 8) -> None:
        self.max_bytes = max_bytes
        self.chunk_chars = chunk_chars
        self.margin = margin
        self._keys: dict[bytes, _Entry] = {}
        self._lru: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.fallbacks = 0
        self.reused_tokens = 0
        self.new_tokens = 0

    def __len__(self) -> int:
        return len(self._lru)

    def _chunk_keys(self, scope: str, text: str) -> list[bytes]:
        h = hashlib.blake2b(scope.encode(), digest_size=16).digest()
        out = []
        step = self.chunk_chars
        for i in range(0, len(text) - step + 1, step):
            h = hashlib.blake2b(
                h + text[i : i + step].encode("utf-8", "surrogatepass"), digest_size=16
            ).digest()
            out.append(h)
        return out

    def encode(
        self,
        scope: str,
        text: str,
        encode_offsets: EncodeOffsets,
        on_prefix: Callable[[list[int]], object] | None = None,
    ) -> list[int]:
        """Token ids of ``text`` (as ``encode_offsets(text)[0]``), reusing a cached prefix's.

        ``on_prefix(ids)`` is called with the reused prefix's ids before the rest is
        tokenized (provisional: should the boundary check fail, the whole text is
        tokenized and may differ near the end of that prefix).
        """
        if self.max_bytes <= 0:
            return encode_offsets(text)[0]
        keys = self._chunk_keys(scope, text)
        prev: _Entry | None = None
        with self._lock:
            for key in reversed(keys):
                prev = self._keys.get(key)
                if prev is not None:
                    self._lru.move_to_end(id(prev))
                    break
        done = self._extend(prev, text, encode_offsets, on_prefix) if prev is not None else None
        if done is None:
            ids, starts_list = encode_offsets(text)
            starts = int_array(starts_list)
            fresh = len(ids)
        else:
            ids, starts, fresh = done
        size = sys.getsizeof(text) + 12 * len(ids) + 32 * fresh + 50 * len(keys)
        with self._lock:
            if done is None:
                self.misses += 1
            else:
                self.hits += 1
                self.reused_tokens += len(ids) - fresh
            self.new_tokens += fresh
            if keys and size <= self.max_bytes:
                self._store(_Entry(text, ids, starts, keys, size), prev)
        return ids

    def _extend(
        self,
        prev: _Entry,
        text: str,
        encode_offsets: EncodeOffsets,
        on_prefix: Callable[[list[int]], object] | None,
    ) -> tuple[list[int], array[int], int] | None:
        common = common_prefix_len(prev.text, text)
        starts = prev.starts
        whole = bisect_right(starts, common) - 1  # tokens [0, whole) end at or before ``common``
        cut = whole - self.margin
        if cut <= 0 or starts[cut - 1] >= starts[cut]:
            self._fallback()
            return None
        offset = starts[cut]
        if on_prefix is not None:
            on_prefix(prev.ids[:cut])
        tail_ids, tail_starts = encode_offsets(text[offset:])
        check = max(1, self.margin // 2)  # the last tokens before ``common`` may differ: text follows them
        if (
            len(tail_ids) < check
            or tail_ids[:check] != prev.ids[cut : cut + check]
            or any(tail_starts[i] + offset != starts[cut + i] for i in range(check))
        ):
            self._fallback()
            return None
        ids = prev.ids[:cut] + tail_ids
        new_starts = starts[:cut]
        new_starts.extend(s + offset for s in tail_starts)
        return ids, new_starts, len(tail_ids)

    def _fallback(self) -> None:
        with self._lock:
            self.fallbacks += 1

    def _store(self, entry: _Entry, prev: _Entry | None) -> None:
        for key in entry.keys:
            self._keys[key] = entry
        self._lru[id(entry)] = entry
        self.bytes += entry.size
        if (
            prev is not None
            and id(prev) in self._lru
            and all(self._keys.get(k) is not prev for k in prev.keys)
        ):
            self._drop(prev)  # superseded: every prefix it could serve now maps to ``entry``
        while self.bytes > self.max_bytes and self._lru:
            self._drop(next(iter(self._lru.values())))

    def _drop(self, entry: _Entry) -> None:
        del self._lru[id(entry)]
        self.bytes -= entry.size
        for key in entry.keys:
            if self._keys.get(key) is entry:
                del self._keys[key]
