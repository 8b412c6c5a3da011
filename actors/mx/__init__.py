"""The shard side of the mx dialect: its state classes, stores and shard component."""
