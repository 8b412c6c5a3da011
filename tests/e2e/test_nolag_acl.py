"""NoLag presence and lobbies under the key's ACL, over real sockets.

A room's presence is shared by the connections subscribed to its topics, so a key may set or read
presence in a room (and watch a lobby's rooms) only if its subscribe ACL allows a topic of that
room; otherwise the request gets ``not_authorized``, as a denied subscribe does.

``acl_router``: one gateway, one shard of each kind, two lobbies (a prefix one and a room list).
"""

from __future__ import annotations

import pytest

from tests.e2e.client import run
from tests.e2e.conftest import start_router
from tests.e2e.nolag_client import Client, NolagRouter

pytestmark = [pytest.mark.e2e, pytest.mark.security]

# A key limited to one room: it may subscribe and publish only in room "general" of app "chat".
GENERAL_ONLY = {"publish": ["chat/general/#"], "subscribe": ["chat/general/#"]}


class AclRouter(NolagRouter):
    async def client(self, **acl) -> Client:
        return await Client.open(self.urls[0], self.token(**acl))


@pytest.fixture(scope="module")
def acl_router(ray_runtime, tmp_path_factory) -> AclRouter:
    data_dir = tmp_path_factory.mktemp("nolag-acl")
    running = start_router(
        namespace="e2e-nolag-acl", data_dir=data_dir, port=0, gateways=1, ray_dashboard=False,
        shards={"session": 1, "topic": 1, "registry": 1}, signal={"enabled": False}, cashu={"enabled": False},
        mx={"enabled": False}, baqend={"enabled": False}, analytics={"enabled": False},
        nolag={"lobbies": {"trips": {"prefix": "trip-"}, "pair": {"rooms": ["r1", "r2"]}}},
    )
    yield AclRouter(running, "proj_acl")
    running.router.stop()


def denied(frame: dict) -> bool:
    """``{type: error, error: not_authorized, hint}``: the spec's error for a denied subscribe."""
    assert set(frame) == {"type", "error", "hint"} and isinstance(frame["hint"], str) and frame["hint"], frame
    return (frame["type"], frame["error"]) == ("error", "not_authorized")


async def quiet(client: Client, room: str) -> None:
    """Nothing queued: a getPresence of a room the key may read answers next."""
    await client.send({"type": "getPresence", "roomId": room})
    reply = await client.recv()
    assert reply["type"] == "presenceList" and reply["roomId"] == room, reply


def test_presence_in_a_room_outside_the_keys_acl_is_not_authorized(acl_router):
    async def scenario():
        owner = await acl_router.client()
        await owner.subscribe("app/vault/events", qos=0)
        await owner.send({"type": "presence", "roomId": "vault", "data": {"status": "guarding"}})
        assert (await owner.expect("presence"))["event"] == "join"
        assert (await owner.expect("presence"))["event"] == "update"

        outsider = await acl_router.client(**GENERAL_ONLY)
        # Reading a room it may not subscribe to: refused, nothing about its members leaks.
        await outsider.send({"type": "getPresence", "roomId": "vault"})
        assert denied(await outsider.recv())
        # Writing presence there: refused, and the room's members see nothing.
        await outsider.send({"type": "presence", "roomId": "vault", "data": {"status": "intruder"}})
        assert denied(await outsider.recv())
        await outsider.send({"type": "presence", "roomId": "vault", "data": None})
        assert denied(await outsider.recv())
        # Without a roomId the presence is the project's, across rooms: only a key that may read every room.
        await outsider.send({"type": "presence", "data": {"status": "x"}})
        assert denied(await outsider.recv())
        await outsider.send({"type": "getPresence"})
        assert denied(await outsider.recv())
        await quiet(owner, "vault")

        # In its own room it works as before.
        actor = outsider.auth["actorTokenId"]
        await outsider.send({"type": "presence", "roomId": "general", "data": {"status": "online"}})
        join, update = await outsider.expect("presence"), await outsider.expect("presence")
        assert (join["event"], update["event"], update["data"]["actorTokenId"]) == ("join", "update", actor)
        await outsider.send({"type": "getPresence", "roomId": "general"})
        listed = await outsider.expect("presenceList")
        assert [(e["actorTokenId"], e["presence"]) for e in listed["data"]] == [(actor, {"status": "online"})]
        # The owner's key (ACL "#") reads every room, the project's one too.
        await owner.send({"type": "getPresence", "roomId": "vault"})
        listed = await owner.expect("presenceList")
        assert [e["presence"] for e in listed["data"]] == [{"status": "guarding"}]
        await quiet(owner, "general")
        for client in (owner, outsider):
            await client.close()

    run(scenario())


def test_lobbies_need_every_room_of_the_lobby_in_the_keys_acl(acl_router):
    async def scenario():
        driver = await acl_router.client()
        driver_actor = driver.auth["actorTokenId"]
        await driver.send({"type": "presence", "roomId": "trip-1", "data": {"status": "driving"}})
        await driver.expect("presence")  # its own join
        await driver.expect("presence")  # and update

        outsider = await acl_router.client(**GENERAL_ONLY)
        for request in ("lobbySubscribe", "getLobbyPresence"):
            await outsider.send({"type": request, "lobbyId": "trips"})
            assert denied(await outsider.recv())
        # One room of a room-list lobby is not enough.
        one_room = await acl_router.client(subscribe=["x/r1/y"])
        await one_room.send({"type": "lobbySubscribe", "lobbyId": "pair"})
        assert denied(await one_room.recv())

        # Refused means not listening: the driver's next change reaches only those allowed.
        watcher = await acl_router.client(publish=[], subscribe=["rides/*/status"])  # every room
        await watcher.send({"type": "lobbySubscribe", "lobbyId": "trips"})
        assert await watcher.recv() == {"type": "lobbySubscribed", "lobbyId": "trips",
                                        "presence": {"trip-1": {driver_actor: {"status": "driving"}}}}
        both_rooms = await acl_router.client(subscribe=["x/r1/y", "x/r2/#"])
        await both_rooms.send({"type": "getLobbyPresence", "lobbyId": "pair"})
        assert await both_rooms.recv() == {"type": "lobbyPresenceList", "lobbyId": "pair", "presence": {}}
        await driver.send({"type": "presence", "roomId": "trip-1", "data": {"status": "arrived"}})
        change = await watcher.expect("lobbyPresence")
        assert (change["lobbyId"], change["roomId"], change["data"]) == ("trips", "trip-1", {"status": "arrived"})
        await quiet(outsider, "general")
        for client in (driver, outsider, one_room, watcher, both_rooms):
            await client.close()

    run(scenario())
