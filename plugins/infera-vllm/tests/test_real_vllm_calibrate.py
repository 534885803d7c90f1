"""``infera-run calibrate`` against real vLLM on CPU: a sim given the profile it writes answers a
workload with TTFT p50/p90 within 25 % of vLLM's on the same workload.

The host is shared (other tests, other engines): a busy spell during one of the three phases
(calibration, vLLM's run, the sim's run) skews that attempt, so the check is made up to four
times, each with fresh prompts, and every attempt's figures are printed.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import httpx
import pytest
from infera_sim.testing import start_sim
from real_vllm import vllm_server

from infera_core.bench.calibrate import CalibrateError, Calibrator, calibrate
from infera_core.bench.stats import percentile

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

LENGTHS = (256, 768, 1280)
GAP_S = 1.0
REQUESTS = 15
OUTPUT = 8
ATTEMPTS = 4


def workload(seed: int) -> list[tuple[float, list[int], int]]:
    """(arrival s, prompt ids, max tokens): three prompt lengths in turn, one request a second;
    every third repeats the previous prompt (a prefix-cache hit)."""
    rng = random.Random(seed)
    out: list[tuple[float, list[int], int]] = []
    prompt: list[int] = []
    for k in range(REQUESTS):
        if k % 3 != 2:
            prompt = [rng.randrange(10, 1000) for _ in range(LENGTHS[k % 3])]
        out.append((k * GAP_S, prompt, OUTPUT))
    return out


async def ttfts(url: str, arrivals: list[tuple[float, list[int], int]]) -> list[float]:
    async with httpx.AsyncClient(timeout=300) as client:
        cal = Calibrator(client, url, "tiny", 1000)
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def one(at: float, prompt: list[int], max_tokens: int) -> float:
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            return (await cal.request(prompt, max_tokens)).ttft

        return list(await asyncio.gather(*(one(*a) for a in arrivals)))


def test_a_calibrated_sim_answers_within_25_percent_of_real_vllm(tmp_path: Path) -> None:
    figures = []
    with vllm_server(tmp_path) as url:
        # vLLM's first request of a new prompt shape is slow (kernels and buffers for it): a
        # warm engine, as in production, for the workload's shapes too (calibrate warms its own)
        rng = random.Random(1)
        asyncio.run(ttfts(url, [(0.0, [rng.randrange(10, 1000) for _ in range(n)], 2) for n in LENGTHS]))
        for attempt in range(ATTEMPTS):
            try:
                profile = asyncio.run(
                    calibrate(url, prompt_lens="128,512,1024,1536", batch_sizes="1,2,4", decode_tokens=16)
                )
            except CalibrateError as exc:  # a busy spell flattened the prefill line
                figures.append({"attempt": attempt, "calibrate": str(exc)})
                continue
            path = tmp_path / f"profile-{attempt}.json"
            path.write_text(profile.to_json())
            arrivals = workload(100 + attempt)
            real = asyncio.run(ttfts(url, arrivals))
            with start_sim(model="tiny", profile=path, timeout=60) as sim:
                simulated = asyncio.run(ttfts(sim.url, arrivals))
            row = {
                "attempt": attempt,
                "profile": profile.model_dump(exclude={"samples"}),
                **{f"vllm_p{p}": percentile(real, p) for p in (50, 90)},
                **{f"sim_p{p}": percentile(simulated, p) for p in (50, 90)},
            }
            row["ratios"] = [row[f"sim_p{p}"] / row[f"vllm_p{p}"] for p in (50, 90)]  # type: ignore[operator]
            figures.append(row)
            print(json.dumps(row))
            if all(0.75 <= r <= 1.25 for r in row["ratios"]):
                return
    pytest.fail(
        "sim TTFT p50/p90 off vLLM's by more than 25 % in every attempt:\n" + json.dumps(figures, indent=1)
    )
