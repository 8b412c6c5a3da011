"""Cashu NUT-17 WebSocket subscriptions (`cashu-nut17-websockets.md`)."""
