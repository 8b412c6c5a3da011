"""Signal Hub's publish answers (``_Published``): each publish gets its ``hub:delivery_ack`` or its
error in the order the publishes came, whatever order the shards answer in; the connection's kept
ack starts and routes stay within their bounds and right per address and topic. Plain objects:
the gateway, the shard links and the socket are small fakes that keep what they were given; the
session, its codec and its answers are the real ones."""

from __future__ import annotations

import orjson

from gateways.signal.codec import KNOWN_ADDRESS_LENGTH
from gateways.signal.config import SignalHubConfig
from gateways.signal.session import ACK_HEADS_MAX, ROUTES_MAX, SignalHubDialect
from router.errors import CommandError, ShardUnavailable
from router.shardmap import TOPIC, shard_index

HUB = SignalHubConfig().hub_address


class Link:
    def __init__(self, index: int) -> None:
        self.index = index
        self.sent: list[tuple] = []  # (command, callback)


class Shards:
    def __init__(self) -> None:
        self.links = {TOPIC: [Link(0), Link(1)], "registry": [Link(0), Link(1)]}
        self.linked = 0  # how many times a link was looked up

    def view(self, timeout_s: float) -> "Shards":
        return self

    def link(self, kind: str, key: str) -> Link:
        self.linked += 1
        links = self.links[kind]
        return links[shard_index(key, len(links))]

    def all(self, kind: str) -> list[Link]:
        return self.links[kind]

    def send(self, link: Link, command: tuple, callback=None) -> None:
        link.sent.append((command, callback))

    def answers(self) -> list:
        return [callback for link in self.links[TOPIC] for _, callback in link.sent]


class Gateway:
    def __init__(self) -> None:
        self.id, self._seq, self.shards, self.connections = "gw", 0, Shards(), {}
        self.accepted_ids: list = []
        self.refused: list[str] = []

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def accepted(self, meta: tuple, protocol_id, nbytes: int, connection_id: int) -> None:
        self.accepted_ids.append(protocol_id)

    def rejected(self, meta: tuple, protocol_id, nbytes: int, connection_id: int, reason: str) -> None:
        self.refused.append(reason)


class Wire:
    id, remote, path, query, dropped, flushes, last_activity = 1, "127.0.0.1", "/ws", "", 0, 0, 0.0
    compressed = writing_paused = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send_text(self, payload: bytes) -> bool:
        self.frames.append(payload)
        return True


def connected(sender: str = "rt/pub"):
    gateway, wire = Gateway(), Wire()
    session = SignalHubDialect(gateway, SignalHubConfig()).new_session(wire, None)  # auth off: anonymous
    session.on_message(orjson.dumps({"type": "hub:connect", "from": sender, "payload": {"version": "1.0"}}), True)
    assert orjson.loads(wire.frames.pop())["type"] == "hub:connected"
    return gateway, wire, session


def publish(session, topic: str, sender: str = "rt/pub", **ids) -> None:
    session.on_message(orjson.dumps({"type": "hub:publish", "from": sender, "payload": {"topic": topic, "message": 1},
                                     **ids}), True)


def ack(to: str, topic: str, count: int, reply_id=None) -> dict:
    frame = {"type": "hub:delivery_ack", "from": HUB, "to": to,
             "payload": {"topic": topic, "subscriberCount": count, "deliveredCount": count}}
    if reply_id is not None:
        frame["correlationId"] = reply_id
    return frame


def test_answers_in_any_order_leave_in_the_order_of_the_publishes_with_errors_in_their_place():
    gateway, wire, session = connected()
    for n in range(4):
        publish(session, "t", correlationId=f"p{n}")
    first, second, third, fourth = gateway.shards.answers()
    fourth(3)
    third(ShardUnavailable("topic-shard-0 did not answer in 5s", timed_out=True))
    assert wire.frames == [] and session.in_flight == 2  # the first is not answered yet: nothing written
    second(CommandError("boom", "the shard failed"))
    first(2)
    frames = [orjson.loads(frame) for frame in wire.frames]
    assert frames[0] == ack("rt/pub", "t", 2, "p0")
    assert frames[1]["type"] == "hub:error" and frames[1]["correlationId"] == "p1"
    assert frames[1]["payload"]["code"] == "internal_error" and frames[1]["payload"]["details"]["reason"] == "boom"
    assert frames[2]["type"] == "hub:error" and frames[2]["correlationId"] == "p2"
    assert frames[2]["payload"]["code"] == "timeout"
    assert frames[3] == ack("rt/pub", "t", 3, "p3")
    assert len(frames) == 4 and session.in_flight == 0 and session.failed == 2
    assert gateway.accepted_ids == [None, "p0", "p1", "p2", "p3"]  # the connect, then each publish


