"""Only the operator's own page may move the robot (issue 36): the Host/Origin/secret/JSON rules
(``console.access``, no aiohttp), the console server refusing what another page or a DNS-rebinding name sends,
the action log, the Foxglove gate, and the two nodes' parameters and diagnostics on real rclpy.
The same attacks from a real browser against a running stack: tests/test_console_security_browser.py."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from typing import NamedTuple

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from rynn_teleop.console.access import (
    MAX_JSON_DEPTH,
    AccessRules,
    BadJson,
    ConsoleAccess,
    RequestInfo,
    SessionSecret,
    content_type_refusal,
    http_head,
    json_depth,
    normalize_origin,
    parse_json,
    split_host,
)
from rynn_teleop.console.gate import WebSocketGate
from rynn_teleop.console.server import WS_BAD_MESSAGE, WS_REFUSED, ConsoleServer, FrameHub
from rynn_teleop.errors import ParameterError

ACTIONS = {"estop": (), "reset": (), "engage": (), "episode start": ("task", "operator")}
SECRET = "s3cret-session"
JSON = "application/json"


# ---------------------------------------------------------------------- the rules, without a server
def _request(method="POST", path="/api/action", **headers) -> RequestInfo:
    return RequestInfo(method, path, {k.replace("_", "-"): v for k, v in headers.items()})


@pytest.mark.parametrize("value, expected", [
    ("127.0.0.1:8080", ("127.0.0.1", 8080)), ("LocalHost", ("localhost", None)), ("[::1]:8080", ("::1", 8080)),
    ("[::1]", ("::1", None)), ("robot.lab:80", ("robot.lab", 80)),
])
def test_split_host_reads_names_addresses_and_ipv6_brackets(value, expected):
    assert split_host(value) == expected


@pytest.mark.parametrize("value", ["", "::1", "[::1", "a:b", "host:99999", "user@host", "host/path", "[nothost]:80"])
def test_split_host_refuses_what_is_not_a_host(value):
    with pytest.raises(ValueError):
        split_host(value)


def test_origins_are_normalized_and_opaque_ones_are_not_origins():
    assert normalize_origin("HTTP://LocalHost:80") == "http://localhost"
    assert normalize_origin("https://teleop.lab:443/") == "https://teleop.lab"
    assert normalize_origin("http://[::1]:8080") == "http://[::1]:8080"
    for opaque in ("null", "file://", "http://h/path", "ftp://h", "chrome-extension://abc", ""):
        assert normalize_origin(opaque) is None, opaque


def test_a_loopback_console_serves_its_address_localhost_and_loopback_only():
    rules = AccessRules("127.0.0.1")
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "127.0.0.1", "LOCALHOST:8080"):
        assert rules.host_refusal(host) is None, host
    for host in ("rebind.evil.example:8080", "evil.localhost:8080", "192.168.1.20:8080", "", None, "a b"):
        refusal = rules.host_refusal(host)
        assert refusal is not None and (refusal.status, refusal.reason) == (403, "host"), host


def test_ipv6_loopback_console_accepts_its_bracketed_address_and_own_origin():
    rules = AccessRules("::1")
    assert rules.host_refusal("[::1]:8080") is None and rules.host_refusal("localhost:8080") is None
    assert rules.origin_refusal("http://[::1]:8080", "[::1]:8080") is None
    assert rules.origin_refusal("http://[::1]:9090", "[::1]:8080").reason == "origin"  # another port: another page


def test_every_interface_serves_any_address_but_only_configured_names():
    rules = AccessRules("0.0.0.0", allowed_hosts=("Robot.Lab", "fe80::1"))
    for host in ("192.168.1.20:8080", "[fd00::5]:8080", "robot.lab:8080", "localhost", "[fe80::1]"):
        assert rules.host_refusal(host) is None, host
    assert rules.host_refusal("rebind.evil.example:8080").reason == "host"  # a name: what DNS rebinding needs


@pytest.mark.parametrize("key, kwargs", [
    ("allowed_hosts", {"allowed_hosts": ("robot.lab:8080",)}), ("allowed_hosts", {"allowed_hosts": ("http://x",)}),
    ("allowed_origins", {"allowed_origins": ("teleop.lab",)}), ("allowed_origins", {"allowed_origins": ("null",)}),
    ("allowed_origins", {"allowed_origins": ("https://teleop.lab/console",)}),
])
def test_malformed_allowed_entries_fail_at_construction_naming_the_key(key, kwargs):
    with pytest.raises(ParameterError) as info:
        AccessRules("127.0.0.1", **kwargs)
    assert info.value.key == key and key in str(info.value)


def test_origin_rules_own_page_configured_origins_and_non_browsers():
    rules = AccessRules("127.0.0.1", allowed_origins=("https://teleop.lab",))
    host = "127.0.0.1:8080"
    assert rules.origin_refusal(None, host) is None  # no Origin: not a browser (curl, a script)
    assert rules.origin_refusal("http://127.0.0.1:8080", host) is None  # the console's own page
    assert rules.origin_refusal("https://teleop.lab", host) is None  # configured (a reverse proxy)
    assert rules.origin_refusal("http://localhost:8080", "localhost:8080") is None
    assert rules.origin_refusal("http://localhost", "localhost:80") is None  # default port either way
    for origin in ("http://evil.example", "null", "http://127.0.0.1:9999", "http://localhost:8080"):
        refusal = rules.origin_refusal(origin, host)
        assert refusal is not None and (refusal.status, refusal.reason) == (403, "origin"), origin
    no_page = AccessRules("127.0.0.1", allowed_origins=("https://app.foxglove.dev",), same_origin=False)
    assert no_page.origin_refusal("http://127.0.0.1:8765", "127.0.0.1:8765").reason == "origin"
    assert no_page.origin_refusal("https://app.foxglove.dev", "127.0.0.1:8765") is None


def test_console_access_checks_host_then_token_then_origin_then_secret_then_json():
    access = ConsoleAccess(AccessRules("127.0.0.1"), "", SessionSecret(SECRET))
    own, host = "http://127.0.0.1:8080", "127.0.0.1:8080"
    ok = dict(Host=host, Origin=own, X_Rynn_Session=SECRET, Content_Type=JSON)
    assert access.check(_request(**ok)) is None
    assert access.check(_request(**{**ok, "Host": "rebind.evil.example:8080"})).reason == "host"
    assert access.check(_request(**{**ok, "Origin": "http://evil.example"})).reason == "origin"
    assert access.check(_request(**{**ok, "X_Rynn_Session": "guess"})).reason == "session"
    no_secret = dict(ok)
    del no_secret["X_Rynn_Session"]
    assert access.check(_request(**no_secret)).reason == "session"
    assert access.check(_request(**{**ok, "Content_Type": "text/plain"})).status == 415
    assert access.check(_request(**{**ok, "Content_Type": "application/json; charset=utf-8"})) is None
    # curl: no Origin, but the secret and a JSON body
    assert access.check(_request(Host=host, X_Rynn_Session=SECRET, Content_Type=JSON)) is None
    # reading: Host (and Origin when sent), no secret
    assert access.check(_request("GET", "/api/state", Host=host)) is None
    assert access.check(_request("GET", "/api/state", Host="rebind.evil.example:8080")).reason == "host"
    assert access.check(_request("GET", "/ws", Host=host, Origin="http://evil.example")).reason == "origin"
    assert access.check(_request("OPTIONS", Host=host, Origin="http://evil.example")).reason == "origin"  # preflight
    with_token = ConsoleAccess(AccessRules("0.0.0.0"), "t0k", SessionSecret(SECRET))
    lan = dict(ok, Host="192.168.1.20:8080", Origin="http://192.168.1.20:8080")
    assert with_token.check(_request(**lan)).status == 401
    assert with_token.check(_request(**lan, X_Rynn_Token="t0k")) is None
    assert with_token.check(RequestInfo("GET", "/", {"Host": lan["Host"]}, {"token": "t0k"})) is None
    assert with_token.check(RequestInfo("GET", "/static/console.js", {"Host": lan["Host"]})) is None


def test_the_hello_message_carries_the_secret():
    access = ConsoleAccess(AccessRules("127.0.0.1"), "", SessionSecret(SECRET))
    assert access.hello_refusal({"type": "hello", "session": SECRET}) is None
    for message in ({"type": "hello", "session": "guess"}, {"type": "hello"}, {"type": "subscribe"}, [SECRET],
                    {"type": "hello", "session": [SECRET]}):
        assert access.hello_refusal(message).reason == "session", message
    assert "guess" not in repr(SessionSecret("guess")) and len(SessionSecret().value) >= 32
    assert SessionSecret().value != SessionSecret().value


def test_content_type_must_be_json():
    assert content_type_refusal("application/json") is None and content_type_refusal("Application/JSON") is None
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None, ""):
        assert content_type_refusal(ct).reason == "content_type", ct


def test_json_deeper_than_the_limit_is_refused_before_the_parser_recurses():
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(BadJson) as info:
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    assert info.value.reason == "nested"
    with pytest.raises(BadJson) as info:
        parse_json(b"[" * 16 * 1024)  # the issue's body: RecursionError in json.loads before
    assert info.value.reason == "nested" and info.value.refusal().status == 400
    assert parse_json('{"task": "[[[[[[[[[[[[{{{{{{{{ \\" ]]]"}') == {"task": "[[[[[[[[[[[[{{{{{{{{ \" ]]]"}
    for bad in (b"not json", b"\xff\xfe", b'{"a": ', b""):
        with pytest.raises(BadJson) as info:
            parse_json(bad)
        assert info.value.reason == "malformed", bad


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ ab\n'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=4), inner,
                                                                 max_size=3),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_json_depth_is_the_nesting_of_any_json_value(value):
    """Property: the pre-scan counts exactly the nesting the parser would recurse into (strings full of brackets,
    quotes and backslashes included)."""
    assert json_depth(json.dumps(value)) == _depth(value)
    assert json_depth(json.dumps(value, ensure_ascii=False, indent=1)) == _depth(value)


def test_http_head_reads_the_request_line_and_headers():
    head = http_head(b"GET /ws?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8765\r\norigin: http://evil.example\r\n"
                     b"Origin: http://second\r\n\r\n")
    assert (head.method, head.path) == ("GET", "/ws")
    assert head.header("host") == "127.0.0.1:8765" and head.header("ORIGIN") == "http://evil.example"
    for bad in (b"hello\r\n\r\n", b"GET / HTTP/1.1\r\nno colon\r\n\r\n", b"GET / HTTP/1.1\r\n bad: x\r\n\r\n"):
        with pytest.raises(ValueError):
            http_head(bad)


# ---------------------------------------------------------------------- the console server
class Result(NamedTuple):
    ok: bool
    message: str
    unavailable: bool = False


class Stack:
    """What the console would drive: the actions performed, and the records of the action log."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.records: list = []
        self.refusals: list = []

    def perform(self, name, fields):
        self.calls.append((name, dict(fields)))
        return Result(True, f"{name} done")


