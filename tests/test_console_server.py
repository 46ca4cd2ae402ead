"""The console's web server (console.server, no ROS): access, requests, video over the WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from typing import NamedTuple

import aiohttp
import cv2
import numpy as np
import pytest

from rynn_teleop.console.server import ConsoleError, ConsoleServer, FrameHub

ACTIONS = {"estop": (), "feed toggle": (), "episode start": ("task", "operator"), "episode stop": ("outcome", "notes")}


class Result(NamedTuple):
    ok: bool
    message: str
    unavailable: bool = False
    episode: str = ""


class Fake:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.answer = Result(True, "done")
        self.decoded: list[tuple[str, float]] = []

    def perform(self, name, fields):
        self.calls.append((name, dict(fields)))
        return self.answer


@pytest.fixture
def served():
    def make(token: str = "", host: str = "127.0.0.1"):
        fake, hub = Fake(), FrameHub()
        server = ConsoleServer(host, 0, token, hub, lambda: {"estop_latched": False}, fake.perform, ACTIONS,
                               on_decoded=lambda s, lat: fake.decoded.append((s, lat)))
        server.start()
        made.append(server)
        return server, hub, fake

    made: list[ConsoleServer] = []
    yield make
    for server in made:
        server.stop()


def _run(coro):
    return asyncio.run(coro)


async def _request(method: str, url: str, **kwargs) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, **kwargs) as response:
            return response.status, await response.text()


def _session(server: ConsoleServer, **headers: str) -> dict[str, str]:
    """Headers of a request that carries the page's session secret (as the console's page sends it)."""
    return {"X-Rynn-Session": server.session_secret, **headers}


def test_the_page_and_its_files_are_served(served):
    server, _, _ = served()
    base = f"http://127.0.0.1:{server.port}"
    status, text = _run(_request("GET", base + "/"))
    assert status == 200 and "E-STOP" in text and "static/console.js" in text and "://" not in text  # no CDN
    assert _run(_request("GET", base + "/static/console.js"))[0] == 200
    status, text = _run(_request("GET", base + "/api/state"))
    assert status == 200 and json.loads(text)["estop_latched"] is False


def test_a_token_is_required_when_set_and_always_off_loopback(served):
    server, _, fake = served(token="s3cret")
    base = f"http://127.0.0.1:{server.port}"
    for method, path in (("GET", "/"), ("GET", "/api/state"), ("POST", "/api/action"), ("GET", "/ws")):
        assert _run(_request(method, base + path, json={"action": "estop"}))[0] == 401, path
    assert _run(_request("POST", base + "/api/action?token=wrong", json={"action": "estop"}))[0] == 401
    assert fake.calls == []
    assert _run(_request("GET", base + "/?token=s3cret"))[0] == 200
    assert _run(_request("POST", base + "/api/action", json={"action": "estop"},
                         headers=_session(server, **{"X-Rynn-Token": "s3cret"})))[0] == 200
    assert fake.calls == [("estop", {})]
    assert server.requests_refused == 5
    with pytest.raises(ConsoleError, match="token"):
        ConsoleServer("0.0.0.0", 0, "", FrameHub(), dict, fake.perform, ACTIONS)
    open_server, _, _ = served(token="t0k", host="0.0.0.0")  # listening on every address, reached on loopback
    assert _run(_request("GET", f"http://127.0.0.1:{open_server.port}/api/state"))[0] == 401


@pytest.mark.parametrize("body", [
    "not json", "[1, 2]", json.dumps({"action": "launch the rockets"}), json.dumps({"action": 3}),
    json.dumps({"action": "estop", "fields": {"task": "x"}}), json.dumps({"action": "episode start", "fields": [1]}),
    json.dumps({"action": "episode start", "fields": {"task": 5}}), json.dumps({"action": "estop", "extra": 1}),
    json.dumps({"action": "episode stop", "fields": {"notes": "x" * 5000}}),
])
def test_malformed_requests_get_400_and_change_nothing(served, body):
    server, _, fake = served()
    status, text = _run(_request("POST", f"http://127.0.0.1:{server.port}/api/action", data=body,
                                 headers=_session(server, **{"Content-Type": "application/json"})))
    assert status == 400 and json.loads(text)["ok"] is False
    assert fake.calls == []


def test_actions_answer_with_the_stack_s_result(served):
    server, _, fake = served()
    url = f"http://127.0.0.1:{server.port}/api/action"
    headers = _session(server)
    status, text = _run(_request("POST", url, json={"action": "episode start", "fields": {"task": "pick"}},
                                 headers=headers))
    assert status == 200 and json.loads(text) == {"ok": True, "message": "done"}
    assert fake.calls == [("episode start", {"task": "pick"})]
    fake.answer = Result(True, "recorder: /data/episode_0004", episode="/data/episode_0004")
    status, text = _run(_request("POST", url, json={"action": "episode stop"}, headers=headers))
    assert status == 200 and json.loads(text)["episode"] == "/data/episode_0004"  # the typed field, answered as such
    fake.answer = Result(False, "no episode is being recorded")
    assert _run(_request("POST", url, json={"action": "episode stop"}, headers=headers))[0] == 409
    fake.answer = Result(False, "start the recorder", unavailable=True)
    assert _run(_request("POST", url, json={"action": "episode stop"}, headers=headers))[0] == 503


def _frame(value: int) -> np.ndarray:
    return np.full((48, 64, 3), value, np.uint8)


@contextlib.asynccontextmanager
async def _subscribed(server: ConsoleServer, streams: tuple[str, ...] = ("consumer",)):
    """A WebSocket to ``server`` that said hello (with the session secret) and asked for ``streams``."""
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"http://127.0.0.1:{server.port}/ws") as ws:
            await ws.send_str(json.dumps({"type": "hello", "session": server.session_secret}))
            await ws.send_str(json.dumps({"type": "subscribe", "streams": list(streams)}))
            await asyncio.sleep(0.2)
            yield ws


async def _next_frame(ws, timeout: float = 10.0):
    """The next binary (frame) message within ``timeout`` [s]: (header, BGR image); state messages in between
    are passed over."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        msg = await asyncio.wait_for(ws.receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
        if msg.type == aiohttp.WSMsgType.BINARY:
            (n,) = struct.unpack(">I", msg.data[:4])
            header = json.loads(msg.data[4:4 + n])
            return header, cv2.imdecode(np.frombuffer(msg.data[4 + n:], np.uint8), cv2.IMREAD_COLOR)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg


def test_the_websocket_sends_the_newest_frames_and_skips_what_a_browser_did_not_take(served):
    server, hub, fake = served()

    async def scenario():
        async with _subscribed(server) as ws:
            for k in range(1, 21):  # far faster than frames are encoded
                hub.put("consumer", 1000 + k, 5000.0 + k, lambda v=10 * k: _frame(v))
            hub.put("physical", 1, 1.0, lambda: _frame(0))  # not subscribed: never sent
            frames = []
            while not frames or frames[-1][0]["seq"] < 20:
                header, image = await _next_frame(ws)
                frames.append((header, image))
                if header["seq"] < 20:  # drawn without a time: acknowledged, no latency reported
                    await ws.send_str(json.dumps({"type": "decoded", "stream": "consumer", "seq": header["seq"]}))
            header, image = frames[-1]
            await ws.send_str(json.dumps({"type": "decoded", "stream": "consumer", "seq": 20,
                                          "received_ms": header["received_ms"],
                                          "t_ms": header["received_ms"] + 12.0}))
            await asyncio.sleep(0.2)
            return frames

    frames = _run(scenario())
    header, image = frames[-1]
    assert header["stream"] == "consumer" and header["stamp_ns"] == 1020 and header["received_ms"] == 5020.0
    assert image.shape == (48, 64, 3) and abs(int(image.mean()) - 200) <= 2  # the newest frame's pixels
    assert all(h["stream"] == "consumer" for h, _ in frames)
    assert len(frames) < 20 and server.frames_skipped["consumer"] > 0  # frames dropped, not queued
    assert fake.decoded == [("consumer", pytest.approx(0.012))]


