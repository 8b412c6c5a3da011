"""The shard side of the baqend dialect: its state classes, stores and shard component."""
