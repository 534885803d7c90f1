"""``infera-run calibrate``: measure a running engine and write a sim timing profile."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from infera_core.bench.calibrate import calibrate
from infera_core.bench.plan_config import CalibrateSettings
from infera_core.config.settings import click_options, resolve
from infera_core.errors import ConfigError
from infera_core.plugin.hooks import InferaHooks


@click.command("calibrate")
@click_options(CalibrateSettings)
@click.option(
    "--config", "config_file", type=click.Path(path_type=Path), help="YAML/JSON file with settings."
)
@click.pass_obj
def calibrate_cmd(hooks: InferaHooks, /, config_file: Path | None, **values: Any) -> None:
    """Measure a running engine (prefill, decode, concurrency) and write a sim timing profile.

    \b
    Examples:
      infera-run calibrate --url http://127.0.0.1:8000/v1 --out vllm.json
      infera-run worker sim --profile vllm.json      # a sim that behaves like that engine
    Point --url at one engine, not at a router: the probe measures one replica.
    """
    s = resolve(CalibrateSettings, values, config_file)
    if not s.url:
        raise ConfigError("--url is required: the engine to measure, e.g. http://127.0.0.1:8000/v1")
    try:
        profile = asyncio.run(
            calibrate(
                s.url,
                s.model,
                s.prompt_lens,
                s.batch_sizes,
                s.decode_tokens,
                s.repeats,
                s.vocab_size,
                s.timeout,
            )
        )
    except KeyboardInterrupt:
        click.echo("infera-run calibrate: aborted", err=True)
        sys.exit(130)
    text = profile.to_json()
    if s.out is None:
        click.echo(text, nl=False)
        return
    try:
        s.out.write_text(text)
    except OSError as exc:
        raise ConfigError(f"--out {s.out}: cannot write ({exc.strerror})") from None
    click.echo(
        f"profile written to {s.out}: prefill {profile.prefill_tokens_per_s:.0f} tok/s "
        f"+ {profile.prefill_base_ms:.1f} ms, ITL {profile.itl_base_ms:.1f} ms "
        f"+ {profile.itl_slope_ms:.2f} ms/request",
        err=True,
    )
