"""Every hook, called through the typed facade the way core calls it."""

from __future__ import annotations

import logging
from typing import Any

import click
import pytest
from click.testing import CliRunner

from infera_core.cli import build_cli
from infera_core.discovery.base import Discovery, DiscoveryRegistry, DiscoverySettings
from infera_core.engines.base import LaunchContext, LaunchSpec
from infera_core.engines.pd import LegRequest, PdContext, PdOrder, PdTransportRegistry
from infera_core.errors import PluginError
from infera_core.kv.events import AllBlocksCleared, KvDecoderRegistry, KvEventBatch
from infera_core.plugin.spec import hookimpl
from infera_core.scheduling.types import RoutedEvent
from infera_core.testing.contracts import sample_launch_context
from infera_core.testing.fixtures import make_hooks
from infera_core.tokenize.base import Tokenizer, TokenizerRegistry
from infera_core.worker import WorkerRecord


class Decoder:
    name = "demo-format"

    def decode(self, payload: bytes) -> KvEventBatch:
        return KvEventBatch(ts=1.0, events=[AllBlocksCleared()])


class Transport:
    name = "demo-pd"
    order = PdOrder.SERIAL

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        ctx.transfer_id = "t1"

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        return LegRequest(body={**body, "max_tokens": 1})

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        return LegRequest(body=body)


class DiscoveryBackend:
    name = "demo-discovery"
    description = "demo"

    def create(self, settings: DiscoverySettings) -> Discovery:
        raise NotImplementedError


class Tokenizers:
    name = "demo-tokenizer"
    description = "demo"

    def create(self, model: str, options: dict[str, Any]) -> Tokenizer:
        raise NotImplementedError


class EveryHook:
    """A plugin implementing every hook, recording the notifications it gets."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []
        self.routed: list[str] = []

    @hookimpl
    def infera_register_kv_event_decoders(self, registry: KvDecoderRegistry) -> None:
        registry.add(Decoder())

    @hookimpl
    def infera_register_pd_transports(self, registry: PdTransportRegistry) -> None:
        registry.add(Transport())

    @hookimpl
    def infera_register_discovery_backends(self, registry: DiscoveryRegistry) -> None:
        registry.add(DiscoveryBackend())

    @hookimpl
    def infera_register_tokenizers(self, registry: TokenizerRegistry) -> None:
        registry.add(Tokenizers())

    @hookimpl
    def infera_register_commands(self, cli: click.Group) -> None:
        @click.command("hello")
        def hello() -> None:
            """Say hello (added by a plugin)."""
            click.echo("hello from a plugin")

        cli.add_command(hello)

    @hookimpl
    def infera_mutate_engine_launch(self, context: LaunchContext, spec: LaunchSpec) -> None:
        spec.argv.append(f"--served-model-name={context.model}")
        spec.env["DEMO_WORKER"] = context.worker_id

    @hookimpl
    def infera_worker_added(self, record: WorkerRecord) -> None:
        self.added.append(record.worker_id)

    @hookimpl
    def infera_worker_removed(self, record: WorkerRecord) -> None:
        self.removed.append(record.worker_id)

    @hookimpl
    def infera_request_routed(self, event: RoutedEvent) -> None:
        self.routed.append(f"{event.request_id}->{event.worker_id}")


class Failing:
    @hookimpl
    def infera_worker_added(self, record: WorkerRecord) -> None:
        raise RuntimeError("listener bug")

    @hookimpl
    def infera_mutate_engine_launch(self, context: LaunchContext, spec: LaunchSpec) -> None:
        raise RuntimeError("cannot mutate")


RECORD = WorkerRecord(worker_id="w1", url="http://127.0.0.1:1", model="m", engine="sim")


def test_catalog_hooks_fill_their_registries_with_owners() -> None:
    hooks = make_hooks(("every", EveryHook()), installed=False)
    catalog = hooks.catalog()
    assert catalog.kv_decoders.get("demo-format").decode(b"").events == [AllBlocksCleared()]
    assert catalog.pd_transports.get("demo-pd").order is PdOrder.SERIAL
    assert catalog.discovery.names() == ["demo-discovery"]
    assert catalog.tokenizers.owner_of("demo-tokenizer") == "every"
    assert catalog.provides()["every"] == {
        "kv_event_decoders": ["demo-format"],
        "pd_transports": ["demo-pd"],
        "discovery_backends": ["demo-discovery"],
        "tokenizers": ["demo-tokenizer"],
    }
    assert hooks.require("kv_event_decoder", "demo-format") is catalog.kv_decoders.get("demo-format")
    assert hooks.require("pd_transport", "demo-pd").name == "demo-pd"
    assert hooks.require("tokenizer", "demo-tokenizer").name == "demo-tokenizer"


def test_register_commands_adds_a_subcommand() -> None:
    hooks = make_hooks(("every", EveryHook()), installed=False)
    result = CliRunner().invoke(build_cli(hooks), ["hello"])
    assert result.exit_code == 0 and result.output == "hello from a plugin\n"
    assert "Say hello" in CliRunner().invoke(build_cli(hooks), ["--help"]).output


def test_mutate_engine_launch_edits_spec_in_place() -> None:
    hooks = make_hooks(("every", EveryHook()), installed=False)
    ctx = sample_launch_context(worker_id="w7", model="tiny")
    spec = LaunchSpec(argv=["engine", "--port", "1"])
    hooks.mutate_engine_launch(ctx, spec)
    assert spec.argv == ["engine", "--port", "1", "--served-model-name=tiny"]
    assert spec.env == {"DEMO_WORKER": "w7"}


def test_failing_launch_mutation_is_fatal_and_names_plugin() -> None:
    hooks = make_hooks(("failing", Failing()), installed=False)
    with pytest.raises(PluginError, match="plugin 'failing' failed in infera_mutate_engine_launch"):
        hooks.mutate_engine_launch(sample_launch_context(), LaunchSpec(argv=["x"]))


def test_worker_notifications_reach_every_listener(caplog: pytest.LogCaptureFixture) -> None:
    listener = EveryHook()
    hooks = make_hooks(("failing", Failing()), ("every", listener), installed=False)
    with caplog.at_level(logging.ERROR, logger="infera.hooks"):
        hooks.worker_added(RECORD)
    hooks.worker_removed(RECORD)
    assert listener.added == ["w1"] and listener.removed == ["w1"]
    assert "plugin 'failing' failed in infera_worker_added" in caplog.text


def test_request_routed_notifier_is_none_without_listeners() -> None:
    assert make_hooks(installed=False).request_routed_notifier() is None
    listener = EveryHook()
    notify = make_hooks(("every", listener), installed=False).request_routed_notifier()
    assert notify is not None
    notify(RoutedEvent(request_id="r1", model="m", worker_id="w1"))
    assert listener.routed == ["r1->w1"]
