"""Spec 3.6 (pub/sub topics), subscribers and publishers on different gateways."""

from __future__ import annotations

import json

from tests.e2e.client import HUB, HubClient, now_ms, run
from tests.e2e.conftest import make_token


def test_subscribe_publish_unsubscribe_across_gateways(hub):
    async def scenario():
        near = await HubClient.open(hub.ws_urls[0], "browser/near", make_token("browser/near"))
        far = await HubClient.open(hub.ws_urls[1], "seag/far", make_token("seag/far"))
        before = now_ms()
        subscribed = await far.request("hub:subscribe", {"topic": "system/events", "actorAddress": "seag/far"},
                                       correlationId="s")
        assert subscribed["type"] == "hub:subscribed" and subscribed["correlationId"] == "s"
        assert subscribed["to"] == "seag/far" and subscribed["from"] == HUB
        assert set(subscribed["payload"]) == {"topic", "subscribedAt"}
        assert subscribed["payload"]["topic"] == "system/events"
        assert before <= subscribed["payload"]["subscribedAt"] <= now_ms()
        await near.request("hub:subscribe", {"topic": "system/events"})

        publication = near.envelope("hub:publish", {
            "topic": "system/events",
            "message": {"type": "user_action", "action": "clicked_button", "metadata": {"buttonId": "submit"}},
        }, correlationId="p")
        await near.send_raw(json.dumps(publication))
        assert await far.recv() == publication
        got = [await near.recv() for _ in range(2)]  # its own copy and the ack
        assert publication in got
        ack = next(m for m in got if m["type"] == "hub:delivery_ack")
        assert ack == {"type": "hub:delivery_ack", "from": HUB, "to": "browser/near",
                       "payload": {"topic": "system/events", "subscriberCount": 2, "deliveredCount": 2},
                       "correlationId": "p"}

        unsubscribed = await far.request("hub:unsubscribe", {"topic": "system/events"}, correlationId="u")
        assert unsubscribed["type"] == "hub:unsubscribed" and unsubscribed["correlationId"] == "u"
        assert set(unsubscribed["payload"]) == {"topic", "unsubscribedAt"}
        after = await near.request("hub:publish", {"topic": "system/events", "message": "only me"})
        assert after["type"] in ("hub:publish", "hub:delivery_ack")
        rest = await near.recv()
        ack = after if after["type"] == "hub:delivery_ack" else rest
        assert ack["payload"] == {"topic": "system/events", "subscriberCount": 1, "deliveredCount": 1}
        # Marker on another topic through the same path: the next thing `far` sees.
        await far.request("hub:subscribe", {"topic": "marker"})
        await near.request("hub:publish", {"topic": "marker", "message": "m"})
        assert (await far.recv())["payload"] == {"topic": "marker", "message": "m"}
        await near.close()
        await far.close()

    run(scenario())


def test_publish_fans_out_to_many_subscribers_in_order(hub):
    async def scenario():
        subscribers = [await HubClient.open(hub.ws_urls[i % 2], f"seag/fan-{i}", make_token(f"seag/fan-{i}"))
                       for i in range(20)]
        for subscriber in subscribers:
            await subscriber.request("hub:subscribe", {"topic": "fan/out"})
        publisher = await HubClient.open(hub.ws_urls[0], "browser/pub", make_token("browser/pub"))
        for n in range(200):
            await publisher.send("hub:publish", {"topic": "fan/out", "message": n})
        acks = [await publisher.recv() for _ in range(200)]
        assert [a["payload"]["deliveredCount"] for a in acks] == [20] * 200
        for subscriber in subscribers:
            assert [(await subscriber.recv())["payload"]["message"] for _ in range(200)] == list(range(200))
        for client in subscribers + [publisher]:
            await client.close()

    run(scenario())


