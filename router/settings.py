"""The router's full settings: the core's sections plus one section per dialect in the table.

A composition root, like ``router/runtime.py`` and ``router/cli.py``: the core's own modules
import no dialect, this one reads the dialect table (``gateways/dialects.py``) and adds
``[<dialect>]`` (its ``DialectSpec.config`` model) and a ``shards.<kind>`` count for every shard
kind a dialect brings. Environment variables and the TOML file reach the dialect sections as
before (``ROUTER_NOLAG__MAX_UNACKED=100``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, create_model

from gateways.dialects import DIALECTS
from router.config import MAX_SHARDS, SHARDS_DEFAULT, ConfigError, CoreSettings, load
from router.config import ShardsConfig as CoreShards

ShardsConfig = create_model(
    "ShardsConfig",
    __base__=CoreShards,
    __module__=__name__,
    __doc__=CoreShards.__doc__,
    **{kind: (int, Field(default=SHARDS_DEFAULT, ge=1, le=MAX_SHARDS))
       for spec in DIALECTS for kind in spec.kinds},
)

RouterSettings = create_model(
    "RouterSettings",
    __base__=CoreSettings,
    __module__=__name__,
    __doc__="Everything the router reads at start. Frozen: actors receive a copy.",
    shards=(ShardsConfig, Field(default_factory=ShardsConfig)),
    **{spec.name: (spec.config, Field(default_factory=spec.config)) for spec in DIALECTS},
)


def settings_from_args(args: Any, **extra: Any) -> Any:
    """The settings for a ``router`` command: its ``--config`` file and the flags it was given."""
    overrides = {
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "gateways": getattr(args, "gateways", None),
        "ray_address": getattr(args, "address", None),
        "namespace": getattr(args, "namespace", None),
        **extra,
    }
    return load_settings(getattr(args, "config", None), **overrides)


# PostgreSQL refuses an index entry over about 2.7 KB, which SQLite does not: a NoLag topic or a
# Baqend key indexed on PostgreSQL must stay under it (Baqend keys may be 4 bytes a character).
POSTGRES_LIMITS = (("nolag", "max_topic_length", 2000), ("baqend", "max_key_length", 500))


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Any:
    """The router's settings from defaults, ``config_file`` (or ``$ROUTER_CONFIG``), the
    environment and ``overrides`` (see :func:`router.config.load`)."""
    settings = load(RouterSettings, config_file, **overrides)
    if settings.store.postgres is not None:
        over = [f"  {section}.{name}: at most {most} with store.url (PostgreSQL index entries are limited "
                f"to about 2.7 KB), not {value}"
                for section, name, most in POSTGRES_LIMITS
                if (value := getattr(getattr(settings, section), name)) > most]
        if over:
            raise ConfigError("invalid configuration:\n" + "\n".join(over))
    return settings
