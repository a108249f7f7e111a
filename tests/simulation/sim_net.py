"""A simulated network of named nodes: in-memory stream connections with random delays.

Each connection is a pair of ``SimTransport`` s. Bytes arrive in order on a connection
(TCP), each write after a random delay; different connections interleave freely. A link
between two nodes can be *cut* (nothing passes either way: writes are held, as on a
network that drops packets, and new connections hang) and healed (held bytes arrive).
A node that goes down resets its connections: both ends see the connection lost.
Everything is driven by the loop's (virtual) clock and the world's seeded generator.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable


class SimTransport(asyncio.Transport):
    def __init__(self, net: SimNetwork, node: str, peer_node: str, peer_address: str) -> None:
        super().__init__()
        self._net = net
        self.node = node
        self.peer_node = peer_node
        self._peer_address = peer_address
        self.peer: SimTransport | None = None
        self.protocol: asyncio.BaseProtocol | None = None
        self._closing = False
        self._lost = False
        self._paused = False
        self._inbox: list[bytes] = []  # arrived while reading is paused
        self._last_arrival = 0.0  # keeps the byte stream in order

    # --- asyncio.Transport -------------------------------------------------------------

    def get_extra_info(self, name, default=None):
        if name == "peername":
            host, _, port = self._peer_address.rpartition(":")
            return (host, int(port) if port.isdigit() else 0)
        return default

    def is_closing(self) -> bool:
        return self._closing

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        inbox, self._inbox = self._inbox, []
        for data in inbox:
            self._receive(data)

    def is_reading(self) -> bool:
        return not self._paused

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def get_protocol(self):
        return self.protocol

    def write(self, data) -> None:
        if self._closing or not data:
            return
        assert self.peer is not None
        self._net.carry(self, self.peer, bytes(data))

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._net.closed(self)

    def abort(self) -> None:
        self.close()

    # --- the network's side ------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        if self._lost:
            return
        if self._paused:
            self._inbox.append(data)
            return
        assert self.protocol is not None
        self.protocol.data_received(data)  # type: ignore[attr-defined]

    def _lose(self) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self._net.connections.pop(self, None)
        if self.protocol is not None:
            self.protocol.connection_lost(None)


Listener = Callable[[], asyncio.BaseProtocol]


class SimNetwork:
    def __init__(self, rng: random.Random, trace: Callable[[str], None]) -> None:
        self.rng = rng
        self._trace = trace
        self.listeners: dict[str, tuple[str, Listener]] = {}  # address -> (node, factory)
        self.down: set[str] = set()
        self.cuts: set[frozenset[str]] = set()
        self.connections: dict[SimTransport, None] = {}  # ordered: deterministic resets
        self._held: list[tuple[SimTransport, SimTransport, bytes]] = []
        self.max_delay = 0.002

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def delay(self) -> float:
        return self.rng.uniform(0.00005, self.max_delay)

    # --- topology ---------------------------------------------------------------------

    def listen(self, node: str, address: str, factory: Listener) -> None:
        self.listeners[address] = (node, factory)

    def cut(self, a: str, b: str) -> None:
        self._trace(f"cut {a} <-> {b}")
        self.cuts.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self._trace(f"heal {a} <-> {b}")
        self.cuts.discard(frozenset((a, b)))
        held, self._held = self._held, []
        for src, dst, data in held:
            self.carry(src, dst, data)

    def is_cut(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.cuts

    def node_down(self, node: str) -> None:
        """Crash: every connection of the node is reset."""
        self.down.add(node)
        for t in list(self.connections):
            if t.node == node or t.peer_node == node:
                self.loop.call_soon(t._lose)
        self._held = [h for h in self._held if node not in (h[0].node, h[1].node)]

    def node_up(self, node: str) -> None:
        self.down.discard(node)

    # --- connections ------------------------------------------------------------------

    async def open_connection(
        self, node: str, address: str, protocol_factory: Callable[[], asyncio.BaseProtocol]
    ) -> tuple[SimTransport, asyncio.BaseProtocol]:
        """Connect ``node`` to ``address``; (our transport, our protocol)."""
        await asyncio.sleep(self.delay())
        target = self.listeners.get(address)
        if target is None or target[0] in self.down or node in self.down:
            raise ConnectionRefusedError(111, f"connection to {address} refused")
        peer_node, factory = target
        while self.is_cut(node, peer_node):  # a SYN that never arrives: callers time out
            await asyncio.sleep(0.1)
            if peer_node in self.down:
                raise ConnectionRefusedError(111, f"connection to {address} refused")
        ours = SimTransport(self, node, peer_node, address)
        theirs = SimTransport(self, peer_node, node, f"{node}:0")
        ours.peer, theirs.peer = theirs, ours
        protocol = protocol_factory()
        ours.protocol = protocol
        theirs.protocol = factory()
        self.connections[ours] = None
        self.connections[theirs] = None
        theirs.protocol.connection_made(theirs)
        protocol.connection_made(ours)
        return ours, protocol

    def carry(self, src: SimTransport, dst: SimTransport, data: bytes) -> None:
        if src.node in self.down or dst._lost:
            return
        if self.is_cut(src.node, dst.node):
            self._held.append((src, dst, data))
            return
        # Strictly later than the previous arrival: timers due at the same instant may run
        # in any order, and a byte stream must not be reordered.
        arrival = max(self.loop.time() + self.delay(), dst._last_arrival + 1e-7)
        dst._last_arrival = arrival
        self.loop.call_at(arrival, dst._receive, data)

    def closed(self, t: SimTransport) -> None:
        """One end closed: both ends see the connection lost, after what is in flight."""
        peer = t.peer
        at = max(self.loop.time(), peer._last_arrival if peer else 0.0) + self.delay()
        self.loop.call_at(at, t._lose)
        if peer is not None:
            self.loop.call_at(at, peer._lose)


async def open_stream(
    net: SimNetwork, node: str, host: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` over the simulated network."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**16, loop=loop)
    transport, protocol = await net.open_connection(
        node, f"{host}:{port}", lambda: asyncio.StreamReaderProtocol(reader, loop=loop)
    )
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer
