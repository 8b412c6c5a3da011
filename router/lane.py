"""Lanes: the data plane between gateways and shards (and from shard to shard, for Baqend).

A Ray actor call costs about 0.5 ms of CPU on each side on a 2-core machine and tops out near
2,000 calls/s per caller (``docs/performance.md``). Batching hides that under load, but at a
modest steady rate every message is its own batch and pays it in full. So the commands and
deliveries travel over *lanes* instead: one persistent stream per (gateway, shard), a Unix socket
when both are on one node, TLS over TCP otherwise. Ray still owns the actors (placement, naming,
restarts) and is the control plane: a gateway asks a shard for its lane with an ordinary Ray call
(``open_lane``), which authenticates it through Ray's token and hands it the shard's secret and,
for TCP, the shard's self-signed certificate to pin.

Frames are a 4-byte big-endian length and a body. The secret never crosses the lane; both ends
prove they know it (HMAC-SHA256 over fresh nonces from both sides, so a recorded exchange cannot
be replayed and neither proof can be reflected as the other):

1. shard → gateway: a 32-byte random nonce;
2. gateway → shard: its own nonce, ``HMAC(secret, "gateway" | shard nonce | gateway nonce | id)``
   and its id;
3. shard → gateway: ``HMAC(secret, "shard" | shard nonce | gateway nonce | id)``.

Until then frames are at most :data:`PREAUTH_FRAME_BYTES`, a peer has :data:`HELLO_TIMEOUT_S`
to say hello, and nothing is unpickled on either side: pickle runs code, so only a peer that
knows the secret gets to send one. After it, gateway → shard frames are a pickled command batch;
shard → gateway frames are pickled ``(REPLY, results, bundle)`` in batch order, or
``(PUSH, bundle)`` for deliveries that other gateways' batches produced. One stream carries both,
in order.

Lanes also run from shard to shard: a Baqend document shard hands every batch's writes to every
query shard and waits until each has applied them (``docs/baqend.md``), and a Ray call each way
per batch cost more than the matching itself. The calling shard is then just another peer of the
query shard's :class:`LaneServer` (its shard name where a gateway puts its id; it never gets
deliveries), and it uses a :class:`BlockingLane`: its batch runs synchronously, holding its lock.

:class:`LaneServer` runs its own asyncio event loop in a thread of the shard process and calls
``execute(gateway_id, commands)`` for every batch; :class:`LaneClient` is an asyncio protocol on
the gateway's loop; :class:`BlockingLane` is a blocking socket for a synchronous caller (a shard).
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import logging
import os
import pickle
import secrets
import socket
import ssl
import struct
import tempfile
import threading
import time
from collections import deque
from typing import Any, Callable

from router.proc import new_event_loop

logger = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
SECRET_BYTES = 32
NONCE_BYTES = 32
MAC_BYTES = 32  # HMAC-SHA256
MAX_FRAME_BYTES = 1 << 28  # a batch is bounded by batch_max commands; this only stops a broken peer
# Before both ends proved they know the secret a frame is a nonce, a hello (nonce, MAC and a
# gateway id of up to 448 bytes) or a proof: a larger announced length closes the lane at once.
PREAUTH_FRAME_BYTES = 512
# A peer must complete the hello (and on TCP the TLS handshake before it) within this long.
HELLO_TIMEOUT_S = 5.0
REPLY, PUSH = 0, 1
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class LaneError(Exception):
    """The peer broke the framing or the hello."""


def encode(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=_PROTOCOL)
    return HEADER.pack(len(body)) + body


def _frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def _mac(secret: bytes, side: bytes, shard_nonce: bytes, gateway_nonce: bytes, gateway_id: bytes) -> bytes:
    """One side's proof; the nonces have a fixed length, so the concatenation is unambiguous."""
    return hmac.digest(secret, side + shard_nonce + gateway_nonce + gateway_id, "sha256")


