"""NoLag in ``router bench``: the shared scenarios through ``/ws`` (MessagePack over binary frames,
API keys), and two of its own.

- ``qos1``: the fan-out at QoS 1 (rows of scenario ``fanout``, case ``S=100 QoS 1``: set against
  Signal Hub's ``S=100``): every message is logged, carries a ``msgId`` and ``requiresAck``, and
  the subscribers acknowledge with ``batchAck`` (every ``nolag.ack_every`` messages, and when a
  connection goes quiet). As many deliveries as Signal Hub's ``fanout`` to as many subscribers
  (``--router-deliveries``; ``--messages-s1`` publishes to one); S = 100, or ``--param
  nolag.qos1_subscribers=100,1000`` (at S = 1,000 one shard reply carries up to a million
  deliveries, which the gateway writes over several loop turns: ``gateway.max_deliveries_per_turn``).
- ``groups``: load balancing. ``nolag.members`` subscribers (default 100) in ``nolag.groups``
  load-balance groups (default 10) of one topic: each message goes to exactly one member of each
  group, so a publish makes ``groups`` deliveries; ``--deliveries`` in all.

How the shared scenarios map onto NoLag:
- one API key per client connection (up to :data:`KEYS`; beyond, connections share them), made by
  :meth:`NolagProfile.prepare` in the router's key store before it starts, with the rate limit out
  of the way and no monthly quota; ``hello`` is ``auth`` with the connection's token;
- harness topics become ``app/room/topic`` slugs (``fanout/100`` → ``bench/fanout/100``);
- NoLag refuses a publish to a topic the connection has not subscribed to (``not_subscribed``): a
  publisher subscribes to its topics with a filter no publish carries, so it receives none of them
  (a wildcard subscription would hand a publisher of the ``topics`` case the other publishers'
  messages), and publishes with ``echo: false`` and a ``msgRef``, which the router answers with
  ``published``: the publisher's acknowledgement;
- a message is padded so the ``message`` frame a subscriber gets at QoS 0 is
  ``PAYLOAD_BYTES`` long (the size every system delivers); the latency stamp is in its ``data``
  string, whose bytes a MessagePack frame carries as they are;
- the router's heartbeats (an empty frame after 30 s of silence, and closing a client silent for
  90 s) are pushed past any case: the load generator's connections stay silent while others set
  up, and a counting receiver would count a heartbeat as a delivery.
"""

from __future__ import annotations

import asyncio
import re
import zlib
from typing import Any, Callable

import msgpack
import numpy as np

from router.bench import loadgen
from router.bench.dialects import Profile, register
from router.bench.loadgen import PAYLOAD_BYTES, Dialect, Subscribers
from router.bench.report import delivery_rate
from router.bench.scenarios import Case, Options, fanout_publishes, split, url_of
from router.bench.wire import HANDLE, STAMP, Tally, WsClient, open_ws

KEYS = 1000  # API keys made for a benchmark router; connection i uses key i mod KEYS
RATE_LIMIT_PER_S = 1_000_000_000  # per connection: out of the way
PUBLISHER_FILTER = "bench-publisher"  # no publish carries it: a publisher's subscription receives nothing
ACK_EVERY = 100  # QoS 1: a batchAck every this many messages
ACK_IDLE_S = 0.05  # ... and this long after the last message, for what is left
COLUMNS_MIN = 48  # frames a read: fewer are searched (taking columns costs about 48 frames' search)
QUIET_S = 24 * 3600.0  # heartbeats: past any case

_PACK = msgpack.packb
_ARRAY_HEADER = msgpack.Packer().pack_array_header  # a MessagePack array's header for a count of items
_TRAILING_NUMBER = re.compile(r"(\d+)$")


def nolag_topic(topic: str) -> str:
    """A harness topic as a NoLag ``app/room/topic`` slug: ``fanout/100`` → ``bench/fanout/100``,
    ``latency`` → ``bench/latency/all``."""
    parts = topic.split("/")
    if len(parts) == 1:
        return f"bench/{parts[0]}/all"
    return f"bench/{parts[0]}/{'-'.join(parts[1:])}"


def key_index(name: str, keys: int) -> int:
    """Which of ``keys`` tokens the connection ``name`` uses: numbered names (``bench/s17``) take
    consecutive keys, so up to ``keys`` subscribers are as many actors; others are hashed."""
    found = _TRAILING_NUMBER.search(name)
    if found is None:
        return zlib.crc32(name.encode()) % keys
    return (zlib.crc32(name[:found.start()].encode()) + int(found.group(1))) % keys