@pytest.fixture
def console():
    made: list[ConsoleServer] = []

    def make(host: str = "127.0.0.1", **kwargs) -> tuple[ConsoleServer, Stack]:
        stack = Stack()
        server = ConsoleServer(host, 0, kwargs.pop("token", ""), FrameHub(), lambda: {"estop_latched": True},
                               stack.perform, ACTIONS, on_action=stack.records.append,
                               on_refused=lambda r, c: stack.refusals.append((r, c)), **kwargs)
        server.start()
        made.append(server)
        return server, stack

    yield make
    for server in made:
        server.stop()


async def _call(method: str, url: str, **kwargs) -> tuple[int, dict | str, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, **kwargs) as response:
            text = await response.text()
            try:
                body = json.loads(text)
            except json.JSONDecodeError:
                body = text
            return response.status, body, dict(response.headers)


def _run(coro):
    return asyncio.run(coro)


def test_the_issue_s_requests_are_refused_counted_and_change_nothing(console):
    server, stack = console()
    base = f"http://127.0.0.1:{server.port}"
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    for action in ("reset", "engage"):  # a no-cors fetch from any page: text/plain, the page's Origin
        status, body, _ = _run(_call("POST", base + "/api/action", data=json.dumps({"action": action}), headers=evil))
        assert (status, body["ok"], body["reason"]) == (403, False, "origin")
    status, body, _ = _run(_call("GET", base + "/api/state", headers={"Host": "rebind.evil.example:8080"}))
    assert (status, body["reason"]) == (403, "host")
    status, body, _ = _run(_call("POST", base + "/api/action", json={"action": "reset"},
                                 headers={"Host": "rebind.evil.example:8080", "X-Rynn-Session": server.session_secret}))
    assert (status, body["reason"]) == (403, "host")  # even with the secret (a rebinding page could not have it)

    async def foreign_websocket():
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await session.ws_connect(base + "/ws", headers={"Origin": "http://evil.example"})
            return info.value.status

    assert _run(foreign_websocket()) == 403
    # without the page's secret (curl, or a page that forged no Origin): refused too
    status, body, _ = _run(_call("POST", base + "/api/action", json={"action": "reset"}))
    assert (status, body["reason"]) == (403, "session")
    assert stack.calls == [] and stack.records == []
    assert server.refused["origin"] == 3 and server.refused["host"] == 2 and server.refused["session"] == 1
    assert server.requests_refused == 6 and len(stack.refusals) == 6
    assert all("evil.example" in client for r, client in stack.refusals if r.reason in ("origin", "host"))
    status, state, _ = _run(_call("GET", base + "/api/state"))
    assert status == 200 and state["access"]["refused"]["origin"] == 3
    assert state["access"]["last_refused"]["reason"] == "session"