def _hello(secret: bytes, gateway_id: bytes, challenge: bytes) -> tuple[tuple[bytes, bytes], bytes]:
    """The caller's answer to the shard's challenge: both nonces, and the hello frame to send."""
    if len(challenge) != NONCE_BYTES:
        raise LaneError("the shard's challenge is malformed")
    nonces = (challenge, secrets.token_bytes(NONCE_BYTES))
    return nonces, _frame(nonces[1] + _mac(secret, b"gateway", *nonces, gateway_id) + gateway_id)


def _check_proof(secret: bytes, nonces: tuple[bytes, bytes], gateway_id: bytes, proof: bytes) -> None:
    """Raise unless the shard's last hello frame proves it knows the secret."""
    if not hmac.compare_digest(proof, _mac(secret, b"shard", *nonces, gateway_id)):
        raise LaneError("the shard did not prove it knows the lane's secret")


class FrameReader:
    """Splits a byte stream into frame bodies, refusing a frame over ``limit`` from its header."""

    __slots__ = ("buffer", "limit")

    def __init__(self, limit: int = MAX_FRAME_BYTES) -> None:
        self.buffer = bytearray()
        self.limit = limit

    def feed(self, data: bytes, most: int = 0) -> list[bytes]:
        """The complete frames so far; at most ``most`` of them if set (the rest stay buffered,
        for a caller that changes ``limit`` between frames)."""
        buffer = self.buffer
        buffer += data
        frames = []
        position, size = 0, len(buffer)
        while size - position >= 4:
            (length,) = HEADER.unpack_from(buffer, position)
            if length > self.limit:
                raise LaneError(f"frame of {length} bytes exceeds {self.limit}")
            end = position + 4 + length
            if end > size:
                break
            frames.append(bytes(buffer[position + 4:end]))
            position = end
            if len(frames) == most:
                break
        if position:
            del buffer[:position]
        return frames


def _certificate(name: str) -> tuple[ssl.SSLContext, str]:
    """A fresh self-signed certificate for one shard's TCP lanes: its server context and the PEM
    that ``open_lane`` hands to gateways to pin. The key never leaves this process (it is on disk
    only for the moment ``load_cert_chain`` needs a file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"router lane {name}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=3650))  # lives as long as the shard process
                   .sign(key, hashes.SHA256()))
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory() as directory:  # mode 0700
        cert_path, key_path = os.path.join(directory, "lane.pem"), os.path.join(directory, "lane.key")
        with open(cert_path, "w") as file:
            file.write(pem)
        with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
        context.load_cert_chain(cert_path, key_path)
    return context, pem


def _pinned(certificate: str) -> ssl.SSLContext:
    """A client context that trusts exactly the shard's own certificate (no names: it is pinned)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.load_verify_locations(cadata=certificate)
    return context


# -- the shard's side ----------------------------------------------------------------------------

Execute = Callable[[str, list], tuple]


