"""Start, supervise and stop a router: shards, gateways, and (embedded) a local Ray.

Used by ``router serve`` and by the test suite, so both start the router the same way.

- Embedded (no Ray address): ``ray.init()`` starts a local Ray with token authentication on
  (Ray 2.60's default for new local clusters; the token is written to ``~/.ray/auth_token``).
- Cluster (``--address auto`` or ``host:port``): joins a running Ray. Shards are *detached*
  named actors, created by the first ``router serve`` and found (``get_if_exists``) by the others,
  so they outlive the process that created them; every ``router serve`` adds its own gateways
  (owned by it: they end with it). The last router to stop removes the shards; ``router stop``
  removes everything in the namespace.

The supervisor watches its own gateways; when one dies it tells every shard to forget the
gateway's connections and starts a replacement on the same ports (the ones the dead gateway had,
also where the configured port is 0, i.e. any; a fresh one only if that port was taken meanwhile).
Shards are restarted by Ray itself (``max_restarts=-1``), whichever router is alive; a shard also forgets a gateway whose lane
closed and whose actor is gone (``actors/shard.py``), so a router killed with its gateways
leaves nothing behind.

Placement on a cluster: gateways are pinned to one node (``ray_node``, else the node of this
driver); shards are dealt round the live nodes when they are created (a soft node affinity each),
so losing a node takes only its share of them, and Ray restarts those on the nodes left
(docs/cluster.md).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray._common.constants import HEAD_NODE_RESOURCE_NAME
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.shard import ShardActor
from gateways.dialects import shard_components
from gateways.gateway import GatewayActor
from router.settings import RouterSettings
from router.shardmap import GATEWAY_PREFIX, SHARD_SUFFIX, gateway_name, shard_name

logger = logging.getLogger(__name__)

# A local Ray's settings. Ray starts its workers at niceness 15, below everything else on the
# machine; the gateways and shards are the server, so they run at the normal priority
# (docs/performance.md). At 15, two busy processes beside the router made it start in 140 s
# instead of 17 s.
LOCAL_RAY_SYSTEM_CONFIG = {"worker_niceness": 0}


@dataclass
class GatewayRecord:
    index: int
    gateway_id: str
    actor: Any
    watch: Any
    info: dict[str, Any]


class Router:
    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.shards: dict[str, list[Any]] = {}
        self.gateways: list[GatewayRecord] = []
        self._owns_ray = False
        self.restarts = 0

    # -- start ----------------------------------------------------------------------------

    def start(self) -> list[dict[str, Any]]:
        self._connect_ray()
        self._start_shards()
        for index in range(self.settings.gateways):
            self.gateways.append(self._start_gateway(index))
        return [record.info for record in self.gateways]

    def _connect_ray(self) -> None:
        if ray.is_initialized():
            return
        settings = self.settings
        options: dict[str, Any] = {"namespace": settings.namespace, "logging_level": logging.WARNING}
        if settings.ray_address:
            ray.init(address=settings.ray_address, **options)
        else:
            # "local": always a new Ray on this machine, even if another one runs here.
            ray.init(address="local", include_dashboard=settings.ray_dashboard,
                     _system_config=LOCAL_RAY_SYSTEM_CONFIG, **options)
        self._owns_ray = True

    def _start_shards(self) -> None:
        settings = self.settings
        # Dealt round the live nodes in a fixed order (by name, then id), the shards of every kind in
        # turn; soft, so that a shard whose node is gone is restarted wherever Ray finds room. An
        # actor that asks for no resource at all is put where Ray likes, whatever its strategy (6 such
        # actors landed 1-3-2 on three nodes with a soft affinity, 0-4-2 with SPREAD): a one-byte
        # memory demand (logical, nothing is reserved) makes Ray follow the strategy (2-2-2 with both).
        nodes = sorted((node["NodeName"], node["NodeID"]) for node in ray.nodes() if node["Alive"])
        dealt = 0
        for kind, components in shard_components(settings).items():
            self.shards[kind] = []
            for index in range(getattr(settings.shards, kind)):
                node = NodeAffinitySchedulingStrategy(node_id=nodes[dealt % len(nodes)][1], soft=True)
                dealt += 1
                self.shards[kind].append(ShardActor.options(
                    name=shard_name(kind, index), namespace=settings.namespace, get_if_exists=True,
                    lifetime="detached", scheduling_strategy=node, memory=1,
                ).remote(kind, index, settings, components))
        # Fail here, not on the first message, if a shard cannot start.
        ray.get([shard.info.remote() for shards in self.shards.values() for shard in shards], timeout=120)

    def _gateway_node(self) -> str:
        """The node id the gateways are pinned to: ``ray_node`` (an id or a node name) or this
        driver's node. A gateway listens on its machine's ports, so it must not run elsewhere."""
        wanted = self.settings.ray_node
        if wanted is None:
            return ray.get_runtime_context().get_node_id()
        found = [node["NodeID"] for node in ray.nodes()
                 if node["Alive"] and wanted in (node["NodeID"], node["NodeName"])]
        if len(found) != 1:
            raise RuntimeError(f"ray_node = {wanted!r}: {len(found) or 'no'} live Ray nodes have that id or name")
        return found[0]

    def _start_gateway(self, index: int, previous_ports: list[int] | None = None) -> GatewayRecord:
        settings = self.settings
        base = settings.port or "any"
        gateway_id = f"{base}-{index}-{secrets.token_hex(3)}"
        here = NodeAffinitySchedulingStrategy(node_id=self._gateway_node(), soft=False)
        actor = GatewayActor.options(
            name=gateway_name(gateway_id), namespace=settings.namespace, scheduling_strategy=here
        ).remote(gateway_id, index, settings)
        info = ray.get(actor.start.remote(previous_ports), timeout=120)
        logger.info("gateway %s listening: %s", gateway_id, info["listeners"])
        return GatewayRecord(index, gateway_id, actor, actor.wait_stopped.remote(), info)

    # -- supervise ------------------------------------------------------------------------

    def supervise(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a gateway to die; replace any that did. False when
        the router was stopped from outside (``router stop`` removed the shards)."""
        watches = {record.watch: record for record in self.gateways}
        if not watches:
            time.sleep(timeout)
            return True
        ready, _ = ray.wait(list(watches), num_returns=1, timeout=timeout)
        for ref in ready:
            record = watches[ref]
            try:
                ray.get(ref)
                logger.warning("gateway %s was stopped from outside (router stop): stopping", record.gateway_id)
                return False
            except Exception as error:  # the actor died
                logger.warning("gateway %s died (%s); replacing it", record.gateway_id, type(error).__name__)
            if not self._shards_exist():
                logger.warning("the shards are gone (router stop): stopping")
                return False
            self.forget_gateway(record.gateway_id)
            # On the dead one's ports, ephemeral ones too: its clients reconnect where they were.
            replacement = self._start_gateway(record.index, [listener["port"] for listener in record.info["listeners"]])
            self.gateways[self.gateways.index(record)] = replacement
            self.restarts += 1
        return True

    def _shards_exist(self) -> bool:
        try:
            ray.get_actor(shard_name(next(iter(self.shards)), 0), namespace=self.settings.namespace)
        except (ValueError, StopIteration):
            return False
        return True

    def forget_gateway(self, gateway_id: str) -> None:
        """Every shard forgets the gateway's connections. A shard that fails the call (it is
        restarting) is left to itself: a restarted shard holds only what live gateways re-announce,
        and a running one purges a gateway whose lane closed and whose actor is gone."""
        refs = {shard.purge_gateway.remote(gateway_id): shard for shards in self.shards.values() for shard in shards}
        for ref in refs:
            try:
                ray.get(ref, timeout=30)
            except Exception as error:
                logger.warning("a shard did not purge gateway %s (%s)", gateway_id, type(error).__name__)

    # -- stop -----------------------------------------------------------------------------

    def stop(self, wait: bool = False) -> None:
        """Stop this router's gateways; the shards too if no other router's gateway is left.
        ``wait``: when this router started Ray, return only once Ray's processes have exited."""
        mine = {gateway_name(record.gateway_id) for record in self.gateways}
        for record in self.gateways:
            try:
                ray.get(record.actor.stop.remote(), timeout=10)
            except Exception:
                logger.warning("gateway %s did not stop cleanly", record.gateway_id)
            ray.kill(record.actor)
        self.gateways.clear()
        others = [name for name in _named(self.settings.namespace) if name.startswith(GATEWAY_PREFIX)
                  and name not in mine] if ray.is_initialized() and self.shards else []
        if others:
            logger.info("leaving the shards to the %d other gateway(s) in %r", len(others), self.settings.namespace)
        else:
            for shards in self.shards.values():
                for shard in shards:
                    ray.kill(shard, no_restart=True)
        self.shards.clear()
        if self._owns_ray:
            ray.shutdown(wait_for_processes=wait)
            self._owns_ray = False

    # -- observe --------------------------------------------------------------------------

    def endpoints(self) -> list[dict[str, Any]]:
        return [record.info for record in self.gateways]


