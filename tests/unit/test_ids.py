"""router/ids.py: version 4 UUID strings from blocks of os.urandom, and time-ordered version 7 ones."""

from __future__ import annotations

import itertools
import os
import time
import uuid

from router import ids


def test_ids_are_random_version_4_uuids_in_canonical_form():
    made = [ids.uuid4() for _ in range(1000)]  # several blocks of 256
    assert len(set(made)) == 1000
    for text in made:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)
    # every variant digit and every hex digit turn up (the bits are the random block's)
    assert {text[19] for text in made} == set("89ab")
    assert set("".join(made).replace("-", "")) == set("0123456789abcdef")


def test_a_forked_child_does_not_repeat_its_parents_ids():
    ids.uuid4()  # a block is loaded
    child = _in_a_child(ids.uuid4)
    assert child != ids.uuid4()
    assert uuid.UUID(child).version == 4


def test_threads_never_take_the_same_bytes(monkeypatch):
    import threading
    import time

    def slow_len(value):  # a thread switch between reading the position and moving it
        time.sleep(0)
        return len(value)

    monkeypatch.setattr(ids, "len", slow_len, raising=False)
    made: list[str] = []

    def take() -> None:
        made.extend(ids.uuid4() for _ in range(500))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 2000 and len(set(made)) == 2000


def test_time_ordered_ids_are_version_7_uuids_in_order_of_making():
    before_ms = time.time_ns() // 1_000_000
    made = [ids.uuid7() for _ in range(20_000)]
    after_ms = time.time_ns() // 1_000_000
    assert len(set(made)) == len(made)
    for text in made:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, text)
        assert before_ms <= parsed.int >> 80 <= after_ms  # the first 48 bits: Unix milliseconds
    # one process's ids sort as they were made, unless the 26-bit counter wrapped among them
    counters = [((uuid.UUID(t).int >> 64) & 0xFFF) << 14 | ((uuid.UUID(t).int >> 48) & 0x3FFF) for t in made]
    wrapped = sum(1 for a, b in zip(counters, counters[1:]) if b != (a + 1) % 2**26)
    assert wrapped == 0
    if counters[0] < counters[-1]:
        assert made == sorted(made)
    assert len({text[-12:] for text in made}) == 1  # the process's random bits


def test_time_ordered_ids_take_new_random_bits_when_the_clock_steps_back(monkeypatch):
    """Before: the ids kept the latest milliseconds until the clock came back to them, so 2**26
    ids in that time repeated earlier ones (the counter wraps, the random bits were the same)."""
    ids.uuid7.reset()
    ids.uuid7.counter = itertools.count(0)
    clock = iter([5_000_000_000_000, 4_000_000_000_000, 4_000_000_000_000, 6_000_000_000_000])
    monkeypatch.setattr(ids.time, "time_ns", lambda: next(clock))
    try:
        first, stepped_back, same_ms, later = (ids.uuid7() for _ in range(4))
    finally:
        monkeypatch.undo()
        ids.uuid7.reset()
    assert [uuid.UUID(t).int >> 80 for t in (first, stepped_back, same_ms, later)] == [5_000_000, 4_000_000,
                                                                                        4_000_000, 6_000_000]
    assert stepped_back[-12:] != first[-12:]  # new random bits from the step back on
    assert stepped_back[-12:] == same_ms[-12:] == later[-12:]
    assert stepped_back < same_ms < later and len({first, stepped_back, same_ms, later}) == 4


def test_a_forked_child_draws_its_own_random_bits():
    parent = ids.uuid7()
    child = _in_a_child(ids.uuid7)
    assert uuid.UUID(child).version == 7
    assert child[-12:] != parent[-12:]


def _in_a_child(make) -> str:
    """The next id ``make`` gives in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, make().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    return child
