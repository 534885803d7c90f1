"""One trace from client to engine: ``infera-run serve --otlp-traces-endpoint`` in front of real
vLLM on CPU started with its own ``--otlp-traces-endpoint``, both exporting to an OTLP/HTTP
receiver in the test. One chat request sent with a ``traceparent`` yields one trace holding the
router's request, route and upstream spans and vLLM's own span, vLLM's a child of the router's
upstream span. Needs ``.venv-vllm`` (with vLLM's OpenTelemetry packages)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from real_vllm import vllm_server

from infera_core.util.net import free_port, stop_process, wait_port

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra: pip install 'infera-core[tracing]'")
otlp = pytest.importorskip("infera_core.testing.otlp")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

TRACE_ID = "5bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "10f067aa0ba902b7"


def _until(check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {check}")
        time.sleep(0.1)
    return got


def test_one_trace_spans_router_and_vllm(tmp_path: Path) -> None:
    with otlp.otlp_receiver() as receiver:
        vllm_env = {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # vLLM's default is gRPC
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        with vllm_server(
            tmp_path, "--otlp-traces-endpoint", receiver.url + "/v1/traces", env=vllm_env
        ) as url:
            fleet = tmp_path / "fleet.yaml"
            fleet.write_text(yaml.safe_dump({"workers": [{"worker_id": "v0", "url": url, "model": "tiny"}]}))
            port = free_port()
            infera_run = str(Path(sys.executable).with_name("infera-run"))
            argv = [infera_run, "serve", "--port", str(port), "--processes", "1", "--discovery", "static"]
            argv += ["--static-file", str(fleet), "--otlp-traces-endpoint", receiver.url]
            env = dict(os.environ, OTEL_BSP_SCHEDULE_DELAY="100", INFERA_LOG_LEVEL="warning")
            serve = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
            try:
                wait_port("127.0.0.1", port, 60)
                base = f"http://127.0.0.1:{port}"
                _until(lambda: httpx.get(base + "/health", timeout=5).status_code == 200, 60)
                body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
                headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
                r = httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=120)
                assert r.status_code == 200, r.text

                def complete() -> bool:
                    spans = receiver.of_trace(TRACE_ID)
                    names = {s.name for s in spans}
                    engine = [s for s in spans if s.service != "infera-router"]
                    return {"infera.request", "infera.route", "infera.upstream"} <= names and bool(engine)

                _until(complete, 60)
            finally:
                stop_process(serve, grace=15)
    spans = receiver.of_trace(TRACE_ID)
    by_name = {s.name: s for s in spans if s.service == "infera-router"}
    root, upstream = by_name["infera.request"], by_name["infera.upstream"]
    assert root.parent_span_id == CLIENT_SPAN
    assert by_name["infera.route"].parent_span_id == root.span_id == upstream.parent_span_id
    engine = [s for s in spans if s.service != "infera-router"]
    assert any(s.parent_span_id == upstream.span_id for s in engine), [(s.service, s.name) for s in engine]
    print("trace:", sorted((s.service, s.name) for s in spans))
