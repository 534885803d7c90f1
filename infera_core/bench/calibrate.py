"""``infera-run calibrate``: measure a running engine and write its :class:`TimingProfile`.

Three short probes against one OpenAI-compatible engine (``/v1/completions``, token-id
prompts so the token counts are exact whatever the tokenizer):

- **prefill**: for each prompt length, a fresh prompt and then the same prompt again (a prefix
  cache hit, ``usage.prompt_tokens_details.cached_tokens`` when the engine reports it), one
  output token each, one at a time. TTFT against the uncached tokens is fitted by least squares:
  the slope gives ``prefill_tokens_per_s``, the intercept ``prefill_base_ms``.
- **decode**: B streams at once (each batch size), ``decode_tokens`` tokens each; the mean
  inter-token time against B gives ``itl_base_ms`` + ``itl_slope_ms`` × B.
- **concurrency**: decode throughput B / ITL(B); the smallest B within 10 % of the best is the
  ``max_useful_concurrency``.

vLLM's ``vllm:cache_config_info`` metric (when ``/metrics`` has it) gives the block size and
the KV capacity in blocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from infera_core.engines.timing import TimingProfile
from infera_core.errors import ConfigError, InferaError


class CalibrateError(InferaError):
    """The engine could not be measured (unreachable, or it refused the probe)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One request's timings: TTFT, mean ITL after the first token, token counts."""

    ttft: float
    itl: float | None
    prompt_tokens: int
    cached_tokens: int | None
    output_tokens: int


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Robust (intercept, slope) of y over x (Theil–Sen: the median of the pairwise slopes, so a
    few points slowed by a busy host do not tilt the line); slope 0 when every x is the same."""
    slopes = [
        (y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1
    ]
    if not slopes:
        return statistics.median(y for _, y in points), 0.0
    slope = statistics.median(slopes)
    return statistics.median(y - slope * x for x, y in points), slope


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class Calibrator:
    """Runs the probes against ``url`` (``…/v1``) with ``model``."""

    def __init__(self, client: httpx.AsyncClient, url: str, model: str, vocab_size: int) -> None:
        self.client = client
        self.url = _base(url)
        self.model = model
        self.vocab_size = vocab_size
        self._rng = random.Random()  # fresh prompts each run: a second calibration must not hit the
        # prefix cache the first one filled

    def prompt(self, n: int) -> list[int]:
        """``n`` token ids no earlier probe (of this run or another) used as a prefix (ids 10 …
        vocab_size − 1)."""
        return [self._rng.randrange(10, self.vocab_size) for _ in range(n)]

    async def request(self, prompt: list[int], max_tokens: int) -> Probe:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        stamps: list[float] = []
        usage: dict[str, object] = {}
        async with self.client.stream("POST", self.url + "/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                raise CalibrateError(f"--url {self.url}: /completions answered {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("choices"):  # a token (its text may be empty: a partial UTF-8 byte)
                    stamps.append(time.perf_counter())
                if chunk.get("usage"):
                    usage = chunk["usage"]
        if not stamps:
            raise CalibrateError(f"--url {self.url}: a probe request streamed no tokens")
        out = int(str(usage.get("completion_tokens", len(stamps))))
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        itl = (stamps[-1] - stamps[0]) / (out - 1) if out > 1 and len(stamps) > 1 else None
        return Probe(
            ttft=stamps[0] - t0,
            itl=itl,
            prompt_tokens=int(str(usage.get("prompt_tokens", len(prompt)))),
            cached_tokens=int(cached) if cached is not None else None,
            output_tokens=out,
        )

    async def prefill(self, lengths: Sequence[int], repeats: int, block: int) -> list[tuple[float, float]]:
        """(uncached tokens, TTFT s) points: medians of ``repeats`` fresh and repeated prompts."""
        for n in lengths:  # warm-up: first-request compilation and allocations for each shape
            await self.request(self.prompt(n), 1)
        points: list[tuple[float, float]] = []
        for n in lengths:
            fresh: list[float] = []
            again: list[tuple[float, float]] = []
            for _ in range(repeats):
                p = self.prompt(n)
                first = await self.request(p, 1)
                fresh.append(first.ttft)
                second = await self.request(p, 1)
                if second.cached_tokens is not None:
                    uncached = second.prompt_tokens - second.cached_tokens
                else:  # no usage details: assume the full blocks before the last token hit
                    uncached = n - ((n - 1) // block) * block
                again.append((float(uncached), second.ttft))
            points.append((float(n), statistics.median(fresh)))
            points.append((statistics.median(u for u, _ in again), statistics.median(t for _, t in again)))
        return points

    async def decode(self, batches: Sequence[int], tokens: int, repeats: int) -> list[tuple[float, float]]:
        """(batch size, mean ITL s) points."""
        points: list[tuple[float, float]] = []
        for b in batches:
            itls: list[float] = []
            for _ in range(repeats):
                got = await asyncio.gather(*(self.request(self.prompt(16), tokens) for _ in range(b)))
                itls += [p.itl for p in got if p.itl is not None]
            if itls:
                points.append((float(b), statistics.median(itls)))
        return points


async def engine_model(client: httpx.AsyncClient, url: str) -> tuple[str, str]:
    """(first served model, owner) from ``GET /v1/models``; CalibrateError naming the URL."""
    base = _base(url)
    try:
        resp = await client.get(base + "/models")
    except httpx.HTTPError as exc:
        raise CalibrateError(f"--url {url}: cannot reach the engine ({type(exc).__name__}: {exc})") from None
    try:
        data = resp.json()["data"]
        return str(data[0]["id"]), str(data[0].get("owned_by", ""))
    except (ValueError, KeyError, IndexError, TypeError):
        raise CalibrateError(
            f"--url {url}: GET /v1/models answered {resp.status_code} without a model list "
            "(is this an OpenAI-compatible engine?)"
        ) from None


_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)


async def cache_config(client: httpx.AsyncClient, url: str) -> dict[str, int]:
    """``block_size`` and ``num_gpu_blocks`` from vLLM's ``vllm:cache_config_info`` (if served)."""
    root = _base(url)[: -len("/v1")]
    try:
        text = (await client.get(root + "/metrics")).text
    except httpx.HTTPError:
        return {}
    m = _CACHE_INFO.search(text)
    if not m:
        return {}
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    out: dict[str, int] = {}
    for key in ("block_size", "num_gpu_blocks"):
        value = labels.get(key, "")
        if value.isdigit() and int(value) > 0:
            out[key] = int(value)
    return out


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ConfigError(f"{flag}: expected a comma list of positive integers (got {text!r})")
    return sorted(set(values))


