"""The dialect table: every protocol the router speaks, and what each one brings.

A dialect is one vertical slice: ``gateways/<dialect>/`` (codec, session, the gateway side) and
``actors/<dialect>/`` (contract, state, stores, and the components it adds to shards). This table
is the one place that lists them; the runtime starts the shard kinds they declare and the
gateway serves the ones enabled in the configuration. Adding a dialect is adding a row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

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
    name: str  # its configuration section (``[nolag]``), and how metrics and the event log name it
    config: type  # the section's pydantic model (router/settings.py adds it to the settings)
    # What it adds to which shard kind, imported only where shards are built.
    components: Callable[[], dict[str, tuple[type, ...]]]
    # Its gateway-side dialects (one per endpoint), imported only in gateways.
    build: Callable[[Any, Any], list["Dialect"]]
    # Shard kinds of its own (beyond the core's session and topic); each gets a `shards.<kind>` count.
    kinds: tuple[str, ...] = ()
    # Adds its `router <command>`s to the CLI's subparsers, imported only by the CLI.
    cli: Callable[[Any], None] | None = None


def _signal_components():
    from actors.signal.shard import SignalRegistry

    return {REGISTRY: (SignalRegistry,)}


def _signal_build(gateway, config):
    from gateways.signal.session import SignalHubDialect

    return [SignalHubDialect(gateway, config)]


def _cashu_cli(subparsers):
    from gateways.cashu.cli import add_commands

    add_commands(subparsers)


def _cashu_components():
    from actors.cashu.shard import CashuRetained

    return {TOPIC: (CashuRetained,)}


def _cashu_build(gateway, config):
    from gateways.cashu.session import CashuDialect

    return [CashuDialect(gateway, config)]


def _mx_cli(subparsers):
    from gateways.mx.cli import add_commands

    add_commands(subparsers)


def _mx_components():
    from actors.mx.shard import MxFilters

    return {TOPIC: (MxFilters,)}


def _mx_build(gateway, config):
    from gateways.mx.ingest import NodeIngestDialect
    from gateways.mx.session import MxHubDialect

    hub = MxHubDialect(gateway, config)
    return [hub, NodeIngestDialect(gateway, config, hub)]


def _nolag_cli(subparsers):
    from gateways.nolag.cli import add_commands

    add_commands(subparsers)


def _nolag_components():
    from actors.nolag.shard import NolagActors, NolagTopics

    return {TOPIC: (NolagTopics,), SESSION: (NolagActors,)}


def _nolag_build(gateway, config):
    from gateways.nolag.session import NolagDialect

    return [NolagDialect(gateway, config)]


def _baqend_components():
    from actors.baqend.shard import BaqendDocuments, BaqendQueries

    return {DOCUMENT: (BaqendDocuments,), QUERY: (BaqendQueries,)}


def _baqend_build(gateway, config):
    from gateways.baqend.session import BaqendDialect

    return [BaqendDialect(gateway, config)]


DIALECTS: tuple[DialectSpec, ...] = (
    DialectSpec("signal", SignalHubConfig, _signal_components, _signal_build, kinds=(REGISTRY,)),
    DialectSpec("cashu", CashuConfig, _cashu_components, _cashu_build, cli=_cashu_cli),
    DialectSpec("mx", MxConfig, _mx_components, _mx_build, cli=_mx_cli),
    DialectSpec("nolag", NolagConfig, _nolag_components, _nolag_build, cli=_nolag_cli),
    DialectSpec("baqend", BaqendConfig, _baqend_components, _baqend_build, kinds=(DOCUMENT, QUERY)),
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
