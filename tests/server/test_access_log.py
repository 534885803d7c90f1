"""The access log (``--access-log``) of a real ``serve`` subprocess in front of a real sim:
one parseable line per request with the fields an operator follows a request by, sampling
honoured, and never a prompt or an API key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infera_core.testing.serve_processes import serve_processes

sim_testing = pytest.importorskip("infera_sim.testing")

MODEL = "sim-model"
SECRET = "sk-very-secret-key-4711"
PROMPT = "the password is hunter2-zebra"


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with sim_testing.start_sim(model=MODEL, speedup="inf", kv_events_port=None, kv_replay_port=None) as s:
        yield s


def _serve_and_send(sim: Any, tmp: Path, args: list[str], requests: int) -> tuple[list[str], list[int]]:
    keys = tmp / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "team-a", "key": SECRET}]}))
    auth = {"Authorization": f"Bearer {SECRET}"}
    statuses: list[int] = []
    worker = {"worker_id": "sim0", "url": sim.url, "model": MODEL}
    with serve_processes([worker], tmp, "--api-key-file", str(keys), *args, processes=2) as serve:
        for i in range(requests):
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"{PROMPT} {i}"}],
                "max_tokens": 3,
                "stream": i % 2 == 1,
            }
            r = serve.http.post(
                "/v1/chat/completions", json=body, headers={**auth, "X-Request-Id": f"cli-{i}"}
            )
            statuses.append(r.status_code)
        r = serve.http.post(
            "/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": PROMPT}]},
            headers=auth,
        )
        statuses.append(r.status_code)
    assert serve.proc.stdout is not None
    return serve.proc.stdout.read().splitlines(), statuses


def test_json_access_log_has_one_line_per_request_and_no_secrets(sim: Any, tmp_path: Path) -> None:
    out, statuses = _serve_and_send(sim, tmp_path, ["--access-log", "json"], 6)
    assert statuses == [200] * 6 + [404]
    lines = [json.loads(line) for line in out if line.startswith("{") and '"request_id"' in line]
    assert len(lines) == 7, out
    for i, rec in enumerate(lines[:6]):
        assert rec["key"] == "team-a"
        assert rec["model"] == MODEL and rec["route"] == "/v1/chat/completions"
        assert rec["worker"] == "sim0" and rec["status"] == 200 and rec["retries"] == 0
        assert rec["client_request_id"] == f"cli-{i}"
        assert rec["prompt_tokens"] > 0 and rec["completion_tokens"] == 3
        assert 0 < rec["ttft_ms"] <= rec["duration_ms"]
        assert rec["time"].endswith("Z") and rec["request_id"]
        assert "cached_tokens" in rec
    missing = lines[6]
    assert missing["status"] == 404 and missing["worker"] is None and missing["model"] == "-"
    everything = "\n".join(out)
    assert SECRET not in everything and "hunter2" not in everything


def test_text_access_log_honours_its_sample_rate(
    sim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERA_ACCESS_LOG_SAMPLE", "0.5")  # the env var, as an operator sets it
    out, statuses = _serve_and_send(sim, tmp_path, ["--access-log", "text"], 40)
    assert statuses.count(200) == 40
    lines = [line for line in out if line.startswith("time=") and " request_id=" in line]
    assert 5 <= len(lines) <= 36, len(lines)  # ~20 of 41: P(outside) < 1e-6
    fields = dict(part.split("=", 1) for part in lines[0].split(" "))
    assert fields["key"] == "team-a" and fields["model"] in (MODEL, "-")
    everything = "\n".join(out)
    assert SECRET not in everything and "hunter2" not in everything


def test_access_log_off_writes_nothing(sim: Any, tmp_path: Path) -> None:
    out, _ = _serve_and_send(sim, tmp_path, [], 2)
    assert not [line for line in out if "request_id" in line]
