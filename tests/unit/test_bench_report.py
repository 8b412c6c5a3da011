"""`router bench`: the pure helpers — rates, percentiles, ratios, the table — and the load
generator's frame counting."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.server import frame_header
from router.bench.report import (
    add_ratios, cpu_percent, delivery_rate, format_table, markdown_table, merged_histogram, percentiles_ms, span_rate,
    write_json,
)
from router.bench.wire import RespClient, Tally, client_frame, count_data_frames, parse_server_frames, resp_command, split_url, stamp


def test_delivery_rate_spans_first_to_last_frame_of_all_receivers():
    results = [{"received": 1000, "first": 10.0, "last": 11.0}, {"received": 3000, "first": 10.5, "last": 12.0},
               {"received": 0, "first": 0.0, "last": 0.0}]
    assert delivery_rate(results) == (4000, 2000.0)


def test_delivery_rate_without_frames_is_zero():
    assert delivery_rate([{"received": 0, "first": 0, "last": 0}]) == (0, 0.0)
    assert delivery_rate([]) == (0, 0.0)


def test_span_rate_counts_work_over_the_workers_window():
    assert span_rate([{"cycles": 50, "start": 1.0, "end": 2.0}, {"cycles": 150, "start": 1.5, "end": 3.0}],
                     "cycles") == (200, 100.0)


def test_percentiles_of_merged_histograms_in_milliseconds():
    from hdrh.histogram import HdrHistogram

    one, two = HdrHistogram(1, 60_000_000, 3), HdrHistogram(1, 60_000_000, 3)
    for value in range(1, 1001):  # 1 µs … 1 ms
        one.record_value(value * 1000)  # 1 ms … 1 s in µs
    two.record_value(5_000_000)  # one 5 s outlier
    merged = merged_histogram([one.encode(), two.encode()])
    figures = percentiles_ms(merged)
    assert figures["samples"] == 1001
    assert figures["p50_ms"] == pytest.approx(500, rel=0.01)
    assert figures["p99_ms"] == pytest.approx(990, rel=0.01)
    assert figures["max_ms"] == pytest.approx(5000, rel=0.01)


def test_ratios_are_to_raw_in_the_same_scenario_and_case():
    rows = [{"scenario": "fanout", "case": "S=100", "system": "raw", "value": 100_000},
            {"scenario": "fanout", "case": "S=100", "system": "router", "value": 75_000},
            {"scenario": "fanout", "case": "S=1", "system": "router", "value": 30_000},
            {"scenario": "fanout", "case": "S=100", "system": "redis", "value": None}]
    add_ratios(rows)
    assert [row["ratio_to_raw"] for row in rows] == [1.0, 0.75, None, None]


def test_a_dialect_is_set_against_signal_hub_on_the_same_router_and_its_compare_case():
    rows = [{"scenario": "fanout", "case": "S=100", "dialect": "-", "system": "raw", "value": 1_000_000},
            {"scenario": "fanout", "case": "S=100", "dialect": "signal", "system": "router", "value": 2_000_000},
            {"scenario": "fanout", "case": "S=100", "dialect": "signal", "system": "router g2/s2", "value": 4_000_000},
            {"scenario": "fanout", "case": "S=100", "dialect": "nolag", "system": "router", "value": 1_500_000},
            {"scenario": "fanout", "case": "S=100 QoS 1", "dialect": "nolag", "system": "router",
             "compare": "S=100", "value": 1_000_000},
            {"scenario": "ingest", "case": "100 consumers", "dialect": "mx", "system": "router", "value": 20_000}]
    add_ratios(rows)
    assert [row.get("ratio_to_signal") for row in rows] == [None, None, None, 0.75, 0.5, None]
    assert [row["ratio_to_raw"] for row in rows] == [1.0, 2.0, 4.0, 1.5, None, None]
    assert "0.75" in format_table([{**row, "metric": "deliveries/s"} for row in rows]).splitlines()[5]


def test_a_ratio_is_shown_rounded_once_from_the_values():
    """The tables show two decimals of the ratio itself: a ratio kept to three decimals and rounded
    again showed 4,235,451 / 184,108 = 23.0054 as 23.00, 431,097 / 528,882 = 0.8151 as 0.81 and
    2.059 / 2.379 = 0.8655 as 0.86 (the full run of 2026-12-04)."""
    rows = [{"scenario": "topics", "case": "t", "dialect": "-", "system": "raw", "value": 184_108},
            {"scenario": "topics", "case": "t", "dialect": "-", "system": "redis", "value": 4_235_451},
            {"scenario": "topics", "case": "t", "dialect": "signal", "system": "router", "value": 528_882},
            {"scenario": "topics", "case": "t", "dialect": "nolag", "system": "router", "value": 431_097},
            {"scenario": "latency", "case": "l", "dialect": "-", "system": "raw", "value": 2.379},
            {"scenario": "latency", "case": "l", "dialect": "-", "system": "redis", "value": 2.059}]
    add_ratios(rows)
    table = markdown_table([{**row, "metric": "m"} for row in rows]).splitlines()[2:]
    assert [line.split(" | ")[6:8] for line in table] == [
        ["1.00", "-"], ["23.01", "-"], ["2.87", "-"], ["2.34", "0.82"], ["1.00", "-"], ["0.87", "-"]]


def test_cpu_percent():
    assert cpu_percent(1.5, 2.0) == 75.0
    assert cpu_percent(1.0, 0) == 0.0


def test_table_and_markdown_show_every_row(tmp_path):
    rows = add_ratios([{"scenario": "fanout", "case": "S=1", "system": "raw", "metric": "deliveries/s", "value": 75_000,
                        "server_cpu_pct": 99.6, "loadgen_cpu_pct": 60.0},
                       {"scenario": "fanout", "case": "S=1", "system": "router", "metric": "deliveries/s",
                        "value": 30_000, "server_cpu_pct": 100.0, "shards_cpu_pct": 40.0, "notes": "x"}])
    table = format_table(rows).splitlines()
    assert table[0].split()[:4] == ["scenario", "case", "dialect", "system"]
    assert "75,000" in table[2] and "100%" in table[2]
    assert "0.40" in table[3] and "40%" in table[3]
    markdown = markdown_table(rows).splitlines()
    assert len(markdown) == 4 and markdown[3].startswith("| fanout | S=1 | - | router |")
    write_json(tmp_path / "r" / "out.json", {"results": rows})
    assert json.loads((tmp_path / "r" / "out.json").read_text())["results"][1]["ratio_to_raw"] == 0.4


def test_client_frames_are_masked_with_the_zero_key():
    assert client_frame(b"hi") == b"\x81\x82\x00\x00\x00\x00hi"
    long = client_frame(b"x" * 300)
    assert long[:4] == b"\x81\xfe\x01\x2c" and long[4:8] == b"\x00" * 4 and len(long) == 308


def test_server_frames_are_split_by_header_and_a_partial_frame_is_kept():
    stream = b"\x81\x02hi" + b"\x81\x7e\x01\x00" + b"y" * 256 + b"\x89\x00" + b"\x81\x05ab"
    frames, consumed = parse_server_frames(stream)
    assert [(opcode, stream[start:end][:2]) for opcode, start, end in frames] == [(1, b"hi"), (1, b"yy"), (9, b"")]
    assert consumed == len(stream) - 4  # the last frame is incomplete


def test_data_frames_are_counted_and_a_control_frame_defers_to_the_full_parse():
    data = b"\x81\x02hi" + b"\x82\x7e\x01\x00" + b"y" * 256
    assert count_data_frames(data + b"\x81\x05ab") == (2, len(data), False)
    assert count_data_frames(data + b"\x89\x00") == (0, 0, True)


def _walked(buffer: bytes) -> tuple[int, int, bool]:
    """count_data_frames as a plain walk, frame by frame (the reference)."""
    count = position = 0
    for opcode, _, end in parse_server_frames(buffer)[0]:
        if opcode & 0x08:
            return 0, 0, True
        count, position = count + 1, end
    return count, position, False


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0x1, 0x2, 0x2, 0x2, 0x9, 0xA]), st.sampled_from([0, 5, 125, 126, 200, 70_000]),
                          st.integers(1, 60)), min_size=1, max_size=4),
       st.integers(0, 300))
def test_counting_runs_of_frames_of_one_size_at_once_counts_as_the_walk(runs: list[tuple], cut: int):
    """Runs of frames of one size (counted as columns from the start) and others, control frames
    among them, the last cut anywhere: the same count, end and control flag as frame by frame."""
    stream = b"".join(frame_header(opcode, size) + bytes([opcode]) * size
                      for opcode, size, repeat in runs for _ in range(repeat))
    buffer = stream[:len(stream) - cut] if cut < len(stream) else stream[:1]
    assert count_data_frames(buffer) == _walked(buffer)
    assert count_data_frames(bytearray(buffer)) == _walked(buffer)


def test_latency_stamp_is_parsed_from_any_payload():
    from hdrh.histogram import HdrHistogram

    tally = Tally(HdrHistogram(1, 60_000_000, 3))
    payload = b'{"type":"hub:publish","payload":{"message":"' + stamp(1_000_000_000).encode() + b'xxxx"}}'
    tally.record_stamps(payload, 1_002_000_000)
    assert tally.latencies == [2000]  # µs
    assert tally.histogram_now().get_max_value() == pytest.approx(2000, rel=0.01)
    assert tally.latencies == []


def test_resp_command_and_urls():
    assert resp_command(b"PUBLISH", b"t", b"hello") == b"*3\r\n$7\r\nPUBLISH\r\n$1\r\nt\r\n$5\r\nhello\r\n"
    assert split_url("ws://127.0.0.1:8080/signal") == ("127.0.0.1", 8080, "/signal")
    assert split_url("redis://127.0.0.1:6380") == ("127.0.0.1", 6380, "/")


def test_resp_replies_are_counted_across_chunk_boundaries():
    import asyncio

    async def main() -> tuple[int, int]:
        subscriber, publisher = RespClient(Tally()), RespClient()
        subscriber.listen("count")
        publisher.listen("count")
        push = b"*3\r\n$7\r\nmessage\r\n$5\r\nbench\r\n$3\r\nabc\r\n"
        stream = push * 3
        for piece in (stream[:10], stream[10:33], stream[33:70], stream[70:]):  # markers split anywhere
            subscriber.data_received(piece)
        for piece in (b":1\r", b"\n:1\r\n:", b"1\r\n"):
            publisher.data_received(piece)
        return subscriber.tally.count, publisher.acks

    assert asyncio.run(main()) == (3, 3)


def test_shared_cases_are_planned_per_dialect_and_once_for_the_baselines():
    from router.bench import plan_cases
    from router.bench.scenarios import Options

    options = Options(subscribers=[1, 100])
    cases = plan_cases("fanout", ["signal"], options)
    assert [(case.dialect, case.case) for case in cases] == [
        ("signal", "S=1"), ("signal", "S=100"), (None, "S=1"), (None, "S=100")]
    with pytest.raises(SystemExit, match="runs 'p2p'"):
        plan_cases("p2p", [], options)


def test_a_baseline_runs_the_shared_cases_and_a_router_its_dialect_s():
    from router.bench.scenarios import Case
    from router.bench.systems import RawSystem, RouterSystem

    shared, own = Case("fanout", "S=1", "deliveries/s", None, None), Case("fanout", "S=1", "deliveries/s", None, None,
                                                                          dialect="signal")
    assert RawSystem(None).accepts(shared) and not RawSystem(None).accepts(own)
    assert RouterSystem(dialect="signal").accepts(own) and not RouterSystem(dialect="nolag").accepts(own)
    assert not RouterSystem(dialect="signal").accepts(shared)


def test_repeated_cases_run_in_a_row_and_compare_run_for_run():
    from router.bench import plan_cases, repeated
    from router.bench.scenarios import Options

    cases = repeated(plan_cases("latency", ["signal"], Options()), 3)
    assert [(case.dialect, case.case) for case in cases] == [
        ("signal", f"1,000 msg/s x 100 subs, run {k}") for k in (1, 2, 3)] + [
        (None, f"1,000 msg/s x 100 subs, run {k}") for k in (1, 2, 3)]
    assert cases[1].compare == "1,000 msg/s x 100 subs, run 2"
    assert repeated(cases, 1) is cases


def test_each_run_of_a_baqend_case_writes_into_a_bucket_of_its_own():
    from router.bench import plan_cases, repeated
    from router.bench.scenarios import Options

    class Peer:  # a system without a router: no processes to read
        def urls(self):
            return ["ws://127.0.0.1:1/v1/events"]

    cases = repeated(plan_cases("queries", ["baqend"], Options(params={"baqend.queries": "1000",
                                                                        "baqend.rounds": "1"})), 2)
    buckets = [{spec["bucket"] for _, spec in case.jobs(Peer())} for case in cases]
    assert [len(run) for run in buckets] == [1, 1]  # the writer and every receiver share the run's bucket
    assert buckets[0] != buckets[1]


def test_a_missing_extra_is_named_with_what_to_install(monkeypatch):
    import importlib.util

    from router.bench import missing_extras, plan_cases
    from router.bench.scenarios import Options
    from router.bench.systems import RedisSystem, Unavailable

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("hdrh", "redis") else real(name, *a))
    assert missing_extras(plan_cases("latency", ["signal", "cashu"], Options())) == [
        "the latency cases' HDR histograms need hdrhistogram: pip install -e '.[bench]'"]
    assert missing_extras(plan_cases("fanout", ["signal"], Options())) == []
    with pytest.raises(Unavailable, match=r"redis client: pip install -e '.\[bench\]'"):
        RedisSystem(None).start()


@pytest.mark.parametrize("count", [0, 1, 15, 16, 100, 65_535, 65_536])
def test_a_nolag_receivers_batch_ack_joins_the_ids_as_the_router_packed_them(count):
    """The acking receivers slice each ``msgId`` out of the frame as MessagePack wrote it and join
    them into ``batchAck`` without decoding: the router must read the very ids it sent."""
    import msgpack

    from gateways.nolag import codec
    from router.bench.dialects.nolag import _Acker, batch_ack

    ids = [f"{index:08x}-0000-4000-8000-000000000000" if index % 3 == 1 else str(index).rjust(256, "x") if index % 3 == 2
           else f"m{index}" for index in range(count)]  # str 8, str 16 (the longest id) and fixstr
    # stamped as the shard stamps a topic's messages: Unix milliseconds, strictly increasing
    frames = [codec.message_packed("app/room/t", msgpack.packb("x"), msg_id, True, False, None, None,
                                   1_700_000_000_000 + index)
              for index, msg_id in enumerate(ids)]

    class Client:
        closed = type("Done", (), {"done": staticmethod(lambda: False)})()
        sent: list[bytes] = []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

    class Dialect:
        duplicates = acks = 0

    async def receive() -> list[bytes]:
        acker = _Acker(Client(), Dialect(), every=10**9)
        assert [acker(frame) for frame in frames] == [1] * count
        if count:
            assert acker(frames[0]) == 0  # seen before: a redelivery, not counted again
        ids_as_packed = acker.pending[:count]
        acker.pending = []
        acker.flush()  # nothing pending: no frame; cancels the idle timer
        return ids_as_packed

    packed = batch_ack(asyncio.run(receive()))
    assert msgpack.unpackb(packed) == {"type": "batchAck", "msgIds": ids}
    if count <= 1000:  # what the router accepts in one batchAck
        assert codec.decode(packed) == codec.BatchAck(tuple(ids))


def client_payloads(data: bytes) -> list[bytes]:
    """The payloads of client frames written one after the other (masked with the zero key, so
    each payload follows its header's 4 mask bytes as it is)."""
    payloads = []
    while data:
        length, header = data[1] & 0x7F, 2
        if length == 126:
            length, header = int.from_bytes(data[2:4], "big"), 4
        payloads.append(data[header + 4:header + 4 + length])
        data = data[header + 4 + length:]
    return payloads


def test_a_nolag_receiver_takes_a_reads_frames_at_once_as_it_would_one_by_one():
    """``_Acker.chunk``: the ids and stamps of a read's complete frames of one layout taken as
    columns; the same counts, duplicates and ``batchAck``s (``every`` ids each, the rest on the idle
    timer) as frame by frame (each frame decoded), a frame cut by the read's end kept for the next;
    a read it cannot take (too few frames, frames of other sizes or layouts) goes frame by frame."""
    import uuid

    import msgpack

    from gateways.nolag import codec
    from router.bench.dialects.nolag import _Acker
    from router.bench.wire import HANDLE, Tally, WsClient

    def message(msg_id: str, stamp: int) -> bytes:  # stamp: the shard's, strictly increasing per topic
        payload = codec.message_packed("app/room/t", msgpack.packb("x" * 50), msg_id, True, False, None, None,
                                       1_700_000_000_000 + stamp)
        return frame_header(0x2, len(payload)) + payload

    class Transport:
        def __init__(self) -> None:
            self.written: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.written.append(data)

        def is_closing(self) -> bool:
            return False

    class Dialect:
        duplicates = acks = one_by_one = columns = 0

    class Acker(_Acker):
        __slots__ = ()

        def __call__(self, payload: bytes) -> int:
            self.dialect.one_by_one += 1
            return super().__call__(payload)

        def _uniform(self, buffer, end, frames):
            found = super()._uniform(buffer, end, frames)
            self.dialect.columns += found is not None
            return found

    class FrameByFrame(Acker):
        __slots__ = ()

        def chunk(self, buffer, end, frames):
            return None

    one_by_one: list[int] = []  # frames each receive() handed to __call__
    columns: list[int] = []  # reads each receive() took as columns of frames of one size
    writes: list[int] = []  # the transport's writes in each receive(), before the idle timer's

    def receive(chunks: list[bytes], chunked: bool) -> tuple:
        async def run() -> tuple:
            client = WsClient("h", 1, "/", Tally(), 0x2)
            client.transport, client._open, client.mode = Transport(), True, HANDLE
            dialect = Dialect()
            client.handler = (Acker if chunked else FrameByFrame)(client, dialect, every=4)
            for chunk in chunks:
                client.data_received(chunk)
            acks = [msgpack.unpackb(payload)["msgIds"] for payload in client_payloads(b"".join(client.transport.written))]
            result = (client.tally.count, dialect.duplicates, dialect.acks, acks, client.handler.waiting(),
                      bytes(client.buffer), client.handler.timer is not None)
            one_by_one.append(dialect.one_by_one)
            columns.append(dialect.columns)
            writes.append(len(client.transport.written))
            client.handler.flush()
            return result
        return asyncio.run(run())

    ids = [str(uuid.UUID(int=index)) for index in range(10)]
    frames = [message(msg_id, index) for index, msg_id in enumerate(ids)] + [message(ids[2], 2)]  # a redelivery
    stream = b"".join(frames)
    cut = len(stream) - len(frames[-1]) // 2  # the last frame split over two reads
    chunks = [stream[:len(frames[0]) * 3], stream[len(frames[0]) * 3:cut], stream[cut:]]
    packed = [msgpack.packb(msg_id) for msg_id in ids]
    got = receive(chunks, chunked=True)
    # 11 frames, one a redelivery; two batchAcks of 4, three ids wait for the idle timer
    assert got == (10, 1, 2, [ids[0:4], ids[4:8]], [packed[8], packed[9], packed[2]], b"", True)
    assert receive(chunks, chunked=False) == got
    assert one_by_one == [11, 11]  # fewer than COLUMNS_MIN frames a read: decoded one by one
    # after the first two reads the cut frame waits in the buffer, the rest counted
    assert receive(chunks[:2], chunked=True)[0] == 10 and receive(chunks[:2], chunked=True)[5] == stream[
        len(stream) - len(frames[-1]):cut]
    # an id that is not a UUID: the read goes frame by frame, with the same result
    short = [message(f"m{index}", index) for index in range(6)]
    assert receive([b"".join(short)], chunked=True) == receive([b"".join(short)], chunked=False)
    assert receive([b"".join(short)], chunked=True)[:3] == (6, 0, 1)
    # a read that leaves nothing pending leaves no idle timer either
    reads = [b"".join(frames[:3]), b"".join(frames[3:8])]  # the first arms the timer, the second ends it
    assert receive(reads, chunked=True)[2:] == (2, [ids[0:4], ids[4:8]], [], b"", False)
    assert receive(reads, chunked=False)[2:] == (2, [ids[0:4], ids[4:8]], [], b"", False)
    assert one_by_one[-5:] == [6, 6, 6, 8, 8]
    assert not any(columns)
    # reads of frames of one size (a topic's messages): the ids and stamps taken as columns
    many_ids = [str(uuid.UUID(int=index)) for index in range(120)]
    many = [message(msg_id, index) for index, msg_id in enumerate(many_ids)] + [message(many_ids[5], 5)]
    assert len(set(map(len, many))) == 1
    reads = [b"".join(many[:60]), b"".join(many[60:])]  # the second ends with a redelivery
    got = receive(reads, chunked=True)
    # 121 frames, one a redelivery; 30 batchAcks of 4 (each read's in one write), one id waits
    assert got == (120, 1, 30, [many_ids[index:index + 4] for index in range(0, 120, 4)],
                   [msgpack.packb(many_ids[5])], b"", True)
    assert receive(reads, chunked=False) == got
    assert columns[-2:] == [2, 0] and one_by_one[-2:] == [0, 121]
    assert writes[-2:] == [2, 30]  # taken at once, a read's batchAcks go in one write; one by one, each in its own
    # a frame of another size among them, or a frame of the size whose id is elsewhere, or whose
    # data is bytes holding a msgId key and a UUID-sized value: each read goes frame by frame
    longer = codec.message_packed("app/room/t", msgpack.packb("x" * 51), many_ids[10], True, False, None, None,
                                  1_700_000_000_000 + 10)
    moved = msgpack.packb({"type": "message", "topic": "app/room/t", "msgId": many_ids[10], "data": "x" * 50,
                           "requiresAck": True, "timestamp": 1_700_000_000_000 + 10})  # the id before the data
    assert len(frame_header(0x2, len(moved)) + moved) == len(many[0])
    decoy = codec.message_packed("app/room/t", msgpack.packb(msgpack.packb("msgId") + b"\xd9\x24" + b"0" * 36 + b"x" * 6),
                                 many_ids[10], True, False, None, None, 1_700_000_000_000 + 10)
    assert len(frame_header(0x2, len(decoy)) + decoy) == len(many[0])
    for odd in (longer, moved, decoy):
        mixed = [b"".join(many[:10] + [frame_header(0x2, len(odd)) + odd] + many[11:80])]
        assert receive(mixed, chunked=True) == receive(mixed, chunked=False)
        assert columns[-2:] == [0, 0] and one_by_one[-2:] == [80, 80]
        # the same after a read that set the layout: the later read is not taken by it
        after = [b"".join(many[:60]), b"".join(many[60:70] + [frame_header(0x2, len(odd)) + odd] + many[71:120])]
        assert receive(after, chunked=True) == receive(after, chunked=False)
        assert columns[-2:] == [1, 0] and one_by_one[-2:] == [60, 120]
    # a read of frames of one size, then a shorter complete frame and a frame cut by the read's
    # end (together shorter than one of the first): the first taken as columns, the shorter one
    # decoded in the same read, the cut one kept for the next
    small = message("m61", 61)
    cut_at = len(many[0]) - len(small) - 1
    tail = [b"".join(many[:60] + [small]) + many[62][:cut_at], many[62][cut_at:] + b"".join(many[63:80])]
    got = receive(tail, chunked=True)
    assert got == receive(tail, chunked=False)
    assert got[:3] == (79, 0, 19) and got[5] == b""
    assert columns[-2:] == [1, 0] and one_by_one[-2:] == [19, 79]
    assert receive(tail[:1], chunked=True)[0::5] == (61, many[62][:cut_at])  # the shorter one not left waiting
    # frames whose last bytes are a place (``requiresAck`` after the stamp): a later read whose
    # last frame differs only there, in the bytes after its last 8-byte word, is not taken
    def ending(msg_id: str, stamp: int, flag: bool) -> bytes:
        payload = msgpack.packb({"type": "message", "topic": "app/room/t", "data": "x" * 51, "msgId": msg_id,
                                 "timestamp": 1_700_000_000_000 + stamp, "requiresAck": flag})
        return frame_header(0x2, len(payload)) + payload
    ended = [ending(msg_id, index, index != 98) for index, msg_id in enumerate(many_ids[:99])]
    assert len(ended[0]) % 8 and 49 * len(ended[0]) % 8
    reads = [b"".join(ended[:50]), b"".join(ended[50:99])]
    assert receive(reads, chunked=True) == receive(reads, chunked=False)
    assert columns[-2:] == [1, 0] and one_by_one[-2:] == [49, 99]
    # reads of two layouts of one size in turn (the id before the data, then after): each read is
    # checked against its own layout's bytes, not the one before's, and its ids read where they are
    def id_first(msg_id: str, stamp: int) -> bytes:
        payload = msgpack.packb({"type": "message", "topic": "app/room/t", "msgId": msg_id, "data": "x" * 50,
                                 "requiresAck": True, "timestamp": 1_700_000_000_000 + stamp})
        return frame_header(0x2, len(payload)) + payload
    turns = [b"".join(many[:50]), b"".join(id_first(many_ids[index], index) for index in range(50, 100)),
             b"".join(many[100:120] + [message(f"{index:036d}", index) for index in range(120, 150)])]
    got = receive(turns, chunked=True)
    assert got == receive(turns, chunked=False)
    assert [i for ack in got[3] for i in ack] == many_ids[:120] + [f"{index:036d}" for index in range(120, 148)]
    assert columns[-2:] == [3, 0]
    # reads taken as columns whose ids differ in size from those waiting (ids of 36 characters,
    # then of 10, then of 36 again): the batchAcks are the same, every one of 4 ids, as one by one
    shorter = [f"id{index:08d}" for index in range(150, 200)]
    turns = [b"".join(many[:50]), b"".join(message(msg_id, 150 + index) for index, msg_id in enumerate(shorter)),
             b"".join(message(f"{index:036d}", index) for index in range(200, 250))]
    got = receive(turns, chunked=True)
    assert got == receive(turns, chunked=False)
    assert columns[-2:] == [3, 0] and {len(ack) for ack in got[3]} == {4} and len(got[4]) == 2
    # frames whose data are bytes, one of them holding a msgId key and a UUID-sized value: one
    # layout (the data's content is free), so taken as columns, each frame's own id read, as decoded
    def binary(msg_id: str, stamp: int, data: bytes) -> bytes:
        payload = codec.message_packed("app/room/t", msgpack.packb(data), msg_id, True, False, None, None,
                                       1_700_000_000_000 + stamp)
        return frame_header(0x2, len(payload)) + payload
    plain = b"y" * 50
    lure = msgpack.packb("msgId") + b"\xd9\x24" + b"0" * 36 + b"x" * 6
    assert len(lure) == len(plain)
    binaries = [binary(msg_id, index, lure if index == 30 else plain) for index, msg_id in enumerate(many_ids)]
    got = receive([b"".join(binaries)], chunked=True)
    assert got == receive([b"".join(binaries)], chunked=False)
    assert columns[-2:] == [1, 0] and one_by_one[-2:] == [0, 120]
    assert [i for ack in got[3] for i in ack] == many_ids  # the lure's id is not read


def test_a_nutshell_mint_that_does_not_start_is_skipped_with_its_last_line(tmp_path, monkeypatch):
    """A peer the user installs: a mint that exits at start (here as a venv with an incompatible
    marshmallow did) is Unavailable, with its last line, so `router bench all` skips it and goes
    on; it raised a RuntimeError that ended the whole run, minutes in."""
    from router.bench.dialects.cashu import NUTSHELL_ENV, NutshellSystem
    from router.bench.systems import Unavailable

    mint = tmp_path / "mint"
    mint.write_text("#!/bin/sh\necho 'Traceback (most recent call last):'\n"
                    "echo \"AttributeError: module 'marshmallow' has no attribute '__version_info__'\"\nexit 3\n")
    mint.chmod(0o755)
    monkeypatch.setenv(NUTSHELL_ENV, str(mint))
    system = NutshellSystem(None)
    with pytest.raises(Unavailable) as failure:
        system.start()
    assert str(failure.value) == (
        "the Nutshell mint did not start (exit status 3: AttributeError: module 'marshmallow' has no attribute "
        "'__version_info__'); its venv needs cashu 'marshmallow<4' 'limits<4'")
    assert system.process is None or system.process.poll() is not None
