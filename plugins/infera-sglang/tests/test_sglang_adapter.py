"""Golden argv tests for the SGLang adapter against SGLang's documented server flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from infera_sglang.adapter import SglangAdapter
from sglang_golden import SGLANG_OPTIONS, SGLANG_WORKER

from infera_core.engines.base import LaunchContext
from infera_core.errors import EngineError
from infera_core.testing.engine_env import flag, launch_context, make_engine_env
from infera_core.worker import Role


def ctx(**kw: object) -> LaunchContext:
    return launch_context({**SGLANG_WORKER, "options": dict(SGLANG_OPTIONS)}, 42000, **kw)


def test_launch_server_with_page_size_metrics_and_kv_events(sglang_python: str) -> None:
    adapter = SglangAdapter()
    c = ctx(engine_python=sglang_python, engine_args=["--mem-fraction-static", "0.8"])
    spec = adapter.build_launch(c)
    argv = spec.argv
    assert spec.engine_version == "0.5.23"
    assert argv[:3] == [sglang_python, "-m", "sglang.launch_server"]
    assert flag(argv, "--model-path") == "/models/qwen"
    assert flag(argv, "--served-model-name") == "qwen"
    assert (flag(argv, "--host"), flag(argv, "--port")) == ("0.0.0.0", "30000")
    assert flag(argv, "--page-size") == "16"
    assert "--enable-metrics" in argv
    kv = json.loads(flag(argv, "--kv-events-config"))
    assert kv["publisher"] == "zmq" and kv["topic"] == "kv-events"
    assert kv["endpoint"].startswith("tcp://*:")
    assert argv[-2:] == ["--mem-fraction-static", "0.8"]
    for absent in ("--tp-size", "--dp-size", "--enable-dp-attention", "--disaggregation-mode"):
        assert absent not in argv
    fields = adapter.record_fields(c)
    assert fields.kv_events is not None
    assert fields.kv_events.format == "sglang" and fields.kv_events.block_size == 16
    assert fields.kv_events.endpoint == "tcp://10.0.0.7:" + kv["endpoint"].rsplit(":", 1)[1]
    assert not fields.kv_events.port_per_dp_rank


def test_page_size_one_is_refused(sglang_python: str) -> None:
    c = ctx(engine_python=sglang_python)
    c.options["page_size"] = 1
    with pytest.raises(EngineError, match="--page-size 1"):
        SglangAdapter().build_launch(c)


def test_tp_and_dp_attention(sglang_python: str) -> None:
    adapter = SglangAdapter()
    c = ctx(engine_python=sglang_python, dp_size=4)
    c.options["tp"] = 8
    argv = adapter.build_launch(c).argv
    assert flag(argv, "--tp-size") == "8"
    assert flag(argv, "--dp-size") == "4"
    assert "--enable-dp-attention" in argv
    fields = adapter.record_fields(c)
    assert fields.dp_size == 4 and fields.dp_rank is None
    assert fields.kv_events is not None and fields.kv_events.port_per_dp_rank
    # rank r publishes on base + r: all four ports were free when chosen
    base = int(fields.kv_events.endpoint.rsplit(":", 1)[1])
    assert json.loads(flag(argv, "--kv-events-config"))["endpoint"] == f"tcp://*:{base}"


def test_dp_attention_with_a_rank_is_refused(sglang_python: str) -> None:
    with pytest.raises(EngineError, match="drop --dp-rank"):
        SglangAdapter().build_launch(ctx(engine_python=sglang_python, dp_size=2, dp_rank=1))


def test_prefill_advertises_its_bootstrap_port(sglang_python: str) -> None:
    adapter = SglangAdapter()
    c = ctx(engine_python=sglang_python, role=Role.PREFILL)
    argv = adapter.build_launch(c).argv
    assert flag(argv, "--disaggregation-mode") == "prefill"
    assert flag(argv, "--disaggregation-transfer-backend") == "mooncake"
    port = int(flag(argv, "--disaggregation-bootstrap-port"))
    pd = adapter.record_fields(c).pd
    assert pd is not None and pd.protocol == "sglang-bootstrap"
    assert pd.params["bootstrap_port"] == port and pd.params["bootstrap_host"] == "10.0.0.7"


def test_decode_has_no_bootstrap_port(sglang_python: str) -> None:
    c = ctx(engine_python=sglang_python, role=Role.DECODE)
    c.options["transfer_backend"] = "nixl"
    argv = SglangAdapter().build_launch(c).argv
    assert flag(argv, "--disaggregation-mode") == "decode"
    assert flag(argv, "--disaggregation-transfer-backend") == "nixl"
    assert "--disaggregation-bootstrap-port" not in argv


def test_missing_sglang_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"pip install 'sglang\[all\]'"):
        SglangAdapter().build_launch(ctx(engine_python=make_engine_env(tmp_path, None).python))


def test_managed_flag_after_separator(sglang_python: str) -> None:
    with pytest.raises(EngineError, match="--page-size"):
        SglangAdapter().build_launch(ctx(engine_python=sglang_python, engine_args=["--page-size", "1"]))


def test_is_embedding_says_what_the_model_serves() -> None:
    # SGLang mounts every route whatever its model: its flag, not its route list, says the kind
    adapter = SglangAdapter()
    assert adapter.record_fields(ctx(engine_args=["--is-embedding"])).tasks == ["embed"]
    assert adapter.record_fields(ctx()).tasks == ["generate"]


@pytest.mark.parametrize(
    ("options", "emitted", "recorded"),
    [
        ({}, [], None),
        ({"enable_priority_scheduling": True}, ["--enable-priority-scheduling"], "higher_first"),
        (
            {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True},
            ["--enable-priority-scheduling", "--schedule-low-priority-values-first"],
            "lower_first",
        ),
        ({"schedule_low_priority_values_first": True}, [], None),  # SGLang ignores it without the first
    ],
)
def test_priority_scheduling_reaches_sglang_and_the_record(
    sglang_python: str, options: dict[str, bool], emitted: list[str], recorded: str | None
) -> None:
    c = ctx(engine_python=sglang_python)
    c.options.update(options)
    adapter = SglangAdapter()
    argv = adapter.build_launch(c).argv
    assert [a for a in argv if a.startswith("--") and "priority" in a] == emitted
    assert adapter.record_fields(c).priority == recorded
