"""The operator console's web server (aiohttp; ROS-free): one page, live video, state, controls.

The console node hands it a :class:`FrameHub` (newest image per stream), ``snapshot()`` (session state as
plain data) and ``perform(action, fields)`` (an operator action; blocking, run on a worker thread). The
server runs its own asyncio loop on its own thread: the ROS side never waits for a browser.

* ``GET /`` the page (``console/static``, no CDN); ``GET /api/state`` the state as JSON, also sent on the
  WebSocket every :data:`STATE_PERIOD_S`; ``POST /api/action`` ``{"action": ..., "fields": {...}}``:
  200 done, 409 refused by the stack, 503 a node is missing, 400 malformed (nothing is done).
* ``GET /xr``: the XR headset's page (``static/xr.html``, WebXR; same rules, same secret, same API). Over the
  WebSocket it sends one ``{"type": "xr_frame", ...}`` per XR frame (``core.xr.parse_frame``: head pose, 25
  joints per tracked hand, the frame's time): each is checked and handed to ``on_xr_frame`` with its stamp on
  this machine's clock (``core.xr.FrameClock``), on the server's loop. One headset at a time is the XR input
  (the first that streams, until it closes or is silent for :data:`XR_OWNER_IDLE_S`); a frame refused (a
  second headset, malformed, not finite, larger than :data:`XR_FRAME_MAX_BYTES`, faster than
  :data:`XR_MAX_RATE_HZ`, out of order) is dropped whole, counted per reason (:attr:`ConsoleServer.xr_refused`,
  ``core.xr.XR_REASONS``) and answered ``{"type": "xr_refused", "reason", "message"}`` (at most once a second
  per reason); nothing else changes. A message over 16 kB closes that WebSocket (code 1009), as any.
* ``GET /ws``: the page subscribes (``{"type": "subscribe", "streams": [...]}``) and acknowledges each frame
  (``{"type": "decoded", "stream", "seq"}``, plus ``received_ms`` and ``t_ms`` once drawn: the latency).
  At most one frame per stream is in flight (a slow browser gets fewer frames, never a queue that would
  delay the state); an acknowledgement missing after :data:`ACK_TIMEOUT_S` is given up. A frame message:
  4-byte big-endian header length, a JSON header (``stream``, ``seq``, ``stamp_ns``, ``received_ms`` [Unix
  ms], ``rate_hz``), then a JPEG.

Access (the rules: :mod:`.access`; threat model: ``docs/security.md``): every request names a host the console
serves and, when it carries an ``Origin``, comes from the console's own page (or ``allowed_origins``);
``POST`` requests carry the per-run session secret (``X-Rynn-Session``, which the served page holds in
``<meta name="rynn-session">``) and a JSON body (``Content-Type: application/json``); the WebSocket's first
message is ``{"type": "hello", "session": SECRET}`` (nothing is sent before it; a wrong one closes it with code
4403). Every request but the static files also needs the token when one is set (``X-Rynn-Token`` header or
``token`` query); a non-loopback address always has one. A refusal answers its HTTP status (403; 401 token; 415
content type; 400 malformed or nested JSON) with ``{"ok": false, "reason", "message"}`` and is counted per
reason (:attr:`ConsoleServer.refused`). Each accepted action is an :class:`~.audit.ActionRecord` (time, client
address, Origin, action, result) in :attr:`ConsoleServer.audit`, shown on the page.
"""

from __future__ import annotations

import asyncio
import html
import json
import math
import ssl
import struct
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from aiohttp import WSMsgType, web

from ..core.scheduling import lower_this_thread
from ..core.xr import XR_REASONS, FrameClock, XRFrame, XRFrameError, parse_frame
from .access import (
    AccessRules,
    BadJson,
    ConsoleAccess,
    Refusal,
    RequestInfo,
    SessionSecret,
    counts,
    parse_json,
)
from .audit import ActionLog, ActionRecord

