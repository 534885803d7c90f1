"""sglang-router's ``cache_aware`` policy, re-implemented for the in-process benches.

What sgl-router (``sgl-router/src/policies/cache_aware.rs`` and ``tree.rs``) does, step by
step, so ``bench/fleet/saturation.py`` can run it against the same sims, in the same virtual
time, as the router's own policies (the real router is an HTTP proxy in real time):

* One approximate radix tree per model, shared by all workers ("tenants"): every routed
  prompt is inserted under the worker it went to; each node remembers, per tenant, when
  it was last used, and each tenant's size (characters it owns) is counted.
* ``load`` = the worker's in-flight requests. The fleet is *imbalanced* when
  ``max − min > balance_abs_threshold`` **and** ``max > min × balance_rel_threshold``;
  then the least loaded worker gets the request (its prompt is still inserted).
* Otherwise the longest prefix match over the whole tree picks the deepest matching
  node; if ``matched / prompt length > cache_threshold`` the request goes to the first
  tenant of that node (DashMap order in Rust: here the first inserted), else to the
  tenant with the smallest tree ("most available cache").
* Every ``eviction_interval`` seconds, tenants over ``max_tree_size`` lose their least
  recently used leaves until they fit.

sgl-router matches the prompt's *text*, character by character; here a character is
one token id (the benches route token ids), which keeps the match rate's meaning.
Defaults are sgl-router's: 0.3, 64, 1.5, 120 s, 2^26.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "parent", "tenants", "text")

    def __init__(self, text: tuple[int, ...], parent: _Node | None) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.tenants: dict[str, float] = {}
        """tenant → last access time."""


def _shared(a: tuple[int, ...], b: Sequence[int], start: int) -> int:
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class RadixTree:
    """Multi-tenant approximate radix tree (sgl-router's ``Tree``)."""

    def __init__(self) -> None:
        self.root = _Node((), None)
        self.size: dict[str, int] = {}

    def add_tenant(self, tenant: str, now: float) -> None:
        self.root.tenants[tenant] = now
        self.size.setdefault(tenant, 0)

    def _touch(self, node: _Node, tenant: str, now: float) -> None:
        if tenant not in node.tenants:
            self.size[tenant] = self.size.get(tenant, 0) + len(node.text)
        node.tenants[tenant] = now

    def insert(self, text: Sequence[int], tenant: str, now: float) -> None:
        node = self.root
        self._touch(node, tenant, now)
        i, n = 0, len(text)
        while i < n:
            child = node.children.get(text[i])
            if child is None:
                new = _Node(tuple(text[i:]), node)
                node.children[text[i]] = new
                self._touch(new, tenant, now)
                return
            k = _shared(child.text, text, i)
            if k < len(child.text):  # split: node → mid (shared part) → child (rest)
                mid = _Node(child.text[:k], node)
                mid.tenants = dict(child.tenants)
                node.children[text[i]] = mid
                child.text = child.text[k:]
                child.parent = mid
                mid.children[child.text[0]] = child
                child = mid
            self._touch(child, tenant, now)
            node = child
            i += k

    def prefix_match(self, text: Sequence[int], now: float) -> tuple[int, str | None]:
        """(matched length, the first tenant of the deepest matching node); refreshes that tenant's path."""
        node = self.root
        i, n = 0, len(text)
        while i < n:
            child = node.children.get(text[i])
            if child is None:
                break
            k = _shared(child.text, text, i)
            i += k
            node = child
            if k < len(child.text):
                break
        tenant = next(iter(node.tenants), None)
        if tenant is not None:
            walk: _Node | None = node
            while walk is not None:
                walk.tenants[tenant] = now
                walk = walk.parent
        return i, tenant

    def smallest_tenant(self) -> str:
        return min(self.size, key=self.size.__getitem__)

    def evict_by_size(self, max_size: int) -> None:
        """Drop each over-size tenant's least recently used leaves until it fits."""
        heap: list[tuple[float, int, str, _Node]] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            below = {t for c in node.children.values() for t in c.tenants}
            for t, ts in node.tenants.items():
                if t not in below:
                    heap.append((ts, id(node), t, node))
        heapq.heapify(heap)
        while heap:
            _, _, t, node = heapq.heappop(heap)
            if self.size.get(t, 0) <= max_size or t not in node.tenants or node is self.root:
                continue
            del node.tenants[t]
            self.size[t] -= len(node.text)
            parent = node.parent
            if not node.tenants and not node.children and parent is not None:
                del parent.children[node.text[0]]
            if (
                parent is not None
                and parent is not self.root
                and t in parent.tenants
                and not any(t in c.tenants for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.tenants[t], id(parent), t, parent))


class CacheAware:
    """``cache_aware`` routing over ``tenants`` (worker ids) given their in-flight loads."""

    def __init__(
        self,
        tenants: Sequence[str],
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size: int = 1 << 26,
    ) -> None:
        self.tree = RadixTree()
        for t in tenants:
            self.tree.add_tenant(t, 0.0)
        self.cache_threshold = cache_threshold
        self.abs = balance_abs_threshold
        self.rel = balance_rel_threshold
        self.interval = eviction_interval_s
        self.max_tree_size = max_tree_size
        self._next_eviction = eviction_interval_s
        self.balanced_picks = 0

    def pick(self, text: Sequence[int], tenants: Sequence[str], loads: Sequence[int], now: float) -> int:
        """Index into ``tenants`` of the worker for ``text``."""
        if now >= self._next_eviction:
            self.tree.evict_by_size(self.max_tree_size)
            self._next_eviction = now + self.interval
        hi, lo = max(loads), min(loads)
        if hi - lo > self.abs and hi > lo * self.rel:
            i = loads.index(lo)
            self.tree.insert(text, tenants[i], now)
            self.balanced_picks += 1
            return i
        matched, tenant = self.tree.prefix_match(text, now)
        rate = matched / len(text) if text else 0.0
        chosen = tenant if rate > self.cache_threshold and tenant is not None else self.tree.smallest_tenant()
        self.tree.insert(text, chosen, now)
        return tenants.index(chosen)
