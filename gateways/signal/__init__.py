"""Signal Hub dialect (signal-hub-protocol.md)."""
