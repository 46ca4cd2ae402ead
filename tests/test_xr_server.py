"""The console's XR input (issue 30): the ``/xr`` page under the console's rules, XR frames over the WebSocket
(accepted, stamped, handed on; bad ones, oversized ones and a second headset refused with a reason while nothing
else changes), HTTPS off loopback with a given or a self-signed certificate, and on real rclpy the console ->
``xr`` tracker and hand backends -> /operator/trackers and /hands/command path."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from rynn_teleop.console import tls
from rynn_teleop.console.server import WS_TOO_BIG, XR_FRAME_MAX_BYTES, ConsoleServer, FrameHub
from rynn_teleop.core.layout import ROLES
from rynn_teleop.errors import ConfigurationError

IWER_HANDS = json.loads((Path(__file__).parent / "vendor" / "iwer" / "hand_poses.json").read_text())
ACTIONS = {"estop": (), "engage": ()}


class Result:
    ok, message, unavailable = True, "done", False


class Headsets:
    """What the console hands on: accepted frames and their stamps, and the refusals it reports."""

    def __init__(self) -> None:
        self.frames: list = []
        self.refusals: list = []


@pytest.fixture
def console():
    made: list[ConsoleServer] = []

    def make(host: str = "127.0.0.1", **kwargs) -> tuple[ConsoleServer, Headsets]:
        seen = Headsets()
        kwargs.setdefault("on_xr_frame", lambda frame, stamp: seen.frames.append((frame, stamp)))
        server = ConsoleServer(host, 0, kwargs.pop("token", ""), FrameHub(), lambda: {"estop_latched": False},
                               lambda name, fields: Result(), ACTIONS,
                               on_refused=lambda r, c: seen.refusals.append((r, c)), **kwargs)
        server.start()
        made.append(server)
        return server, seen

    yield make
    for server in made:
        server.stop()


def _run(coro):
    return asyncio.run(coro)


def xr_frame(seq: int, t_ms: float, shift=(0.0, 0.0, 0.0), left=True, right=True, **changes) -> dict:
    """A frame of IWER's relaxed hands, both moved by ``shift`` [m] (WebXR reference space)."""
    def hand(side):
        joints = np.array(IWER_HANDS["relaxed"][side])
        joints[:, :3] += [0.0, 1.3, -0.35] + np.asarray(shift)
        return joints.round(6).tolist()
    doc = {"type": "xr_frame", "seq": seq, "t_ms": t_ms, "head": [0.0, 1.6, 0.0, 0.0, 0.0, 0.0, 1.0],
           "left": hand("left") if left else None, "right": hand("right") if right else None}
    doc.update(changes)
    return doc


class Client:
    """One page's WebSocket: hello first, then whatever the test sends; collects what the console says."""

    def __init__(self, session: aiohttp.ClientSession, url: str, secret: str, ssl_context=None) -> None:
        self.session, self.url, self.secret, self.ssl = session, url, secret, ssl_context
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.states = 0
        self.refused: list[dict] = []
        self.closed: tuple[int, str] | None = None
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> Client:
        self.ws = await self.session.ws_connect(self.url, max_msg_size=0, ssl=self.ssl if self.ssl else True)
        await self.ws.send_str(json.dumps({"type": "hello", "session": self.secret}))
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        self._reader.cancel()
        await self.ws.close()

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                doc = json.loads(msg.data)
                if doc["type"] == "state":
                    self.states += 1
                elif doc["type"] == "xr_refused":
                    self.refused.append(doc)
        self.closed = (self.ws.close_code, str(self.ws.protocol or ""))

    async def send(self, doc: dict | str) -> None:
        await self.ws.send_str(doc if isinstance(doc, str) else json.dumps(doc))


async def _settle(seconds: float = 0.3) -> None:
    await asyncio.sleep(seconds)


# ---------------------------------------------------------------------- the page and its rules
def test_the_xr_page_is_served_with_the_secret_and_under_the_console_s_rules(console):
    server, _ = console(host="127.0.0.1", token="t0k")
    base = f"http://127.0.0.1:{server.port}"

    async def get(path, **headers):
        async with aiohttp.ClientSession() as session, session.get(base + path, headers=headers) as r:
            return r.status, await r.text(), r.headers

    status, page, headers = _run(get("/xr?token=t0k"))
    assert status == 200 and f'content="{server.session_secret}"' in page and "static/xr.js" in page
    assert headers["X-Frame-Options"] == "DENY" and headers["Cache-Control"] == "no-store"
    assert _run(get("/xr"))[0] == 401  # the token
    assert _run(get("/xr?token=t0k", Host="rebind.evil.example"))[0] == 403  # the Host
    for path in ("/static/xr.js", "/static/vendor/three/three.module.js", "/static/vendor/three/three.core.js",
                 "/static/vendor/three/LICENSE"):
        assert _run(get(path))[0] == 200, path  # shipped files: no CDN, no token needed
    assert server.xr_url == f"http://127.0.0.1:{server.port}/xr?token=t0k"


def test_the_vendored_three_js_is_the_npm_build_with_its_licence():
    vendor = Path(__file__).resolve().parents[1] / "src/rynn_teleop/rynn_teleop/console/static/vendor/three"
    module = (vendor / "three.module.js").read_text()
    assert "from './three.core.js'" in module and "REVISION" in (vendor / "three.core.js").read_text()[:20000]
    assert "MIT License" in (vendor / "LICENSE").read_text()
    static = vendor.parent.parent
    imports = re.findall(r'from "([^"]+)"', (static / "xr.js").read_text())
    assert imports == ["./vendor/three/three.module.js"]  # no CDN
    assert not re.search(r'(src|href)="(https?:)?//', (static / "xr.html").read_text())


# ---------------------------------------------------------------------- frames
def test_frames_are_stamped_on_the_console_s_clock_and_handed_on(console):
    server, seen = console()
    url = f"http://127.0.0.1:{server.port}/ws"

    async def scenario():
        async with aiohttp.ClientSession() as session, Client(session, url, server.session_secret) as headset:
            t0 = time.time() * 1e3
            for k in range(20):
                await headset.send(xr_frame(k, t0 + k * 1000 / 72, right=k < 10))
                await asyncio.sleep(1 / 72)
            await _settle()
            return headset.refused, server.xr_state()

    before = time.time()
    refused, state = _run(scenario())
    assert refused == []
    assert len(seen.frames) == 20 and server.xr_frames == 20
    stamps = np.array([s for _, s in seen.frames])
    assert (np.diff(stamps) > 0).all() and before <= stamps[0] <= time.time()
    spacing = np.diff(stamps)  # the headset's (FrameClock), but for a step where a faster delivery came along
    assert np.median(spacing) == pytest.approx(1 / 72, abs=1e-3) and np.mean(np.abs(spacing - 1 / 72) < 0.004) > 0.8
    frame = seen.frames[15][0]
    assert frame.hands["right"] is None and frame.hands["left"].shape == (25, 7)  # lost: None, handed on as is
    assert state["frames"] == 20 and state["streaming"] and state["client"].startswith("127.0.0.1")
    assert not any(state["refused"].values()) and state["rate_hz"] > 10
    deadline = time.monotonic() + 10.0  # the server sees the close on its own loop, a moment later
    while server.xr_state()["client"] is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.xr_state()["client"] is None  # the headset closed: the XR input is free


