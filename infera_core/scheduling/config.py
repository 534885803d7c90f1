"""Scheduling profiles as configuration (flags, presets or a YAML file)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PluginRef(BaseModel):
    """A filter, scorer or picker by name, with its parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ScorerRef(PluginRef):
    weight: float = Field(default=1.0, ge=0)


class ProfileConfig(BaseModel):
    """One scheduling profile: filters → weighted scorers → one picker."""

    model_config = ConfigDict(extra="forbid")

    filters: list[PluginRef] = Field(default_factory=list)
    scorers: list[ScorerRef] = Field(default_factory=list)
    picker: PluginRef = Field(default_factory=lambda: PluginRef(name="max-score"))