def test_the_page_carries_a_per_run_secret_and_its_own_requests_work(console):
    server, stack = console()
    other, _ = console()
    base = f"http://127.0.0.1:{server.port}"
    status, page, headers = _run(_call("GET", base + "/"))
    secret = re.search(r'<meta name="rynn-session" content="([^"]+)">', page).group(1)
    assert status == 200 and secret == server.session_secret != other.session_secret
    assert headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert headers["Cache-Control"] == "no-store"
    page_headers = {"Origin": base, "Content-Type": JSON, "X-Rynn-Session": secret}
    status, body, headers = _run(_call("POST", base + "/api/action", headers=page_headers,
                                       data=json.dumps({"action": "episode start", "fields": {"operator": "ada"}})))
    assert (status, body) == (200, {"ok": True, "message": "episode start done"})
    assert "Access-Control-Allow-Origin" not in headers  # no CORS, ever
    assert stack.calls == [("episode start", {"operator": "ada"})]
    # localhost is the same console, under its own origin
    local = f"http://localhost:{server.port}"
    status, _, _ = _run(_call("POST", local + "/api/action", json={"action": "estop"},
                              headers={"Origin": local, "X-Rynn-Session": secret}))
    assert status == 200 and server.requests_refused == 0


def test_a_configured_origin_is_accepted(console):
    server, stack = console(rules=AccessRules("127.0.0.1", allowed_origins=("https://teleop.lab",)))
    url = f"http://127.0.0.1:{server.port}/api/action"
    headers = {"Origin": "https://teleop.lab", "X-Rynn-Session": server.session_secret}
    assert _run(_call("POST", url, json={"action": "estop"}, headers=headers))[0] == 200
    headers["Origin"] = "https://other.lab"
    assert _run(_call("POST", url, json={"action": "estop"}, headers=headers))[0] == 403
    assert stack.calls == [("estop", {})]