async def calibrate(
    url: str,
    model: str | None = None,
    prompt_lens: str = "64,256,512,1024",
    batch_sizes: str = "1,2,4,8",
    decode_tokens: int = 32,
    repeats: int = 3,
    vocab_size: int = 1000,
    request_timeout: float = 120.0,
) -> TimingProfile:
    """Measure the engine at ``url`` and return its profile."""
    lengths = _ints(prompt_lens, "--prompt-lens")
    batches = _ints(batch_sizes, "--batch-sizes")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: expected an http(s) URL such as http://127.0.0.1:8000/v1")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per probe request
    limits = httpx.Limits(max_connections=max(batches) + 4)
    async with httpx.AsyncClient(timeout=request_timeout, limits=limits) as client:
        served, owner = await engine_model(client, url)
        cal = Calibrator(client, url, model or served, vocab_size)
        cache = await cache_config(client, url)
        block = cache.get("block_size", 16)
        try:
            prefill = await cal.prefill(lengths, repeats, block)
            decode = await cal.decode(batches, decode_tokens, repeats)
        except httpx.HTTPError as exc:
            raise CalibrateError(f"--url {url}: a probe failed ({type(exc).__name__}: {exc})") from None
    base, slope = fit_line(prefill)
    if slope <= 0:
        raise CalibrateError(
            "prefill time did not grow with prompt length: use longer --prompt-lens (e.g. 256,1024,2048)"
        )
    itl_base, itl_slope = fit_line(decode)
    itl_slope = max(0.0, itl_slope)
    if itl_slope == 0.0:
        itl_base = statistics.fmean(y for _, y in decode)
    throughput = [(b, b / (itl_base + itl_slope * b)) for b, _ in decode]
    best = max(t for _, t in throughput)
    useful = min(int(b) for b, t in throughput if t >= 0.9 * best)
    return TimingProfile(
        engine=owner or url,
        model=model or served,
        prefill_tokens_per_s=1.0 / slope,
        prefill_base_ms=max(0.0, base) * 1000.0,
        itl_base_ms=max(0.0, itl_base) * 1000.0,
        itl_slope_ms=itl_slope * 1000.0,
        block_size=cache.get("block_size"),
        cache_blocks=cache.get("num_gpu_blocks"),
        max_useful_concurrency=useful,
        samples={
            "prefill_uncached_tokens_ttft_s": [list(p) for p in prefill],
            "decode_batch_itl_s": [list(p) for p in decode],
        },
    )