def delivered_frame(topic: str, data: str) -> bytes:
    """The ``message`` frame the router writes for a QoS 0 publish of ``data`` (the shard's
    timestamp, a 13-digit Unix millisecond count, included)."""
    from gateways.nolag.codec import message_packed

    return message_packed(topic, _PACK(data), timestamp=1_700_000_000_000)


def padded(topic: str, body: str) -> str:
    """``body`` padded so its delivered frame is ``PAYLOAD_BYTES`` long, and so that a latency
    stamp in it is the first ``@`` of the frame (a string header byte may be 0x40, ``@``)."""
    pad = max(0, PAYLOAD_BYTES - len(delivered_frame(topic, body)))
    while pad and len(delivered_frame(topic, body + "x" * pad)) > PAYLOAD_BYTES:
        pad -= 1  # the string's header grew (a fixstr holds at most 31 bytes)
    data = body + "x" * pad
    if body.startswith(STAMP.decode()):
        while True:
            frame = delivered_frame(topic, data)
            if frame.find(STAMP) == frame.find(body.encode()):
                break
            data += "x"
    return data


# -- the load generators' side ----------------------------------------------------------------

class _Acker:
    """A QoS 1 receiver's handler (``HANDLE`` mode): reads each message's ``msgId`` (a read of
    frames of one layout as columns, else each frame decoded), acknowledges them in ``batchAck``
    frames, and counts a message once: a redelivery (its ack was late) is counted apart as a
    duplicate.

    A message is new when its ``timestamp`` is above every one the connection got before: the
    topic shard stamps a topic's messages strictly increasing and writes them to a subscriber in
    that order, and a redelivery is the same frame. (A set of every id seen, kept before, grew by
    a message per delivery for the whole run: 37 % of a receiver's time, and more as it grew.)"""

    __slots__ = ("client", "dialect", "every", "pending", "block", "width", "held", "top", "timer", "layout")

    def __init__(self, client: WsClient, dialect: "NolagClientDialect", every: int) -> None:
        self.client, self.dialect, self.every = client, dialect, every
        # The ids not acked yet, packed, in the order they came: the frames decoded one by one
        # add to ``pending`` (a list); a read taken as columns to ``block`` (``held`` ids of
        # ``width`` bytes each, back to back, as the read held them). One of the two is empty.
        self.pending: list[bytes] = []
        self.block = b""
        self.width = self.held = 0
        self.top = -1  # the highest timestamp the connection got
        self.timer: asyncio.TimerHandle | None = None
        # the last read's frames' layout as _uniform found it (see there), None before
        self.layout: tuple | None = None

    def waiting(self) -> list[bytes]:
        """The ids not acked yet, packed, in the order they came."""
        if self.held:
            width, block = self.width, self.block
            return [block[at:at + width] for at in range(0, len(block), width)]
        return list(self.pending)

    def __call__(self, payload: bytes) -> int:
        """One frame, decoded as a client decodes it: its ``msgId`` (packed again, as a batchAck
        carries it) and its ``timestamp``."""
        try:
            message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception:
            return 0  # not MessagePack: not a message
        msg_id = message.get("msgId") if type(message) is dict else None
        if type(msg_id) is not str:
            return 0  # not a logged message (a heartbeat, an error)
        if self.held:  # after a read taken as columns: its ids go first
            self.pending, self.block, self.held = self.waiting(), b"", 0
        self.pending.append(_PACK(msg_id))
        if len(self.pending) >= self.every:
            self.flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(ACK_IDLE_S, self.flush)
        stamp = message.get("timestamp")
        if type(stamp) is not int:
            return 1  # not stamped as the router stamps: counted, not checked
        if stamp <= self.top:
            self.dialect.duplicates += 1
            return 0
        self.top = stamp
        return 1

    def chunk(self, buffer: bytearray, end: int, frames: int) -> int | None:
        """``frames`` complete data frames in ``buffer[:end]``, read at once: when they are
        frames of one size and one layout (:meth:`_uniform`: a topic's messages as the router
        writes them), their ids and timestamps are taken as columns, the ids queued for
        ``batchAck`` as the read's bytes (``every`` of them are a slice of those) and the new
        messages counted in numpy, with no Python work per frame. None (then each frame goes to
        ``__call__``) otherwise."""
        found = self._uniform(buffer, end, frames)
        if found is None:
            return None
        ids, width, stamps = found
        pending, every = self.pending, self.every
        if pending and all(len(packed) == width for packed in pending):
            self.block, self.width, self.held = b"".join(pending), width, len(pending)
            self.pending = pending = []
        closed = self.client.closed.done()
        if pending or (self.held and self.width != width):
            # ids of another size wait (rare: the router's are all of one): this read's join them
            # as a list, and a batchAck is joined from ``every`` of them
            queue = self.waiting() + [ids[at:at + width] for at in range(0, len(ids), width)]
            full = 0 if closed else len(queue) // every
            acks = [batch_ack(queue[at:at + every]) for at in range(0, full * every, every)]
            self.pending, self.block, self.held = queue[full * every:], b"", 0
        else:
            block = self.block + ids if self.held else ids
            held = self.held + frames
            full = 0 if closed else held // every
            step = every * width
            head = _BATCH_ACK_HEAD + _ARRAY_HEADER(every)
            acks = [head + block[at:at + step] for at in range(0, full * step, step)]
            self.block, self.width, self.held = block[full * step:], width, held - full * every
        if acks:
            self.client.send_all(acks)  # one write for the read's acks
            self.dialect.acks += full
            if self.timer is not None:  # as flush(): the idle timer starts again from what is left
                self.timer.cancel()
                self.timer = None
        if (self.held or self.pending) and self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(ACK_IDLE_S, self.flush)
        return self._fresh(stamps)

    def _uniform(self, buffer: bytearray, end: int, frames: int) -> tuple[bytes, int, np.ndarray] | None:
        """The packed ids (back to back, each ``width`` bytes) and the timestamps of ``frames``
        frames of one size and one layout, read as columns of a frames × size array; None when
        they are not such frames. The layout (:meth:`_layout`) is found in the first frame of a
        read and kept: a later read of frames of its size is checked against it in one step
        (every frame, the first too, holds its bytes at its places: the read's bytes masked to
        those places equal the first frame's so masked, repeated) instead of being parsed again."""
        stride = end // frames
        if frames < COLUMNS_MIN or stride * frames != end:
            return None
        rows = np.frombuffer(buffer, np.uint8, end).reshape(frames, stride)
        layout = self.layout
        if layout is None or layout[0] != stride or not self._holds(buffer, end, frames):
            layout = self._layout(rows, stride)
            if layout is None:
                return None
        ids, stamps = layout[3], layout[4]
        taken = rows[:, ids].tobytes()
        stamped = np.ascontiguousarray(rows[:, stamps]).view(">u8")
        return taken, ids.stop - ids.start, stamped.ravel().astype(np.int64)

    def _holds(self, buffer: bytearray, end: int, frames: int) -> bool:
        """Whether ``frames`` frames in ``buffer[:end]`` each hold the layout's bytes at its
        places: 8 bytes at a time, the read and the layout's mask repeated ANDed, compared with
        the layout's expected bytes so masked and repeated (the last ``end % 8`` bytes, a frame's
        last ones, as one integer)."""
        layout = self.layout
        tiles = _TILES.get(layout[5])
        if tiles is None or tiles[0] < frames:
            tiles = _tiles(layout, max(frames, 2 * tiles[0] if tiles else 0))
        _, masks, expect, scratch, tail_mask, tail_expected, tail = tiles
        words = end // 8
        masked = np.bitwise_and(np.frombuffer(buffer, np.uint64, words), masks[:words], out=scratch[:words])
        if masked.tobytes() != expect[:words * 8]:
            return False
        return end % 8 == 0 or int.from_bytes(buffer[end - tail:end], "little") & tail_mask == tail_expected

    def _layout(self, rows: np.ndarray, stride: int) -> tuple | None:
        """The first frame decoded as ``__call__`` decodes it, with where each of its map's keys
        and values lies: its ``data`` a string or bytes, its ``msgId`` a string, its
        ``timestamp`` a uint 64. Every byte but the data's content, the id's characters and the
        stamp's value is then a place every frame must hold the first one's byte at, so every
        frame decodes the same way, its id and stamp where the first frame's are (the data's
        content cannot be read as anything else: its header, with its length, is a place). Kept
        as the layout if every frame does; None otherwise. (Not checked: that an id's or the
        data's bytes are valid UTF-8, and that a string's header is the shortest: frames the
        router never writes, which one by one would not count or would ack repacked.)"""
        first = rows[0].tobytes()
        start = 2 if first[1] & 0x7F < 126 else 4  # the WebSocket header (unmasked: the server's)
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(first[start:])
        spans: dict[Any, tuple[int, int, Any]] = {}
        try:
            for _ in range(unpacker.read_map_header()):
                key = unpacker.unpack()
                at = start + unpacker.tell()
                value = unpacker.unpack()
                spans[key] = (at, start + unpacker.tell(), value)  # a repeated key: its last value, as a dict
        except Exception:
            return None
        if start + unpacker.tell() != stride or not {"data", "msgId", "timestamp"} <= spans.keys():
            return None
        data_at, data_end, data = spans["data"]
        id_at, id_end, msg_id = spans["msgId"]
        stamp_at, stamp_end, stamp = spans["timestamp"]
        if type(data) is str:
            data = data.encode()
        if (type(data) is not bytes or type(msg_id) is not str or type(stamp) is not int
                or first[stamp_at] != 0xCF):
            return None
        free = np.zeros(stride, bool)  # what may differ from frame to frame
        free[data_end - len(data):data_end] = True
        id_head = id_end - len(msg_id.encode())
        free[id_head:id_end] = True
        free[stamp_at + 1:stamp_end] = True
        places = np.flatnonzero(~free)
        expected = rows[0, places].copy()
        if not (rows[1:, places] == expected).all():
            return None
        layout = (stride, places, expected, slice(id_at, id_end), slice(stamp_at + 1, stamp_end),
                  (stride, places.tobytes(), expected.tobytes()))
        self.layout = layout
        return layout

    def _fresh(self, stamps: np.ndarray) -> int:
        """How many of ``stamps`` (in the order received) are above every one before them."""
        if stamps[0] > self.top and (len(stamps) == 1 or (stamps[1:] > stamps[:-1]).all()):
            self.top = int(stamps[-1])  # the usual read: new messages only, in order
            return len(stamps)
        before = np.maximum.accumulate(np.concatenate(([self.top], stamps[:-1])))
        fresh = int(np.count_nonzero(stamps > before))
        self.top = max(self.top, int(stamps.max()))
        self.dialect.duplicates += len(stamps) - fresh
        return fresh

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not (self.pending or self.held) or self.client.closed.done():
            return
        if self.held:
            frame = _BATCH_ACK_HEAD + _ARRAY_HEADER(self.held) + self.block
            self.block, self.held = b"", 0
        else:
            frame = batch_ack(self.pending)
            self.pending = []
        self.client.send(frame)
        self.dialect.acks += 1


# A layout's mask and expected bytes repeated over a read of many frames (``_Acker._holds``), by the
# layout's key; shared by a process's receivers (their frames are mostly of one layout), as is the
# scratch array (one event loop a process).
_TILES: dict[tuple, tuple] = {}
_TILES_MAX = 64


def _tiles(layout: tuple, frames: int) -> tuple:
    stride, places, expected, key = layout[0], layout[1], layout[2], layout[5]
    mask = np.zeros(stride, np.uint8)
    mask[places] = 0xFF
    first = np.zeros(stride, np.uint8)
    first[places] = expected
    masks, expect = np.tile(mask, frames), np.tile(first, frames)
    words = len(masks) // 8
    tail = min(8, stride)
    if len(_TILES) >= _TILES_MAX:
        _TILES.clear()
    tiles = _TILES[key] = (frames, masks[:words * 8].view(np.uint64), expect[:words * 8].tobytes(),
                           np.empty(words, np.uint64), int.from_bytes(mask[-tail:].tobytes(), "little"),
                           int.from_bytes(first[-tail:].tobytes(), "little"), tail)
    return tiles


def batch_ack(packed_ids: list[bytes]) -> bytes:
    """``{"type": "batchAck", "msgIds": [...]}`` of ids already packed as MessagePack strings,
    joined without decoding them (the receivers' CPU is the router's machine's too)."""
    return _BATCH_ACK_HEAD + _ARRAY_HEADER(len(packed_ids)) + b"".join(packed_ids)


