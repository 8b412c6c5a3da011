"""mx-notifier hub dialect: MultiversX node events in, filtered protobuf event streams out."""