STATIC_DIR = Path(__file__).resolve().parent / "static"
STREAMS = ("consumer", "physical", "generated")
#: [px] width of each stream's JPEG (height keeps the aspect ratio; None = as received): the consumer feed is
#: shown large, the two sources as thumbnails
STREAM_WIDTH = {"consumer": None, "physical": 320, "generated": 320}
JPEG_QUALITY = {"consumer": 85, "physical": 70, "generated": 70}
STATE_PERIOD_S = 0.5
#: [s] how long a stream waits for the browser to acknowledge its last frame before it sends the next anyway
#: (a page that never acknowledges, e.g. a script, still gets a frame this often)
ACK_TIMEOUT_S = 5.0
MAX_BODY_BYTES = 16 * 1024
MAX_FIELD_CHARS = 2000
LOOPBACK = ("127.0.0.1", "::1", "localhost")
HELLO_TIMEOUT_S = 5.0  # [s] a WebSocket has to send its hello (the session secret) before it is closed
WS_REFUSED = 4403  # WebSocket close code of a refused hello (4000-4999: the application's own)
WS_BAD_MESSAGE = 1007  # WebSocket close code of a malformed or too deeply nested message (RFC 6455: bad data)
SHOWN_ACTIONS = 10  # newest actions in the state document (the page's action log)
XR_FRAME_MAX_BYTES = 8 * 1024  # a frame with both hands is about 4 kB of JSON
XR_OWNER_IDLE_S = 2.0  # [s] a headset silent this long is no longer the XR input (another may take over)
XR_MAX_RATE_HZ = 250.0  # [Hz] sustained XR frames accepted from a headset (displays run at 72-120 Hz)
XR_BURST = 25  # [frames] accepted back to back above that rate (frames bunched by the network)
XR_TELL_S = 1.0  # [s] a headset is told each refusal reason at most this often
WS_TOO_BIG = 1009  # WebSocket close code of a message over the size limit (aiohttp closes it)
SECURITY_HEADERS = {  # on every answer: no framing (the page's keys e-stop and reset), no sniffing, no referrer
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class ConsoleError(Exception):
    """The console cannot start (bad address, port in use)."""


@dataclass
class Frame:
    """A stream's newest image, as received (decoded lazily by the server)."""

    seq: int
    stamp_ns: int  # the image's header stamp [ns]
    received_ms: float  # Unix time [ms] when the node received it
    decode: Callable[[], np.ndarray]  # -> (H, W, 3) RGB uint8 (called at most once, on a worker thread)


class FrameHub:
    """Newest frame per stream, set by the ROS side (any thread), read by the server's loop."""

    def __init__(self, streams: tuple[str, ...] = STREAMS) -> None:
        self._lock = threading.Lock()
        self._frames: dict[str, Frame] = {}
        self._times: dict[str, list[float]] = {s: [] for s in streams}  # receive times [s], last 2 s
        self._listeners: list[Callable[[str], None]] = []
        self.streams = streams

    def put(self, stream: str, stamp_ns: int, received_ms: float, decode: Callable[[], np.ndarray]) -> None:
        """A new image of ``stream``: replaces the one before (never queues)."""
        with self._lock:
            old = self._frames.get(stream)
            self._frames[stream] = Frame((old.seq + 1) if old else 1, stamp_ns, received_ms, decode)
            times = self._times[stream]
            times.append(received_ms * 1e-3)
            while times and times[0] < times[-1] - 2.0:
                times.pop(0)
            listeners = list(self._listeners)
        for notify in listeners:
            notify(stream)

    def get(self, stream: str) -> Frame | None:
        with self._lock:
            return self._frames.get(stream)

    def rate_hz(self, stream: str, now_s: float | None = None) -> float:
        """Frames per second received over the last 2 s (0 when none for 2 s)."""
        now_s = time.time() if now_s is None else now_s
        with self._lock:
            times = [t for t in self._times[stream] if t >= now_s - 2.0]
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0

    def listen(self, notify: Callable[[str], None]) -> None:
        with self._lock:
            self._listeners.append(notify)


class ConsoleServer:
    """The console's HTTP/WebSocket server on its own thread.

    Args:
        host, port: where to listen (port 0: any free port; :attr:`port` tells which after :meth:`start`).
        token: required from every request when not empty.
        hub: the video frames.
        snapshot: -> the session state (plain data), called on the server's thread.
        perform: (action, fields) -> an object with ``ok``, ``message``, ``unavailable`` (and, for an episode
            action, ``episode``: its directory, answered as ``episode``); blocking, called on a worker thread.
        actions: the action names :func:`perform` knows, with the ``fields`` each accepts.
        on_decoded: (stream, latency [s]) for each frame a page reports decoded.
        rules: the Host and Origin rules (default: those of ``host`` alone).
        secret: the page's session secret (default: a new random one).
        on_refused: (refusal, client) for each refused request or WebSocket (and XR frame), on the server's thread.
        on_action: each accepted action's record, on the server's thread (keep it short).
        on_xr_frame: (frame, stamp [s] on ``clock``) for each accepted XR frame, on the server's thread (keep it
            short); None: XR input is off (frames refused, reason ``disabled``).
        clock: this machine's clock [s] XR frames are stamped on (the node's clock).
        ssl_context: serve HTTPS with it (None: plain HTTP).
    """

    def __init__(self, host: str, port: int, token: str, hub: FrameHub, snapshot: Callable[[], dict],
                 perform: Callable[[str, Mapping[str, str]], Any], actions: Mapping[str, tuple[str, ...]],
                 on_decoded: Callable[[str, float], None] | None = None, *, rules: AccessRules | None = None,
                 secret: SessionSecret | None = None, on_refused: Callable[[Refusal, str], None] | None = None,
                 on_action: Callable[[ActionRecord], None] | None = None,
                 on_xr_frame: Callable[[XRFrame, float], None] | None = None, clock: Callable[[], float] = time.time,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if host not in LOOPBACK and not token:
            raise ConsoleError(f"the console on {host} (not loopback) needs a token")
        self.host, self.port, self.token = host, int(port), token
        self.access = ConsoleAccess(rules if rules is not None else AccessRules(host), token, secret)
        self.hub, self.snapshot, self.perform, self.actions = hub, snapshot, perform, dict(actions)
        self.on_decoded = on_decoded or (lambda stream, latency: None)
        self.on_refused = on_refused or (lambda refusal, client: None)
        self.audit = ActionLog(on_record=on_action)
        self.clients = 0  # open WebSockets
        self.frames_sent = {s: 0 for s in hub.streams}
        self.frames_skipped = {s: 0 for s in hub.streams}  # newer frames came before a browser took the last
        self.acks_missed = {s: 0 for s in hub.streams}  # frames a browser did not acknowledge in ACK_TIMEOUT_S
        self.refused = counts()  # refusal reason (access.REASONS) -> requests and WebSockets refused
        self.last_refused: dict[str, Any] | None = None  # the newest refusal: time [Unix s], reason, message, client
        self.on_xr_frame, self.clock, self.ssl_context = on_xr_frame, clock, ssl_context
        self.xr_frames = 0  # XR frames accepted
        self.xr_refused = {r: 0 for r in XR_REASONS}  # XR frames refused, per reason
        self.xr_last_refused: dict[str, Any] | None = None  # time [Unix s], reason, message, client
        self._xr_owner: _XRClient | None = None  # the headset that is the XR input
        self._xr_times: list[float] = []  # monotonic times [s] of the accepted frames, last 2 s
        self._connections = 0  # WebSockets accepted so far (numbers them in XR messages)
        # the JPEG encoders and the action workers (waiting for services) are never urgent: in the normal scheduler
        # below the rest (lower_this_thread), while the loop's thread takes the XR frames at the node's priority
        self._encoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="console-encode",
                                           initializer=lower_this_thread)
        self._workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="console-action",
                                           initializer=lower_this_thread)
        self._jpeg: dict[str, tuple[int, bytes]] = {}  # stream -> (seq, header + JPEG) of the newest encoded
        self._encoding: dict[str, tuple[int, asyncio.Future]] = {}  # stream -> (seq, its encoding)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._new_frame: dict[str, asyncio.Condition] = {}
        self._started = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout: float = 10.0) -> None:
        """Listen (raises ConsoleError when the address cannot be bound)."""
        self._thread = threading.Thread(target=self._run, name="console-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise ConsoleError(f"the console did not start within {timeout:g} s")
        if self._error is not None:
            raise ConsoleError(f"cannot serve on {self.host}:{self.port}: {self._error}") from self._error

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def requests_refused(self) -> int:
        """Requests and WebSockets refused, all reasons."""
        return sum(self.refused.values())

    @property
    def session_secret(self) -> str:
        """The secret the served page carries (tests, and a script on this machine, read it from the page)."""
        return self.access.secret.value

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    @property
    def xr_url(self) -> str:
        """The XR headset's page."""
        base, _, query = self.url.partition("?")
        return base + "xr" + (f"?{query}" if query else "")

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=5.0)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._encoder.shutdown(wait=False, cancel_futures=True)
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        loop.run_forever()
        loop.close()

    async def _serve(self) -> None:
        for stream in self.hub.streams:
            self._new_frame[stream] = asyncio.Condition()
        self.hub.listen(self._notify)
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/", self._index)
        app.router.add_get("/xr", self._xr_page)
        app.router.add_get("/favicon.ico", _no_content)
        app.router.add_static("/static", STATIC_DIR, show_index=False)
        app.router.add_get("/api/state", self._state)
        app.router.add_post("/api/action", self._action)
        app.router.add_get("/ws", self._websocket)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # aiohttp has no public getter

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _notify(self, stream: str) -> None:  # any thread
        loop = self._loop
        if self.clients and loop is not None and not loop.is_closed():  # no browser: nothing to wake
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._wake(stream)))

    async def _wake(self, stream: str) -> None:
        cond = self._new_frame[stream]
        async with cond:
            cond.notify_all()

    # ------------------------------------------------------------------ access
    @web.middleware
    async def _guard(self, request: web.Request, handler):
        refusal = self.access.check(RequestInfo(request.method, request.path, request.headers, request.query))
        response = self._refuse(request, refusal) if refusal is not None else await handler(request)
        if not response.prepared:  # a WebSocket has answered already
            response.headers.update(SECURITY_HEADERS)
        return response

    def _count(self, request: web.Request, refusal: Refusal) -> None:
        client = _client(request)
        self.refused[refusal.reason] = self.refused.get(refusal.reason, 0) + 1
        self.last_refused = {"time": round(time.time(), 3), "reason": refusal.reason, "message": refusal.message,
                             "client": client}
        self.on_refused(refusal, client)

    def _refuse(self, request: web.Request, refusal: Refusal) -> web.Response:
        self._count(request, refusal)
        return web.json_response(refusal.body(), status=refusal.status, headers={"Cache-Control": "no-store"})

    # ------------------------------------------------------------------ HTTP
    async def _index(self, request: web.Request) -> web.StreamResponse:
        """The page, carrying this run's session secret."""
        return self._page("index.html")

    async def _xr_page(self, request: web.Request) -> web.StreamResponse:
        """The XR headset's page, carrying this run's session secret."""
        return self._page("xr.html")

    def _page(self, name: str) -> web.Response:
        page = (STATIC_DIR / name).read_text(encoding="utf-8")
        page = page.replace("{{session}}", html.escape(self.session_secret, quote=True))
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self._state_doc())

    def _state_doc(self) -> dict[str, Any]:
        now = time.time()
        doc = self.snapshot()
        doc["streams"] = {}
        for s in self.hub.streams:
            frame = self.hub.get(s)
            doc["streams"][s] = {"rate_hz": round(self.hub.rate_hz(s, now), 1),
                                 "age_ms": None if frame is None else round(now * 1e3 - frame.received_ms, 1)}
        doc["actions"] = {name: list(fields) for name, fields in self.actions.items()}
        doc["access"] = {"refused": dict(self.refused), "last_refused": self.last_refused,
                         "accepted": self.audit.accepted,
                         "log": [r.to_dict() for r in self.audit.recent(SHOWN_ACTIONS)]}
        doc["xr"] = self.xr_state()
        return doc

    def xr_state(self) -> dict[str, Any]:
        """The XR input: which headset streams (if any), frames accepted and refused."""
        owner = self._xr_owner
        live = owner is not None and time.monotonic() - owner.last_seen < XR_OWNER_IDLE_S
        return {"enabled": self.on_xr_frame is not None, "streaming": live,
                "client": owner.address if live else None, "since": round(owner.since, 3) if live else None,
                "frames": self.xr_frames, "rate_hz": round(self.xr_rate_hz(), 1), "refused": dict(self.xr_refused),
                "last_refused": self.xr_last_refused}

    def xr_rate_hz(self) -> float:
        """XR frames accepted per second over the last 2 s."""
        times = [t for t in list(self._xr_times) if t >= time.monotonic() - 2.0]
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0

    async def _action(self, request: web.Request) -> web.Response:
        try:
            body = parse_json(await request.read())
        except BadJson as exc:
            return self._refuse(request, exc.refusal())
        if not isinstance(body, dict) or set(body) - {"action", "fields"}:
            return self._bad(request, 'the body must be {"action": NAME, "fields": {...}}')
        name, fields = body.get("action"), body.get("fields", {})
        if not isinstance(name, str) or name not in self.actions:
            return self._bad(request, f"unknown action {name!r}; actions: {', '.join(self.actions)}")
        if not isinstance(fields, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in fields.items()
        ):
            return self._bad(request, "fields must map names to strings")
        if unknown := sorted(set(fields) - set(self.actions[name])):
            return self._bad(request, f"{name} does not take {', '.join(unknown)}")
        if any(len(v) > MAX_FIELD_CHARS for v in fields.values()):
            return self._bad(request, f"a field is longer than {MAX_FIELD_CHARS} characters")
        result = await asyncio.get_running_loop().run_in_executor(self._workers, self.perform, name, fields)
        status = 200 if result.ok else (503 if result.unavailable else 409)
        self.audit.add(ActionRecord(time.time(), request.remote or "", request.headers.get("Origin", ""), name,
                                    dict(fields), bool(result.ok), status, str(result.message)))
        answer = {"ok": bool(result.ok), "message": result.message}
        if getattr(result, "episode", ""):  # episode start / stop: the directory (typed, not in the message)
            answer["episode"] = str(result.episode)
        return web.json_response(answer, status=status, headers={"Cache-Control": "no-store"})

    def _bad(self, request: web.Request, message: str) -> web.Response:
        return self._refuse(request, Refusal(400, "malformed", message))

    # ------------------------------------------------------------------ WebSocket
    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=MAX_BODY_BYTES)
        await ws.prepare(request)
        if not await self._hello(request, ws):
            return ws
        self.clients += 1
        self._connections += 1
        xr = _XRClient(f"{request.remote or '?'} #{self._connections}")  # address and which connection
        wanted: set[str] = set()
        acked = {s: _Acks() for s in self.hub.streams}
        senders = {s: asyncio.ensure_future(self._send_stream(ws, s, wanted, acked[s])) for s in self.hub.streams}
        state = asyncio.ensure_future(self._send_state(ws))
        too_big = False
        try:
            async for msg in ws:
                if msg.type == WSMsgType.ERROR:  # e.g. a message over the size limit: aiohttp closed it
                    too_big = getattr(msg.data, "code", None) == WS_TOO_BIG
                    break
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = parse_json(msg.data)
                except BadJson as exc:
                    await self._close_refused(request, ws, exc.refusal(), WS_BAD_MESSAGE)
                    break
                if not isinstance(data, dict):
                    continue
                if data.get("type") == "xr_frame":
                    await self._xr_frame(ws, xr, data, len(msg.data))
                elif data.get("type") == "subscribe" and isinstance(data.get("streams"), list):
                    wanted.clear()
                    wanted.update(s for s in data["streams"] if s in self.hub.streams)
                    for s in wanted:
                        await self._wake(s)
                elif data.get("type") == "decoded" and data.get("stream") in self.hub.streams:
                    if isinstance(data.get("seq"), int):
                        acked[data["stream"]].ack(data["seq"])
                    try:
                        latency_ms = float(data["t_ms"]) - float(data["received_ms"])
                    except (KeyError, TypeError, ValueError):
                        continue
                    self.on_decoded(data["stream"], latency_ms * 1e-3)
        finally:
            self.clients -= 1
            for task in (*senders.values(), state):
                task.cancel()
            if too_big and xr.frames:  # a headset's (oversized) frame
                self._xr_refuse(xr, XRFrameError("oversized", "a message over the WebSocket's size limit: closed"))
            if self._xr_owner is xr:
                self._xr_owner = None  # another headset may stream now
        return ws

    # ------------------------------------------------------------------ XR frames
    async def _xr_frame(self, ws: web.WebSocketResponse, xr: _XRClient, data: dict, size: int) -> None:
        """One ``xr_frame`` message of ``xr``'s WebSocket: checked, stamped, handed on; or refused (see the module)."""
        now = time.monotonic()
        xr.frames += 1
        try:
            if self.on_xr_frame is None:
                raise XRFrameError("disabled", "XR input is off on this console (parameter xr.enabled)")
            if size > XR_FRAME_MAX_BYTES:
                raise XRFrameError("oversized", f"an XR frame of {size} bytes; at most {XR_FRAME_MAX_BYTES}")
            owner = self._xr_owner
            if owner is not None and owner is not xr and now - owner.last_seen < XR_OWNER_IDLE_S:
                since = time.strftime("%H:%M:%S", time.localtime(owner.since))
                raise XRFrameError("busy", f"another headset ({owner.address}) is the XR input since {since}; this "
                                   "one's frames are refused until it stops streaming")
            frame = parse_frame(data)
            if frame.t_ms <= xr.last_t_ms:
                raise XRFrameError("order", f"frame time {frame.t_ms} ms is not after the previous frame's")
            if not xr.take(now):
                raise XRFrameError("rate", f"more than {XR_MAX_RATE_HZ:g} XR frames per second")
        except XRFrameError as exc:
            message = self._xr_refuse(xr, exc)
            if message is not None:
                try:
                    await ws.send_str(json.dumps(message))
                except (ConnectionError, RuntimeError):
                    pass
            return
        if self._xr_owner is not xr:  # this headset becomes the XR input: its clock starts afresh
            self._xr_owner, xr.since, xr.clock = xr, time.time(), FrameClock()
        xr.last_t_ms, xr.last_seen = frame.t_ms, now
        self.xr_frames += 1
        self._xr_times.append(now)
        while self._xr_times and self._xr_times[0] < now - 2.0:
            self._xr_times.pop(0)
        self.on_xr_frame(frame, xr.clock.stamp(frame.t_ms, self.clock()))

    def _xr_refuse(self, xr: _XRClient, exc: XRFrameError) -> dict[str, Any] | None:
        """Count a refused XR frame; the message to tell its headset (None: told this reason within XR_TELL_S)."""
        self.xr_refused[exc.reason] = self.xr_refused.get(exc.reason, 0) + 1
        self.xr_last_refused = {"time": round(time.time(), 3), "reason": exc.reason, "message": str(exc),
                                "client": xr.address}
        self.on_refused(Refusal(400, f"xr {exc.reason}", f"XR frame refused: {exc}"), xr.address)
        now = time.monotonic()
        if now - xr.told.get(exc.reason, -math.inf) < XR_TELL_S:
            return None
        xr.told[exc.reason] = now
        return {"type": "xr_refused", "reason": exc.reason, "message": str(exc)}

    async def _hello(self, request: web.Request, ws: web.WebSocketResponse) -> bool:
        """Wait for the WebSocket's first message: True when it is the hello with the session secret; else the
        WebSocket is closed (code :data:`WS_REFUSED`, the reason) and the refusal counted."""
        try:
            msg = await ws.receive(timeout=HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            refusal = Refusal(403, "session", f"no hello message within {HELLO_TIMEOUT_S:g} s")
        else:
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                return False  # gone before saying anything
            if msg.type != WSMsgType.TEXT:
                refusal = Refusal(403, "session", 'the first message must be the text {"type": "hello", ...}')
            else:
                try:
                    refusal = self.access.hello_refusal(parse_json(msg.data))
                except BadJson as exc:
                    refusal = exc.refusal()
        if refusal is None:
            return True
        await self._close_refused(request, ws, refusal, WS_REFUSED if refusal.reason == "session" else WS_BAD_MESSAGE)
        return False

    async def _close_refused(self, request: web.Request, ws: web.WebSocketResponse, refusal: Refusal,
                             code: int) -> None:
        self._count(request, refusal)
        reason = refusal.message.encode()[:123]  # RFC 6455: a close reason is at most 123 bytes
        try:
            await ws.close(code=code, message=reason)
        except (ConnectionError, RuntimeError):
            pass

    async def _send_state(self, ws: web.WebSocketResponse) -> None:
        while not ws.closed:
            try:
                await ws.send_str(json.dumps({"type": "state", **self._state_doc()}))
            except (ConnectionError, RuntimeError):
                return
            await asyncio.sleep(STATE_PERIOD_S)

    async def _send_stream(self, ws: web.WebSocketResponse, stream: str, wanted: set[str], acks: _Acks) -> None:
        """Send ``stream``'s newest frame whenever there is one newer than the last sent and the browser
        acknowledged the last sent (or :data:`ACK_TIMEOUT_S` passed): one frame in flight."""
        cond = self._new_frame[stream]
        last = 0  # seq of the last frame sent
        base: int | None = None  # seq before the first frame this browser wanted (None: not wanted)
        pending = 0  # seq of the frame sent and not yet acknowledged (0: none)
        while not ws.closed:
            if pending:
                if not await acks.wait(pending, ACK_TIMEOUT_S):
                    self.acks_missed[stream] += 1
                pending = 0
            frame = self.hub.get(stream)
            if stream not in wanted:
                base = None
            elif base is None:
                base = frame.seq - 1 if frame is not None else 0
            if stream not in wanted or frame is None or frame.seq == last:
                async with cond:
                    await cond.wait()
                continue
            self.frames_skipped[stream] += max(0, frame.seq - max(last, base) - 1)
            message = await self._encoded(stream, frame)
            last = frame.seq
            if message is None:
                continue
            try:
                await ws.send_bytes(message)
            except (ConnectionError, RuntimeError):
                return
            self.frames_sent[stream] += 1
            pending = frame.seq

    async def _encoded(self, stream: str, frame: Frame) -> bytes | None:
        """``frame`` as a binary message, encoded once for every browser (on a worker thread)."""
        cached = self._jpeg.get(stream)
        if cached is not None and cached[0] == frame.seq:
            return cached[1]
        pending = self._encoding.get(stream)
        if pending is not None and pending[0] == frame.seq:  # another browser's request is encoding it
            future = pending[1]
        else:
            future = asyncio.get_running_loop().run_in_executor(self._encoder, self._encode, stream, frame)
            self._encoding[stream] = (frame.seq, future)
        try:
            message = await asyncio.shield(future)
        except Exception:  # noqa: BLE001 - a frame that cannot be decoded is skipped
            return None
        self._jpeg[stream] = (frame.seq, message)
        return message

    def _encode(self, stream: str, frame: Frame) -> bytes:
        rgb = frame.decode()
        width = STREAM_WIDTH.get(stream)
        if width and rgb.shape[1] > width:
            height = max(1, round(rgb.shape[0] * width / rgb.shape[1]))
            rgb = cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA)
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                                [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY.get(stream, 80)])
        if not ok:
            raise ValueError("JPEG encoding failed")
        header = json.dumps({"stream": stream, "seq": frame.seq, "stamp_ns": frame.stamp_ns,
                             "received_ms": frame.received_ms, "rate_hz": round(self.hub.rate_hz(stream), 1),
                             "width": int(rgb.shape[1]), "height": int(rgb.shape[0])}).encode()
        return struct.pack(">I", len(header)) + header + jpeg.tobytes()