def test_nested_json_is_answered_400_without_a_traceback(console, caplog):
    caplog.set_level(logging.DEBUG)
    server, stack = console()
    base = f"http://127.0.0.1:{server.port}"
    headers = {"Content-Type": JSON, "X-Rynn-Session": server.session_secret}
    status, body, _ = _run(_call("POST", base + "/api/action", data="[" * (16 * 1024 - 1), headers=headers))
    assert (status, body["reason"]) == (400, "nested")

    async def nested_message():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(base + "/ws") as ws:
                await ws.send_str(json.dumps({"type": "hello", "session": server.session_secret}))
                await ws.send_str("[" * 10_000)
                while True:
                    msg = await asyncio.wait_for(ws.receive(), 10.0)
                    if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                        return ws.close_code, msg.extra

    code, reason = _run(nested_message())
    assert code == WS_BAD_MESSAGE and "nested" in reason
    assert server.refused["nested"] == 2 and stack.calls == []
    assert not [r for r in caplog.records if r.exc_info or "RecursionError" in r.getMessage()], caplog.text


def test_a_websocket_gets_nothing_before_its_hello_and_is_closed_without_one(console, monkeypatch):
    import rynn_teleop.console.server as console_server

    monkeypatch.setattr(console_server, "HELLO_TIMEOUT_S", 0.5)
    server, _ = console()
    url = f"http://127.0.0.1:{server.port}/ws"

    async def scenario(first: str | None):
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url) as ws:
                if first is not None:
                    await ws.send_str(first)
                msg = await asyncio.wait_for(ws.receive(), 10.0)
                return msg.type, ws.close_code, msg.extra if msg.type == aiohttp.WSMsgType.CLOSE else msg.data

    silent = _run(scenario(None))
    assert silent[0] == aiohttp.WSMsgType.CLOSE and silent[1] == WS_REFUSED and "hello" in silent[2]
    wrong = _run(scenario(json.dumps({"type": "hello", "session": "guess"})))
    assert wrong[1] == WS_REFUSED and "secret" in wrong[2]
    subscribe_first = _run(scenario(json.dumps({"type": "subscribe", "streams": ["consumer"]})))
    assert subscribe_first[1] == WS_REFUSED
    assert server.refused["session"] == 3 and server.clients == 0
    kind, _, data = _run(scenario(json.dumps({"type": "hello", "session": server.session_secret})))
    assert kind == aiohttp.WSMsgType.TEXT and json.loads(data)["type"] == "state"  # then the state comes
    assert server.refused["session"] == 3


