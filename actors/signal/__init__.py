"""The shard side of the signal dialect: its state classes, stores and shard component."""
