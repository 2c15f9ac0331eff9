"""Proxies on 127.0.0.1 that put faults on one line, and nothing else in the machine's
network: ``cut()`` is a partition (TCP: open connections reset and new ones refused; UDP:
datagrams dropped), ``delay`` a slow link, ``restore()`` heals it. The lab puts one in
front of each host's BMC (bmc-down, bmc-slow), and tests put one between a client and
the apiserver."""

from __future__ import annotations

import asyncio
import contextlib


class FaultLine:
    """What both lines share: down (``severed``) or up, and a ``delay``."""

    severed = False
    delay = 0.0  # seconds added before each chunk or datagram is forwarded

    def cut(self) -> None:
        self.severed = True

    def restore(self) -> None:
        self.severed = False

    def apply(self, down: bool, delay: float) -> None:
        """Make the line down (or up) and this slow; idempotent."""
        if down and not self.severed:
            self.cut()
        elif not down and self.severed:
            self.restore()
        self.delay = delay


class TcpProxy(FaultLine):
    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[None]] = set()  # one per accepted connection

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def cut(self) -> None:
        super().cut()
        for writer in list(self._open):  # open connections are reset, as on a lost link
            writer.transport.abort()
        self._open.clear()

    async def stop(self) -> None:
        """Close the port, reset every connection and end every relay: none is left
        pending when the loop closes (a Task destroyed pending logs from wherever the
        garbage collector finds it, in a later test)."""
        self.cut()
        if self._server is not None:
            self._server.close()
        for relay in list(self._relays):
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay = asyncio.current_task()
        if relay is None:  # always a Task under asyncio.start_server
            return
        self._relays.add(relay)
        try:
            await self._relay(reader, writer)
        finally:
            self._relays.discard(relay)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.severed:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, upstream_writer))
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._open.discard(writer)
            with contextlib.suppress(Exception):
                writer.transport.abort()


class UdpRelay(FaultLine):
    """A UDP relay: datagrams from each client go to the target from a socket of their own,
    and answers come back to that client."""

    def __init__(self, target_host: str, target_port: int, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.listen_port = listen_port
        self.port = 0
        self._public: asyncio.DatagramTransport | None = None
        self._upstreams: dict[tuple[str, int], asyncio.DatagramTransport] = {}

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._public, _ = await loop.create_datagram_endpoint(
            lambda: _Inbound(self), local_addr=("127.0.0.1", self.listen_port)
        )
        self.port = self._public.get_extra_info("sockname")[1]
        return self.port

    async def stop(self) -> None:
        for transport in self._upstreams.values():
            transport.close()
        if self._public is not None:
            self._public.close()

    async def forward(self, data: bytes, client: tuple[str, int]) -> None:
        if self.severed:
            return
        if self.delay:
            await asyncio.sleep(self.delay)
        upstream = self._upstreams.get(client)
        if upstream is None:
            loop = asyncio.get_running_loop()
            upstream, _ = await loop.create_datagram_endpoint(
                lambda: _Outbound(self, client), remote_addr=self.target
            )
            self._upstreams[client] = upstream
        upstream.sendto(data)

    async def answer(self, data: bytes, client: tuple[str, int]) -> None:
        if self.severed or self._public is None:
            return
        if self.delay:
            await asyncio.sleep(self.delay)
        self._public.sendto(data, client)


class _Inbound(asyncio.DatagramProtocol):
    def __init__(self, relay: UdpRelay) -> None:
        self.relay = relay
        self._tasks: set[asyncio.Task[None]] = set()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        task = asyncio.get_running_loop().create_task(self.relay.forward(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Outbound(asyncio.DatagramProtocol):
    def __init__(self, relay: UdpRelay, client: tuple[str, int]) -> None:
        self.relay = relay
        self.client = client
        self._tasks: set[asyncio.Task[None]] = set()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        task = asyncio.get_running_loop().create_task(self.relay.answer(data, self.client))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def error_received(self, exc: Exception) -> None:
        pass  # the BMC behind us is gone; the client will time out as with a real one
