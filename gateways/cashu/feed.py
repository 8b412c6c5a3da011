"""The mint's side of the state feed: push quote and proof states into the router.

A mint calls this whenever an object changes (a quote is paid, a proof becomes pending or
spent); the router stores the state and notifies every wallet subscribed to the object::

    from gateways.cashu.feed import StateFeed

    feed = StateFeed("http://127.0.0.1:8080", api_key="…")
    feed.push("bolt11_mint_quote", {"quote": "q1", "state": "PAID", ...})
    feed.push_many([("proof_state", {"Y": "02…", "state": "SPENT", "witness": None}), ...])

Pushes of one object must be made in order (wait for one before sending the next); the router
numbers each object's states and keeps the last one across restarts. Standard library only, so
a mint can vendor this file.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Iterable


class FeedError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('message', body)}")
        self.status = status
        self.body = body


class StateFeed:
    def __init__(self, router_url: str, api_key: str, path: str = "/v1/ws/state", timeout_s: float = 10) -> None:
        self.url = router_url.rstrip("/") + path
        self.api_key = api_key
        self.timeout_s = timeout_s

    def push(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Store one state; returns ``{"kind", "id", "stored", "version", "subscribers"}``."""
        return self._post({"kind": kind, "payload": payload})["states"][0]

    def push_many(self, states: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Store several states in one request (in order); returns one result per state."""
        body = {"states": [{"kind": kind, "payload": payload} for kind, payload in states]}
        return self._post(body)["states"]

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                detail = json.loads(raw)
            except ValueError:
                detail = {"message": raw.decode(errors="replace")}
            raise FeedError(error.code, detail) from None
