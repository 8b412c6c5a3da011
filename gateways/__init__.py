"""Gateways: the stateless front of the router (server, shard client, dialects)."""
