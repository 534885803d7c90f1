"""External-LB data parallel as vLLM 0.32 runs it.

* vLLM refuses ``--data-parallel-size N --data-parallel-rank K --data-parallel-external-lb`` for
  a dense model (``EngineArgs.create_engine_config``: "Non-MoE models do not support external
  data parallel mode"; MoE means ``ModelConfig.is_moe``): the adapter refuses it first.
* Under DP every engine core appends ``_dp<rank>`` to the connector's engine id
  (``EngineCoreProc.run_engine_core``): the Mooncake decode leg must name that id.
* MoRIIO folds the DP rank with ``data_parallel_size_local`` (1 under external LB) before
  offsetting its ports (``moriio_common.get_port_offset(fold_local_rank(...), tp_rank)``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from infera_vllm.adapter import VllmAdapter
from infera_vllm.model_config import REFUSAL, find_config, is_moe, num_experts
from infera_vllm.pd import VllmMooncakeTransport, VllmMoriioTransport
from real_vllm import vllm_python
from vllm_records import adapter_record

from infera_core.engines.base import LaunchContext
from infera_core.engines.pd import PdContext
from infera_core.errors import EngineError
from infera_core.testing.engine_env import GOLDEN_WORKER, clean_environ, flag, launch_context
from infera_core.worker import Role

HERE = Path(__file__).resolve().parent
DENSE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2}
MOE = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8}


def model_dir(root: Path, config: dict[str, Any]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return str(root)


def ctx(model_path: str, **kw: object) -> LaunchContext:
    options = {"tp": 1, "pd_connector": "nixl"}
    return launch_context(
        {**GOLDEN_WORKER, "model": "m", "model_path": model_path, "options": options}, 41000, **kw
    )


# -- the dense-model refusal ------------------------------------------------------------


def test_external_dp_on_a_dense_model_is_refused_in_one_line(vllm_cpu: str, tmp_path: Path) -> None:
    dense = model_dir(tmp_path / "dense", DENSE)
    with pytest.raises(EngineError) as err:
        VllmAdapter().build_launch(ctx(dense, engine_python=vllm_cpu, dp_size=2, dp_rank=1))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--dp-size 2: ") and REFUSAL in message
    assert "run 2 separate workers without --dp-size" in message


@pytest.mark.parametrize(
    "dp_flags",
    [["--dp-size", "2", "--dp-rank", "1"], ["--", "--data-parallel-size", "2", "--data-parallel-rank", "1"]],
)
def test_the_seed_command_refuses_it_in_one_line(vllm_cpu: str, tmp_path: Path, dp_flags: list[str]) -> None:
    dense = model_dir(tmp_path / "dense", DENSE)
    infera = [
        "--model",
        "m",
        "--model-path",
        dense,
        "--discovery-backend",
        "memory",
        "--engine-python",
        vllm_cpu,
    ]
    out = subprocess.run(
        [sys.executable, "-m", "infera.engine.vllm", *infera, *dp_flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_environ(),
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infera-run: error: --dp-size 2: ")
    assert "run 2 separate workers without --dp-size instead" in lines[0]


def test_external_dp_on_a_moe_model_starts(vllm_cpu: str, tmp_path: Path) -> None:
    moe = model_dir(tmp_path / "moe", MOE)
    argv = VllmAdapter().build_launch(ctx(moe, engine_python=vllm_cpu, dp_size=2, dp_rank=1)).argv
    assert (flag(argv, "--data-parallel-size"), flag(argv, "--data-parallel-rank")) == ("2", "1")
    assert "--data-parallel-external-lb" in argv


def test_a_hub_id_is_read_from_the_hugging_face_cache(
    vllm_cpu: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    repo = cache / "models--org--dense"
    model_dir(repo / "snapshots" / "abc123", DENSE)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert find_config("org/dense") == repo / "snapshots" / "abc123" / "config.json"
    with pytest.raises(EngineError, match="org/dense is a dense"):
        VllmAdapter().build_launch(ctx("org/dense", engine_python=vllm_cpu, dp_size=2, dp_rank=0))


def test_a_model_it_cannot_read_gets_one_warning_and_starts(
    vllm_cpu: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with caplog.at_level(logging.WARNING, logger="infera_vllm"):
        argv = (
            VllmAdapter().build_launch(ctx("org/unknown", engine_python=vllm_cpu, dp_size=2, dp_rank=1)).argv
        )
    assert "--data-parallel-external-lb" in argv
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot tell whether org/unknown is a mixture-of-experts" in warnings[0]


def test_without_dp_nothing_is_read(vllm_cpu: str, tmp_path: Path) -> None:
    dense = model_dir(tmp_path / "dense", DENSE)
    argv = VllmAdapter().build_launch(ctx(dense, engine_python=vllm_cpu)).argv
    assert "--data-parallel-size" not in argv


@pytest.mark.parametrize(
    ("config", "experts"),
    [
        (DENSE, 0),
        (MOE, 8),
        ({"n_routed_experts": 64, "num_local_experts": 4}, 64),  # vLLM's order: the first present
        ({"num_experts": 0, "num_local_experts": 8}, 0),  # the first present wins, even 0
        ({"num_experts": [16, 16]}, 16),  # Ernie VL: a list
        ({"text_config": {"num_experts": 32}}, 32),  # multimodal: the text config
        (
            {"block_configs": [{"block_type": "attention"}, {"block_type": "moe", "n_routed_experts": 128}]},
            128,
        ),
    ],
)
def test_expert_count_follows_vllm(config: dict[str, Any], experts: int) -> None:
    assert num_experts(config) == experts


def test_a_moe_looking_config_without_a_count_is_unclear_not_dense(tmp_path: Path) -> None:
    # a transformers class default may supply the count: not sure enough to refuse
    assert is_moe(model_dir(tmp_path / "q", {"model_type": "qwen2_moe"})) is None
    assert is_moe(model_dir(tmp_path / "d", DENSE)) is False


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_vllm_agrees_on_the_tiny_model_and_a_moe_config(tmp_path: Path) -> None:
    """vLLM 0.32's own ModelConfig.is_moe and its refusal, for a dense and a MoE config."""
    python, tiny = vllm_python()
    moe = model_dir(
        tmp_path / "mixtral",
        {
            **MOE,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_hidden_layers": 2,
            "num_experts_per_tok": 2,
            "vocab_size": 4096,
            "max_position_embeddings": 2048,
            "head_dim": 32,
        },
    )
    run = subprocess.run(
        [python, str(HERE / "vllm_dp_check.py")],
        input=json.dumps([tiny, moe]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith('{"model"')]  # vLLM logs to stdout
    results = {r["model"]: r for r in map(json.loads, lines)}
    assert results[tiny]["is_moe"] is False and is_moe(tiny) is False
    assert REFUSAL in results[tiny]["error"]
    assert results[moe]["is_moe"] is True and is_moe(moe) is True
    assert results[moe]["error"] is None or REFUSAL not in results[moe]["error"]


# -- Mooncake: the engine id of a DP rank ---------------------------------------------


def test_mooncake_decode_names_the_prefills_dp_rank_engine_id(tmp_path: Path) -> None:
    moe = model_dir(tmp_path / "moe", MOE)
    p = ctx(moe, worker_id="p", role=Role.PREFILL, dp_size=2, dp_rank=1)
    p.options["pd_connector"] = "mooncake"
    d = ctx(moe, worker_id="d", role=Role.DECODE, advertise_host="10.0.0.6")
    d.options["pd_connector"] = "mooncake"
    prefill, decode = adapter_record(p), adapter_record(d)
    # vLLM launches with engine_id p and registers p_dp1 with its bootstrap server
    assert json.loads(flag(VllmAdapter().engine_flags(p), "--kv-transfer-config"))["engine_id"] == "p"
    assert prefill.pd is not None and prefill.pd.params["engine_id"] == "p_dp1"
    t = VllmMooncakeTransport()
    pd_ctx = PdContext(request_id="r1", route="/v1/completions")
    t.prepare(pd_ctx, prefill, decode)
    body = {"model": "m", "prompt": "hi", "max_tokens": 4}
    params = t.decode_request(body, pd_ctx, prefill, decode, None).body["kv_transfer_params"]
    assert params["remote_engine_id"] == "p_dp1"
    assert params["remote_bootstrap_addr"] == f"http://10.0.0.5:{prefill.pd.params['bootstrap_port']}"


def test_mooncake_without_dp_keeps_the_worker_id() -> None:
    p = ctx("/models/m", worker_id="p", role=Role.PREFILL)
    p.options["pd_connector"] = "mooncake"
    fields = VllmAdapter().record_fields(p)
    assert fields.pd is not None and fields.pd.params["engine_id"] == "p"


def test_mooncake_leg_derives_the_id_from_an_older_record() -> None:
    p = ctx("/models/m", worker_id="p", role=Role.PREFILL)
    p.options["pd_connector"] = "mooncake"
    prefill = adapter_record(p).model_copy(update={"dp_rank": 3, "dp_size": 4})
    assert prefill.pd is not None
    del prefill.pd.params["engine_id"]
    t = VllmMooncakeTransport()
    pd_ctx = PdContext(request_id="r2", route="/v1/completions")
    t.prepare(pd_ctx, prefill, prefill)
    params = t.decode_request({"model": "m"}, pd_ctx, prefill, prefill, None).body["kv_transfer_params"]
    assert params["remote_engine_id"] == "p_dp3"


# -- MoRIIO: the ports an external-LB rank binds ----------------------------------------


def fold_local_rank(global_dp_rank: int, dp_size_local: int) -> int:
    """vLLM 0.32 ``moriio_common.fold_local_rank``."""
    return global_dp_rank % dp_size_local if dp_size_local else global_dp_rank


def get_port_offset(dp_rank: int, tp_rank: int, tp_size: int = 1) -> int:
    """vLLM 0.32 ``moriio_common.get_port_offset``."""
    return dp_rank * tp_size + tp_rank


@pytest.mark.parametrize(("dp_size", "dp_rank", "tp"), [(1, None, 1), (2, 1, 1), (4, 3, 2), (8, 5, 4)])
def test_moriio_ports_are_where_vllm_binds_them(
    dp_size: int, dp_rank: int | None, tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the block is the launch's free ports (41002 on): a layout check, whatever else is bound here
    monkeypatch.setattr("infera_core.engines.support._bindable", lambda port: True)
    c = ctx("/models/m", role=Role.PREFILL, dp_size=dp_size, dp_rank=dp_rank)
    c.options.update(pd_connector="moriio", tp=tp)
    extra = json.loads(flag(VllmAdapter().engine_flags(c), "--kv-transfer-config"))[
        "kv_connector_extra_config"
    ]
    pd = VllmAdapter().record_fields(c).pd
    assert pd is not None
    reserved = set(range(41002, 41002 + 2 * tp))  # 41000/41001: KV events and replay
    local = fold_local_rank(dp_rank or 0, pd.params["dp_size_local"])  # external LB: local size 1
    handshake = {extra["handshake_port"] + get_port_offset(local, t) for t in range(tp)}
    notify = {extra["notify_port"] + get_port_offset(local, t) for t in range(tp)}
    assert handshake | notify == reserved and not handshake & notify
    assert pd.params["handshake_port"] == extra["handshake_port"] == min(handshake)
    assert pd.params["notify_port"] == extra["notify_port"] == min(notify)


def test_moriio_peer_folds_the_workers_ranks_to_its_own_ports() -> None:
    p = ctx("/models/m", worker_id="p", role=Role.PREFILL, dp_size=4, dp_rank=3)
    p.options["pd_connector"] = "moriio"
    d = ctx("/models/m", worker_id="d", role=Role.DECODE, advertise_host="10.0.0.6")
    d.options["pd_connector"] = "moriio"
    prefill, decode = adapter_record(p), adapter_record(d)
    t = VllmMoriioTransport()
    pd_ctx = PdContext(request_id="r3", route="/v1/completions")
    t.prepare(pd_ctx, prefill, decode)
    params = t.decode_request({"model": "m"}, pd_ctx, prefill, decode, None).body["kv_transfer_params"]
    # the decode handshakes every prefill rank at handshake + offset(fold(rank, local size)):
    # with remote_dp_size_local 1 that is the prefill launcher's own port for each of them
    assert (params["remote_dp_size"], params["remote_dp_rank"], params["remote_dp_size_local"]) == (4, 3, 1)
    assert prefill.pd is not None
    ports = {
        params["remote_handshake_port"]
        + get_port_offset(fold_local_rank(r, params["remote_dp_size_local"]), 0)
        for r in range(params["remote_dp_size"])
    }
    assert ports == {prefill.pd.params["handshake_port"]}
