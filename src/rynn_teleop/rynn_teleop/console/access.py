"""Who may use the console (and the Foxglove node's gate): the rules, free of ROS and of aiohttp.

A browser runs any page's script against any address it can reach, loopback included, so the console
refuses every request that does not come from its own page (threat model: ``docs/security.md``):

* **Host** (:meth:`AccessRules.host_refusal`): every request names a host the server serves: its bind
  address, ``localhost``, the loopback addresses when bound to loopback, any IP address when bound to every
  interface (``0.0.0.0`` / ``::``), and the names in ``allowed_hosts``. A DNS-rebinding page reaches the
  port under a name of its own (``Host: rebind.evil.example:8080``): refused, whatever the request.
* **Origin** (:meth:`AccessRules.origin_refusal`): a request that carries an ``Origin`` (every browser
  request but a plain navigation or a same-origin GET) comes from the server's own origin
  (``http://<Host>``, when the server serves a page) or from ``allowed_origins``. No ``Origin``: a
  non-browser client (curl, a script), which the session secret still stops.
* **Session secret** (:class:`SessionSecret`): generated per run, carried by the page the console serves
  (``<meta name="rynn-session">``, never a URL); state-changing requests send it in :data:`SESSION_HEADER`,
  the WebSocket in its first message. A page of another origin cannot read it.
* **JSON bodies** (:func:`content_type_refusal`): ``application/json`` only, which a cross-origin page cannot
  send without a CORS preflight, and the console answers no CORS.
* **Depth-limited JSON** (:func:`parse_json`): nesting deeper than :data:`MAX_JSON_DEPTH` is refused before
  the parser recurses.

:class:`ConsoleAccess` applies them in order (Host, token, Origin, secret, content type) to one request given
as plain data; each refusal is a :class:`Refusal`: HTTP status, a reason (the counters' key, one of
:data:`REASONS`) and a message that says what to do.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from ..errors import ParameterError

SESSION_HEADER = "X-Rynn-Session"  # the per-run secret of state-changing requests
TOKEN_HEADER = "X-Rynn-Token"  # the access token of a non-loopback console (or ``?token=``)
SESSION_META = "rynn-session"  # <meta name=...> of the page that carries the secret
MAX_JSON_DEPTH = 8  # deepest nesting of arrays/objects accepted in a body or a WebSocket message
WILDCARD_HOSTS = ("0.0.0.0", "::")  # bind addresses meaning every interface
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
#: every refusal reason, in the order the checks run (the console counts refusals per reason)
REASONS = ("host", "token", "origin", "session", "content_type", "malformed", "nested")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # methods that change nothing (OPTIONS: a preflight, never answered)


class Refusal(NamedTuple):
    """Why a request is refused."""

    status: int  # HTTP status
    reason: str  # one of REASONS
    message: str  # what the client is told (and the log shows)

    def body(self) -> dict[str, Any]:
        """The JSON body of the refusal."""
        return {"ok": False, "reason": self.reason, "message": self.message}


class BadJson(ValueError):
    """A body or message that is not acceptable JSON; ``reason`` is ``malformed`` or ``nested``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def refusal(self) -> Refusal:
        return Refusal(400, self.reason, str(self))


# ---------------------------------------------------------------------- hosts and origins
def split_host(value: str) -> tuple[str, int | None]:
    """A ``Host`` header or URL authority -> (host lower-cased, IPv6 without brackets; port or None).

    Raises ValueError when it is not ``name[:port]``, ``ipv4[:port]`` or ``[ipv6][:port]``.
    """
    text = value.strip().lower()
    if not text or any(c in text for c in "/?#@ \t"):
        raise ValueError(f"not a host: {value!r}")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"not a host: {value!r}")
        host, rest = text[1:end], text[end + 1:]
        ipaddress.IPv6Address(host)  # raises ValueError
    else:
        host, sep, rest = text.partition(":")
        rest = sep + rest
    if rest and not re.fullmatch(r":\d{1,5}", rest):
        raise ValueError(f"not a host: {value!r}")
    port = int(rest[1:]) if rest else None
    if not host or (port is not None and port > 65535):
        raise ValueError(f"not a host: {value!r}")
    return host, port


