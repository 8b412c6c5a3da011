"""Which client an address counts as for per-address limits."""

from __future__ import annotations

import ipaddress

from gateways.addresses import address_key

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


def test_ipv4_is_counted_per_address():
    assert address_key("203.0.113.7", LOOPBACK) == "203.0.113.7"
    assert address_key("::ffff:203.0.113.7", LOOPBACK) == "203.0.113.7"  # IPv4-mapped


def test_ipv6_is_counted_per_64_so_one_site_cannot_be_many_clients():
    assert address_key("2001:db8:1:2::7", LOOPBACK) == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:2:ffff::9", LOOPBACK) == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::7", LOOPBACK) == "2001:db8:1:3::/64"


def test_exempt_networks_are_not_counted():
    assert address_key("127.0.0.5", LOOPBACK) is None
    assert address_key("::1", LOOPBACK) is None
    assert address_key("::ffff:127.0.0.1", LOOPBACK) is None
    assert address_key("127.0.0.5", []) == "127.0.0.5"


def test_a_peer_that_is_not_an_ip_is_counted_as_it_is():
    assert address_key("", LOOPBACK) == ""
