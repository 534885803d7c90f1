"""``infera-run serve`` as a user runs it: a subprocess in front of sim worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from infera_core.cli import main
from infera_core.util.net import free_port, stop_process

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle, start_sims

MODEL = "sim-model"
INFERA_RUN = str(Path(sys.executable).with_name("infera-run"))


def _write_fleet(path: Path, sims: list[SimHandle], labels: list[dict[str, str]] | None = None) -> None:
    workers = [
        {
            "worker_id": f"sim{i}",
            "url": s.url,
            "model": MODEL,
            "engine": "sim",
            "labels": (labels or [{}] * 9)[i],
        }
        for i, s in enumerate(sims)
    ]
    path.write_text(yaml.safe_dump({"workers": workers}))


class Serve:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, INFERA_LOG_LEVEL="warning")
        self.proc = subprocess.Popen(
            [INFERA_RUN, "serve", "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )

    def wait_healthy(self, workers: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.proc.stdout.read() if self.proc.stdout else ''}")
            try:
                r = httpx.get(self.url + "/health", timeout=1)
                if r.status_code == 200 and r.json()["active_workers"] == workers:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("infera-run serve did not become healthy")

    def stop(self) -> None:
        stop_process(self.proc, grace=10, sig=signal.SIGINT)


@pytest.fixture
def two_sims() -> Iterator[list[SimHandle]]:
    with start_sims(2, model=MODEL, speedup="inf", kv_events_port=None, kv_replay_port=None) as sims:
        yield sims


@pytest.mark.slow
def test_killing_a_worker_between_requests_loses_nothing(tmp_path: Path, two_sims: list[SimHandle]) -> None:
    fleet = tmp_path / "fleet.yaml"
    _write_fleet(fleet, two_sims)
    serve = Serve("--discovery", "static", "--static-file", str(fleet), "--request-max-retries", "1")
    client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0)
    try:
        serve.wait_healthy(2)
        for _ in range(4):
            r = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert r.choices[0].message.content
        picks = {w["worker_id"]: w["picks"] for w in httpx.get(serve.url + "/v1/workers").json()["data"]}
        assert picks == {"sim0": 2, "sim1": 2}
        two_sims[0].proc.kill()
        two_sims[0].proc.wait()
        for i in range(10):
            stream = i % 2 == 1
            if stream:
                chunks = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
                )
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                r = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
                )
                assert r.choices[0].message.content
        metrics = httpx.get(serve.url + "/metrics").text
        assert (
            'infera_requests_total{model="sim-model",route="/v1/chat/completions",status="200"} 14.0'
            in metrics
        )
        assert "infera_retries_total" in metrics
    finally:
        client.close()
        serve.stop()
    assert serve.proc.returncode == 0, serve.proc.stdout.read() if serve.proc.stdout else ""


@pytest.mark.slow
def test_out_of_tree_policy_plugin_is_selectable_by_name(tmp_path: Path, two_sims: list[SimHandle]) -> None:
    pytest.importorskip("infera_example_policy")
    fleet = tmp_path / "fleet.yaml"
    _write_fleet(fleet, two_sims, labels=[{}, {"preferred": "true"}])
    serve = Serve("--discovery", "static", "--static-file", str(fleet), "--router-policy", "example-labelled")
    try:
        serve.wait_healthy(2)
        for _ in range(6):
            r = httpx.post(
                serve.url + "/v1/completions",
                json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                timeout=10,
            )
            assert r.status_code == 200 and r.headers["x-infera-worker"] == "sim1"
        metrics = httpx.get(serve.url + "/metrics").text
        assert 'infera_routing_decision_seconds_count{policy="example-labelled"} 6.0' in metrics
    finally:
        serve.stop()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--router-policy", "no-such"], "unknown policy preset 'no-such'"),
        (["--router-config", "/nonexistent/router.yaml"], "--router-config /nonexistent/router.yaml"),
        (["--router-config", "BAD"], "unknown scorer 'no-such-scorer'"),
        (["--discovery", "nope"], "unknown discovery backend 'nope'"),
        (["--port", "99999"], "--port"),
        (["--router-mode", "sideways"], "sideways"),
    ],
)
def test_cli_mistakes_are_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scorers: [{name: no-such-scorer}]\n")
    args = [str(bad) if a == "BAD" else a for a in args]
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--discovery", "memory", *args])
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def _answers(url: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Wait until the server answers HTTP at all (no worker needed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            httpx.get(url + "/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise TimeoutError("infera-run serve never answered")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "warned"),
    [
        (("--host", "0.0.0.0", "--processes", "2"), True),
        (("--host", "0.0.0.0", "--processes", "1", "--admin-token", "adm"), True),
        (("--host", "127.0.0.1", "--processes", "1"), False),
    ],
)
def test_serving_inference_open_to_the_network_says_so_once(
    tmp_path: Path, args: tuple[str, ...], warned: bool
) -> None:
    """Issue #28 row 15: a non-loopback --host without --api-key-file is one warning line."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("workers: []\n")
    serve = Serve("--discovery", "static", "--static-file", str(fleet), *args)
    try:
        _answers(serve.url, serve.proc)
    finally:
        serve.stop()
    out = serve.proc.stdout.read() if serve.proc.stdout else ""
    lines = [line for line in out.splitlines() if "without --api-key-file" in line]
    assert len(lines) == (1 if warned else 0), out
    if warned:
        assert "0.0.0.0" in lines[0] and "anyone who can reach this port can run inference" in lines[0]
        assert "Traceback" not in out
