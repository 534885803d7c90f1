"""KV transfer connectors: how an engine is configured to move KV between prefill and decode.

An engine plugin registers one :class:`TransferConnector` per way its engine can move KV
(vLLM ``NixlConnector``, ``MooncakeConnector``, ``MoRIIOConnector``…; SGLang's
``--disaggregation-transfer-backend`` values; ATOM's ``mooncake``) through the catalog
hook ``infera_register_transfer_connectors``. At launch the engine adapter picks one
(from its ``--pd-connector``-style option or the ``kv_connector`` of the user's
``--kv-transfer-config``), lets it build a :class:`TransferPlan` for the worker's role,
then every plugin may amend the plan (``infera_amend_kv_transfer``) before the adapter
turns it into argv, environment and the worker record's ``pd`` field.

A third-party plugin adds a connector (say a new vLLM connector) by registering it for
the engine, or changes fields of the built-in ones by amending the plan; no adapter fork.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from infera_core.engines.base import (
    LaunchContext,
    TransferConnector,
    TransferConnectorRegistry,
    TransferHooks,
    TransferPlan,
)
from infera_core.errors import EngineError
from infera_core.worker import Role


def parse_user_config(raw: object, flag: str = "--kv-transfer-config") -> dict[str, Any]:
    """The user's transfer config as a dict ({} when not given); one-line errors."""
    if raw in (None, ""):
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    try:
        value = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise EngineError(f"{flag}: not JSON ({exc.msg}): {raw}") from None
    if not isinstance(value, dict):
        raise EngineError(f"{flag}: expected a JSON object, got {raw}")
    return value


def connectors_for(
    ctx: LaunchContext, engine: str, builtin: Iterable[TransferConnector]
) -> dict[str, TransferConnector]:
    """``engine``'s connectors by name: the plugins' (``ctx.hooks``), else ``builtin``."""
    if ctx.hooks is not None:
        return ctx.hooks.transfer_connectors(engine)
    return {c.name: c for c in builtin}


def find_connector(
    connectors: Mapping[str, TransferConnector],
    engine: str,
    *,
    native: str | None,
    chosen: str | None,
    option: str = "--pd-connector",
) -> TransferConnector:
    """The connector the user named: by the engine's own name (``native``) or Infera's
    (``chosen``, from the adapter's ``option``)."""
    if native is not None:
        for connector in connectors.values():
            if native in connector.native or native == connector.name:
                return connector
        known = sorted(n for c in connectors.values() for n in c.native)
        raise EngineError(
            f"--kv-transfer-config kv_connector {native}: Infera cannot drive it for prefill/decode "
            f"on {engine} (known: {', '.join(known)}); drop --role to run your own connector, "
            "or register it through infera_register_transfer_connectors"
        )
    name = chosen or ""
    if name not in connectors:
        raise EngineError(
            f"{option} {name or '(none)'}: {engine} knows {', '.join(sorted(connectors)) or 'no connector'}"
        )
    return connectors[name]


def resolve_plan(
    ctx: LaunchContext,
    engine: str,
    builtin: Iterable[TransferConnector],
    *,
    chosen: str | None,
    user: dict[str, Any],
    mixed: TransferPlan | None = None,
    option: str = "--pd-connector",
) -> TransferPlan:
    """Build the launch's plan once, let plugins amend it, and keep it in ``ctx.kv_transfer``.

    ``builtin``: the adapter's own connectors, used when ``ctx.hooks`` is not set (an
    adapter driven without a plugin manager, e.g. in unit tests); with hooks, the
    catalog's connectors for ``engine`` (the adapter's plugin registers the same ones).
    ``mixed``: the plan of a mixed worker (no PD), built by the adapter. ``option``: the
    adapter's flag that names the connector (for the error when it names none).
    """
    if ctx.kv_transfer is not None:
        return ctx.kv_transfer
    hooks = ctx.hooks
    connectors = connectors_for(ctx, engine, builtin)
    if ctx.role is Role.MIXED:
        plan = mixed or TransferPlan(engine=engine, role=ctx.role, connector=None)
    else:
        native = user.get("kv_connector")
        connector = find_connector(
            connectors,
            engine,
            native=str(native) if native is not None else None,
            chosen=chosen,
            option=option,
        )
        plan = connector.build(ctx, user)
    if hooks is not None:
        hooks.amend_kv_transfer(ctx, plan)
    if ctx.role is not Role.MIXED and plan.pd is None:
        raise EngineError(
            f"--role {ctx.role.value}: the {plan.connector or 'chosen'} transfer connector gives the "
            "router no PD protocol (plan.pd is None)"
        )
    ctx.kv_transfer = plan
    return plan


