"""The shard side of the nolag dialect: its state classes, stores and shard component."""
