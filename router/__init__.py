"""Core of the router: configuration, shard map, commands, runtime and CLI.

Nothing here knows a dialect's wire format; dialects live in ``gateways/<dialect>/``.
"""

__version__ = "0.1.0"