def test_bad_frames_are_refused_with_their_reason_and_nothing_else_changes(console):
    server, seen = console()
    url = f"http://127.0.0.1:{server.port}/ws"

    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with Client(session, url, server.session_secret) as headset, \
                    Client(session, url, server.session_secret) as viewer:
                t = time.time() * 1e3
                await headset.send(xr_frame(0, t))
                nan_frame = json.dumps(xr_frame(1, t + 10)).replace("1.6,", "NaN,", 1)  # Python's json reads NaN
                bad = [
                    ("malformed", xr_frame(1, t + 10, head=[0, 1.6, 0])),
                    ("not_finite", nan_frame),
                    ("not_finite", xr_frame(1, t + 10, head=[0, 1.6, None, 0, 0, 0, 1])),  # a browser's NaN
                    ("not_unit", xr_frame(1, t + 10, head=[0, 1.6, 0, 0, 0, 0, 3])),
                    ("order", xr_frame(1, t)),  # the same time again
                    ("oversized", xr_frame(1, t + 10, pad="x" * XR_FRAME_MAX_BYTES)),
                ]
                for _, doc in bad:
                    await headset.send(doc)
                    await asyncio.sleep(0.05)
                await headset.send(xr_frame(2, t + 20))  # the headset goes on
                await _settle(1.2)
                return headset, viewer, [r for r, _ in bad]

    headset, viewer, reasons = _run(scenario())
    assert [f.seq for f, _ in seen.frames] == [0, 2]  # only the good ones reached the stack
    refused = {r: n for r, n in server.xr_refused.items() if n}
    assert refused == {r: reasons.count(r) for r in reasons}
    told = {m["reason"] for m in headset.refused}
    assert told == set(reasons) and all(m["message"] for m in headset.refused)  # told why, once per reason
    assert headset.closed is None and viewer.closed is None and viewer.states >= 2  # nobody disconnected
    assert server.xr_last_refused["client"].startswith("127.0.0.1")
    assert all(r.reason.startswith("xr ") for r, _ in seen.refusals)  # the node logs them


def test_a_second_headset_is_refused_while_the_first_streams_and_takes_over_once_it_stops(console, monkeypatch):
    import rynn_teleop.console.server as console_server

    monkeypatch.setattr(console_server, "XR_OWNER_IDLE_S", 0.5)
    server, seen = console()
    url = f"http://127.0.0.1:{server.port}/ws"

    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with Client(session, url, server.session_secret) as first, \
                    Client(session, url, server.session_secret) as second:
                t = time.time() * 1e3
                await first.send(xr_frame(0, t - 14))
                await _settle(0.1)  # the first headset streams; then a second one connects and streams too
                for k in range(1, 10):
                    await first.send(xr_frame(k, t + 14 * k))
                    await second.send(xr_frame(k, t + 14 * k, shift=(0.1, 0, 0)))
                    await asyncio.sleep(0.014)
                await _settle()
                busy = list(second.refused)
                accepted = len(seen.frames)
                await asyncio.sleep(0.7)  # the first headset stops streaming (still connected)
                for k in range(10, 15):
                    await second.send(xr_frame(k, t + 14 * k + 700, shift=(0.1, 0, 0)))
                    await asyncio.sleep(0.014)
                await _settle()
                return busy, accepted, first, second

    busy, accepted, first, second = _run(scenario())
    assert accepted == 10 and all(abs(f.hands["left"][0, 0] - IWER_HANDS["relaxed"]["left"][0][0]) < 1e-6
                                  for f, _ in seen.frames[:10])  # only the first headset's frames
    assert [m["reason"] for m in busy] == ["busy"] and "another headset" in busy[0]["message"]
    assert server.xr_refused["busy"] == 9 and first.refused == []
    assert first.states >= 1 and second.states >= 1  # both still see the session
    assert len(seen.frames) == 15  # the second took over once the first was silent


def test_a_frame_over_the_websocket_limit_closes_only_that_headset(console):
    server, seen = console()
    url = f"http://127.0.0.1:{server.port}/ws"

    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with Client(session, url, server.session_secret) as headset, \
                    Client(session, url, server.session_secret) as other:
                t = time.time() * 1e3
                await headset.send(xr_frame(0, t))
                await headset.send(xr_frame(1, t + 10, pad="x" * 20_000))  # over 16 kB
                await _settle(0.5)
                await other.send(xr_frame(0, t + 20))  # the XR input is free again
                await _settle(0.8)
                return headset, other

    headset, other = _run(scenario())
    assert headset.closed is not None and headset.closed[0] == WS_TOO_BIG
    assert other.closed is None and other.states >= 1
    assert [f.seq for f, _ in seen.frames] == [0, 0] and server.xr_refused["oversized"] == 1