def check_kv_role(
    user: Mapping[str, Any], role: Role, allowed: tuple[str, ...], connector: str
) -> str | None:
    """The user's ``kv_role`` if it fits ``role`` (None when not given); else one clear error."""
    kv_role = user.get("kv_role")
    if kv_role is None:
        return None
    if kv_role not in allowed:
        raise EngineError(
            f"--kv-transfer-config kv_role {kv_role} contradicts --role {role.value} for {connector} "
            f"(use {' or '.join(allowed)}, or leave kv_role out)"
        )
    return str(kv_role)


def check_one_sided_mixed(user: Mapping[str, Any]) -> None:
    """A mixed worker whose config makes it a producer or consumer: one error naming the --role."""
    one_sided = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(str(user.get("kv_role")))
    if one_sided is not None:
        raise EngineError(
            f"--kv-transfer-config kv_role {user['kv_role']} makes a {one_sided} worker: "
            f"add --role {one_sided} (this worker is registered as mixed)"
        )


def extra_config(user: Mapping[str, Any]) -> dict[str, Any]:
    """The user's ``kv_connector_extra_config`` (a JSON object) as a new dict."""
    extra = user.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        raise EngineError(
            f"--kv-transfer-config kv_connector_extra_config: expected an object, got {extra!r}"
        )
    return dict(extra)


def one_pd_child(
    ctx: LaunchContext,
    engine: str,
    builtin: Iterable[TransferConnector],
    children: object,
    *,
    multi: str,
    label: str,
    field: str,
    example: str,
) -> tuple[list[dict[str, Any]], int, TransferConnector]:
    """A MultiConnector's ``children`` checked (vLLM's ``MultiConnector``, ATOM's ``multi``):
    a list of connector configs holding exactly one of ``engine``'s PD connectors (the one
    named ``multi`` left out). Returns the children, the PD child's index and the connector
    that builds it; one error line otherwise (``label``: the engine's name for the
    MultiConnector, ``field``: where the list goes, ``example``: a list to show)."""
    if not isinstance(children, list) or not children or not all(isinstance(c, dict) for c in children):
        raise EngineError(
            f"--kv-transfer-config {label} needs {field}: a list of connector configs, e.g. {example}"
        )
    known = {n: c for c in connectors_for(ctx, engine, builtin).values() if c.name != multi for n in c.native}
    pd_children = [i for i, c in enumerate(children) if c.get("kv_connector") in known]
    if len(pd_children) != 1:
        named = ", ".join(str(c.get("kv_connector")) for c in children)
        raise EngineError(
            f"--kv-transfer-config {label} [{named}]: --role {ctx.role.value} needs exactly one PD "
            f"connector among them ({', '.join(sorted(known))})"
        )
    index = pd_children[0]
    return children, index, known[str(children[index]["kv_connector"])]


__all__ = [
    "TransferConnector",
    "TransferConnectorRegistry",
    "TransferHooks",
    "TransferPlan",
    "check_kv_role",
    "check_one_sided_mixed",
    "connectors_for",
    "extra_config",
    "find_connector",
    "one_pd_child",
    "parse_user_config",
    "resolve_plan",
]
