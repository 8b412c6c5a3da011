"""State owners. Each actor kind is a plain class (tested without Ray) plus a thin Ray wrapper.

A *location* is ``(gateway_id, connection_id)``: where a connection lives. Shards keep locations,
never sockets; gateways resolve them.
"""
