"""The infera-openai engines against stand-in HTTP servers speaking their formats (readiness,
in-flight, the adapter contract kit) and `infera-run up` over an OpenAI server it knows only by command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import httpx
import pytest
from infera_openai.generic import GenericOpenAIAdapter
from infera_openai.llamacpp import LlamaCppAdapter
from infera_openai.tgi import TgiAdapter
from infera_openai.triton import TritonAdapter
from infera_openai.trtllm import TrtllmAdapter
from openai_rig import ctx

from infera_core.engines.base import LaunchContext, RunningEngine
from infera_core.testing.contracts import EngineAdapterContract, sample_launch_context
from infera_core.testing.engine_contract import StandinEndpoints, closed_port
from infera_core.testing.engine_env import clean_environ
from infera_core.testing.fleet import read_until, stopped_with_sigint

# -- readiness and in-flight over real HTTP ------------------------------------------------


class StandIn:
    """The contract kit's loopback stand-in, with ``routes`` to change as the test goes."""

    def __init__(self, server: StandinEndpoints) -> None:
        self.routes: dict[str, tuple[int, str]] = {}
        server.replies = self.routes
        self.url = f"http://127.0.0.1:{server.port}"


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandinEndpoints({}) as server:
        yield StandIn(server)


async def check(adapter: Any, url: str, **options: Any) -> tuple[bool, int | None]:
    c = ctx(adapter, options=options)
    async with httpx.AsyncClient(timeout=5) as client:
        engine = RunningEngine(c, client, url)
        return await adapter.is_ready(engine), await adapter.in_flight(engine)


LLAMACPP_METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


async def test_llamacpp_ready_and_in_flight(standin: StandIn) -> None:
    adapter = LlamaCppAdapter()
    standin.routes["/health"] = (503, '{"error":{"code":503,"message":"Loading model"}}')
    standin.routes["/metrics"] = (200, LLAMACPP_METRICS)
    assert await check(adapter, standin.url) == (False, 5)
    standin.routes["/health"] = (200, '{"status":"ok"}')
    assert await check(adapter, standin.url) == (True, 5)
    # started without --metrics: llama-server answers 501; the busy slots of /slots count
    standin.routes["/metrics"] = (501, '{"error":{"code":501}}')
    slots = [
        {"id": 0, "is_processing": True},
        {"id": 1, "is_processing": False},
        {"id": 2, "is_processing": True},
    ]
    standin.routes["/slots"] = (200, json.dumps(slots))
    assert await check(adapter, standin.url) == (True, 2)
    standin.routes.pop("/slots")
    assert await check(adapter, standin.url) == (True, None)


TGI_METRICS = (
    "# TYPE tgi_queue_size gauge\ntgi_queue_size 4\n"
    "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 7\n"
    "# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens 900\n"
)
TRTLLM_METRICS = (
    'trtllm_num_requests_running{model_name="undefined",engine_type="undefined"} 6.0\n'
    'trtllm_num_requests_waiting{model_name="undefined",engine_type="undefined"} 1.0\n'
    'trtllm_num_requests_completed_total{model_name="undefined",engine_type="undefined"} 50.0\n'
)


@pytest.mark.parametrize(
    ("adapter", "path", "metrics", "in_flight"),
    [
        (TgiAdapter(), "/metrics", TGI_METRICS, 11),  # queue 4 + batch 7
        (TrtllmAdapter(), "/prometheus/metrics", TRTLLM_METRICS, 7),  # running 6 + waiting 1
    ],
    ids=["tgi", "trtllm"],
)
async def test_ready_and_in_flight_from_prometheus_metrics(
    standin: StandIn, adapter: Any, path: str, metrics: str, in_flight: int
) -> None:
    standin.routes["/health"] = (200, "")
    standin.routes[path] = (200, metrics)
    assert await check(adapter, standin.url) == (True, in_flight)


async def test_tgi_unhealthy_is_not_ready(standin: StandIn) -> None:
    standin.routes["/metrics"] = (200, TGI_METRICS)
    standin.routes["/health"] = (503, '{"error":"unhealthy","error_type":"healthcheck"}')
    assert (await check(TgiAdapter(), standin.url))[0] is False


async def test_trtllm_in_flight_from_iteration_stats(standin: StandIn) -> None:
    # without return_perf_metrics (no /prometheus/metrics): the iteration stats of /metrics, newest last
    standin.routes["/health"] = (200, "")
    stats = [
        {"iter": 1, "numActiveRequests": 9, "numQueuedRequests": 9},
        {"iter": 2, "numActiveRequests": 2, "numQueuedRequests": 1},
    ]
    standin.routes["/metrics"] = (200, json.dumps(stats))
    assert await check(TrtllmAdapter(), standin.url) == (True, 3)
    standin.routes["/metrics"] = (200, "[]")  # iteration stats off
    assert await check(TrtllmAdapter(), standin.url) == (True, None)