def test_a_stream_waits_for_the_browser_to_draw_its_last_frame_while_the_state_goes_on(served):
    """One frame per stream on its way at a time: a browser that has not drawn the last frame is sent no other
    (a queue of frames would hold the state messages back), then the newest; the state keeps coming."""
    server, hub, fake = served()

    async def scenario():
        async with _subscribed(server) as ws:
            hub.put("consumer", 1, 1.0, lambda: _frame(10))
            first, _ = await _next_frame(ws)
            for k in range(2, 11):
                hub.put("consumer", k, float(k), lambda v=10 * k: _frame(v))
                await asyncio.sleep(0.05)
            states, frames_meanwhile = 0, 0
            deadline = asyncio.get_running_loop().time() + 1.2  # over two state periods, no acknowledgement
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    msg = await asyncio.wait_for(ws.receive(), left)
                except asyncio.TimeoutError:
                    break
                states += msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "state"
                frames_meanwhile += msg.type == aiohttp.WSMsgType.BINARY
            await ws.send_str(json.dumps({"type": "decoded", "stream": "consumer", "seq": first["seq"]}))
            newest, _ = await _next_frame(ws, 2.0)
            return first, states, frames_meanwhile, newest

    first, states, frames_meanwhile, newest = _run(scenario())
    assert first["seq"] == 1 and frames_meanwhile == 0 and states >= 2
    assert newest["seq"] == 10 and server.frames_skipped["consumer"] == 8
    assert server.acks_missed["consumer"] == 0


def test_a_frame_never_acknowledged_is_given_up_after_the_timeout(served, monkeypatch):
    import rynn_teleop.console.server as console_server

    monkeypatch.setattr(console_server, "ACK_TIMEOUT_S", 0.3)
    server, hub, _ = served()

    async def scenario():
        async with _subscribed(server) as ws:
            hub.put("consumer", 1, 1.0, lambda: _frame(10))
            await _next_frame(ws)
            hub.put("consumer", 2, 2.0, lambda: _frame(20))
            second, _ = await _next_frame(ws, 5.0)  # a script that never acknowledges still gets frames
            return second

    assert _run(scenario())["seq"] == 2
    assert server.acks_missed["consumer"] >= 1


def test_the_page_has_the_policy_panel_and_its_actions_reach_the_stack(served):
    from rynn_teleop.nodes.operator import ACTIONS as OPERATOR_ACTIONS

    server, _, fake = served()
    base = f"http://127.0.0.1:{server.port}"
    page = _run(_request("GET", base + "/"))[1]
    script = _run(_request("GET", base + "/static/console.js"))[1]
    assert 'id="policy-state"' in page and "showPolicy" in script
    for action in ("policy start", "policy stop"):  # the buttons name operator actions: the console performs them
        assert f'data-action="{action}"' in page and action in OPERATOR_ACTIONS
    assert [s.service for s in OPERATOR_ACTIONS["policy start"].steps] == ["/policy/start"]
    assert [s.service for s in OPERATOR_ACTIONS["policy stop"].steps] == ["/policy/stop"]
    policy = ConsoleServer("127.0.0.1", 0, "", FrameHub(), dict, fake.perform, {"policy start": ()})
    policy.start()
    try:
        status, _ = _run(_request("POST", f"http://127.0.0.1:{policy.port}/api/action",
                                  json={"action": "policy start"}, headers=_session(policy)))
    finally:
        policy.stop()
    assert status == 200 and fake.calls == [("policy start", {})]
