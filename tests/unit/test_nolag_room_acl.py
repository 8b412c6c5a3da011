"""A key's ACL over rooms: presence and lobbies are allowed where the key may subscribe to a topic of the room."""

from __future__ import annotations

import pytest

from actors.nolag.keys import KeyRecord, pattern_reaches_room


@pytest.mark.parametrize("pattern, room, allowed", [
    ("#", "vault", True),
    ("#", None, True),
    ("chat/#", "vault", True),  # chat/vault/x
    ("chat/#", None, True),
    ("*/#", None, True),
    ("chat/*/messages", "vault", True),
    ("chat/+/messages", None, True),
    ("chat/general/messages", "general", True),
    ("chat/general/#", "general", True),  # chat/general/x
    ("chat/general/messages", "vault", False),
    ("chat/general/#", "vault", False),
    ("chat/general/messages", None, False),  # one room is not every room
    ("chat/general", "general", False),  # matches no topic: topics have three segments
    ("chat/general/messages/x", "general", False),
    ("chat/general/messages/#", "general", False),
    ("chat", "chat", False),
    ("*", None, False),
])
def test_a_pattern_reaches_a_room_if_it_matches_a_topic_of_it(pattern, room, allowed):
    assert pattern_reaches_room(pattern, room) is allowed


def test_a_key_may_enter_rooms_its_subscribe_acl_reaches():
    key = KeyRecord("0123456789abcdef", "live", "p", publish=("#",), subscribe=("chat/general/#", "x/r1/y"),
                    rate_limit_per_s=50, monthly_quota=None, created_at=0.0)
    assert key.can_subscribe_room("general") and key.can_subscribe_room("r1")
    assert not key.can_subscribe_room("vault")  # the publish ACL does not count: presence goes to subscribers
    assert not key.can_subscribe_room(None)
    assert not KeyRecord("0123456789abcdef", "live", "p", ("#",), (), 50, None, 0.0).can_subscribe_room("general")
