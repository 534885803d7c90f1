"""ATOM data parallel (``-- -dp N``): what the worker record, the engine environment and the PD
legs say, checked against ROCm/ATOM main ffdf3bb5 (no ATOM here: argv/env/record level).

* ``-dp N``: one OpenAI server, N engine cores (``atom/model_engine/engine_core_mgr.py``) —
  the record says ``dp_size: N`` and no ``dp_rank``, like an SGLang DP-attention server.
* The DP ranks meet on ``ATOM_DP_MASTER_PORT`` (``atom/utils/envs.py``, default 29500; no CLI
  flag): each Infera launch gets its own, so two ``-dp`` workers on one host do not collide.
* A DP rank is steered by the body's ``data_parallel_rank`` (``atom/entrypoints/openai/protocol.py``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from infera_atom.adapter import AtomAdapter
from infera_atom.kv_events import launch_env
from infera_atom.parallel import DP_MASTER_ENV
from infera_atom.pd import AtomMooncakeTransport
from infera_atom.transfer import handshake_ports

from infera_core.engines.base import LaunchContext
from infera_core.engines.pd import PdContext
from infera_core.errors import EngineError
from infera_core.launcher.address import free_port
from infera_core.scheduling.dp import DpRanks
from infera_core.scheduling.types import Endpoint
from infera_core.testing.contracts import launch_record
from infera_core.worker import Role, WorkerRecord

ATOM_DEFAULT_DP_MASTER_PORT = 29500


def ctx(
    role: Role = Role.MIXED, engine_args: tuple[str, ...] = (), port: int = 8888, **options: Any
) -> LaunchContext:
    return LaunchContext(
        worker_id=f"atom-{role.value}-{port}",
        model="ds",
        model_path="/models/ds",
        role=role,
        host="0.0.0.0",
        port=port,
        advertise_host="10.0.0.9",
        engine_args=list(engine_args),
        options={"tp": 1, "block_size": 16, **options},
        free_port=free_port,
        discovery="etcd",
    )


def record(c: LaunchContext) -> WorkerRecord:
    """The worker record the launcher publishes for this launch (the adapter's fields)."""
    return launch_record(AtomAdapter(), c)


@pytest.mark.parametrize(
    ("args", "size"), [((), 1), (("-dp", "1"), 1), (("-dp", "4"), 4), (("--data-parallel-size=2",), 2)]
)
def test_the_record_carries_atoms_dp_size(args: tuple[str, ...], size: int) -> None:
    rec = record(ctx(engine_args=args))
    assert (rec.dp_size, rec.dp_rank) == (size, None)
    assert (rec.kv_events is None) == (size > 1), "every rank would bind the one publisher endpoint"


def test_a_bad_dp_size_is_one_error_line_on_every_role() -> None:
    with pytest.raises(EngineError, match=r"^-dp two: expected a positive number$"):
        AtomAdapter().record_fields(ctx(engine_args=("-dp", "two")))


def test_two_dp_workers_on_one_host_get_their_own_rendezvous_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DP_MASTER_ENV, raising=False)
    first, second = ctx(engine_args=("-dp", "2")), ctx(engine_args=("-dp", "2"), port=8889)
    ports = [int(launch_env(c)[DP_MASTER_ENV]) for c in (first, second)]
    assert ports[0] != ports[1] and ATOM_DEFAULT_DP_MASTER_PORT not in ports
    assert launch_env(first)[DP_MASTER_ENV] == str(ports[0]), "picked once per launch"
    assert DP_MASTER_ENV not in launch_env(ctx()), "one rank: no DP group, nothing to set"


def test_the_users_rendezvous_port_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launch_env(ctx(engine_args=("-dp", "2"), dp_master_port=29611))[DP_MASTER_ENV] == "29611"
    monkeypatch.setenv(DP_MASTER_ENV, "29700")
    assert DP_MASTER_ENV not in launch_env(ctx(engine_args=("-dp", "2"))), "the exported value reaches ATOM"
    assert launch_env(ctx(engine_args=("-dp", "2"), dp_master_port=29611))[DP_MASTER_ENV] == "29611"


def test_handshake_ports_are_picked_once_per_launch() -> None:
    handed: list[int] = []

    def spaced() -> int:  # every call a new port: a second pick would show
        handed.append(45000 + 10 * len(handed))
        return handed[-1]

    c = ctx(Role.PREFILL, ("-dp", "2"), tp=2)
    c.free_port = spaced
    first = handshake_ports(c, {})
    assert handshake_ports(c, {}) == first == list(range(first[0], first[0] + 4))
    flags = AtomAdapter().engine_flags(c)
    config = json.loads(flags[flags.index("--kv-transfer-config") + 1])
    assert config["handshake_port"] == first[0]
    assert AtomAdapter().record_fields(c).pd.params["handshake_port"] == first[0]  # type: ignore[union-attr]
    assert handshake_ports(ctx(Role.DECODE, tp=2), {"handshake_port": 7100}) == [7100, 7101]


def test_pd_legs_name_the_dp_prefill_and_steer_its_rank_in_the_body() -> None:
    prefill = record(ctx(Role.PREFILL, ("-dp", "2"), tp=4))
    decode = record(ctx(Role.DECODE, port=8889, tp=4))
    t = AtomMooncakeTransport()
    rank = DpRanks().choose(Endpoint(prefill), None)  # the router's pick for a DP endpoint
    assert rank is not None and 0 <= rank < 2
    pctx = PdContext(request_id="q", route="/v1/completions", prefill_dp_rank=rank)
    body = {"model": "ds", "prompt": "1 2 3", "max_tokens": 8}
    pre = t.prefill_request(body, pctx, prefill, decode)
    assert pre.body["data_parallel_rank"] == rank and "data_parallel_rank" not in body
    reply = {"remote_block_ids": [3], "dp_rank": rank, "remote_pp_size": 1}
    dec = t.decode_request(body, pctx, prefill, decode, {"kv_transfer_params": reply})
    params = dec.body["kv_transfer_params"]
    assert params["remote_dp_size"] == 2 and params["remote_dp_rank"] == rank
    assert params["remote_handshake_port"] == prefill.pd.params["handshake_port"]  # type: ignore[union-attr]
    assert "data_parallel_rank" not in dec.body, "no decode rank picked: ATOM balances its own"
