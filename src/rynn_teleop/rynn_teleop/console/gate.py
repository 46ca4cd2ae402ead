"""A gate in front of a WebSocket server that has no Host/Origin checks of its own (the Foxglove node's SDK
server): ROS-free, on its own thread and asyncio loop.

The gate listens where clients connect and reads each connection's HTTP request head (at most
:data:`MAX_HEAD_BYTES`, within :data:`HEAD_TIMEOUT_S`). A head whose ``Host`` or ``Origin`` the
:class:`~.access.AccessRules` refuse is answered ``403`` with ``{"ok": false, "reason", "message"}`` and
closed, counted per reason (:attr:`WebSocketGate.refused`); any other connection is passed byte for byte
to the upstream server on loopback (the upgrade, the subprotocol choice and every frame are the upstream's).
The copy never queues: each direction reads the next chunk only once the last was written
(:data:`SOCKET_BUFFER_BYTES` of socket buffer each way), so a client that stops reading makes the upstream's
own per-client queue fill and drop, as without the gate.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .access import AccessRules, Refusal, counts, http_head

MAX_HEAD_BYTES = 16 * 1024  # [bytes] a request head longer than this is refused (400)
HEAD_TIMEOUT_S = 10.0  # [s] a client has to send its request head
CHUNK_BYTES = 256 * 1024  # [bytes] read at once in each direction
SOCKET_BUFFER_BYTES = 256 * 1024  # [bytes] kernel buffer of the upstream receive and client send sides


class GateError(Exception):
    """The gate cannot listen (address in use, bad address)."""


class WebSocketGate:
    """Host/Origin gate on ``host``:``port`` (0: any free port, :attr:`port` after :meth:`start`) in front of a
    server on ``127.0.0.1``:``upstream_port``.

    Args:
        rules: which Host and Origin values pass (``same_origin=False``: the upstream serves no page).
        on_refused: (refusal, client) for each refused connection, on the gate's thread.
        thread_name: of the gate's thread (CPU accounting finds it by name).
    """

    def __init__(self, host: str, port: int, upstream_port: int, rules: AccessRules,
                 on_refused: Callable[[Refusal, str], None] | None = None, thread_name: str = "ws-gate") -> None:
        self.host, self.port, self.upstream_port, self.rules = host, int(port), int(upstream_port), rules
        self.on_refused = on_refused or (lambda refusal, client: None)
        self.thread_name = thread_name
        self.refused = counts(("host", "origin", "malformed"))  # refusal reason -> connections refused
        self.last_refused: dict[str, Any] | None = None  # newest refusal: time [Unix s], reason, message, client
        self.connections = 0  # connections passed to the upstream and still open
        self.native_id: int | None = None  # the gate thread's native id, once it runs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout: float = 10.0) -> None:
        """Listen; raises GateError when the address cannot be bound."""
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise GateError(f"the gate did not start within {timeout:g} s")
        if self._error is not None:
            raise GateError(str(self._error)) from self._error

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=5.0)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    @property
    def requests_refused(self) -> int:
        return sum(self.refused.values())

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._connection, self.host, self.port, limit=MAX_HEAD_BYTES))
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._started.set()
            loop.close()
            return
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        loop.run_forever()
        loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ one connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if peer else "?"
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                return  # gone or silent: nothing to answer
            except asyncio.LimitOverrunError:
                await self._refuse(writer, Refusal(400, "malformed", "request head too long"), client)
                return
            try:
                request = http_head(head)
            except ValueError as exc:
                await self._refuse(writer, Refusal(400, "malformed", str(exc)), client)
                return
            host, origin = request.header("Host"), request.header("Origin")
            shown = client + "".join(f", {n} {v[:80]}" for n, v in (("Origin", origin), ("Host", host)) if v)
            refusal = self.rules.host_refusal(host) or self.rules.origin_refusal(origin, host)
            if refusal is not None:
                await self._refuse(writer, refusal, shown)
                return
            await self._splice(head, reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _refuse(self, writer: asyncio.StreamWriter, refusal: Refusal, client: str) -> None:
        self.refused[refusal.reason] = self.refused.get(refusal.reason, 0) + 1
        self.last_refused = {"time": round(time.time(), 3), "reason": refusal.reason, "message": refusal.message,
                             "client": client}
        self.on_refused(refusal, client)
        body = json.dumps(refusal.body()).encode()
        reason = {400: "Bad Request", 403: "Forbidden"}.get(refusal.status, "Refused")
        writer.write(f"HTTP/1.1 {refusal.status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        try:
            await writer.drain()
        except ConnectionError:
            pass

    async def _splice(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port, limit=CHUNK_BYTES)
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        _small_buffer(up_writer, socket.SO_RCVBUF)
        _small_buffer(writer, socket.SO_SNDBUF)
        self.connections += 1
        try:
            up_writer.write(head)
            pumps = [asyncio.ensure_future(_pump(reader, up_writer)), asyncio.ensure_future(_pump(up_reader, writer))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self.connections -= 1
            up_writer.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until ``source`` ends, reading the next chunk only once the last is written."""
    try:
        while data := await source.read(CHUNK_BYTES):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        return


def _small_buffer(writer: asyncio.StreamWriter, option: int) -> None:
    """Bound a socket's kernel buffer (what waits between the two ends is then the upstream's own queue)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        except OSError:
            pass
    writer.transport.set_write_buffer_limits(high=CHUNK_BYTES)