def test_a_burst_of_publishes_is_written_over_several_loop_turns_in_order(hub):
    """100 publishes read in one go make a shard reply of 2,000 deliveries to this gateway; the
    hub's gateways apply 100 per loop turn, so the reply goes out in slices, in order, whole; with
    more than 8 turns' worth waiting the gateway stops reading its lanes, and reads them again."""
    import ray

    def stats() -> tuple[int, int, bool]:
        gateway = ray.get(hub.router.gateways[0].actor.stats.remote(), timeout=30)
        lanes = gateway["shard_client"]
        return gateway["deliveries_sliced"], lanes["lane_pauses"], lanes["lanes_paused"]

    async def scenario():
        subscribers = [await HubClient.open(hub.ws_urls[0], f"seag/burst-{i}", make_token(f"seag/burst-{i}"))
                       for i in range(20)]
        for subscriber in subscribers:
            await subscriber.request("hub:subscribe", {"topic": "burst"})
        publisher = await HubClient.open(hub.ws_urls[0], "browser/burst", make_token("browser/burst"))
        sliced, pauses, _ = stats()
        publisher.send_burst([publisher.envelope("hub:publish", {"topic": "burst", "message": n})
                              for n in range(100)])
        acks = [await publisher.recv() for _ in range(100)]
        assert [a["payload"]["deliveredCount"] for a in acks] == [20] * 100
        for subscriber in subscribers:
            assert [(await subscriber.recv())["payload"]["message"] for _ in range(100)] == list(range(100))
        after = stats()
        assert after[0] > sliced and after[1] > pauses and after[2] is False
        for client in subscribers + [publisher]:
            await client.close()

    run(scenario())


def test_publish_without_subscribers_and_closed_subscribers(hub):
    async def scenario():
        publisher = await HubClient.open(hub.ws_urls[1], "browser/lonely", make_token("browser/lonely"))
        empty = await publisher.request("hub:publish", {"topic": "nobody/here", "message": 1})
        assert empty["payload"] == {"topic": "nobody/here", "subscriberCount": 0, "deliveredCount": 0}
        leaver = await HubClient.open(hub.ws_urls[0], "seag/leaver", make_token("seag/leaver"))
        await leaver.request("hub:subscribe", {"topic": "nobody/here"})
        assert (await publisher.request("hub:publish", {"topic": "nobody/here", "message": 2}))["payload"][
            "subscriberCount"] == 1
        await leaver.close()
        # The closed subscriber's subscription is purged; poll until the shard has seen the purge.
        for _ in range(100):
            reply = await publisher.request("hub:publish", {"topic": "nobody/here", "message": 3})
            if reply["payload"]["subscriberCount"] == 0:
                break
        assert reply["payload"] == {"topic": "nobody/here", "subscriberCount": 0, "deliveredCount": 0}
        missing = await publisher.request("hub:publish", {"message": 1})
        assert missing["payload"] == {
            "code": "internal_error",
            "message": "payload.topic must be a non-empty string of at most 256 characters",
            "details": {"reason": "invalid_message", "field": "payload.topic"},
        }
        await publisher.close()

    run(scenario())


def test_each_publish_is_acked_for_its_own_topic_and_id_past_the_kept_ack_starts(hub):
    """A connection keeps the start of its delivery acks for up to 16 (address, topic) pairs, and
    its topics' routes (key and shard) for up to 16 topics, then starts again: publishes to 22
    topics, twice round, each reach their own topic's subscribers and get the ack of their own
    topic, count and correlationId (a string, a number, or none when the publish has no id)."""
    from gateways.signal.session import ACK_HEADS_MAX, ROUTES_MAX

    assert ROUTES_MAX == ACK_HEADS_MAX

    async def scenario():
        topics = [f"many/{n}" for n in range(ACK_HEADS_MAX + 6)]
        subscriber = await HubClient.open(hub.ws_urls[0], "seag/many-sub", make_token("seag/many-sub"))
        for topic in topics[::2]:
            await subscriber.request("hub:subscribe", {"topic": topic})
        publisher = await HubClient.open(hub.ws_urls[0], "browser/many", make_token("browser/many"))
        expected = []
        for round_ in range(2):
            for n, topic in enumerate(topics):
                ids = [{"correlationId": f"c-{round_}-{n}"}, {"id": round_ * 1000 + n}, {}][n % 3]
                await publisher.send("hub:publish", {"topic": topic, "message": n}, **ids)
                ack = {"type": "hub:delivery_ack", "from": HUB, "to": "browser/many",
                       "payload": {"topic": topic, "subscriberCount": 1 - n % 2, "deliveredCount": 1 - n % 2}}
                if ids:
                    ack["correlationId"] = next(iter(ids.values()))
                expected.append(ack)
        assert [await publisher.recv() for _ in expected] == expected
        got = [await subscriber.recv() for _ in range(2 * len(topics[::2]))]
        by_topic: dict[str, list] = {}  # topics of different shards arrive in either order
        for m in got:
            by_topic.setdefault(m["payload"]["topic"], []).append(m["payload"]["message"])
        assert by_topic == {topic: [n, n] for n, topic in enumerate(topics) if n % 2 == 0}
        await subscriber.close()
        await publisher.close()

    run(scenario())
