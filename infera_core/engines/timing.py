"""Engine timing profiles, and engines that step on a virtual clock.

A :class:`TimingProfile` is what ``infera-run calibrate`` measures on a running engine and what
a simulated engine reads (``infera-run worker sim --profile FILE``) to behave like it: the time
of one engine step is

    prefill_base_ms (when the step prefills) + uncached prompt tokens / prefill_tokens_per_s
    + itl_base_ms + itl_slope_ms × running requests (when the step decodes)

An adapter whose engine can also run in-process on a virtual clock (the sim) implements
:class:`VirtualEngines`; ``infera-run plan`` replays a trace over fleets of such engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infera_core.config.settings import read_data_file
from infera_core.errors import ConfigError
from infera_core.kv.events import KvEvent

PROFILE_SCHEMA = "infera.timing/v1"


class TimingProfile(BaseModel):
    """How fast one engine replica is: prefill, decode and batch limits (``infera.timing/v1``)."""

    model_config = ConfigDict(extra="ignore")

    schema_: str = Field(PROFILE_SCHEMA, alias="schema", description="always infera.timing/v1")
    engine: str = Field("", description="what was measured (the /v1/models owner or the --url)")
    model: str = Field("", description="the served model that was measured")
    prefill_tokens_per_s: float = Field(gt=0, description="prefill speed over uncached prompt tokens")
    prefill_base_ms: float = Field(0.0, ge=0, description="fixed time of a step that prefills")
    itl_base_ms: float = Field(ge=0, description="decode step time with one running request")
    itl_slope_ms: float = Field(0.0, ge=0, description="extra decode step time per running request")
    max_num_seqs: int | None = Field(None, gt=0, description="most requests running at once, if known")
    max_num_batched_tokens: int | None = Field(None, gt=0, description="token budget per step, if known")
    block_size: int | None = Field(None, gt=0, description="KV block size in tokens, if known")
    cache_blocks: int | None = Field(None, gt=0, description="KV cache capacity in blocks, if known")
    max_useful_concurrency: int | None = Field(
        None, gt=0, description="the batch size beyond which decode throughput grew < 10 % (measured)"
    )
    samples: dict[str, list[list[float]]] = Field(
        default_factory=dict, description="the raw points the fit used (for the record)"
    )

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2, exclude_none=True) + "\n"


def load_profile(path: str | Path) -> TimingProfile:
    """Read a profile file (JSON, or YAML unless the name ends in ``.json``); :class:`ConfigError` with one line when it is missing or bad."""
    p = Path(path)
    raw = read_data_file(p, "--profile")
    if not isinstance(raw, dict):
        raise ConfigError(f"--profile {p}: expected a mapping (an {PROFILE_SCHEMA} profile)")
    if raw.get("schema", PROFILE_SCHEMA) != PROFILE_SCHEMA:
        raise ConfigError(f"--profile {p}: schema {raw.get('schema')!r} is not {PROFILE_SCHEMA}")
    try:
        return TimingProfile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"--profile {p}: {where}: {first['msg']}") from None


@dataclass(slots=True)
class Finished:
    """One request a virtual engine completed: times in virtual seconds."""

    request_id: str
    arrival: float
    first_token_at: float
    finished_at: float
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int


Publish = Callable[[float, list[KvEvent]], None]
"""Receives each KV event batch a virtual engine emits, with its virtual timestamp."""


class VirtualEngine(Protocol):
    """One engine replica stepped by the caller on a virtual clock (no sockets, no sleeping)."""

    def submit(
        self, request_id: str, prompt: Sequence[int], max_tokens: int, now: float, received: int = 0
    ) -> None:
        """Queue a request that arrives at ``now``; ``received``: prompt tokens whose KV came from a
        prefill worker (PD), not computed here."""
        ...

    def start_step(self, now: float) -> float | None:
        """Plan the next step at ``now``; its end time, or None when there is nothing to run."""
        ...

    def end_step(self, t: float) -> list[Finished]:
        """Run the step planned last, ending at ``t``; the requests it finished."""
        ...


@runtime_checkable
class VirtualEngines(Protocol):
    """An adapter capability: build in-process engines on a virtual clock (``infera-run plan``)."""

    def virtual_engine(
        self, profile: TimingProfile, block_size: int, cache_blocks: int, publish: Publish | None
    ) -> VirtualEngine: ...
