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
