"""KV transfer config of the SGLang and ATOM adapters: every role × backend, port layouts, conflicts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from infera_atom.adapter import AtomAdapter
from infera_atom.transfer import handshake_ports
from infera_sglang.adapter import SglangAdapter
from transfer_rig import ctx, kv_config

from infera_core.errors import EngineError
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import PdInfo, Role

# -- SGLang and ATOM -------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["mooncake", "nixl", "mori", "mooncake_tcp"])
@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_sglang_backends(backend: str, role: Role) -> None:
    c = ctx(role, transfer_backend=backend, page_size=16)
    flags = SglangAdapter().engine_flags(c)
    pd = SglangAdapter().record_fields(c).pd
    assert flags[flags.index("--disaggregation-mode") + 1] == role.value
    assert flags[flags.index("--disaggregation-transfer-backend") + 1] == backend
    assert pd is not None and pd.protocol == "sglang-bootstrap" and pd.params["transfer_backend"] == backend
    if role is Role.PREFILL:
        port = int(flags[flags.index("--disaggregation-bootstrap-port") + 1])
        assert pd.params["bootstrap_port"] == port and pd.params["bootstrap_host"] == "10.0.0.5"
    else:
        assert "--disaggregation-bootstrap-port" not in flags and "bootstrap_port" not in pd.params


def test_sglang_mixed_has_no_disaggregation_flags_and_unknown_backend_is_one_line() -> None:
    flags = SglangAdapter().engine_flags(ctx(Role.MIXED, page_size=16))
    assert not [f for f in flags if f.startswith("--disaggregation")]
    with pytest.raises(
        EngineError, match="--transfer-backend fake: sglang knows ascend, mooncake, mooncake_tcp, mori, nixl"
    ):
        SglangAdapter().engine_flags(ctx(Role.DECODE, transfer_backend="fake", page_size=16))


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")])
def test_atom_mooncake_reserves_one_handshake_port_per_tp_rank(role: Role, kv_role: str) -> None:
    taken: list[int] = []
    base = ctx(role, tp=4, block_size=16)

    def free() -> int:  # spaced out, so a port handed out for anything else is visible
        taken.append(43000 + 10 * len(taken))
        return taken[-1]

    base.free_port = free
    flags = AtomAdapter().engine_flags(base)
    config = kv_config(flags)
    first = config["handshake_port"]
    assert config == {
        "kv_connector": "mooncake",
        "kv_role": kv_role,
        "handshake_port": first,
        "http_port": 8100,
    }
    # ATOM binds handshake_port + tp_rank for ranks 0..3: the block is Infera's, nothing else lands in it
    assert first in taken and not (set(taken) - {first}) & set(range(first, first + 4))
    pd = AtomAdapter().record_fields(base).pd
    assert pd == PdInfo(protocol="atom-mooncake", params={"handshake_port": first, "tp_size": 4})


def test_atom_reserves_a_port_for_every_dp_and_pp_rank_too() -> None:
    """ATOM's offset is pp_rank·dp·tp + dp_rank·tp + tp_rank: -dp 2 -pp 2 with -tp 2 binds 8 ports."""
    c = ctx(Role.PREFILL, tp=2, block_size=16, handshake_port=7000)
    c.engine_args = ["-dp", "2", "--pipeline-parallel-size=2"]
    assert handshake_ports(c, {}) == list(range(7000, 7008))
    c.engine_args = ["-dp", "x"]
    with pytest.raises(EngineError, match="-dp x: expected a positive number"):
        handshake_ports(c, {})


def test_atom_user_handshake_port_is_the_first_of_the_tp_ranks() -> None:
    c = ctx(Role.DECODE, tp=2, block_size=16, handshake_port=6800)
    assert kv_config(AtomAdapter().engine_flags(c))["handshake_port"] == 6800


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")])
def test_atom_moriio_and_the_users_knobs(role: Role, kv_role: str) -> None:
    user = {"kv_connector": "moriio", "qp_per_transfer": 8, "num_worker_threads": 8}
    c = ctx(role, tp=8, block_size=16, handshake_port=6301, kv_transfer_config=json.dumps(user))
    config = kv_config(AtomAdapter().engine_flags(c))
    assert config == {**user, "kv_role": kv_role, "handshake_port": 6301, "http_port": 8100}
    pd = AtomAdapter().record_fields(c).pd
    assert pd == PdInfo(protocol="atom-moriio", params={"handshake_port": 6301, "tp_size": 8})


def test_atom_multi_composes_mooncake_with_lmcache_offload() -> None:
    offload = {"kv_connector": "lmcache_offload", "kv_role": "offload"}
    user = {"kv_connector": "multi", "connectors": [{"kv_connector": "mooncake", "protocol": "tcp"}, offload]}
    c = ctx(Role.PREFILL, tp=1, block_size=16, handshake_port=6700, kv_transfer_config=json.dumps(user))
    config = kv_config(AtomAdapter().engine_flags(c))
    # ATOM's MultiConnector layout (atom/kv_transfer/disaggregation/multi/README.md)
    assert config == {
        "kv_connector": "multi",
        "connectors": [
            {
                "kv_connector": "mooncake",
                "protocol": "tcp",
                "kv_role": "kv_producer",
                "handshake_port": 6700,
                "http_port": 8100,
            },
            offload,
        ],
    }
    assert AtomAdapter().record_fields(c).pd == PdInfo(
        protocol="atom-mooncake", params={"handshake_port": 6700, "tp_size": 1}
    )


@pytest.mark.parametrize(
    ("role", "user", "message"),
    [
        (
            Role.PREFILL,
            {"kv_role": "kv_consumer"},
            "kv_role kv_consumer contradicts --role prefill for mooncake",
        ),
        (Role.DECODE, {"http_port": 9}, "http_port 9: ATOM needs the server port \\(8100\\)"),
        (Role.DECODE, {"kv_connector": "nixl"}, "kv_connector nixl: Infera cannot drive it"),
        (
            Role.DECODE,
            {"kv_connector": "multi", "connectors": [{"kv_connector": "lmcache_offload"}]},
            "exactly one PD",
        ),
        (
            Role.MIXED,
            {"kv_connector": "multi", "connectors": [{"kv_connector": "mooncake", "kv_role": "kv_producer"}]},
            "add --role prefill",
        ),
    ],
)
def test_atom_conflicts_are_one_clear_line(role: Role, user: dict[str, Any], message: str) -> None:
    c = ctx(role, tp=1, block_size=16, kv_transfer_config=json.dumps(user))
    with pytest.raises(EngineError, match=message) as err:
        AtomAdapter().engine_flags(c)
    assert "\n" not in str(err.value)


def test_atom_moriio_transport_is_registered_and_refuses_a_mooncake_peer() -> None:
    from infera_core.engines.pd import PdPairError, check_pair
    from infera_core.worker import WorkerRecord

    assert "atom-moriio" in make_hooks().catalog().pd_transports.names()

    def record(worker_id: str, role: Role, connector: str) -> WorkerRecord:
        c = ctx(role, tp=1, block_size=16, pd_connector=connector)
        pd = AtomAdapter().record_fields(c).pd
        return WorkerRecord(
            worker_id=worker_id, url="http://10.0.0.5:8100", model="m", engine="atom", role=role, pd=pd
        )

    check_pair(record("p", Role.PREFILL, "moriio"), record("d", Role.DECODE, "moriio"))
    with pytest.raises(PdPairError, match="speaks atom-moriio but decode d speaks atom-mooncake"):
        check_pair(record("p", Role.PREFILL, "moriio"), record("d", Role.DECODE, "mooncake"))