def _named(namespace: str) -> list[str]:
    return sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                  if entry.get("namespace") == namespace)


def stop_everything(namespace: str) -> dict[str, int]:
    """``router stop``: every gateway (which makes their routers exit), then every shard, of the
    router in ``namespace`` on the connected cluster."""
    names = _named(namespace)
    gateways = [name for name in names if name.startswith(GATEWAY_PREFIX)]
    shards = [name for name in names if SHARD_SUFFIX in name]
    for name in shards:  # first: a supervisor that sees its gateway die then finds no shard and exits
        _kill(name, namespace)
    for name in gateways:
        try:
            ray.get(ray.get_actor(name, namespace=namespace).stop.remote(), timeout=10)
        except Exception:
            logger.warning("%s did not stop cleanly", name)
        _kill(name, namespace)
    return {"gateways": len(gateways), "shards": len(shards)}


def _kill(name: str, namespace: str) -> None:
    try:
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    except ValueError:
        pass  # gone already


# `router status` waits this long for the gateways and shards to answer; one that does not (a shard
# Ray is restarting after its node was lost) is listed with its Ray state instead.
STATUS_TIMEOUT_S = 10.0


def cluster_status(namespace: str, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, Any]:
    """The router in ``namespace`` on the connected Ray cluster: its nodes (each with its gateways
    and shards), every gateway's stats and shard's info with the node it runs on and its Ray state,
    and the lanes by kind (``unix`` within a node, ``tcp`` between nodes), counted by the shards."""
    actors: dict[str, Any] = {}
    for name in _named(namespace):
        if name.startswith(GATEWAY_PREFIX) or SHARD_SUFFIX in name:
            try:
                actors[name] = ray.get_actor(name, namespace=namespace)
            except ValueError:
                continue  # gone meanwhile
    refs = {name: (actor.stats if name.startswith(GATEWAY_PREFIX) else actor.info).remote()
            for name, actor in actors.items()}
    if refs:
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    gateways, shards = [], []
    for name, ref in refs.items():
        # The GCS's actor table (a debugging API, and the one that has every actor's node without
        # the dashboard): where the actor runs now, and whether it is alive or restarting.
        placed = ray._private.state.actors(actors[name]._actor_id.hex())
        entry = {"name": name, "state": placed.get("State"), "node": placed.get("Address", {}).get("NodeID")}
        if SHARD_SUFFIX in name:
            entry["kind"] = name.split(SHARD_SUFFIX)[0]
        try:
            entry.update(ray.get(ref, timeout=0))
        except Exception as error:  # no answer in time, or the actor died
            entry["error"] = type(error).__name__
        (gateways if name.startswith(GATEWAY_PREFIX) else shards).append(entry)
    lanes = {"unix": 0, "tcp": 0}
    for shard in shards:
        for kind in (shard.get("lane_kinds") or {}).values():
            lanes[kind] += 1
    nodes = []
    for node in ray.nodes():
        node_id = node["NodeID"]
        nodes.append({
            "id": node_id, "name": node["NodeName"], "address": node["NodeManagerAddress"], "alive": node["Alive"],
            "head": HEAD_NODE_RESOURCE_NAME in node.get("Resources", {}),
            "gateways": [g.get("gateway", g["name"]) for g in gateways if g["node"] == node_id],
            "shards": sorted(s["name"] for s in shards if s["node"] == node_id),
        })
    return {"namespace": namespace, "nodes": nodes, "gateways": gateways, "shards": shards, "lanes": lanes}


def store_status(settings: RouterSettings) -> dict[str, Any]:
    """Where the durable state lives, as seen from this process: PostgreSQL (reachable, its version,
    the pool) or the SQLite files under ``data_dir`` (each node's own)."""
    url = settings.store.postgres
    if url is None:
        folder = Path(settings.data_dir)
        files = {path.name: path.stat().st_size for path in sorted(folder.glob("*.sqlite3"))}
        return {"backend": "sqlite", "data_dir": str(folder), "ok": folder.is_dir(), "files": files}
    from router import postgres

    try:
        return {"backend": "postgresql", "url": postgres.redact(url), **postgres.health(postgres.pool_of(settings.store))}
    except postgres.StoreUnavailable as error:
        return {"backend": "postgresql", "url": postgres.redact(url), "ok": False, "error": str(error)}
    finally:
        postgres.close_all()