def test_each_accepted_action_is_logged_with_time_client_and_result(console):
    server, stack = console()
    base = f"http://127.0.0.1:{server.port}"
    headers = {"Origin": base, "X-Rynn-Session": server.session_secret}
    _run(_call("POST", base + "/api/action", json={"action": "engage"}, headers=headers))
    _run(_call("POST", base + "/api/action", json={"action": "estop"},
               headers={"X-Rynn-Session": server.session_secret}))  # curl: no Origin
    _run(_call("POST", base + "/api/action", json={"action": "reset"}, headers={"Origin": "http://evil.example"}))
    assert [r.action for r in stack.records] == ["engage", "estop"]  # the refused one is no action
    engage = stack.records[0].to_dict()
    assert engage["client"] == "127.0.0.1" and engage["origin"] == base and engage["ok"] is True
    assert engage["status"] == 200 and engage["result"] == "engage done" and engage["time"].endswith("Z")
    assert json.loads(stack.records[1].to_json())["origin"] == ""
    status, state, _ = _run(_call("GET", base + "/api/state"))
    assert [a["action"] for a in state["access"]["log"]] == ["estop", "engage"]  # newest first
    assert state["access"]["accepted"] == 2 and server.audit.accepted == 2


# ---------------------------------------------------------------------- the gate (Foxglove node)
class Upstream:
    """A WebSocket echo server on loopback (a stand-in of the Foxglove SDK server), subprotocol echo.v1."""

    def __init__(self) -> None:
        self.port = 0
        self.seen_origins: list[str | None] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10.0)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def echo(request):
            self.seen_origins.append(request.headers.get("Origin"))
            ws = web.WebSocketResponse(protocols=("echo.v1",))
            await ws.prepare(request)
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    await ws.send_str("echo " + msg.data)
            return ws

        async def start():
            app = web.Application()
            app.router.add_get("/", echo)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]

        self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self._loop).result(5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


def test_the_gate_refuses_foreign_origins_and_names_and_passes_the_rest_unchanged():
    upstream = Upstream()
    rules = AccessRules("127.0.0.1", allowed_origins=("https://app.foxglove.dev",), same_origin=False)
    refusals = []
    gate = WebSocketGate("127.0.0.1", 0, upstream.port, rules, on_refused=lambda r, c: refusals.append((r, c)))
    gate.start()
    url = f"http://127.0.0.1:{gate.port}/"

    async def talk(headers: dict[str, str]):
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(url, headers=headers, protocols=("echo.v1",)) as ws:
                    await ws.send_str("hi")
                    msg = await asyncio.wait_for(ws.receive(), 10.0)
                    return ws.protocol, msg.data
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status, None

    async def refused_body(headers: dict[str, str]):
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers={"Connection": "Upgrade", "Upgrade": "websocket", **headers}) as r:
                return r.status, await r.json()

    try:
        assert _run(talk({})) == ("echo.v1", "echo hi")  # Foxglove desktop, scripts: no Origin
        assert _run(talk({"Origin": "https://app.foxglove.dev"})) == ("echo.v1", "echo hi")
        assert _run(talk({"Origin": "http://evil.example"})) == (403, None)
        assert _run(talk({"Host": "rebind.evil.example:8765"})) == (403, None)
        status, body = _run(refused_body({"Origin": "null"}))
        assert status == 403 and body["reason"] == "origin" and body["ok"] is False
        assert gate.refused == {"host": 1, "origin": 2, "malformed": 0}
        assert upstream.seen_origins == [None, "https://app.foxglove.dev"]  # refused ones never reached it
        assert len(refusals) == 3 and gate.last_refused["reason"] == "origin"
    finally:
        gate.stop()
        upstream.stop()


