"""SGLang argv for DP-attention (``--tp-size`` defaults to ``--dp-size``) and decode workers'
radix cache (``--disaggregation-decode-enable-radix-cache``, so a decode worker publishes KV events).

Checked against SGLang's ``server_args.py``: DP-attention requires ``tp_size % dp_size == 0``;
``--disaggregation-decode-enable-radix-cache`` is a store-true flag that SGLang refuses with
speculative decoding, ``--enable-hisparse`` and the ``fake`` transfer backend.
"""

from __future__ import annotations

import pytest
from infera_sglang.adapter import SglangAdapter
from infera_sglang.parallel import DECODE_RADIX_FLAG
from sglang_golden import SGLANG_OPTIONS, SGLANG_WORKER

from infera_core.engines.base import LaunchContext
from infera_core.errors import EngineError
from infera_core.testing.engine_env import flag, launch_context
from infera_core.worker import Role


def ctx(**kw: object) -> LaunchContext:
    options = {**SGLANG_OPTIONS, **kw.pop("options", {})}  # type: ignore[dict-item]
    return launch_context({**SGLANG_WORKER, "options": options}, 43000, **kw)


@pytest.mark.parametrize(("dp", "tp", "want"), [(8, 1, "8"), (2, 1, "2"), (2, 4, "4"), (4, 8, "8")])
def test_dp_attention_gets_a_tp_size_sglang_accepts(dp: int, tp: int, want: str) -> None:
    argv = SglangAdapter().engine_flags(ctx(dp_size=dp, options={"tp": tp}))
    assert flag(argv, "--tp-size") == want
    assert int(want) % dp == 0  # SGLang's own check
    assert flag(argv, "--dp-size") == str(dp) and "--enable-dp-attention" in argv


def test_without_dp_the_tp_size_is_the_users() -> None:
    assert "--tp-size" not in SglangAdapter().engine_flags(ctx())
    assert flag(SglangAdapter().engine_flags(ctx(options={"tp": 4})), "--tp-size") == "4"


def test_a_tp_size_that_is_no_multiple_of_dp_is_one_error() -> None:
    with pytest.raises(EngineError, match=r"--tp 3 with --dp-size 2: .*tp_size % dp_size == 0"):
        SglangAdapter().engine_flags(ctx(dp_size=2, options={"tp": 3}))


def test_decode_workers_keep_a_radix_cache_for_their_kv_events() -> None:
    decode = SglangAdapter().engine_flags(ctx(role=Role.DECODE))
    assert decode.count(DECODE_RADIX_FLAG) == 1
    assert flag(decode, "--disaggregation-mode") == "decode"
    for role in (Role.PREFILL, Role.MIXED):
        assert DECODE_RADIX_FLAG not in SglangAdapter().engine_flags(ctx(role=role))


@pytest.mark.parametrize(
    "engine_args",
    [
        [DECODE_RADIX_FLAG],  # the user's own: not twice
        ["--disable-radix-cache"],
        ["--speculative-algorithm", "EAGLE"],
        ["--speculative-algorithm=EAGLE3"],
        ["--enable-hisparse"],
    ],
)
def test_no_radix_flag_where_sglang_would_refuse_it(engine_args: list[str]) -> None:
    argv = SglangAdapter().engine_flags(ctx(role=Role.DECODE, engine_args=engine_args))
    assert argv.count(DECODE_RADIX_FLAG) == (1 if DECODE_RADIX_FLAG in engine_args else 0)


@pytest.mark.parametrize(
    "engine_args",
    [
        ["--dcp-size", "2"],
        ["--dcp-size=4"],
        ["--decode-context-parallel-size", "8"],
    ],
)
def test_a_dcp_decode_worker_gets_no_radix_flag_sglang_refuses(engine_args: list[str]) -> None:
    """SGLang (to 0.5.x) refuses ``--disaggregation-decode-enable-radix-cache`` on a decode
    worker with ``--dcp-size`` > 1: Infera must not add it there, and passes the DCP flag on."""
    argv = SglangAdapter().engine_flags(ctx(role=Role.DECODE, engine_args=engine_args))
    assert DECODE_RADIX_FLAG not in argv
    assert argv[-len(engine_args) :] == engine_args


