"""``Connection.send_frame`` reads the ``websockets`` protocol's ``_state`` (what its ``state``
property returns) without the property call, once per recipient of a fan-out. This holds the
installed ``websockets`` to that: an upgrade that renames or derives it fails here."""

from websockets.protocol import State
from websockets.server import ServerProtocol


def test_state_is_the_protocols_state_attribute_in_every_state():
    protocol = ServerProtocol()
    for state in State:
        protocol.state = state
        assert protocol._state is protocol.state is state
    protocol.state = State.OPEN
    protocol.send_close(1000, "bye")  # the protocol moves itself, too
    assert protocol._state is protocol.state is State.CLOSING
