"""router/ids.py: version 4 UUID strings from blocks of os.urandom."""

from __future__ import annotations

import os
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
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, ids.uuid4().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
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
