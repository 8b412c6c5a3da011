"""Which client a socket's address stands for, as per-address limits count it. Pure."""

from __future__ import annotations

import ipaddress
from typing import Iterable

IPV6_PREFIX = 64  # one site or subscriber gets a /64: counting each /128 would let it open 2**64 "clients"

Networks = Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]


def address_key(host: str, exempt: Networks) -> str | None:
    """The key per-address limits count ``host`` under: an IPv4 address, an IPv6 /64 (an
    IPv4-mapped IPv6 address as its IPv4 one); None when it is in an ``exempt`` network (loopback,
    a load balancer: every client behind it shares its address, so it is counted per connection)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host  # not an IP (a Unix socket peer): counted as it is
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in exempt):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{address}/{IPV6_PREFIX}", strict=False))
    return str(address)