_BATCH_ACK_HEAD = b"\x82" + _PACK("type") + _PACK("batchAck") + _PACK("msgIds")


class NolagClientDialect(Dialect):
    """A NoLag client: ``auth`` with the connection's token, ``subscribe`` (QoS, load-balance group
    from the worker's job), ``publish`` answered by ``published``."""

    name = "nolag"
    publish_ack_every = 1  # every publish carries a msgRef: one ``published`` each

    def __init__(self, config: dict[str, Any] | None = None, spec: dict[str, Any] | None = None) -> None:
        super().__init__(config, spec)
        self.tokens: list[str] = self.config.get("tokens", [])
        self.entries = {entry["name"]: entry for entry in self.spec.get("connections", ()) if "name" in entry}
        self.qos = int(self.spec.get("qos", 0))
        self.ack_every = int(self.spec.get("ack_every", ACK_EVERY))
        self.duplicates = 0
        self.acks = 0

    async def open(self, url: str, tally: Tally | None = None) -> WsClient:
        return await open_ws(url, tally, opcode=0x2)  # MessagePack is not UTF-8: binary frames

    async def _auth(self, client: WsClient, name: str) -> None:
        token = self.tokens[key_index(name, len(self.tokens))]
        client.send(_PACK({"type": "auth", "token": token, "protocolVersion": 2}))
        reply = msgpack.unpackb((await client.messages(1))[0])
        if reply.get("type") != "auth" or reply.get("success") is not True:
            raise RuntimeError(f"auth refused: {reply!r}")

    async def _subscribe(self, client: WsClient, topics: list[str], **options: Any) -> None:
        for topic in topics:
            client.send(_PACK({"type": "subscribe", "topic": nolag_topic(topic), **options}))
        for reply in await client.messages(len(topics)):
            if msgpack.unpackb(reply).get("type") != "subscribed":
                raise RuntimeError(f"subscribe refused: {msgpack.unpackb(reply)!r}")

    async def hello(self, client: WsClient, name: str) -> None:
        """``auth``; a publisher (a connection with topics) also subscribes to them, filtered so
        that it receives nothing: NoLag publishes only to topics the connection subscribed to."""
        await self._auth(client, name)
        topics = self.entries.get(name, {}).get("topics")
        if topics:
            await self._subscribe(client, topics, qos=0, filters=[PUBLISHER_FILTER])

    async def subscribe(self, client: WsClient, name: str, topics: list[str]) -> None:
        await self._auth(client, name)
        group = self.entries.get(name, {}).get("group")
        options: dict[str, Any] = {"qos": self.qos}
        if group is not None:
            options.update(loadBalance=True, loadBalanceGroup=group)
        await self._subscribe(client, topics, **options)

    def publish(self, name: str, topic: str, body: str) -> bytes:
        slug = nolag_topic(topic)
        return _PACK({"type": "publish", "topic": slug, "data": padded(slug, body), "qos": self.qos,
                      "echo": False, "msgRef": 1})

    def listen(self, client: WsClient, mode: str) -> None:
        if client.tally is not None and self.qos >= 1:  # a receiver that acknowledges
            client.handler = _Acker(client, self, self.ack_every)
            client.mode = HANDLE
        else:
            client.mode = mode