def test_a_burst_above_the_rate_limit_is_refused(console):
    server, seen = console()
    url = f"http://127.0.0.1:{server.port}/ws"

    async def scenario():
        async with aiohttp.ClientSession() as session, Client(session, url, server.session_secret) as headset:
            t = time.time() * 1e3
            frames = [json.dumps(xr_frame(k, t + k, left=False, right=False)) for k in range(200)]
            for frame in frames:  # back to back: 200 small frames in a few milliseconds
                await headset.send(frame)
            await _settle()
            return headset

    headset = _run(scenario())
    assert 25 <= len(seen.frames) < 200 and server.xr_refused["rate"] == 200 - len(seen.frames)
    assert [m["reason"] for m in headset.refused] == ["rate"]


def test_xr_input_off_refuses_every_frame(console):
    server, seen = console(on_xr_frame=None)
    url = f"http://127.0.0.1:{server.port}/ws"

    async def scenario():
        async with aiohttp.ClientSession() as session, Client(session, url, server.session_secret) as headset:
            await headset.send(xr_frame(0, time.time() * 1e3))
            await _settle()
            return headset.refused

    assert [m["reason"] for m in _run(scenario())] == ["disabled"] and not seen.frames
    assert server.xr_state()["enabled"] is False


# ---------------------------------------------------------------------- HTTPS
def test_a_self_signed_certificate_is_made_once_and_its_fingerprint_is_openssl_s(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    made = tls.self_signed(tmp_path / "tls", ["127.0.0.1", "robot.lab"])
    assert made.generated and made.cert.exists() and (made.key.stat().st_mode & 0o077) == 0
    again = tls.self_signed(tmp_path / "tls", ["127.0.0.1"])
    assert not again.generated and again.fingerprint == made.fingerprint
    out = subprocess.run(["openssl", "x509", "-in", str(made.cert), "-noout", "-fingerprint", "-sha256", "-ext",
                          "subjectAltName"], capture_output=True, text=True, check=True).stdout
    assert made.fingerprint in out and "IP Address:127.0.0.1" in out and "DNS:robot.lab" in out
    with pytest.raises(ConfigurationError, match="tls.cert_file"):
        tls.given(tmp_path / "missing.pem", made.key)
    names = tls.server_names("0.0.0.0")
    assert "127.0.0.1" in names and "localhost" in names and "0.0.0.0" not in names


def test_the_server_speaks_https_with_the_certificate(console, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    files = tls.self_signed(tmp_path, ["127.0.0.1"])
    server, seen = console(ssl_context=tls.server_context(files))
    assert server.url.startswith("https://127.0.0.1:") and server.xr_url.startswith("https://")
    trusted = ssl.create_default_context(cafile=str(files.cert))  # as a browser that accepted the certificate
    base = f"https://127.0.0.1:{server.port}"

    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/xr", ssl=trusted) as r:
                page = await r.text()
                status = r.status
            secret = re.search(r'name="rynn-session" content="([^"]+)"', page).group(1)
            async with Client(session, base.replace("https", "wss") + "/ws", secret, trusted) as headset:
                await headset.send(xr_frame(0, time.time() * 1e3))
                await _settle()
            with pytest.raises(aiohttp.ClientError):  # plain HTTP to the HTTPS port
                async with session.get(f"http://127.0.0.1:{server.port}/xr") as r:
                    await r.text()
        return status

    assert _run(scenario()) == 200
    assert len(seen.frames) == 1


# ---------------------------------------------------------------------- on real rclpy
def test_the_console_node_off_loopback_serves_https_with_a_token(ros_domain_id, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    from rynn_teleop.runner import Composition

    comp = Composition(["console"], overrides={"console": {"host": "0.0.0.0", "port": 0,
                                                           "tls.dir": str(tmp_path / "tls")}},
                       domain_id=ros_domain_id)
    try:
        server = comp.node("console").server
        assert server.url.startswith("https://0.0.0.0:") and server.token
        files = tls.self_signed(tmp_path / "tls", [])  # made by the node; reused here
        trusted = ssl.create_default_context(cafile=str(files.cert))
        base = f"https://127.0.0.1:{server.port}"

        async def get(path):
            async with aiohttp.ClientSession() as session, session.get(base + path, ssl=trusted) as r:
                return r.status

        assert _run(get("/xr")) == 401
        assert _run(get(f"/xr?token={server.token}")) == 200
    finally:
        comp.shutdown()


def test_xr_frames_reach_the_tracker_and_hand_backends_through_ros(ros_domain_id):
    from geometry_msgs.msg import PoseArray
    from rclpy.node import Node
    from ros_helpers import wait_for
    from sensor_msgs.msg import JointState

    from rynn_teleop.runner import Composition

    comp = Composition(["console", "tracker", "hand_retarget"],
                       overrides={"console": {"port": 0},
                                  # a loaded test machine may deliver late: keep every frame (the path is tested)
                                  "tracker": {"backend": "xr", "max_lag_s": 1.0, "dropout_timeout_s": 1.0},
                                  "hand_retarget": {"backend": "xr"}}, domain_id=ros_domain_id)
    try:
        helper = Node("xr_test_helper", context=comp.context)
        trackers, commands, hands = [], [], []
        helper.create_subscription(PoseArray, "/operator/trackers", trackers.append, 100)
        helper.create_subscription(JointState, "/hands/command", commands.append, 100)
        helper.create_subscription(PoseArray, "/xr/hands/left", hands.append, 100)
        comp.add_node(helper)
        server = comp.node("console").server
        url = f"http://127.0.0.1:{server.port}/ws"
        time.sleep(2.0)  # discovery

        async def scenario():
            async with aiohttp.ClientSession() as session, Client(session, url, server.session_secret) as headset:
                t = time.time() * 1e3
                for k in range(60):
                    await headset.send(xr_frame(k, t + k * 1000 / 72, right=k < 40))
                    await asyncio.sleep(1 / 72)
                await _settle(1.0)

        _run(scenario())
        # every accepted frame is published once, but for frames a loaded machine delivered later than max_lag_s
        # (dropped and counted by the tracker) and frames the console refused as a burst (counted by reason)
        tracker, refused = comp.node("tracker"), server.xr_refused
        assert server.xr_frames + sum(refused.values()) == 60 and server.xr_frames >= 30, refused
        assert wait_for(lambda: len(trackers) + tracker.late_dropped >= server.xr_frames, 10.0), \
            (len(trackers), tracker.late_dropped, server.xr_frames)
        assert not any(v for k, v in refused.items() if k != "rate"), refused
        stamps = [m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in trackers]
        assert (np.diff(stamps) > 0).all() and trackers[0].header.frame_id == "xr_world"
        last = trackers[-1]
        assert len(last.poses) == len(ROLES)
        right_wrist = last.poses[ROLES.index("right_wrist")]
        assert math.isnan(right_wrist.position.x)  # the right hand was lost: no sample, the arm holds
        chest = last.poses[ROLES.index("chest")]
        assert chest.position.z == pytest.approx(1.6 - 0.10 - 0.10, abs=1e-6)  # eye height - neck - shoulders
        assert wait_for(lambda: {c.name[0].split("_")[0] for c in commands} == {"left", "right"}, 10.0)
        right = [c for c in commands if c.name[0].startswith("right")]
        left = [c for c in commands if c.name[0].startswith("left")]
        assert len(left) > len(right) >= 30  # no right hand commands after it was lost (held)
        # the hand command carries the XR frame's stamp (its latency is measured from there)
        assert {(c.header.stamp.sec, c.header.stamp.nanosec) for c in left} <= {
            (h.header.stamp.sec, h.header.stamp.nanosec) for h in hands}
        diag = comp.node("hand_retarget").diagnostic_values()
        assert diag["message_errors"] == 0 and not any(v for k, v in diag.items() if ".held." in k and v)
    finally:
        comp.shutdown()
    assert not comp.errors
