"""Is a worker that answers nothing working? Its engine's progress counters say.

The hang detector (:mod:`infera_core.server.hangs`) asks before it calls a worker hung:
a long non-streaming request gets its response headers only when it is done, so silence
alone does not tell a busy worker from a hung one. :func:`progress` reads the worker's
``/metrics`` (the vLLM and SGLang names, which the sim speaks too) and returns the values
of the series that move while an engine works: tokens prefilled and generated, iterations,
requests running and waiting, KV cache usage. Two readings a few seconds apart that differ
show the worker alive; equal readings while requests wait on it, or no answer at all, show
it is not working (so retrying its requests elsewhere runs nothing twice).
"""

from __future__ import annotations

from infera_core.scheduling.types import Endpoint

PROGRESS = (
    "generation_tokens_total",
    "prompt_tokens_total",
    "iteration_tokens_total_count",
    "iteration_tokens_total_sum",
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "gpu_cache_usage_perc",
    "num_running_reqs",
    "num_queue_reqs",
    "token_usage",
)
"""Endings of the metric names (any ``engine:`` prefix) whose change shows progress."""


def progress_of(text: str) -> str:
    """The progress series of a ``/metrics`` text, one ``name{labels} value`` a line, sorted."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(PROGRESS):
            out.append(line)
    return "\n".join(sorted(out))


async def progress(ep: Endpoint, within: float) -> str | None:
    """The worker's progress reading (see :func:`progress_of`; ``""`` when its ``/metrics``
    answered without such series), or None when it did not answer within ``within`` s or
    cannot be asked (a worker reached by another transport than HTTP)."""
    url = ep.record.url
    if not url.startswith(("http://", "https://")):
        return None
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as session,
            session.get(url.rstrip("/") + "/metrics") as r,
        ):
            if r.status != 200:
                return ""
            return progress_of(await r.text(errors="replace"))
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
