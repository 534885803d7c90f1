"""The policy registry: filters, scorers and pickers by ``kind:name``, plus named presets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from infera_core.errors import DuplicateNameError, PluginError, UnknownNameError
from infera_core.registry import Entry, Registry
from infera_core.scheduling.config import ProfileConfig
from infera_core.scheduling.types import PolicyFactory


@dataclass(frozen=True, slots=True)
class Preset:
    """A named scheduling profile selectable with ``--router-policy``."""

    name: str
    profile: ProfileConfig
    description: str = ""


class PolicyRegistry(Registry[PolicyFactory]):
    """Filters, scorers and pickers (by ``kind:name``) plus named presets."""

    kind = "policy"

    def __init__(self, owner: str = "<core>", _shared: dict[str, Entry[PolicyFactory]] | None = None) -> None:
        super().__init__(owner, _shared)
        self._presets: dict[str, Entry[Preset]] = {}

    def _copy_extra_state(self, other: Any) -> None:
        self._presets = other._presets

    def add(self, obj: PolicyFactory) -> None:
        if not isinstance(obj, PolicyFactory):
            raise PluginError(
                f"plugin {self.owner!r} registered a {type(obj).__name__} as a policy: "
                "register infera_core.scheduling.types.PolicyFactory(name, kind, build, params, description)"
            )
        self._add(f"{obj.kind}:{obj.name}", obj)

    def factory(self, kind: str, name: str) -> PolicyFactory:
        key = f"{kind}:{name}"
        if key not in self._entries:
            available = [n.split(":", 1)[1] for n in self.names() if n.startswith(kind + ":")]
            raise UnknownNameError(kind, name, available, self.note)
        return self._entries[key].obj

    def add_preset(self, name: str, profile: ProfileConfig, description: str = "") -> None:
        if name in self._presets:
            first = self._presets[name].owner
            raise DuplicateNameError(
                f"policy preset {name!r} is registered twice: by plugin {first!r} and by plugin {self.owner!r}"
            )
        self._presets[name] = Entry(name, Preset(name, profile, description), self.owner)

    def preset(self, name: str) -> Preset:
        try:
            return self._presets[name].obj
        except KeyError:
            raise UnknownNameError("policy preset", name, self.preset_names(), self.note) from None

    def preset_names(self) -> list[str]:
        return sorted(self._presets)

    def preset_entries(self) -> Iterator[Entry[Preset]]:
        for name in self.preset_names():
            yield self._presets[name]