class _ServerLane(asyncio.Protocol):
    def __init__(self, server: "LaneServer") -> None:
        self.server = server
        self.reader = FrameReader(PREAUTH_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None
        self.gateway_id: str | None = None
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.deadline: asyncio.TimerHandle | None = None
        self.kind = "tcp"  # or "unix": what `router status` counts

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            self.kind = "unix"
        self.transport.write(_frame(self.nonce))
        self.deadline = self.server._loop.call_later(self.server.hello_timeout_s, self._refuse, "no hello in time")

    def _refuse(self, reason: str) -> None:
        if self.transport.is_closing():
            return
        self.server.refused += 1
        logger.warning("lane peer %s refused: %s", self.transport.get_extra_info("peername") or "(local)", reason)
        self.transport.close()

    def _hello(self, body: bytes) -> bool:
        """Check the gateway's proof, answer with the shard's; False (and closed) if it is wrong."""
        server = self.server
        gateway_nonce, mac = body[:NONCE_BYTES], body[NONCE_BYTES:NONCE_BYTES + MAC_BYTES]
        gateway_id = body[NONCE_BYTES + MAC_BYTES:]
        expected = _mac(server.secret, b"gateway", self.nonce, gateway_nonce, gateway_id)
        if not gateway_id or not hmac.compare_digest(mac, expected):
            self._refuse("wrong hello")
            return False
        self.deadline.cancel()
        self.transport.write(_frame(_mac(server.secret, b"shard", self.nonce, gateway_nonce, gateway_id)))
        self.reader.limit = MAX_FRAME_BYTES
        self.gateway_id = gateway_id.decode("utf-8", "replace")
        server.attach(self.gateway_id, self)
        return True

    def data_received(self, data: bytes) -> None:
        if self.gateway_id is None:
            if self.transport.is_closing():
                return
            try:
                frames = self.reader.feed(data, 1)
            except LaneError as error:
                self._refuse(str(error))
                return
            if not frames or not self._hello(frames[0]):
                return
            data = b""
        try:
            frames = self.reader.feed(data)
        except LaneError as error:
            logger.warning("lane from %s: %s; closing", self.gateway_id, error)
            self.transport.close()
            return
        out = []
        server = self.server
        for body in frames:
            try:
                results, bundle = server.execute(self.gateway_id, pickle.loads(body))
                out.append(encode((REPLY, results, bundle)))
            except Exception:  # the execute callback answers every command; this is a bug
                logger.exception("lane batch from %s failed", self.gateway_id)
                self.transport.close()
                return
        if out:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        if self.gateway_id is not None:
            self.server.detach(self.gateway_id, self)


class LaneServer:
    """A shard's lane endpoint: its own event loop in a daemon thread.

    ``execute(gateway_id, commands) -> (results, bundle)`` runs on that thread; the shard must
    serialise it with anything else that touches its state (its Ray methods run on the main thread).
    ``refused`` counts the peers it closed for a wrong, late or oversized hello.
    """

    def __init__(self, name: str, execute: Execute) -> None:
        self.name = name
        self.execute = execute
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self.certificate: str | None = None  # PEM of the TCP listener's certificate, once it listens
        self.hello_timeout_s = HELLO_TIMEOUT_S
        self.refused = 0
        self.on_detach: Callable[[str], None] | None = None  # a gateway's lane closed (on the lane thread)
        self._lanes: dict[str, _ServerLane] = {}
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"lane-{name}", daemon=True)
        self._thread.start()
        self._unix_path: str | None = None
        self._tcp: tuple[str, int] | None = None
        self._servers: list[asyncio.AbstractServer] = []

    def _run(self, coroutine: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def unix_address(self) -> str:
        """A Unix socket for gateways on this node (Linux: abstract, nothing on disk)."""
        if self._unix_path is None:
            path = f"\0router-lane-{os.getpid()}-{secrets.token_hex(6)}"
            if not hasattr(socket, "AF_UNIX") or not os.uname().sysname == "Linux":
                import tempfile

                path = os.path.join(tempfile.gettempdir(), path[1:] + ".sock")
            self._servers.append(self._run(self._loop.create_unix_server(lambda: _ServerLane(self), path)))
            self._unix_path = path
        return self._unix_path

    def tcp_address(self, host: str) -> tuple[str, int]:
        """A TLS listener on ``host`` (an ephemeral port) for gateways on other nodes; gateways pin
        :attr:`certificate`, made for it here."""
        if self._tcp is None:
            context, self.certificate = _certificate(self.name)
            server = self._run(self._loop.create_server(lambda: _ServerLane(self), host, 0, ssl=context,
                                                        ssl_handshake_timeout=self.hello_timeout_s))
            self._servers.append(server)
            self._tcp = (host, server.sockets[0].getsockname()[1])
        return self._tcp

    # -- lanes of connected gateways (called on the lane thread) ---------------------------

    def attach(self, gateway_id: str, lane: _ServerLane) -> None:
        old = self._lanes.get(gateway_id)
        self._lanes[gateway_id] = lane
        if old is not None and old is not lane and old.transport is not None:
            old.transport.close()

    def detach(self, gateway_id: str, lane: _ServerLane) -> None:
        if self._lanes.get(gateway_id) is lane:
            del self._lanes[gateway_id]
            if self.on_detach is not None:
                self.on_detach(gateway_id)

    def connected(self) -> list[str]:
        return list(self._lanes)

    def kinds(self) -> dict[str, str]:
        """Each connected gateway's lane kind: ``unix`` (same node) or ``tcp`` (TLS, another node)."""
        return {gateway_id: lane.kind for gateway_id, lane in list(self._lanes.items())}

    def push(self, gateway_id: str, bundle: tuple) -> bool:
        """Send deliveries to a gateway over its lane, from any thread; False if it has none."""
        lane = self._lanes.get(gateway_id)
        if lane is None or lane.transport is None or lane.transport.is_closing():
            return False
        data = encode((PUSH, bundle))
        if threading.get_ident() == self._thread.ident:
            lane.transport.write(data)
        else:
            self._loop.call_soon_threadsafe(_write_if_open, lane, data)
        return True

    def drop(self, gateway_id: str) -> None:
        """Forget a gateway (it is gone): close its lane."""
        lane = self._lanes.get(gateway_id)
        if lane is not None and lane.transport is not None:
            self._loop.call_soon_threadsafe(lane.transport.close)

    def close(self) -> None:
        def stop() -> None:
            for server in self._servers:
                server.close()
            for lane in list(self._lanes.values()):
                if lane.transport is not None:
                    lane.transport.close()
            self._loop.call_soon(self._loop.stop)

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(stop)
            self._thread.join(5)


def _write_if_open(lane: _ServerLane, data: bytes) -> None:
    if lane.transport is not None and not lane.transport.is_closing():
        lane.transport.write(data)


# -- the gateway's side --------------------------------------------------------------------------

class LaneClient(asyncio.Protocol):
    """A gateway's end of one lane. Replies come back in the order batches were sent: the caller
    keeps its batches in a FIFO and ``on_reply`` takes the oldest. :func:`connect` makes it and
    returns it once the shard has proven it knows the secret; ``on_lost`` is called only for a
    lane that got that far."""

    def __init__(self, on_reply: Callable[[Any, Any], None], on_push: Callable[[tuple], None],
                 on_lost: Callable[["LaneClient", Exception | None], None]) -> None:
        self.on_reply = on_reply
        self.on_push = on_push
        self.on_lost = on_lost
        self.reader = FrameReader(PREAUTH_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.batches = 0
        # Until the shard's proof: the secret, our id, the ready future, and both nonces once known.
        self._secret = b""
        self._gateway_id = b""
        self._ready: asyncio.Future | None = None
        self._nonces: tuple[bytes, bytes] | None = None

    def expect(self, secret: bytes, gateway_id: str, ready: asyncio.Future) -> None:
        """What the hello needs; ``ready`` resolves once the shard has proven itself (set by
        :func:`connect` before the first byte can arrive)."""
        self._secret, self._gateway_id, self._ready = secret, gateway_id.encode(), ready

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, commands: list) -> None:
        """Send one batch (raises if it cannot be pickled or the lane is closed)."""
        if not self.open:
            raise ConnectionError("lane closed")
        self.transport.write(encode(commands))
        self.batches += 1

    def _handshake(self, body: bytes) -> None:
        """The shard's challenge (answered with our hello), then its proof (the lane opens)."""
        if self._nonces is None:
            self._nonces, hello = _hello(self._secret, self._gateway_id, body)
            self.transport.write(hello)
            return
        _check_proof(self._secret, self._nonces, self._gateway_id, body)
        ready, self._ready, self._secret = self._ready, None, b""
        self.reader.limit = MAX_FRAME_BYTES
        self.open = True
        if not ready.done():
            ready.set_result(None)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        try:
            while self._ready is not None:  # the handshake: one small frame at a time
                frames = reader.feed(data, 1)
                data = b""
                if not frames:
                    return
                self._handshake(frames[0])
            frames = reader.feed(data)
        except LaneError as error:
            logger.error("lane: %s; closing", error)
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(error)
            self.transport.close()
            return
        for body in frames:
            message = pickle.loads(body)
            if message[0] == REPLY:
                self.on_reply(message[1], message[2])
            else:
                self.on_push(message[1])

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ready is not None:
            if not self._ready.done():
                self._ready.set_exception(LaneError(f"closed by the shard during the hello ({exc or 'no error'})"))
            return
        self.open = False
        self.on_lost(self, exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(loop: asyncio.AbstractEventLoop, address: tuple, gateway_id: str,
                  factory: Callable[[], LaneClient], timeout_s: float = HELLO_TIMEOUT_S) -> LaneClient:
    """Open a lane to ``address`` (as ``open_lane`` returned it) and complete the hello; raises
    :class:`LaneError` if the shard does not prove it knows the secret."""
    kind = address[0]
    ready = loop.create_future()

    def protocol() -> LaneClient:
        lane = factory()
        lane.expect(address[3 if kind == "tcp" else 2], gateway_id, ready)
        return lane

    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address[1])  # uvloop refuses abstract paths itself
        except BaseException:
            sock.close()
            raise
        _, lane = await loop.create_unix_connection(protocol, sock=sock)
    elif kind == "tcp":
        _, lane = await loop.create_connection(protocol, address[1], address[2], ssl=_pinned(address[4]),
                                               ssl_handshake_timeout=timeout_s)
    else:
        raise ValueError(f"unknown lane address kind {kind!r}")
    try:
        await asyncio.wait_for(ready, timeout_s)
    except BaseException:
        lane.close()
        raise
    if not lane.open:
        raise ConnectionError("lane closed as it opened")
    return lane


# -- a synchronous caller's side (a shard calling another shard) ---------------------------------

RECEIVE_BYTES = 1 << 16


class BlockingLane:
    """One lane as a synchronous caller uses it: a shard calling another shard in the middle of its
    own batch, holding its lock, with no event loop to hand a reply to. Plain blocking sockets (a
    Unix socket, or TLS pinned to the shard's certificate with ``TCP_NODELAY``); the same hello as
    a gateway's, the caller's id where a gateway puts its own.

    :meth:`send` a batch, then :meth:`receive` its reply. A reply that has not come by its deadline
    is still owed: the stream is intact (whatever part of a frame was read stays buffered) and the
    batch may yet run, so the lane stays open and the next :meth:`receive` reads that reply and
    drops it before the one it wants. Batches thus run in the order they were sent, and a late
    reply is never taken for a later batch's. Any other error (the shard closed the lane, its
    process died, a malformed frame, a send that failed or did not complete) closes the lane for
    good: what is left in the stream is unknown, and the caller opens a new one.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader(PREAUTH_FRAME_BYTES)
        self.owed = 0  # batches sent whose reply has not been read yet
        self.pushes = 0  # deliveries the shard pushed to this caller (dropped: see receive)
        self.closed = False
        self._frames: deque[bytes] = deque()

    @classmethod
    def connect(cls, address: tuple, caller_id: str, timeout_s: float = HELLO_TIMEOUT_S) -> "BlockingLane":
        """Open a lane to ``address`` (as ``open_lane`` returned it) and complete the hello within
        ``timeout_s``; raises :class:`LaneError` if the shard refuses it or does not prove it knows
        the secret, ``TimeoutError`` or another ``OSError`` if it cannot be reached in time."""
        deadline = time.monotonic() + timeout_s
        kind = address[0]
        if kind == "unix":
            secret = address[2]
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(address[1])
            except BaseException:
                sock.close()
                raise
        elif kind == "tcp":
            secret = address[3]
            raw = socket.create_connection((address[1], address[2]), timeout=timeout_s)
            try:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                raw.settimeout(max(0.001, deadline - time.monotonic()))
                sock = _pinned(address[4]).wrap_socket(raw)  # the TLS handshake, within that timeout
            except BaseException:
                raw.close()
                raise
        else:
            raise ValueError(f"unknown lane address kind {kind!r}")
        lane = cls(sock)
        ident = caller_id.encode()
        try:
            try:
                nonces, hello = _hello(secret, ident, lane._next(deadline))
                lane._write(hello, deadline)
                _check_proof(secret, nonces, ident, lane._next(deadline))
            except (ConnectionError, ssl.SSLError) as error:  # a wrong secret: the shard hangs up
                raise LaneError(f"closed by the shard during the hello ({error})") from error
        except BaseException:
            lane.close()
            raise
        lane.reader.limit = MAX_FRAME_BYTES
        return lane

    def send(self, commands: list, deadline: float | None = None, encoded: bytes | None = None) -> None:
        """Send one batch; :meth:`receive` returns its reply. Raises ``ConnectionError`` if the
        lane is closed; a send that fails or is not done by ``deadline`` (default
        :data:`HELLO_TIMEOUT_S` from now) closes it (part of the frame may have gone).
        ``encoded``: the batch already framed by :func:`encode` (one batch sent on several lanes)."""
        if self.closed:
            raise ConnectionError("lane closed")
        data = encode(commands) if encoded is None else encoded  # unpicklable: raises, the lane intact
        if deadline is None:
            deadline = time.monotonic() + HELLO_TIMEOUT_S
        elif deadline <= time.monotonic():
            raise TimeoutError("no time left to send the batch")  # nothing sent: the lane is intact
        try:
            self._write(data, deadline)
        except BaseException:
            self.close()
            raise
        self.owed += 1

    def receive(self, deadline: float) -> tuple[list, Any]:
        """``(results, bundle)`` of the last batch sent, by ``deadline`` (``time.monotonic()``).
        Replies still owed to batches sent before it (whose :meth:`receive` timed out) are read
        and dropped first. Raises ``TimeoutError`` at the deadline (the lane stays open, the reply
        owed); any other error closes the lane and raises."""
        if self.closed:
            raise ConnectionError("lane closed")
        if not self.owed:
            raise ValueError("no batch awaits a reply")
        try:
            while True:
                message = pickle.loads(self._next(deadline))
                if message[0] == PUSH:
                    # A shard delivers to gateways; a shard that calls it holds no connection, so
                    # no component routes a delivery to it and a bundle here has nowhere to go.
                    # Dropping it keeps the stream in step: the reply is still to come.
                    self.pushes += 1
                    logger.warning("lane: a delivery bundle pushed to a shard caller was dropped")
                    continue
                self.owed -= 1
                if not self.owed:
                    return message[1], message[2]
        except TimeoutError:
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass

    def _write(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(max(0.001, deadline - time.monotonic()))
        self.sock.sendall(data)  # the timeout bounds the whole call

    def _next(self, deadline: float) -> bytes:
        """The next frame's body (during the hello one small frame at a time, as the limit changes
        after it); ``TimeoutError`` at the deadline keeps whatever was read."""
        frames, reader = self._frames, self.reader
        most = 1 if reader.limit == PREAUTH_FRAME_BYTES else 0
        data, looked = b"", False
        while True:
            if not frames:
                frames.extend(reader.feed(data, most))  # first: what is already buffered
            if frames:
                return frames.popleft()
            remaining = deadline - time.monotonic()
            if remaining <= 0 and looked:
                raise TimeoutError("no answer from the shard in time")
            # Past the deadline it still looks once: a caller reading several lanes in turn after
            # one of them took all the time finds the replies the others sent meanwhile.
            looked = True
            self.sock.settimeout(max(remaining, 0.0001))
            data = self.sock.recv(RECEIVE_BYTES)  # socket timeouts raise TimeoutError
            if not data:
                raise ConnectionError("the shard closed the lane")