def test_each_ack_goes_to_its_own_sender_on_one_anonymous_connection():
    """Without auth a connection may publish as several addresses: the kept starts are per address."""
    gateway, wire, session = connected("rt/one")
    publish(session, "t", "rt/one", id=1)
    publish(session, "t", "rt/two", id=2)
    publish(session, "t", "rt/one")
    for answer in gateway.shards.answers():
        answer(5)
    assert [orjson.loads(frame) for frame in wire.frames] == [ack("rt/one", "t", 5, 1), ack("rt/two", "t", 5, 2),
                                                              ack("rt/one", "t", 5)]


def test_kept_routes_and_ack_starts_stay_bounded_and_right_past_their_bound():
    gateway, wire, session = connected()
    topics = [f"topic/{n}" for n in range(ROUTES_MAX + 5)]
    for topic in topics:
        publish(session, topic)
        assert len(session._routes) <= ROUTES_MAX
    assert gateway.shards.linked == len(topics)
    publish(session, topics[-1])  # kept since the cache was emptied at its bound
    assert gateway.shards.linked == len(topics)
    publish(session, topics[0])  # emptied away: routed again
    assert gateway.shards.linked == len(topics) + 1
    for topic in topics[1:-1]:
        publish(session, topic)
        assert len(session._routes) <= ROUTES_MAX
    for link in gateway.shards.links[TOPIC]:  # every publish went to its topic's shard, with its key
        for command, _ in link.sent:
            assert link.index == shard_index(command[1], 2) and command[1] == "signal/" + command[5][5]
    for answer in gateway.shards.answers():
        answer(1)
        assert len(session._ack_heads) <= ACK_HEADS_MAX
    got = sorted((frame["payload"]["topic"], frame["payload"]["subscriberCount"])
                 for frame in map(orjson.loads, wire.frames))
    assert got == sorted((topic, 1) for topic in topics * 2)


def test_kept_send_links_stay_bounded_and_each_send_goes_to_its_targets_registry_shard():
    """hub:send keeps each target's registry shard link per connection, as publishes keep routes."""
    gateway, wire, session = connected()
    targets = [f"rt/target-{n}" for n in range(ROUTES_MAX + 5)]

    def send(target: str) -> None:
        session.on_message(orjson.dumps({"type": "hub:send", "from": "rt/pub", "to": target, "payload": {"b": 1}}),
                           True)

    for target in targets:
        send(target)
        assert len(session._targets) <= ROUTES_MAX
    assert gateway.shards.linked == len(targets)
    send(targets[-1])  # kept since the cache was emptied at its bound
    assert gateway.shards.linked == len(targets)
    send(targets[0])  # emptied away: looked up again
    assert gateway.shards.linked == len(targets) + 1
    sent = [(link.index, command[1]) for link in gateway.shards.links["registry"] for command, _ in link.sent]
    assert sorted(target for _, target in sent) == sorted(targets + [targets[-1], targets[0]])
    assert all(index == shard_index(target, 2) for index, target in sent)
    assert wire.frames == [] and gateway.refused == []


def test_a_send_to_an_address_longer_than_the_kept_ones_is_routed_but_its_link_is_not_kept():
    """An address has no length limit of its own: a connection keeps no link for a long one."""
    gateway, wire, session = connected()
    long_target = "rt/" + "a" * KNOWN_ADDRESS_LENGTH
    for _ in range(2):
        session.on_message(orjson.dumps({"type": "hub:send", "from": "rt/pub", "to": long_target,
                                         "payload": {"b": 1}}), True)
    assert session._targets == {} and gateway.shards.linked == 2
    sent = [(link.index, command[1]) for link in gateway.shards.links["registry"] for command, _ in link.sent]
    assert sent == [(shard_index(long_target, 2), long_target)] * 2 and wire.frames == []
