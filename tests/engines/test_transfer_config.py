"""KV transfer config as a hook: every adapter × role × connector, merges, conflicts, a plugin.

The argv and JSON are checked against the engines' own field names (vLLM
``KVTransferConfig`` and its connectors' ``kv_connector_extra_config`` keys, SGLang's
``--disaggregation-transfer-backend`` values, ATOM's mooncake ``handshake_port`` per TP
rank); vLLM's own argument parser validates the vLLM argv in the vLLM plugin's
``tests/test_vllm_parser.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from infera_vllm.adapter import VllmAdapter
from infera_vllm.transfer import transfer_plan
from transfer_rig import ctx, kv_config

from infera_core.engines.base import LaunchContext
from infera_core.engines.transfer import TransferConnectorRegistry, TransferPlan
from infera_core.errors import EngineError, PluginError
from infera_core.plugin.spec import hookimpl
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import PdInfo, Role

OFFLOAD = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"cpu_bytes_to_use": 1000000}}


def vllm(c: LaunchContext) -> tuple[list[str], TransferPlan]:
    flags = VllmAdapter().engine_flags(c)
    fields = VllmAdapter().record_fields(c)
    plan = transfer_plan(c)
    assert fields.pd == plan.pd  # the record advertises what the engine was launched with
    return flags, plan


# -- vLLM: every role × connector ----------------------------------------------------


@pytest.mark.parametrize(
    ("role", "kv_role", "env_key"),
    [
        (Role.PREFILL, "kv_both", "VLLM_NIXL_SIDE_CHANNEL_PORT"),
        (Role.DECODE, "kv_both", "VLLM_NIXL_SIDE_CHANNEL_PORT"),
    ],
)
def test_vllm_nixl(role: Role, kv_role: str, env_key: str) -> None:
    flags, plan = vllm(ctx(role, pd_connector="nixl"))
    assert kv_config(flags) == {"kv_connector": "NixlConnector", "kv_role": kv_role, "engine_id": "w1"}
    port = int(plan.env[env_key])
    assert plan.pd == PdInfo(
        protocol="vllm-nixl",
        params={"engine_id": "w1", "tp_size": 1, "side_channel_host": "10.0.0.5", "side_channel_port": port},
    )
    assert plan.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.5"


def test_vllm_nixl_side_channel_under_external_lb_dp() -> None:
    """vLLM listens on VLLM_NIXL_SIDE_CHANNEL_PORT + its DP rank: the record names the real port."""
    c = ctx(Role.DECODE, pd_connector="nixl", dp_size=4, dp_rank=3)
    _, plan = vllm(c)
    assert plan.pd is not None
    assert int(plan.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + 3 == plan.pd.params["side_channel_port"]


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")])
def test_vllm_mooncake(role: Role, kv_role: str) -> None:
    flags, plan = vllm(ctx(role, pd_connector="mooncake"))
    assert kv_config(flags) == {"kv_connector": "MooncakeConnector", "kv_role": kv_role, "engine_id": "w1"}
    assert plan.pd is not None and plan.pd.protocol == "vllm-mooncake"
    if role is Role.PREFILL:
        assert plan.pd.params["bootstrap_port"] == int(plan.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"])
    else:
        assert plan.env == {} and "bootstrap_port" not in plan.pd.params


def test_vllm_mooncake_prefill_with_its_own_bootstrap_server_advertises_that() -> None:
    user = {
        "kv_connector": "MooncakeConnector",
        "kv_connector_extra_config": {"bootstrap_server_address": "10.9.9.9:7000"},
    }
    flags, plan = vllm(ctx(Role.PREFILL, kv_transfer_config=json.dumps(user)))
    assert kv_config(flags)["kv_connector_extra_config"] == {"bootstrap_server_address": "10.9.9.9:7000"}
    assert plan.env == {} and plan.pd is not None
    assert (plan.pd.params["bootstrap_host"], plan.pd.params["bootstrap_port"]) == ("10.9.9.9", 7000)


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")])
def test_vllm_moriio_write_mode(role: Role, kv_role: str) -> None:
    flags, plan = vllm(ctx(role, pd_connector="moriio"))
    config = kv_config(flags)
    extra = config.pop("kv_connector_extra_config")
    assert config == {"kv_connector": "MoRIIOConnector", "kv_role": kv_role, "engine_id": "w1"}
    # the keys vLLM's MoRIIOConfig.from_vllm_config reads
    assert extra["http_port"] == 8100 and extra["host_ip"] == "10.0.0.5"
    assert extra["proxy_ip"] == "" and extra["proxy_ping_port"] == 0  # no toy-proxy heartbeat
    assert extra["handshake_port"] != extra["notify_port"]
    assert (
        plan.pd
        == PdInfo(
            protocol="vllm-moriio",
            params={
                "engine_id": f"10.0.0.5:{extra['handshake_port']}",  # vLLM's MoRIIO engine_id: host_ip:handshake_port
                "host": "10.0.0.5",
                "handshake_port": extra["handshake_port"],
                "notify_port": extra["notify_port"],
                "tp_size": 1,
                "dp_size": 1,
                "dp_size_local": 1,  # external LB: one engine per launcher (vLLM folds ranks by it)
                "dp_rank": 0,
            },
        )
    )


def test_vllm_moriio_read_mode_is_the_serial_protocol_and_keeps_the_users_knobs() -> None:
    user = {
        "kv_connector": "MoRIIOConnector",
        "kv_connector_extra_config": {"read_mode": "true", "qp_per_transfer": 4},
    }
    flags, plan = vllm(ctx(Role.DECODE, kv_transfer_config=json.dumps(user)))
    extra = kv_config(flags)["kv_connector_extra_config"]
    assert extra["read_mode"] == "true" and extra["qp_per_transfer"] == 4
    assert plan.pd is not None and plan.pd.protocol == "vllm-moriio-read"


def test_vllm_moriio_reserves_a_port_per_tp_rank_offset_by_the_dp_rank() -> None:
    """vLLM binds handshake/notify at port + dp_rank + tp_rank: tp consecutive ports from the
    configured port + dp_rank must be free, and the peers compute the same offsets."""
    c = ctx(Role.PREFILL, pd_connector="moriio", tp=4, dp_size=2, dp_rank=1)
    flags, plan = vllm(c)
    extra = kv_config(flags)["kv_connector_extra_config"]
    assert plan.pd is not None and plan.pd.params["dp_rank"] == 1 and plan.pd.params["tp_size"] == 4
    for key in ("handshake_port", "notify_port"):
        bound = [extra[key] + 1 + tp_rank for tp_rank in range(4)]  # what each rank binds
        assert bound == list(range(bound[0], bound[0] + 4))
        assert bound[0] >= 41000  # inside what free_port handed out
    handshake = range(extra["handshake_port"] + 1, extra["handshake_port"] + 5)
    assert not set(handshake) & set(range(extra["notify_port"] + 1, extra["notify_port"] + 5))


def test_vllm_multi_composes_nixl_with_offloading() -> None:
    user = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [{"kv_connector": "NixlConnector"}, OFFLOAD]},
    }
    flags, plan = vllm(ctx(Role.DECODE, kv_transfer_config=json.dumps(user)))
    assert kv_config(flags) == {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "engine_id": "w1",
        "kv_connector_extra_config": {
            "connectors": [
                # vLLM hands the parent's engine_id to each child (a second one would be a TypeError)
                {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                {"kv_role": "kv_both", **OFFLOAD},
            ]
        },
    }
    assert plan.pd is not None and plan.pd.protocol == "vllm-nixl"
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" in plan.env


def test_vllm_multi_with_moriio_takes_moriio_roles_and_protocol() -> None:
    lmcache = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    user = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [lmcache, {"kv_connector": "MoRIIOConnector"}]},
    }
    flags, plan = vllm(ctx(Role.PREFILL, kv_transfer_config=json.dumps(user)))
    config = kv_config(flags)
    first, second = config["kv_connector_extra_config"]["connectors"]
    assert config["kv_role"] == "kv_producer" and first == lmcache
    assert second["kv_connector"] == "MoRIIOConnector" and second["kv_role"] == "kv_producer"
    assert second["kv_connector_extra_config"]["http_port"] == 8100 and "engine_id" not in second
    assert plan.pd is not None and plan.pd.protocol == "vllm-moriio"


def test_vllm_mixed_has_no_transfer_config_unless_the_user_gives_one() -> None:
    flags, plan = vllm(ctx(Role.MIXED))
    assert "--kv-transfer-config" not in flags and plan.pd is None and plan.env == {}
    flags, plan = vllm(ctx(Role.MIXED, kv_transfer_config=json.dumps({"kv_role": "kv_both", **OFFLOAD})))
    assert kv_config(flags) == {"kv_role": "kv_both", **OFFLOAD} and plan.pd is None


def test_user_fields_are_merged_and_infera_fields_win() -> None:
    user = {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_consumer",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"backends": ["UCX"]},
        "kv_load_failure_policy": "recompute",
    }
    flags, _ = vllm(ctx(Role.DECODE, kv_transfer_config=json.dumps(user)))
    assert kv_config(flags) == {**user, "engine_id": "w1"}


# -- vLLM: conflicts are one line ----------------------------------------------------


@pytest.mark.parametrize(
    ("role", "user", "options", "message"),
    [
        (
            Role.PREFILL,
            {"kv_role": "kv_consumer"},
            {},
            "kv_role kv_consumer contradicts --role prefill for NixlConnector",
        ),
        (
            Role.PREFILL,
            {"kv_connector": "MoRIIOConnector", "kv_role": "kv_both"},
            {},
            "kv_role kv_both contradicts --role prefill for MoRIIOConnector",
        ),
        (
            Role.DECODE,
            {"kv_connector": "P2pNcclConnector"},
            {},
            "kv_connector P2pNcclConnector: Infera cannot drive",
        ),
        (
            Role.DECODE,
            {"kv_connector": "MoRIIOConnector", "kv_connector_extra_config": {"http_port": 9}},
            {},
            "http_port 9: MoRIIO needs the engine's HTTP port \\(8100\\)",
        ),
        (
            Role.DECODE,
            {"kv_connector": "MultiConnector"},
            {},
            "MultiConnector needs kv_connector_extra_config.connectors",
        ),
        (
            Role.DECODE,
            {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [OFFLOAD]}},
            {},
            "needs exactly one PD connector",
        ),
        (
            Role.DECODE,
            {
                "kv_connector": "MultiConnector",
                "kv_connector_extra_config": {
                    "connectors": [{"kv_connector": "NixlConnector"}, {"kv_connector": "MooncakeConnector"}]
                },
            },
            {},
            "needs exactly one PD connector",
        ),
        (Role.DECODE, {"kv_connector_extra_config": [1]}, {"pd_connector": "moriio"}, "expected an object"),
        (
            Role.DECODE,
            {},
            {"pd_connector": "p2p"},
            "--pd-connector p2p: vllm knows mooncake, moriio, multi, nixl",
        ),
        (Role.MIXED, {"kv_connector": "MoRIIOConnector", "kv_role": "kv_consumer"}, {}, "add --role decode"),
    ],
)
def test_vllm_conflicts_are_one_clear_line(
    role: Role, user: dict[str, Any], options: dict[str, Any], message: str
) -> None:
    c = ctx(role, kv_transfer_config=json.dumps(user), **options)
    with pytest.raises(EngineError, match=message) as err:
        VllmAdapter().engine_flags(c)
    assert "\n" not in str(err.value)


# -- a third-party plugin through the hooks -----------------------------------------


class P2pConnector:
    """A connector the vLLM plugin does not ship (P2pNcclConnector), with its own protocol."""

    engine = "vllm"
    name = "p2p"
    native = ("P2pNcclConnector",)
    description = "test: P2pNcclConnector"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        role = "kv_producer" if ctx.role is Role.PREFILL else "kv_consumer"
        config = {**user, "kv_connector": "P2pNcclConnector", "kv_role": role, "kv_port": 21001}
        pd = PdInfo(protocol="vllm-p2p", params={"kv_port": 21001})
        return TransferPlan(engine="vllm", role=ctx.role, connector=self.name, config=config, pd=pd)


class ThirdParty:
    amended: list[tuple[str, str | None]] = []

    @hookimpl
    def infera_register_transfer_connectors(self, registry: TransferConnectorRegistry) -> None:
        registry.add(P2pConnector())

    @hookimpl
    def infera_amend_kv_transfer(self, context: LaunchContext, plan: TransferPlan) -> None:
        self.amended.append((context.role.value, plan.connector))
        if plan.connector == "nixl":
            plan.config.setdefault("kv_connector_extra_config", {})["backends"] = ["UCX"]
            plan.env["UCX_TLS"] = "tcp"


def test_a_plugin_adds_a_connector_and_amends_the_builtin_ones() -> None:
    plugin = ThirdParty()
    hooks = make_hooks(("third-party", plugin))
    assert hooks.catalog().transfer_connectors.owner_of("vllm:p2p") == "third-party"
    assert hooks.catalog().transfer_connectors.owner_of("vllm:moriio") == "vllm"

    c = ctx(Role.PREFILL, pd_connector="p2p")
    c.hooks = hooks
    flags, plan = vllm(c)
    assert (
        kv_config(flags)["kv_connector"] == "P2pNcclConnector"
        and kv_config(flags)["kv_role"] == "kv_producer"
    )
    assert plan.pd == PdInfo(protocol="vllm-p2p", params={"kv_port": 21001})

    # the user's own spelling selects it too
    c = ctx(Role.DECODE, kv_transfer_config='{"kv_connector":"P2pNcclConnector"}')
    c.hooks = hooks
    assert kv_config(VllmAdapter().engine_flags(c))["kv_role"] == "kv_consumer"

    # the amend hook changes a built-in connector's config and environment
    c = ctx(Role.DECODE, pd_connector="nixl")
    c.hooks = hooks
    flags, plan = vllm(c)
    assert kv_config(flags)["kv_connector_extra_config"] == {"backends": ["UCX"]}
    assert plan.env["UCX_TLS"] == "tcp"
    # it runs once per launch (the plan is kept in ctx.kv_transfer), and on mixed workers too
    c = ctx(Role.MIXED)
    c.hooks = hooks
    vllm(c)
    assert plugin.amended == [("prefill", "p2p"), ("decode", "p2p"), ("decode", "nixl"), ("mixed", None)]


class Unspelled(P2pConnector):
    """A plugin's connector with no vLLM class name of its own (native=())."""

    name = "unspelled"
    native = ()


