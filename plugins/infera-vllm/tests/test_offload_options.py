"""KV offloading options: vLLM native CPU offloading and LMCache, SGLang HiCache and LMCache.

The vLLM argv is also resolved by vLLM 0.32's own parser and config (``vllm_offload_check.py``
under ``.venv-vllm``): vLLM on CPU cannot run offloading ("CPU Offloading is currently only
supported on CUDA-alike and XPU GPUs"), so the argv is checked, not run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from infera_sglang.adapter import SglangAdapter
from infera_vllm.adapter import VllmAdapter
from infera_vllm.transfer import transfer_plan
from real_vllm import vllm_check, vllm_python

from infera_core.cli.worker import flat_worker_args
from infera_core.engines.base import LaunchContext
from infera_core.errors import EngineError
from infera_core.launcher.flags import launch_options
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.engine_env import GOLDEN_WORKER, flag, launch_context
from infera_core.worker import Role

GIB = 1 << 30
SELF_DESCRIBING = {"self_describing_kv_events": True}


def ctx(role: Role = Role.MIXED, **options: Any) -> LaunchContext:
    defaults = {"tp": 1, "pd_connector": "nixl", "kv_events_port": 0, "page_size": 16}
    return launch_context(GOLDEN_WORKER, 42000, role=role, options={**defaults, **options})


def transfer(argv: list[str]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(flag(argv, "--kv-transfer-config"))
    return config


# -- vLLM ---------------------------------------------------------------------------------


def test_vllm_native_offloading_on_a_mixed_worker_asks_for_self_describing_events() -> None:
    argv = VllmAdapter().engine_flags(ctx(kv_offloading_size=8))
    assert flag(argv, "--kv-offloading-size") == "8"
    assert flag(argv, "--kv-offloading-backend") == "native"
    # vLLM merges its own cpu_bytes_to_use into this and names the OffloadingConnector
    assert transfer(argv) == {"kv_connector_extra_config": SELF_DESCRIBING}


def test_vllm_user_extra_config_is_kept_and_a_replaced_connector_refused() -> None:
    user = {"kv_connector_extra_config": {"block_size": 64}}
    argv = VllmAdapter().engine_flags(ctx(kv_offloading_size=0.5, kv_transfer_config=json.dumps(user)))
    assert transfer(argv) == {"kv_connector_extra_config": {"block_size": 64, **SELF_DESCRIBING}}
    assert flag(argv, "--kv-offloading-size") == "0.5"
    nixl = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    with pytest.raises(EngineError, match=r"replacing --kv-transfer-config.s NixlConnector.*MultiConnector"):
        VllmAdapter().engine_flags(ctx(kv_offloading_size=8, kv_transfer_config=nixl))


def test_vllm_lmcache_backends() -> None:
    argv = VllmAdapter().engine_flags(ctx(kv_offloading_size=4, kv_offloading_backend="lmcache"))
    assert flag(argv, "--kv-offloading-backend") == "lmcache"
    assert "--kv-transfer-config" not in argv  # LMCacheMPConnector: the LMCache server owns events
    c = ctx(lmcache_config="/etc/lmcache.yaml")
    argv = VllmAdapter().engine_flags(c)
    assert transfer(argv) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    assert "--kv-offloading-size" not in argv
    assert transfer_plan(c).env["LMCACHE_CONFIG_FILE"] == "/etc/lmcache.yaml"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kv_offloading_size": 0}, "must be a positive number of GiB"),
        ({"kv_offloading_backend": "native"}, "needs --kv-offloading-size"),
        ({"kv_offloading_size": 1, "kv_offloading_backend": "disk"}, "choose native or lmcache"),
        ({"kv_offloading_size": 1, "lmcache_config": "/x.yaml"}, "give one"),
    ],
)
def test_vllm_bad_offloading_options_are_one_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        VllmAdapter().engine_flags(ctx(**options))


@pytest.mark.parametrize(
    ("connector", "native"), [("nixl", "NixlConnector"), ("mooncake", "MooncakeConnector")]
)
def test_vllm_pd_worker_composes_a_multiconnector_instead_of_the_flags(connector: str, native: str) -> None:
    c = ctx(Role.DECODE, pd_connector=connector, kv_offloading_size=2)
    argv = VllmAdapter().engine_flags(c)
    # vLLM's --kv-offloading-size would replace the PD connector: not passed
    assert "--kv-offloading-size" not in argv
    config = transfer(argv)
    assert config["kv_connector"] == "MultiConnector" and config["engine_id"] == "w1"
    pd, offloading = config["kv_connector_extra_config"]["connectors"]
    assert pd["kv_connector"] == native and "engine_id" not in pd
    assert offloading == {
        "kv_role": "kv_both",
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 2 * GIB, **SELF_DESCRIBING},
    }
    assert config["kv_role"] == pd["kv_role"]
    assert VllmAdapter().record_fields(c).pd is not None  # the router still speaks the PD protocol


def test_vllm_pd_user_multiconnector_gets_the_offloading_child_once() -> None:
    multi = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [{"kv_connector": "NixlConnector"}]},
    }
    argv = VllmAdapter().engine_flags(
        ctx(Role.PREFILL, kv_transfer_config=json.dumps(multi), lmcache_config="/l.yaml")
    )
    children = transfer(argv)["kv_connector_extra_config"]["connectors"]
    assert [c["kv_connector"] for c in children] == ["NixlConnector", "LMCacheConnectorV1"]
    multi["kv_connector_extra_config"]["connectors"].append({"kv_connector": "OffloadingConnector"})  # type: ignore[index]
    with pytest.raises(EngineError, match="already has an offloading connector"):
        VllmAdapter().engine_flags(
            ctx(Role.PREFILL, kv_transfer_config=json.dumps(multi), kv_offloading_size=1)
        )


def test_vllm_offloading_flags_after_dashes_become_infera_options() -> None:
    aliases = VllmAdapter().flag_aliases()
    assert aliases["--kv-offloading-size"].target == "--kv-offloading-size"
    assert aliases["--kv-offloading-backend"].target == "--kv-offloading-backend"
    names = {o.name for o in VllmAdapter().options()}
    assert {"kv_offloading_size", "kv_offloading_backend", "lmcache_config"} <= names


def test_flat_form_and_flags_after_dashes_reach_the_offload_options() -> None:
    hooks = InferaHooks.load()
    flat = ["--model", "m", "--kv-offloading-size", "8", "--kv-offloading-backend", "native", "--seed", "3"]
    assert flat_worker_args(hooks, "vllm", flat) == [
        "worker", "vllm", "--model", "m", "--kv-offloading-size", "8", "--kv-offloading-backend", "native",
        "--", "--seed", "3",
    ]  # fmt: skip
    got, rest = launch_options(
        hooks.require("engine", "vllm"), {}, ["--kv-offloading-size", "4", "--seed", "3"]
    )
    assert got["kv_offloading_size"] == 4.0 and rest == ["--seed", "3"]
    flat = [
        "--model-path",
        "p",
        "--enable-hierarchical-cache",
        "--hicache-ratio",
        "2",
        "--hicache-storage-backend",
        "file",
    ]
    argv = flat_worker_args(hooks, "sglang", flat)
    infera, engine = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    assert {"--enable-hierarchical-cache", "--hicache-ratio", "--hicache-storage-backend"} <= set(infera)
    assert engine == []  # all taken as Infera options (re-emitted by the adapter)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_resolves_the_offloading_argv_itself() -> None:
    """vLLM 0.32's parser and create_engine_config on the adapter's argv (tiny model)."""
    _, model = vllm_python()
    cases = {
        "native": ctx(kv_offloading_size=0.5),
        "lmcache-mp": ctx(kv_offloading_size=0.5, kv_offloading_backend="lmcache"),
        "lmcache-v1": ctx(lmcache_config="/tmp/lmcache.yaml"),
        "nixl-prefill": ctx(Role.PREFILL, kv_offloading_size=0.5),
        "mooncake-decode": ctx(Role.DECODE, pd_connector="mooncake", kv_offloading_size=0.5),
    }
    extra = ["--max-model-len", "512", "--enforce-eager"]
    argvs = [["--model", model, *VllmAdapter().engine_flags(c), *extra] for c in cases.values()]
    got = dict(zip(cases, vllm_check("vllm_offload_check.py", argvs, timeout=300), strict=True))
    native = got["native"]
    assert native.get("ok"), native
    assert native["resolved"]["kv_connector"] == "OffloadingConnector"
    assert native["resolved"]["extra"] == {"cpu_bytes_to_use": 0.5 * GIB, **SELF_DESCRIBING}
    # vLLM accepts the flags and builds the LMCache MP connector, whose package is not installed here
    assert got["lmcache-mp"]["kv_offloading_backend"] == "lmcache"
    assert got["lmcache-mp"].get("ok") or "lmcache" in got["lmcache-mp"]["error"]
    assert got["lmcache-v1"]["resolved"]["kv_connector"] == "LMCacheConnectorV1"
    for name, pd_connector, kv_role in (
        ("nixl-prefill", "NixlConnector", "kv_both"),
        ("mooncake-decode", "MooncakeConnector", "kv_consumer"),
    ):
        r = got[name]
        assert r.get("ok"), r
        resolved = r["resolved"]
        assert resolved["kv_connector"] == "MultiConnector" and resolved["engine_id"] == "w1"
        assert resolved["kv_role"] == kv_role
        kinds = [child["kv_connector"] for child in resolved["extra"]["connectors"]]
        assert kinds == [pd_connector, "OffloadingConnector"], name


# -- SGLang -------------------------------------------------------------------------------


def test_sglang_hicache_options_become_its_flags() -> None:
    argv = SglangAdapter().engine_flags(
        ctx(hicache_ratio=2.0, hicache_write_policy="write_back", hicache_storage_backend="file")
    )
    i = argv.index("--enable-hierarchical-cache")
    assert argv[i : i + 7] == [
        "--enable-hierarchical-cache",
        "--hicache-ratio",
        "2",
        "--hicache-write-policy",
        "write_back",
        "--hicache-storage-backend",
        "file",
    ]
    argv = SglangAdapter().engine_flags(ctx(enable_hierarchical_cache=True, hicache_size=40))
    assert flag(argv, "--hicache-size") == "40" and "--enable-hierarchical-cache" in argv
    assert "--enable-hierarchical-cache" not in SglangAdapter().engine_flags(ctx())


def test_sglang_lmcache_and_bad_hicache_values() -> None:
    argv = SglangAdapter().engine_flags(ctx(lmcache_config="/etc/lmcache.yaml"))
    assert "--enable-lmcache" in argv and flag(argv, "--lmcache-config-file") == "/etc/lmcache.yaml"
    with pytest.raises(EngineError, match="alternatives"):
        SglangAdapter().engine_flags(ctx(lmcache_config="/l.yaml", hicache_ratio=2))
    with pytest.raises(EngineError, match="must be > 0"):
        SglangAdapter().engine_flags(ctx(hicache_ratio=0))
    with pytest.raises(EngineError, match="write_through"):
        SglangAdapter().engine_flags(ctx(hicache_write_policy="sometimes"))
