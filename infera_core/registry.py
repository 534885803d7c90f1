"""Typed registries filled by the catalog hooks.

A registry maps a unique name to an object and remembers which plugin added it, so
that a duplicate name fails at start-up naming both owners. Hook implementations
receive a registry already bound to their plugin (``registry.owner``); core code
reads registries through :meth:`Registry.get` and :meth:`Registry.names`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from infera_core.errors import DuplicateNameError, PluginError, UnknownNameError


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    name: str
    obj: T
    owner: str


def protocol_members(proto: type) -> list[str]:
    """The public attributes and methods a protocol (and its protocol bases) declares."""
    names: set[str] = set()
    for base in proto.__mro__:
        if base is object or not getattr(base, "_is_protocol", False) or base.__module__ == "typing":
            continue
        names.update(vars(base))
        names.update(getattr(base, "__annotations__", {}))
    return sorted(n for n in names if not n.startswith("_"))


class Registry(Generic[T]):
    """A name → object map with owners. ``kind`` names the registry in errors.

    ``protocol``: what every registered object must provide; :meth:`add` checks it at
    once, so a plugin that registers an incomplete object fails at load naming itself
    and the missing members (not later, in a request, with an ``AttributeError``).
    """

    kind = "object"
    protocol: type | None = None

    def __init__(self, owner: str = "<core>", _shared: dict[str, Entry[T]] | None = None) -> None:
        self.owner = owner
        self._entries: dict[str, Entry[T]] = {} if _shared is None else _shared
        self.note = ""
        """Appended to every "unknown name" error: the facade sets it to the plugins that
        failed to load or were disabled (the name may have come from one of them)."""

    def bound(self, owner: str) -> Any:
        """A view of this registry that records ``owner`` for everything added."""
        view = type(self).__new__(type(self))
        Registry.__init__(view, owner, self._entries)
        view._copy_extra_state(self)
        return view

    def _copy_extra_state(self, other: Any) -> None:
        """Subclasses with more state share it with their bound views here."""

    def add(self, obj: T) -> None:
        self._check(obj)
        self._add(obj.name, obj)

    def _check(self, obj: object) -> None:
        """Raise :class:`PluginError` naming the plugin and what ``obj`` lacks."""
        proto = self.protocol
        if proto is None:
            return
        members = protocol_members(proto) or ["name"]
        missing = [m for m in members if not hasattr(obj, m)]
        uncallable = [
            m
            for m in members
            if m not in missing and callable(getattr(proto, m, None)) and not callable(getattr(obj, m))
        ]
        if not missing and not uncallable:
            return
        name = getattr(obj, "name", None)
        what = f"{self.kind} {name!r}" if isinstance(name, str) else f"a {self.kind} ({type(obj).__name__})"
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"not callable: {', '.join(uncallable)}"] if uncallable else []
        raise PluginError(
            f"plugin {self.owner!r} registered {what} that does not implement {proto.__name__}: {'; '.join(parts)}"
        )

    def _add(self, name: str, obj: T) -> None:
        if not name:
            raise ValueError(f"{self.kind} registered by plugin {self.owner!r} has an empty name")
        if name in self._entries:
            first = self._entries[name].owner
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: by plugin {first!r} and by plugin {self.owner!r}"
            )
        self._entries[name] = Entry(name, obj, self.owner)

    def get(self, name: str) -> T:
        try:
            return self._entries[name].obj
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names(), self.note) from None

    def owner_of(self, name: str) -> str:
        return self._entries[name].owner

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        for name in self.names():
            yield self._entries[name]

    def __len__(self) -> int:
        return len(self._entries)


_MOVED = {
    "EngineRegistry": "infera_core.engines.base",
    "option_clashes": "infera_core.engines.base",
    "OPTION_CLASH_HINT": "infera_core.engines.base",
    "KvDecoderRegistry": "infera_core.kv.events",
    "PdTransportRegistry": "infera_core.engines.pd",
    "PdProtocolRegistry": "infera_core.engines.pd",
    "DiscoveryRegistry": "infera_core.discovery.base",
    "TokenizerRegistry": "infera_core.tokenize.base",
    "RequestTransportRegistry": "infera_core.transports.base",
    "KvEventTransportRegistry": "infera_core.transports.base",
    "PolicyRegistry": "infera_core.scheduling.registry",
    "Preset": "infera_core.scheduling.registry",
}


def __getattr__(name: str) -> Any:
    """The typed registries moved beside their contracts; the old names resolve for one
    release (by module name, so this generic module depends on none of them)."""
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
