"""gateways/baqend/limits.py and the limit errors and settings of the Baqend dialect."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from gateways.baqend import codec, limits
from gateways.baqend.config import BaqendConfig
from gateways.baqend.limits import ClientCounts, ClientRates, address_client, subject_client


def test_a_client_is_its_token_subject_or_its_address_without_the_port():
    assert address_client("10.0.0.7:51234", "10.0.0.7") == "ip:10.0.0.7"
    assert address_client("2001:db8::7:51234", "2001:db8::/64") == "ip:2001:db8::/64"
    # From an exempt address (a load balancer's), each connection is a client of its own.
    assert address_client("10.0.0.1:51234", None) == "conn:10.0.0.1:51234"
    assert subject_client("u1") == "user:u1"


def test_rates_give_each_client_its_burst_then_the_rate():
    rates = ClientRates(per_minute=60, burst=3)
    assert [rates.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rates.take("a", 0.0) == pytest.approx(1.0)  # one a second
    assert rates.take("b", 0.0) == 0.0  # another client has its own burst
    assert rates.take("a", 1.0) == 0.0


def test_rates_forget_clients_whose_bucket_refilled_when_the_table_grows(monkeypatch):
    monkeypatch.setattr(limits, "PRUNE_AT", 4)
    rates = ClientRates(per_minute=60, burst=2)  # a bucket refills in 2 s
    for client in "abcd":
        rates.take(client, 0.0)
    rates.take("d", 0.0)
    rates.take("e", 1.5)  # a, b, c had refilled at 1.0; d took two and has not
    assert sorted(rates.buckets) == ["d", "e"]
    assert rates.take("a", 1.5) == 0.0


def test_counts_bound_live_subscriptions_per_client_and_forget_a_client_at_zero():
    counts = ClientCounts(limit=2)
    assert counts.acquire("a") and counts.acquire("a") and not counts.acquire("a")
    assert counts.acquire("b")
    counts.release("a")
    assert counts.acquire("a")
    counts.release("b")
    assert counts.counts == {"a": 2}


def test_limit_errors_carry_the_protocol_fields():
    assert codec.too_many_for_client(6, "s").error == {
        "message": "Too many active subscriptions for this client (only 6 allowed)!", "status": 429,
        "reason": "Too Many Requests"}
    assert codec.subscribing_too_fast(6, 9.8341, "s").message == (
        "Too many subscribe requests: at most 6 a minute; try again in 9835 ms")
    assert codec.query_too_large("s", documents=100).error == {
        "message": "The query matches more than 100 documents (the limit): narrow the query", "status": 413,
        "reason": "Payload Too Large"}
    assert codec.query_too_large("s", nbytes=4096).message == (
        "The query's documents exceed 4096 bytes (the limit): narrow the query")
    expired = codec.token_expired("s")
    assert (expired.sub_id, expired.error) == ("s", {"message": "Invalid token: expired", "status": 401,
                                                     "reason": "Unauthorized"})
    refused = codec.rest_too_fast(6, 9.2)
    assert (refused.status, refused.headers) == (429, [("Retry-After", "10")])
    assert orjson.loads(codec.error_body(429, refused.message)) == {
        "message": "Too many requests: at most 6 a minute; try again later", "reason": "Too Many Requests",
        "className": "baqend.error.TooManyRequests", "status": 429}


def test_limit_settings_defaults_and_bounds():
    config = BaqendConfig()
    assert (config.max_scan_documents, config.max_scan_bytes, config.max_result_documents, config.max_query_bytes) == (
        1000, 1 << 20, 10_000, 16 << 20)
    assert (config.max_client_subscriptions, config.subscribe_rate_limit_per_minute, config.rest_rate_limit_per_minute,
            config.ping_interval_s, config.idle_timeout_s) == (100, 300, 3000, 20, 60)
    with pytest.raises(ValidationError, match="ping_interval_s must be below idle_timeout_s"):
        BaqendConfig(ping_interval_s=60, idle_timeout_s=60)
    with pytest.raises(ValidationError):  # a page must stay far below a lane frame
        BaqendConfig(max_scan_bytes=1 << 28)