def test_the_gate_answers_400_to_what_is_not_an_http_request():
    upstream = Upstream()
    gate = WebSocketGate("127.0.0.1", 0, upstream.port, AccessRules("127.0.0.1", same_origin=False))
    gate.start()

    async def send(raw: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(raw)
        answer = await asyncio.wait_for(reader.read(), 10.0)
        writer.close()
        return answer

    try:
        assert _run(send(b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert _run(send(b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert gate.refused["malformed"] == 2
    finally:
        gate.stop()
        upstream.stop()


# ---------------------------------------------------------------------- the nodes, on real rclpy
def _console_status(statuses: list, key: str):
    """The newest console status whose values hold ``key`` (as a dict), or None."""
    for st_ in reversed(statuses):
        values = {kv.key: kv.value for kv in st_.values}
        if st_.name == "console" and key in values:
            return values
    return None


def test_the_console_node_counts_refusals_and_publishes_each_action_in_its_diagnostics(ros_domain_id):
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from rclpy.node import Node
    from ros_helpers import wait_for
    from std_srvs.srv import Trigger

    from rynn_teleop.runner import Composition

    comp = Composition(["console"], overrides={"console": {"port": 0, "allowed_hosts": ["robot.lab"]}},
                       domain_id=ros_domain_id)
    try:
        console_node = comp.node("console")
        helper = Node("security_test_helper", context=comp.context)
        statuses: list = []
        toggles: list = []
        helper.create_subscription(DiagnosticArray, "/diagnostics", lambda m: statuses.extend(m.status), 50)

        def toggle(request, response):
            toggles.append(1)
            response.success, response.message = True, "showing generated"
            return response

        helper.create_service(Trigger, "/camera_switch/toggle", toggle)
        comp.add_node(helper)
        server = console_node.server
        base = f"http://127.0.0.1:{server.port}"
        # foreign page, then a rebinding name, then the page's own request (by a configured name)
        assert _run(_call("POST", base + "/api/action", json={"action": "reset"},
                          headers={"Origin": "http://evil.example"}))[0] == 403
        assert _run(_call("GET", base + "/api/state", headers={"Host": f"rebind.test:{server.port}"}))[0] == 403
        own = f"http://robot.lab:{server.port}"
        for _ in range(3):  # back to back: each is published on its own, not only the newest once a second
            status, body, _ = _run(_call("POST", base + "/api/action", json={"action": "feed toggle"},
                                         headers={"Host": f"robot.lab:{server.port}", "Origin": own,
                                                  "X-Rynn-Session": server.session_secret}))
            assert (status, body["ok"]) == (200, True)
        assert toggles == [1, 1, 1]

        def published() -> dict[float, dict]:
            records = [json.loads({kv.key: kv.value for kv in s.values}.get("action.last", "null"))
                       for s in list(statuses) if s.name == "console"]
            return {r["t"]: r for r in records if r is not None}

        assert wait_for(lambda: len(published()) == 3, 10.0), published()
        record = max(published().items())[1]
        assert (record["action"], record["client"], record["origin"], record["ok"]) == (
            "feed toggle", "127.0.0.1", own, True)
        assert "showing generated" in record["result"]
        assert wait_for(lambda: (_console_status(statuses, "actions.accepted") or {}).get("actions.accepted") == "3",
                        5.0)
        assert wait_for(lambda: (_console_status(statuses, "refused.host") or {}).get("refused.host") == "1", 5.0)
        values = _console_status(statuses, "refused.host")
        assert values["refused.origin"] == "1" and values["requests_refused"] == "2"
        level = [s for s in statuses if s.name == "console"][-1].level
        assert level == DiagnosticStatus.WARN  # for a minute after a refusal
    finally:
        comp.shutdown()
    assert not comp.errors


@pytest.mark.parametrize("key, value", [("allowed_origins", ["teleop.lab"]), ("allowed_hosts", ["robot.lab:80"])])
def test_the_console_node_refuses_malformed_allow_lists_naming_the_key(ros_domain_id, key, value):
    from rynn_teleop.runner import Composition

    with pytest.raises(ParameterError) as info:
        Composition(["console"], overrides={"console": {"port": 0, key: value}}, domain_id=ros_domain_id)
    assert info.value.key == key


def test_the_foxglove_node_refuses_foreign_pages_and_passes_the_foxglove_app(ros_domain_id):
    pytest.importorskip("foxglove")
    from diagnostic_msgs.msg import DiagnosticStatus

    from rynn_teleop.runner import Composition

    comp = Composition(["foxglove"], overrides={"foxglove": {"port": 0}}, domain_id=ros_domain_id)
    try:
        fox = comp.node("foxglove")
        url = f"http://127.0.0.1:{fox.port}/"

        async def connect(headers: dict[str, str]):
            async with aiohttp.ClientSession() as session:
                try:
                    async with session.ws_connect(url, headers=headers, protocols=("foxglove.sdk.v1",)) as ws:
                        msg = await asyncio.wait_for(ws.receive(), 10.0)
                        return ws.protocol, json.loads(msg.data)["op"]
                except aiohttp.WSServerHandshakeError as exc:
                    return exc.status, None

        assert _run(connect({"Origin": "https://app.foxglove.dev"})) == ("foxglove.sdk.v1", "serverInfo")
        assert _run(connect({})) == ("foxglove.sdk.v1", "serverInfo")  # no Origin: desktop app, scripts
        assert _run(connect({"Origin": "http://evil.example"})) == (403, None)
        assert _run(connect({"Host": f"rebind.test:{fox.port}"})) == (403, None)
        values = fox.diagnostic_values()
        assert (values["refused.origin"], values["refused.host"]) == (1, 1)
        assert fox.diagnostic_level()[0] == DiagnosticStatus.WARN
    finally:
        comp.shutdown()
    assert not comp.errors