TRITON_METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 1
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 2
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 4
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 4
"""


async def test_triton_ready_and_in_flight(standin: StandIn) -> None:
    standin.routes["/health"] = (200, "")  # not Triton's route: readiness is /health/ready
    standin.routes["/metrics"] = (200, TRITON_METRICS)
    assert await check(TritonAdapter(), standin.url) == (False, 10)  # 4 active + 3 waiting + 3 pending
    standin.routes["/health/ready"] = (200, "")
    assert (await check(TritonAdapter(), standin.url))[0] is True
    standin.routes["/metrics"] = (
        200,
        'vllm:num_requests_running{model="m"} 2\nvllm:num_requests_waiting{model="m"} 1\n',
    )
    assert await check(TritonAdapter(), standin.url) == (True, 3)


async def test_generic_ready_and_in_flight(standin: StandIn) -> None:
    adapter = GenericOpenAIAdapter()
    standin.routes["/v1/models"] = (200, '{"object":"list","data":[]}')
    assert await check(adapter, standin.url, command="srv --port {port}") == (True, None)
    standin.routes["/stats"] = (200, "my_running 2\nmy_queue 5\n")
    options = {
        "health_path": "/ready",
        "metrics_path": "/stats",
        "running_metric": "my_running",
        "waiting_metric": "my_queue",
    }
    assert await check(adapter, standin.url, **options) == (False, 7)
    standin.routes["/ready"] = (200, "ok")
    assert await check(adapter, standin.url, **options) == (True, 7)


async def test_unreachable_engine_is_not_ready_and_unknown() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for adapter in (LlamaCppAdapter(), TgiAdapter(), TrtllmAdapter(), TritonAdapter()):
        assert await check(adapter, url) == (False, None)


# -- core's adapter contract (its stand-in speaks each engine's own endpoints) ----------------


class _Contract(EngineAdapterContract):
    """A stand-in for the adapter's engine: while starting, ``health`` answers ``starting``
    (nothing when None); once ready, ``healthy`` there and ``metrics % in_flight`` on ``metrics_path``."""

    options: ClassVar[dict[str, Any]] = {}
    health = "/health"
    starting: tuple[int, str] | None = None
    healthy = ""
    metrics_path = "/metrics"
    metrics = ""

    def launch_context(self) -> LaunchContext:
        c = sample_launch_context(options={o.name: o.default for o in self.adapter.options()})
        c.options.update(self.options)
        c.engine_python = "/bin/sh"
        return c

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, tuple[int, str]]:
        if not ready:
            return {self.health: self.starting} if self.starting else {}
        return {self.health: (200, self.healthy), self.metrics_path: (200, self.metrics % in_flight)}


class TestLlamaCppContract(_Contract):
    adapter = LlamaCppAdapter()
    options: ClassVar[dict[str, Any]] = {"llama_server": "/bin/sh"}
    starting = (503, '{"error":{"code":503,"message":"Loading model"}}')
    healthy = '{"status":"ok"}'
    metrics = "llamacpp:requests_processing %d\nllamacpp:requests_deferred 0\n"


class TestTgiContract(_Contract):
    adapter = TgiAdapter()
    options: ClassVar[dict[str, Any]] = {"tgi_launcher": "/bin/sh"}
    starting = (503, '{"error":"unhealthy","error_type":"healthcheck"}')
    metrics = "tgi_batch_current_size %d\ntgi_queue_size 0\n"


class TestTrtllmContract(_Contract):
    adapter = TrtllmAdapter()
    options: ClassVar[dict[str, Any]] = {"trtllm_serve": "/bin/sh"}
    metrics_path = "/prometheus/metrics"
    metrics = (
        'trtllm_num_requests_running{model_name="m"} %d\ntrtllm_num_requests_waiting{model_name="m"} 0\n'
    )


class TestTritonContract(_Contract):
    adapter = TritonAdapter()
    options: ClassVar[dict[str, Any]] = {"triton_frontend": __file__}
    health = "/health/ready"
    starting = (400, '{"detail":"not ready"}')
    metrics = (
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} %d\n'
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64\n'
        'nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 0\n'
    )


class TestGenericContract(_Contract):
    adapter = GenericOpenAIAdapter()
    options: ClassVar[dict[str, Any]] = {
        "command": "my-server --port {port}",
        "running_metric": "my_running",
        "waiting_metric": "my_waiting",
    }
    health = "/v1/models"
    starting = (503, "")
    healthy = '{"object":"list","data":[]}'
    metrics = "my_running %d\nmy_waiting 0\n"


# -- the generic engine end to end: infera-run up over an OpenAI server it knows only by command --

READY_LINE = re.compile(
    r"Infera ready: (http://127\.0\.0\.1:\d+/v1)\s+\((\d+) openai workers, policy ([^;)\s]+)[;)]"
)


@pytest.mark.slow
def test_up_runs_any_openai_server_from_its_command() -> None:
    # the sim stands in for "some OpenAI server"; the adapter knows nothing of it but the command
    command = (
        f"{sys.executable} -m infera_sim.server --host {{host}} --port {{port}} --served-model-name {{model}} "
        "--kv-events-port 0 --kv-replay-port 0 --speedup 50"
    )
    cmd = [sys.executable, "-m", "infera_core", "up", "--engine", "openai", "--workers", "2", "--model", "m"]
    cmd += ["--port", "0", "--quiet", "--drain-timeout", "3", "--ready-timeout", "90"]
    cmd += ["--", "--command", command]
    cmd += ["--running-metric", "vllm:num_requests_running", "--waiting-metric", "vllm:num_requests_waiting"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_environ()
    )
    with stopped_with_sigint(proc):
        found = read_until(proc, READY_LINE, 180)
        url, workers, policy = found.group(1), found.group(2), found.group(3)
        assert (workers, policy) == ("2", "approximate-prefix")
        reply = httpx.post(
            f"{url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"
        listed = httpx.get(url.removesuffix("/v1") + "/v1/workers", timeout=10).json()["data"]
        assert {w["engine"] for w in listed} == {"openai"} and len(listed) == 2
        assert all(w["labels"].get("kv-events") == "none" for w in listed), [w["labels"] for w in listed]
