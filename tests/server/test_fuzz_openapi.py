"""schemathesis against the document the server serves at ``/openapi.json``: no 5xx, responses
as documented (status codes, content types, bodies, ``Allow`` on 405), and no traceback.

Bounded in time (``--max-time``); the number of inputs it tried is reported. Left out:
``positive_data_acceptance`` / ``negative_data_rejection``, since the hot routes validate only
what routing needs and forward every other field unchecked (the document says as much).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from infera_core.testing.threaded import report_line, served_in_thread

ST = Path(sys.executable).with_name("st")
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "unsupported_method",
]


def test_openapi_document_lists_the_public_routes() -> None:
    with served_in_thread(workers=1, model="sim-model") as srv:
        doc = httpx.get(srv.url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/models",
        "/health",
    }
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"):
        assert {"200", "400", "413"} <= set(doc["paths"][path]["post"]["responses"])


@pytest.mark.slow
@pytest.mark.skipif(not ST.exists(), reason="schemathesis (requirements-dev.txt) is not installed")
def test_schemathesis_finds_no_failure(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    seconds = os.environ.get("INFERA_FUZZ_SECONDS", "40")
    with served_in_thread(workers=2, model="sim-model") as srv:
        proc = subprocess.run(
            [
                str(ST),
                "run",
                srv.url + "/openapi.json",
                "--checks",
                ",".join(CHECKS),
                "--max-time",
                seconds,
                "--workers",
                "1",
                "--no-color",
                "--generation-database",
                "none",
                "--request-timeout",
                "20",
                "--phases",
                "examples,coverage,fuzzing",
            ],
            capture_output=True,
            text=True,
            timeout=float(seconds) + 120,
            cwd=tmp_path,
            check=False,
        )
        errors = srv.errors
    counted = re.search(r"(\d+) generated", proc.stdout)
    report_line(request, f"fuzz (schemathesis): {counted.group(1) if counted else '?'} inputs in {seconds} s")
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    assert not errors, errors[:3]
