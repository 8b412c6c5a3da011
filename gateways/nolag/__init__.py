"""NoLag: MessagePack pub/sub with QoS, filters, load balancing, presence, lobbies and replay."""
