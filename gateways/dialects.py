"""The dialect table: every protocol the router speaks, and what each one brings.

A dialect is one vertical slice: ``gateways/<dialect>/`` (codec, session, the gateway side) and
``actors/<dialect>/`` (contract, state, stores, and the components it adds to shards). This table
is the one place that lists them; the runtime starts the shard kinds they declare and the
gateway serves the ones enabled in the configuration. Adding a dialect is adding a row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from actors.baqend.contract import DOCUMENT, QUERY
from actors.signal.contract import REGISTRY
from gateways.baqend.config import BaqendConfig
from gateways.cashu.config import CashuConfig
from gateways.mx.config import MxConfig
from gateways.nolag.config import NolagConfig
from gateways.signal.config import SignalHubConfig
from router.shardmap import SESSION, TOPIC

if TYPE_CHECKING:
    from gateways.dialect import Dialect


@dataclass(frozen=True)
class DialectSpec:
    """One dialect. Its parts are found by convention, and imported only where they are used:
    ``actors/<name>/shard.py`` ``COMPONENTS`` (what it adds to which shard kind) where shards are
    built, ``gateways/<name>/session.py`` ``endpoints(gateway, config)`` in gateways, and
    ``gateways/<name>/cli.py`` ``add_commands(subparsers)`` in the CLI."""

    name: str  # its package under actors/ and gateways/, its configuration section (``[nolag]``), and
    # how metrics and the event log name it
    config: type  # the section's pydantic model (router/settings.py adds it to the settings)
    # Shard kinds of its own (beyond the core's session and topic); each gets a `shards.<kind>` count.
    kinds: tuple[str, ...] = ()
    cli: bool = False  # it has `router <command>`s

    def components(self) -> dict[str, tuple[type, ...]]:
        return import_module(f"actors.{self.name}.shard").COMPONENTS

    def build(self, gateway: Any, config: Any) -> list["Dialect"]:
        return import_module(f"gateways.{self.name}.session").endpoints(gateway, config)

    def add_commands(self, subparsers: Any) -> None:
        if self.cli:
            import_module(f"gateways.{self.name}.cli").add_commands(subparsers)


DIALECTS: tuple[DialectSpec, ...] = (
    DialectSpec("signal", SignalHubConfig, kinds=(REGISTRY,)),
    DialectSpec("cashu", CashuConfig, cli=True),
    DialectSpec("mx", MxConfig, cli=True),
    DialectSpec("nolag", NolagConfig, cli=True),
    DialectSpec("baqend", BaqendConfig, kinds=(DOCUMENT, QUERY)),
)


def enabled(settings: Any) -> list[DialectSpec]:
    return [spec for spec in DIALECTS if getattr(settings, spec.name).enabled]


def _core_components():
    from actors.pubsub import PubSub

    return {SESSION: (), TOPIC: (PubSub,)}


def shard_components(settings: Any) -> dict[str, tuple[type, ...]]:
    """Each shard kind the router starts, with its components in order: the core's first, then
    each enabled dialect's in table order. The core's kinds (session, topic) always start; a
    dialect's own kind only when the dialect is enabled."""
    kinds: dict[str, list[type]] = {kind: list(components) for kind, components in _core_components().items()}
    for spec in enabled(settings):
        for kind, components in spec.components().items():
            kinds.setdefault(kind, []).extend(components)
    return {kind: tuple(components) for kind, components in kinds.items()}


def shard_kinds(settings: Any) -> tuple[str, ...]:
    return tuple(shard_components(settings))


def build_dialects(gateway: Any, settings: Any) -> list["Dialect"]:
    """The gateway-side dialects of every enabled dialect, in table order."""
    built: list[Dialect] = []
    for spec in enabled(settings):
        built.extend(spec.build(gateway, getattr(settings, spec.name)))
    return built