def test_offloading_with_a_plugin_connector_that_has_no_vllm_class_is_one_line() -> None:
    class Plugin:
        @hookimpl
        def infera_register_transfer_connectors(self, registry: TransferConnectorRegistry) -> None:
            registry.add(Unspelled())

    hooks = make_hooks(("unspelled", Plugin()))
    c = ctx(Role.DECODE, pd_connector="unspelled")
    c.hooks = hooks
    assert transfer_plan(c).connector == "unspelled"  # without offloading it runs as the plugin says
    for option, value, flag in (
        ("kv_offloading_size", 8, "--kv-offloading-size"),
        ("lmcache_config", "/etc/lmcache.yaml", "--lmcache-config"),
    ):
        c = ctx(Role.DECODE, pd_connector="unspelled", **{option: value})
        c.hooks = hooks
        # not a MultiConnector with NixlConnector as the PD child (the plugin's choice lost)
        with pytest.raises(EngineError, match=rf"^--pd-connector unspelled with {flag}: .* drop {flag}"):
            VllmAdapter().engine_flags(c)
    # an unknown --pd-connector is refused with offloading too (not silently NIXL)
    c = ctx(Role.PREFILL, pd_connector="nope", kv_offloading_size=8)
    c.hooks = hooks
    with pytest.raises(EngineError, match=r"^--pd-connector nope: vllm knows .*unspelled"):
        VllmAdapter().engine_flags(c)


def test_a_connector_name_registered_twice_names_both_plugins() -> None:
    class Again:
        @hookimpl
        def infera_register_transfer_connectors(self, registry: TransferConnectorRegistry) -> None:
            registry.add(P2pConnector())

    hooks = make_hooks(("one", ThirdParty()), ("two", Again()))
    with pytest.raises(
        PluginError, match=r"'vllm:p2p' is registered twice: by plugin '(one|two)' and by plugin '(two|one)'"
    ):
        hooks.catalog()


def test_an_amend_hook_that_drops_the_pd_is_refused() -> None:
    class Breaks:
        @hookimpl
        def infera_amend_kv_transfer(self, plan: TransferPlan) -> None:
            plan.pd = None

    c = ctx(Role.DECODE, pd_connector="nixl")
    c.hooks = make_hooks(("breaks", Breaks()))
    with pytest.raises(
        EngineError, match="--role decode: the nixl transfer connector gives the router no PD protocol"
    ):
        VllmAdapter().engine_flags(c)
