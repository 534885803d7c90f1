"""Hugging Face TGI: ``infera-run worker tgi --model-path <id or dir> [-- launcher flags]``.

Flags checked against TGI's launcher, ``launcher/src/main.rs`` (clap ``Args``: ``--model-id``,
``--hostname``, ``--port``/``-p``, ``--prometheus-port`` (default 9000), ``--shard-uds-path``
(default ``/tmp/text-generation-server``), ``--master-port`` (default 29500),
``--num-shard``); routes in ``router/src/server.rs`` (``GET /health``, ``/metrics`` on the
HTTP port) and gauge names in ``backends/v3/src/{queue,backend}.rs`` (``tgi_queue_size``,
``tgi_batch_current_size``). TGI answers any ``model`` in OpenAI requests, so the served name
needs no flag. Every per-host default above is replaced by a free port / a per-worker path,
so two TGI workers share a host.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from infera_core.engines.base import EngineOption, FlagAlias, LaunchContext, LaunchSpec
from infera_core.engines.support import free_ports
from infera_openai.base import OpenAIServerAdapter, locate_binary, positive

LAUNCHER = "text-generation-launcher"

MANAGED_FLAGS = {
    "--model-id": "--model-path",
    "--hostname": "infera's --host",
    "--port": "infera's --port",
    "-p": "infera's --port",
    "--prometheus-port": "nothing: Infera picks a free one per worker",
    "--shard-uds-path": "nothing: Infera sets one per worker",
    "--master-port": "nothing: Infera picks a free one per worker",
    "--num-shard": "--tp",
}

ALIASES: Mapping[str, FlagAlias] = {
    "--model-id": FlagAlias("--model-path"),
    "--hostname": FlagAlias("--host"),
    "-p": FlagAlias("--port"),
    "--num-shard": FlagAlias("--tp"),
}
"""TGI's spellings of what Infera manages (``python -m infera.engine.tgi``, or after ``--``)."""

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption("tp", int, 1, "Tensor-parallel shards (TGI --num-shard)."),
    EngineOption(
        "tgi_launcher",
        str,
        None,
        f"Path of {LAUNCHER} [default: the one on PATH].",
    ),
)


def uds_path(ctx: LaunchContext) -> str:
    """A per-worker ``--shard-uds-path`` (TGI appends ``-<rank>``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", ctx.worker_id)[:48]
    return str(Path(tempfile.gettempdir()) / f"infera-tgi-{safe}-{ctx.port}")


class TgiAdapter(OpenAIServerAdapter):
    """Launches and watches one ``text-generation-launcher`` (its router and shards)."""

    name = "tgi"
    description = "Hugging Face text-generation-inference (text-generation-launcher); no KV events"
    package_hint = "install text-generation-inference (its text-generation-launcher binary)"
    running_metrics = ("tgi_batch_current_size",)
    waiting_metrics = ("tgi_queue_size",)
    managed_flags = MANAGED_FLAGS
    aliases = ALIASES
    engine_options = OPTIONS

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        launcher = locate_binary(
            ctx.options.get("tgi_launcher"), LAUNCHER, "--tgi-launcher", self.package_hint
        )
        return LaunchSpec(argv=[launcher, *self.engine_flags(ctx)])

    def engine_flags(self, ctx: LaunchContext) -> list[str]:
        """Every launcher flag (pure: no probe)."""
        if not ctx.ports:
            prometheus, master = free_ports(ctx, 2)
            ctx.ports.update(prometheus=prometheus, master=master)
        return [
            "--model-id",
            ctx.served_path,
            "--hostname",
            ctx.host,
            "--port",
            str(ctx.port),
            "--prometheus-port",
            str(ctx.ports["prometheus"]),
            "--master-port",
            str(ctx.ports["master"]),
            "--shard-uds-path",
            uds_path(ctx),
            "--num-shard",
            str(positive(ctx, "tp", "--tp")),
            *ctx.engine_args,
        ]