async def _no_content(request: web.Request) -> web.Response:
    return web.Response(status=204)


def _client(request: web.Request) -> str:
    """Who sent ``request``, for the log: address, and Origin and Host when present."""
    parts = [request.remote or "?"]
    for name in ("Origin", "Host"):
        if value := request.headers.get(name):
            parts.append(f"{name} {value[:80]}")
    return ", ".join(parts)


class _XRClient:
    """One WebSocket's XR frames (used on the server's loop)."""

    def __init__(self, address: str) -> None:
        self.address = address  # who, for messages
        self.frames = 0  # xr_frame messages received, accepted or not
        self.since = 0.0  # [Unix s] when it became the XR input
        self.last_seen = -math.inf  # [s, monotonic] its newest accepted frame
        self.last_t_ms = -math.inf  # [ms, browser clock] its newest accepted frame's time
        self.clock = FrameClock()
        self.told: dict[str, float] = {}  # refusal reason -> when it was last told [s, monotonic]
        self._tokens = float(XR_BURST)  # token bucket of the rate limit
        self._filled = -math.inf  # [s, monotonic]

    def take(self, now: float) -> bool:
        """One frame at ``now`` [s, monotonic] within the rate limit (XR_MAX_RATE_HZ, bursts of XR_BURST)."""
        self._tokens = min(float(XR_BURST), self._tokens + (now - self._filled) * XR_MAX_RATE_HZ)
        self._filled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class _Acks:
    """The newest frame seq a browser acknowledged on one stream (one WebSocket; used on the server's loop)."""

    def __init__(self) -> None:
        self.seq = 0
        self._event = asyncio.Event()

    def ack(self, seq: int) -> None:
        if seq > self.seq:
            self.seq = seq
            self._event.set()

    async def wait(self, seq: int, timeout: float) -> bool:
        """Until frame ``seq`` (or a newer one) is acknowledged: True, or False after ``timeout`` [s]."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.seq < seq:
            self._event.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except asyncio.TimeoutError:
                return self.seq >= seq
        return True