@pytest.mark.parametrize("engine_args", [["--dcp-size", "1"], ["--dcp-size=1"]])
def test_dcp_size_one_keeps_the_radix_flag(engine_args: list[str]) -> None:
    argv = SglangAdapter().engine_flags(ctx(role=Role.DECODE, engine_args=engine_args))
    assert argv.count(DECODE_RADIX_FLAG) == 1


def test_a_dcp_decode_worker_may_ask_for_the_radix_cache_itself() -> None:
    """An SGLang that accepts the combination (PR #40263): the user's own flag is kept, once."""
    args = ["--dcp-size", "2", DECODE_RADIX_FLAG]
    argv = SglangAdapter().engine_flags(ctx(role=Role.DECODE, engine_args=args))
    assert argv.count(DECODE_RADIX_FLAG) == 1


# -- plain data parallel (--dp-mode plain): one launcher per replica ------------------------


def plain(rank: int | None, size: int = 4, **kw: object) -> LaunchContext:
    options = {"dp_mode": "plain", "dp_size": size, "dp_rank": rank, **kw.pop("options", {})}  # type: ignore[dict-item]
    return ctx(options=options, **kw)


@pytest.mark.parametrize(("rank", "tp", "gpu"), [(0, 1, "0"), (1, 1, "1"), (3, 2, "6")])
def test_plain_dp_replica_is_one_sglang_server_on_its_own_gpus(rank: int, tp: int, gpu: str) -> None:
    """Replica K of SGLang's plain DP: a server of its own, no --dp-size / DP-attention, on the
    GPUs SGLang's own plain DP gives rank K (``launch_dp_schedulers``: K × tp × pp × step)."""
    c = plain(rank, options={"tp": tp})
    argv = SglangAdapter().engine_flags(c)
    assert "--dp-size" not in argv and "--enable-dp-attention" not in argv
    assert flag(argv, "--base-gpu-id") == gpu
    assert (flag(argv, "--tp-size") if tp > 1 else None) == (str(tp) if tp > 1 else None)
    fields = SglangAdapter().record_fields(c)
    # an ordinary worker: the router balances the replicas (no X-Data-Parallel-Rank, no per-rank views)
    assert fields.dp_size == 1 and fields.dp_rank is None
    assert fields.kv_events is not None and not fields.kv_events.port_per_dp_rank


def test_plain_dp_placement_counts_pipeline_stages_and_keeps_the_users() -> None:
    argv = SglangAdapter().engine_flags(plain(2, options={"tp": 2}, engine_args=["--pp-size", "2"]))
    assert flag(argv, "--base-gpu-id") == "8"
    mine = SglangAdapter().engine_flags(plain(2, engine_args=["--base-gpu-id", "5"]))
    assert mine.count("--base-gpu-id") == 1 and flag(mine, "--base-gpu-id") == "5"


def test_plain_dp_in_one_server_is_one_line() -> None:
    """Without DP-attention every rank's KV publisher binds one port (attn_dp_rank is 0): refused."""
    with pytest.raises(EngineError, match=r"^--dp-mode plain --dp-size 4: one SGLang server cannot") as err:
        SglangAdapter().engine_flags(plain(None))
    assert "--dp-rank 0" in str(err.value) and "--dp-mode attention" in str(err.value)
    assert "\n" not in str(err.value)


def test_dp_mode_is_checked_and_attention_stays_the_default() -> None:
    with pytest.raises(EngineError, match=r"^--dp-mode replica: expected one of attention, plain$"):
        SglangAdapter().engine_flags(ctx(options={"dp_mode": "replica"}))
    argv = SglangAdapter().engine_flags(ctx(dp_size=2))
    assert flag(argv, "--dp-size") == "2" and "--enable-dp-attention" in argv
    assert "--base-gpu-id" not in argv
    with pytest.raises(EngineError, match="drop --dp-rank"):
        SglangAdapter().engine_flags(ctx(options={"dp_size": 2, "dp_rank": 1}))
