"""The shard side of the cashu dialect: its state classes, stores and shard component."""
