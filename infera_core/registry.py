"""Typed registries filled by the catalog hooks.

A registry maps a unique name to an object and remembers which plugin added it, so
that a duplicate name fails at start-up naming both owners. Hook implementations
receive a registry already bound to their plugin (``registry.owner``); core code
reads registries through :meth:`Registry.get` and :meth:`Registry.names`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from infera_core.discovery.base import DiscoveryFactory
from infera_core.engine import EngineAdapter, old_check_signatures
from infera_core.errors import DuplicateNameError, PluginError, UnknownNameError
from infera_core.kv.events import KvEventDecoder
from infera_core.pd import PdTransport
from infera_core.scheduling.config import ProfileConfig
from infera_core.scheduling.types import PolicyFactory
from infera_core.tokenize.base import TokenizerFactory
from infera_core.transports import KvEventTransportFactory, RequestTransportFactory


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


def option_clashes(adapter: EngineAdapter, taken: Collection[str]) -> list[str]:
    """The adapter's options spelled like one of Infera's launcher flags (``taken``), as
    ``"--port (Infera's --port)"``: Infera's flag would win and the option could never be set."""
    out = []
    for opt in adapter.options():
        hit = next((f for f in (opt.flag, f"--no-{opt.flag[2:]}") if f in taken), None)
        if hit is not None:
            out.append(f"{opt.flag} (Infera's {hit})")
    return out


OPTION_CLASH_HINT = (
    "rename them (e.g. --engine-port) or read Infera's value from the LaunchContext "
    "(ctx.port, ctx.model, ctx.role…)"
)


class EngineRegistry(Registry[EngineAdapter]):
    kind = "engine"
    protocol = EngineAdapter

    def check_options(self, taken: Collection[str], distributions: Mapping[str, str | None]) -> None:
        """Refuse (:class:`PluginError`) an engine whose options are spelled like Infera's
        launcher flags ``taken`` (:func:`infera_core.launcher.flags.launcher_flags`), naming
        its plugin and ``distributions[plugin]``. Run once every plugin is collected, since
        discovery backends and transports add launcher flags of their own."""
        for entry in self.entries():
            try:
                clashes = option_clashes(entry.obj, taken)
            except Exception as exc:
                raise PluginError(
                    f"plugin {entry.owner!r}: engine {entry.name!r} options() failed: {type(exc).__name__}: {exc}"
                ) from exc
            if clashes:
                dist = distributions.get(entry.owner)
                raise PluginError(
                    f"plugin {entry.owner!r}{f' (distribution {dist})' if dist else ''} registered engine "
                    f"{entry.name!r} with options named like Infera's own flags: {', '.join(clashes)}; "
                    f"Infera's flag would win and the option could never be set: {OPTION_CLASH_HINT}"
                )

    def _check(self, obj: object) -> None:
        super()._check(obj)
        old = old_check_signatures(obj)
        if old:
            raise PluginError(
                f"plugin {self.owner!r} registered engine {getattr(obj, 'name', '?')!r} with checks written "
                f"for the old adapter contract: {', '.join(old)}; each now takes one RunningEngine "
                "(engine.client, engine.url, engine.ctx), e.g. async def is_ready(self, engine) "
                "(see docs/plugin-guide.md, 'Engine plugins')"
            )


class KvDecoderRegistry(Registry[KvEventDecoder]):
    kind = "KV event decoder"
    protocol = KvEventDecoder


class PdTransportRegistry(Registry[PdTransport]):
    kind = "PD transport"
    protocol = PdTransport


class DiscoveryRegistry(Registry[DiscoveryFactory]):
    kind = "discovery backend"
    protocol = DiscoveryFactory


class TokenizerRegistry(Registry[TokenizerFactory]):
    kind = "tokenizer"
    protocol = TokenizerFactory


class RequestTransportRegistry(Registry[RequestTransportFactory]):
    kind = "request transport"
    protocol = RequestTransportFactory


class KvEventTransportRegistry(Registry[KvEventTransportFactory]):
    kind = "KV-event transport"
    protocol = KvEventTransportFactory


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