class AckingSubscribers(Subscribers):
    """Subscribers (QoS 1, acknowledging) that also report the redeliveries they saw and the
    ``batchAck`` frames they sent."""

    @staticmethod
    async def run(dialect: Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        result = await Subscribers.run(dialect, spec, state)
        return {**result, "duplicates": dialect.duplicates, "acks": dialect.acks}


loadgen.DIALECTS["nolag"] = NolagClientDialect
loadgen.ROLES["nolag-acking"] = AckingSubscribers


# -- scenarios ----------------------------------------------------------------------------------

def _deliveries_row(options: Options) -> Callable[..., dict[str, Any]]:
    """Deliveries/s over the receivers' window; what was missing, and whether the receivers gave up
    after ``--idle`` seconds without a frame (the router stalled) or ran out of time."""

    def summarise(system: Any, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        receivers = [r for r in results if "expected" in r]
        received, rate = delivery_rate(receivers)
        expected = sum(r["expected"] for r in receivers)
        row: dict[str, Any] = {"value": round(rate), "received": received, "expected": expected}
        notes = []
        if received < expected:
            short = [r for r in receivers if r["received"] < r["expected"]]
            idle = any(r["last"] and r["last"] - r["first"] < options.timeout - 1 - options.idle_s for r in short)
            why = f"no frame for {options.idle_s:g} s" if idle else f"not in {options.timeout:g} s"
            notes.append(f"{expected - received:,} of {expected:,} not received ({why})")
        if any("duplicates" in r for r in receivers):
            row["duplicates"] = sum(r.get("duplicates", 0) for r in receivers)
            row["batch_acks"] = sum(r.get("acks", 0) for r in receivers)
            if row["duplicates"]:
                notes.append(f"{row['duplicates']:,} redelivered")
        if notes:
            row["notes"] = ", ".join(notes)
        return row

    return summarise


def qos1_cases(options: Options) -> list[Case]:
    """Fan-out at QoS 1 with acknowledgements, S subscribers of one topic."""
    counts = options.param("nolag.qos1_subscribers", [100])
    counts = counts if isinstance(counts, list) else [counts]
    ack_every = options.param("nolag.ack_every", ACK_EVERY)
    cases = []
    for subscribers in counts:
        topic = f"qos1/{subscribers}"

        def jobs(system: Any, subscribers: int = subscribers, topic: str = topic):
            publishes = fanout_publishes(options, system, subscribers)  # as Signal Hub's case it is set against
            connections = [{"url": url_of(system, i), "name": f"bench/s{i}", "topics": [topic]}
                           for i in range(subscribers)]
            out = [("nolag-acking", {"connections": group, "expected": len(group) * publishes, "qos": 1,
                                     "ack_every": ack_every})
                   for group in split(connections, options.procs)]
            out.append(("publishers", {"connections": [{"url": url_of(system, 0), "name": "bench/p", "topics": [topic]}],
                                       "messages": publishes, "window": options.window, "qos": 1}))
            return out

        # Scenario "fanout": its figure is set against Signal Hub's fan-out to as many subscribers.
        cases.append(Case("fanout", f"S={subscribers} QoS 1", "deliveries/s", jobs, _deliveries_row(options),
                          compare=f"S={subscribers}"))
    return cases


def groups_cases(options: Options) -> list[Case]:
    """Load-balance groups: each message to one member of each group."""
    groups = options.param("nolag.groups", 10)
    members = options.param("nolag.members", 100)
    if groups < 1 or members < groups:
        raise SystemExit("router bench: nolag.groups must be 1 or more, nolag.members at least nolag.groups")
    publishes = max(1, options.deliveries // groups)

    def jobs(system: Any):
        # Whole groups to each receiving process: its share is exact (groups x publishes) however
        # a group's turns fall among its members.
        names = [f"g{g}" for g in range(groups)]
        out = []
        for part in split(names, options.procs):
            connections = [{"url": url_of(system, i), "name": f"bench/s{i}", "topics": ["groups"],
                            "group": names[i % groups]}
                           for i in range(members) if names[i % groups] in part]
            out.append(("subscribers", {"connections": connections, "expected": len(part) * publishes}))
        out.append(("publishers", {"connections": [{"url": url_of(system, 0), "name": "bench/p", "topics": ["groups"]}],
                                   "messages": publishes, "window": options.window}))
        return out

    return [Case("groups", f"{members} subs in {groups} groups", "deliveries/s", jobs, _deliveries_row(options))]


class NolagProfile(Profile):
    name = "nolag"
    shared = ("fanout", "topics", "latency", "connections", "churn")

    def settings(self) -> dict[str, Any]:
        # max_unacked: a QoS 1 receiver's window holds every message not yet acked.
        return {"nolag": {"rate_limit_per_s": float(RATE_LIMIT_PER_S), "max_unacked": 100_000,
                          "heartbeat_interval_s": QUIET_S, "heartbeat_timeout_s": QUIET_S}}

    def prepare(self, settings: Any) -> dict[str, Any]:
        """API keys in the router's key store: no monthly quota, the rate limit out of the way.
        Keys set no connection limit (the gateway's ``max_connections`` is per gateway)."""
        from actors.nolag.keys import open_key_store

        store = open_key_store(settings)
        try:
            tokens = [store.create("bench", rate_limit_per_s=RATE_LIMIT_PER_S)[0] for _ in range(KEYS)]
        finally:
            store.close()
        return {"tokens": tokens}

    def plans(self) -> dict[str, Any]:
        return {"qos1": qos1_cases, "groups": groups_cases}


register(NolagProfile())