def normalize_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` lower-cased without a default port (``http://Localhost:80`` ->
    ``http://localhost``); None when ``origin`` is not one (``null``, a path, another scheme)."""
    try:
        parts = urlsplit(origin.strip())
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query or parts.fragment:
            return None
        host, port = split_host(parts.netloc)
    except ValueError:
        return None
    if port == {"http": 80, "https": 443}[parts.scheme]:
        port = None
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}" + (f":{port}" if port is not None else "")


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    return host == "localhost" or (is_ip(host) and ipaddress.ip_address(host).is_loopback)


@dataclass(frozen=True)
class AccessRules:
    """Which ``Host`` and ``Origin`` values a server accepts.

    Args:
        bind_host: the address it listens on (``0.0.0.0`` / ``::``: every interface).
        allowed_hosts: further host names it serves (e.g. ``robot.lab``: the console opened by name), without
            port or scheme.
        allowed_origins: further origins requests may come from (``scheme://host[:port]``).
        same_origin: the server serves its own page, so ``http(s)://<Host>`` is an allowed origin too.
    Raises ParameterError (key ``allowed_hosts`` / ``allowed_origins``) for a malformed entry.
    """

    bind_host: str
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    same_origin: bool = True
    _hosts: frozenset[str] = field(init=False, repr=False, compare=False)
    _origins: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bind = self.bind_host.strip().lower().strip("[]")
        hosts = {"localhost"}
        if bind not in WILDCARD_HOSTS:
            hosts.add(bind)
            if is_loopback(bind):
                hosts.update(LOOPBACK_NAMES)
        for entry in self.allowed_hosts:
            try:  # an IPv6 address may be given without brackets
                host, port = (entry.strip().lower(), None) if is_ip(entry.strip()) else split_host(entry)
            except ValueError:
                host, port = "", None
            if not host or port is not None:
                raise ParameterError("allowed_hosts", f"allowed_hosts: {entry!r} is not a host name or address "
                                     "(no scheme, no port; e.g. robot.lab or 192.168.1.20)")
            hosts.add(host)
        origins = set()
        for entry in self.allowed_origins:
            origin = normalize_origin(entry)
            if origin is None:
                raise ParameterError("allowed_origins", f"allowed_origins: {entry!r} is not an origin "
                                     "(scheme://host[:port] with scheme http or https, no path)")
            origins.add(origin)
        object.__setattr__(self, "_hosts", frozenset(hosts))
        object.__setattr__(self, "_origins", frozenset(origins))

    @property
    def any_address(self) -> bool:
        """Listening on every interface: any IP address is a host it serves."""
        return self.bind_host.strip().strip("[]") in WILDCARD_HOSTS

    @property
    def hosts(self) -> frozenset[str]:
        """The host names and addresses served (besides any IP address when :attr:`any_address`)."""
        return self._hosts

    @property
    def origins(self) -> frozenset[str]:
        """The configured origins (normalized)."""
        return self._origins

    def host_refusal(self, host_header: str | None) -> Refusal | None:
        """None when ``host_header`` names a host this server serves (the port is not checked: a name of
        someone else's is what DNS rebinding needs, and an IP address cannot be rebound)."""
        if not host_header:
            return Refusal(403, "host", "a Host header is required")
        try:
            host, _ = split_host(host_header)
        except ValueError:
            return Refusal(403, "host", f"malformed Host header {host_header[:80]!r}")
        if host in self._hosts or (self.any_address and is_ip(host)):
            return None
        return Refusal(403, "host", f"this server does not serve the host {host[:80]!r} (a page that renamed the "
                       "console's address, as DNS rebinding does?); open it by its address or localhost, or add "
                       "the name to the parameter allowed_hosts")

    def origin_refusal(self, origin: str | None, host_header: str | None) -> Refusal | None:
        """None when ``origin`` is absent (not a browser) or allowed: the server's own origin (``same_origin``,
        ``http(s)://<host_header>``) or a configured one. Call after :meth:`host_refusal`."""
        if origin is None:
            return None
        normalized = normalize_origin(origin)
        if normalized is not None:
            if normalized in self._origins:
                return None
            if self.same_origin and host_header:
                own = {normalize_origin(f"{scheme}://{host_header}") for scheme in ("http", "https")}
                if normalized in own:
                    return None
        return Refusal(403, "origin", f"requests from the origin {origin[:80]!r} are refused: only the server's own "
                       "page may use it (another origin: the parameter allowed_origins)")


# ---------------------------------------------------------------------- secret, body type, JSON
class SessionSecret:
    """The per-run secret of the console's page (``value``: given, for tests; default: 32 random bytes)."""

    def __init__(self, value: str | None = None) -> None:
        self.value = value if value is not None else secrets.token_urlsafe(32)
        if not self.value:
            raise ValueError("the session secret must not be empty")

    def refusal(self, given: str | None, where: str = f"the {SESSION_HEADER} header") -> Refusal | None:
        """None when ``given`` is the secret (compared in constant time)."""
        if given and hmac.compare_digest(given.encode(), self.value.encode()):
            return None
        return Refusal(403, "session", f"{where} must carry the console's session secret "
                       f"(its page has it in <meta name=\"{SESSION_META}\">)")

    def __repr__(self) -> str:  # never printed by accident
        return "SessionSecret(...)"


def content_type_refusal(content_type: str | None) -> Refusal | None:
    """None for ``application/json`` (parameters such as ``charset`` allowed)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        return None
    return Refusal(415, "content_type", f"the body must be Content-Type: application/json, not {media or 'none'!r}")


_JSON_SYNTAX = re.compile(r'\\.|["\[\]{}]', re.DOTALL)  # an escape pair, a quote or a bracket


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text``; brackets inside strings do not count. One linear
    pass (no backtracking whatever the input)."""
    depth = deepest = 0
    in_string = False
    for match in _JSON_SYNTAX.finditer(text):
        token = match.group()
        if token == '"':
            in_string = not in_string
        elif in_string or len(token) == 2:  # inside a string, or an escape pair
            continue
        elif token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse_json(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``data`` (UTF-8) parsed; raises :class:`BadJson` (reason ``nested`` when deeper than ``max_depth``, before
    the parser recurses; ``malformed`` otherwise)."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError:
        raise BadJson("malformed", "the body is not UTF-8 text") from None
    if json_depth(text) > max_depth:
        raise BadJson("nested", f"JSON nested deeper than {max_depth} levels is refused")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise BadJson("malformed", "not valid JSON") from None


# ---------------------------------------------------------------------- one request
class RequestInfo(NamedTuple):
    """What the rules look at in an HTTP request."""

    method: str
    path: str
    headers: Mapping[str, str]  # names in any case
    query: Mapping[str, str] = {}

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers.items():
            if key.lower() == name:
                return value
        return None


class ConsoleAccess:
    """The console's rules for one request, in order: Host; the token (when set; the page's static files are
    exempt); Origin; for a state-changing method the session secret and a JSON body.

    The WebSocket (``GET``) passes Host, token and Origin here and presents the secret in its first message
    (:meth:`hello_refusal`).
    """

    def __init__(self, rules: AccessRules, token: str = "", secret: SessionSecret | None = None) -> None:
        self.rules, self.token = rules, token
        self.secret = secret if secret is not None else SessionSecret()

    def check(self, request: RequestInfo) -> Refusal | None:
        host = request.header("Host")
        if refusal := self.rules.host_refusal(host):
            return refusal
        if self.token and not request.path.startswith("/static/"):  # the shipped CSS/JS hold nothing private
            given = request.header(TOKEN_HEADER) or request.query.get("token", "")
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return Refusal(401, "token", "a valid token is required")
        if refusal := self.rules.origin_refusal(request.header("Origin"), host):
            return refusal
        if request.method.upper() not in SAFE_METHODS:
            if refusal := self.secret.refusal(request.header(SESSION_HEADER)):
                return refusal
            if refusal := content_type_refusal(request.header("Content-Type")):
                return refusal
        return None

    def hello_refusal(self, message: Any) -> Refusal | None:
        """None when ``message`` (a WebSocket's first message, parsed) is ``{"type": "hello", "session": SECRET}``."""
        if not isinstance(message, dict) or message.get("type") != "hello":
            return Refusal(403, "session", 'the first WebSocket message must be {"type": "hello", "session": ...}')
        session = message.get("session")
        return self.secret.refusal(session if isinstance(session, str) else None, "the hello message")


def http_head(data: bytes) -> RequestInfo:
    """An HTTP/1.x request head (request line and headers, up to the blank line) as :class:`RequestInfo`;
    raises ValueError when it is not one. Repeated headers keep their first value."""
    lines = data.decode("latin-1").split("\r\n")  # latin-1 decodes every byte
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"not an HTTP request line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            break
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers.setdefault(name.strip().lower(), value.strip())
    path = parts[1].split("?", 1)[0]
    return RequestInfo(parts[0], path, headers)


def counts(reasons: Iterable[str] = REASONS) -> dict[str, int]:
    """A zero counter per refusal reason."""
    return {r: 0 for r in reasons}
