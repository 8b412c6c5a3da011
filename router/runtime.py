"""Start, supervise and stop a router: shards, gateways, and (embedded) a local Ray.

Used by ``router serve`` and by the test suite, so both start the router the same way.

- Embedded (no Ray address): ``ray.init()`` starts a local Ray with token authentication on
  (Ray 2.60's default for new local clusters; the token is written to ``~/.ray/auth_token``).
- Cluster (``--address auto`` or ``host:port``): joins a running Ray. Shards are named actors
  created if missing (``get_if_exists``) and owned by the driver that created them, so start the
  router that owns them first and stop it last; every ``router serve`` adds its own gateways.

The supervisor watches each gateway; when one dies it tells every shard to forget the gateway's
connections and starts a replacement on the same ports.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import ray
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
        for kind, components in shard_components(settings).items():
            self.shards[kind] = [
                ShardActor.options(
                    name=shard_name(kind, index), namespace=settings.namespace, get_if_exists=True
                ).remote(kind, index, settings, components)
                for index in range(getattr(settings.shards, kind))
            ]
        # Fail here, not on the first message, if a shard cannot start.
        ray.get([shard.info.remote() for shards in self.shards.values() for shard in shards], timeout=120)

    def _start_gateway(self, index: int) -> GatewayRecord:
        settings = self.settings
        base = settings.port or "any"
        gateway_id = f"{base}-{index}-{secrets.token_hex(3)}"
        # A gateway listens on this machine's ports: pin it to the node this supervisor runs on.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        actor = GatewayActor.options(
            name=gateway_name(gateway_id), namespace=settings.namespace, scheduling_strategy=here
        ).remote(gateway_id, index, settings)
        info = ray.get(actor.start.remote(), timeout=120)
        logger.info("gateway %s listening: %s", gateway_id, info["listeners"])
        return GatewayRecord(index, gateway_id, actor, actor.wait_stopped.remote(), info)

    # -- supervise ------------------------------------------------------------------------

    def supervise(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a gateway to die; replace any that did."""
        watches = {record.watch: record for record in self.gateways}
        if not watches:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(list(watches), num_returns=1, timeout=timeout)
        for ref in ready:
            record = watches[ref]
            try:
                ray.get(ref)
                continue  # stopped on purpose
            except Exception as error:  # the actor died
                logger.warning("gateway %s died (%s); replacing it", record.gateway_id, type(error).__name__)
            self.forget_gateway(record.gateway_id)
            replacement = self._start_gateway(record.index)
            self.gateways[self.gateways.index(record)] = replacement
            self.restarts += 1

    def forget_gateway(self, gateway_id: str) -> None:
        refs = [shard.purge_gateway.remote(gateway_id) for shards in self.shards.values() for shard in shards]
        ray.get(refs, timeout=30)

    # -- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        for record in self.gateways:
            try:
                ray.get(record.actor.stop.remote(), timeout=10)
            except Exception:
                logger.warning("gateway %s did not stop cleanly", record.gateway_id)
            ray.kill(record.actor)
        self.gateways.clear()
        for shards in self.shards.values():
            for shard in shards:
                ray.kill(shard)
        self.shards.clear()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    # -- observe --------------------------------------------------------------------------

    def endpoints(self) -> list[dict[str, Any]]:
        return [record.info for record in self.gateways]


def cluster_status(namespace: str) -> dict[str, Any]:
    """Gateways and shards of the router in ``namespace`` on the connected Ray cluster."""
    names = sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                   if entry.get("namespace") == namespace)
    gateways, shards = [], []
    for name in names:
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            continue
        if name.startswith(GATEWAY_PREFIX):
            gateways.append(actor.stats.remote())
        elif SHARD_SUFFIX in name:
            shards.append(actor.info.remote())
    return {
        "namespace": namespace,
        "gateways": ray.get(gateways, timeout=30),
        "shards": ray.get(shards, timeout=30),
    }
