"""console node: the operator's web page for a whole session (``console.server`` serves it).

Served at ``http://<host>:<port>/``: the consumer feed large, the physical and generated sources beside it,
per-arm state, e-stop, active feed, the episode being recorded, the physical twin, the policy (when a policy node
runs: its state, rate against its frame rate and act() time, with start and stop), every node's health, and a
button (most with a keyboard shortcut) for every operator action (``nodes.operator.ACTIONS``). E-stop: the button,
Space or Esc.
Images are kept as received (newest per stream) and JPEG-encoded only while a browser shows them, so the
page never slows the stack. A non-loopback address needs a token (``token``, or one generated and logged).

Only the console's own page may act (``console.access``; threat model ``docs/security.md``): requests naming a
host the console does not serve (``allowed_hosts`` adds names), requests from another origin
(``allowed_origins`` adds origins), and actions or WebSockets without the page's per-run session secret are
refused and counted per reason. Each accepted action (time, client address, Origin, action, result) is logged,
shown on the page, and published at once in this node's ``/diagnostics`` status (``action.last``, a JSON line),
which the recorder writes into the episode being recorded.

XR headset (``/xr``, ``console.server``): the headset's page streams its XR frames over the WebSocket; each
accepted one is published at once, stamped with the frame's time on this node's clock (``core.xr.FrameClock``),
in the frame ``xr.frame_id`` (x forward, y left, z up: ``core.xr.XR_TO_WORLD``). The ``xr`` tracker and hand
backends (``sources.trackers.xr``, ``sources.hands.xr``) take them. WebXR needs a secure context: off loopback
the page is served over HTTPS (``console.tls``: ``tls.cert_file`` / ``tls.key_file``, or a self-signed
certificate made on first use in ``tls.dir``, its SHA-256 fingerprint logged).

Topics and services: :attr:`ConsoleNode.IO` (``/diagnostics`` also goes out once per action).
Diagnostics: ``url`` (typed: ``core.status.ConsoleStatus``), ``browsers``, per stream ``<stream>.sent`` /
``.skipped`` / ``.acks_missed``, the ``browser.<stream>`` meters (latency: ROS message received -> frame
drawn), ``cpu_process_percent`` and ``cpu_server_percent`` [% of one core], ``requests_refused`` and per
reason ``refused.<reason>`` (``console.access.REASONS``), ``actions.accepted``, ``action.last``, ``xr.client``
(the headset streaming, or none), ``xr.frames`` and per reason ``xr.refused.<reason>`` (``core.xr.XR_REASONS``),
the ``xr`` meter (frames received; latency: a frame's stamp -> published). WARN for :data:`REFUSED_WARN_S` after
a refused request or XR frame.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
import time
from collections import deque
from typing import Any

import cv2
import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import Image

from ..console import tls
from ..console.access import REASONS, AccessRules, Refusal
from ..console.audit import ActionRecord
from ..console.server import LOOPBACK, STREAMS, ConsoleError, ConsoleServer, FrameHub
from ..core import node_io
from ..core.layout import SIDES
from ..core.node_io import SENSOR_DATA, Each, NodeIO, QoS, Service, Topic
from ..core.params import STR_LIST, Param, ParamSchema
from ..core.status import ConsoleStatus
from ..core.xr import XR_REASONS, XRFrame, frame_world_poses, to_world
from ..errors import ConfigurationError, ParameterError
from ..recording.cdr import header_stamp_ns, pose_array_cdr
from .base import TeleopNode, run_single
from .conversions import image_array
from .io import type_name
from .operator import (
    ACTIONS,
    ACTIVE_SOURCE_TOPIC,
    DIAGNOSTICS_TOPIC,
    EPISODE_TOPIC,
    ESTOP_TOPIC,
    RECORDER_FIELDS,
    OperatorClient,
)

BROWSER_BUDGET_MS = 50.0  # ROS message received -> frame drawn in a browser, p99 (shown against in diagnostics)
REFUSED_WARN_S = 60.0  # [s] the node's status stays WARN after the newest refused request
REFUSED_LOG_S = 5.0  # [s] at most one log line per refusal reason this often (a page retrying floods no log)
CPU_WINDOW_S = 0.5  # [s] shortest interval the CPU shares are measured over (diagnostics also go out per action)
XR_QOS = QoS(10)  # reliable: matches reliable and best-effort readers


def _operator_clients() -> tuple[Service, ...]:
    """The service clients of :class:`~.operator.OperatorClient`: one per service an action calls."""
    used: dict[str, tuple[str, list[str]]] = {}
    for action_name, action in ACTIONS.items():
        for step in action.steps:
            used.setdefault(step.service, (type_name(step.srv_type), []))[1].append(action_name)
    clients = [Service(name, kind, f"operator actions: {', '.join(actions)}") for name, (kind, actions) in used.items()]
    clients.append(Service("/recorder/set_parameters", "rcl_interfaces/srv/SetParameters",
                           "the recorder's task, operator, notes and outcome before an episode action"))
    return tuple(clients)


class ConsoleNode(TeleopNode):
    # an XR headset's frames come in here and go on to the tracker and hand_retarget (input class, like theirs);
    # the JPEG encoders run below everything else (console.server)
    PRIORITY = "input"
    SCHEMA = ParamSchema(
        "console",
        [
            Param("host", str, "127.0.0.1", "address the page is served on (another than loopback needs a token)"),
            Param("port", int, 8080, "TCP port of the page (0: any free port, logged)", min=0, max=65535),
            Param("token", str, "", "access token of the page; empty: none on loopback, else one is generated and "
                  "logged once"),
            Param("allowed_hosts", STR_LIST, [],
                  "host names the page may also be opened by (e.g. robot.lab; no port): requests naming any other "
                  "host are refused (DNS rebinding); served anyway: the address, localhost, loopback addresses on "
                  "loopback, any IP address when host is 0.0.0.0 or ::"),
            Param("allowed_origins", STR_LIST, [],
                  "origins (scheme://host[:port]) besides the page's own whose requests and WebSockets are accepted, "
                  "e.g. a reverse proxy's https://teleop.lab; the console answers no CORS"),
            Param("consumer_topic", str, "/head_camera/color/image_raw", "the consumer feed (shown large)"),
            Param("physical_topic", str, "/head_camera/physical/color/image_raw", "the physical camera"),
            Param("generated_topic", str, "/head_camera/generated/color/image_raw", "the world model's feed"),
            Param("xr.enabled", bool, True, "accept an XR headset's frames from the /xr page (false: refused)"),
            Param("xr.poses_topic", str, "/xr/poses", "XR frames' head, left wrist, right wrist (PoseArray)"),
            Param("xr.hands_topic", str, "/xr/hands/{side}", "XR frames' 25 hand joints per tracked hand "
                  "(PoseArray; {side} replaced)"),
            Param("xr.frame_id", str, "xr_world", "frame id of the XR poses (x forward, y left, z up)"),
            Param("tls.cert_file", str, "", "PEM certificate to serve HTTPS with (also on loopback); empty: off "
                  "loopback a self-signed one from tls.dir"),
            Param("tls.key_file", str, "", "PEM private key of tls.cert_file"),
            Param("tls.dir", str, "~/.ros/rynn_teleop/console_tls", "folder of the self-signed certificate made on "
                  "first use off loopback (delete its files to make a new one)"),
        ],
    )
    IO = NodeIO(
        publishers=(
            Topic(ESTOP_TOPIC, "std_msgs/msg/Bool", QoS(10), "true with the e-stop action (beside the drivers' "
                  "e-stop services)"),
            Topic("{xr.poses_topic}", "geometry_msgs/msg/PoseArray", XR_QOS,
                  "per accepted XR frame: head, left wrist, right wrist in xr.frame_id (untracked: all-NaN), stamped "
                  "with the frame's time on this node's clock"),
            Topic("{xr.hands_topic}", "geometry_msgs/msg/PoseArray", XR_QOS,
                  "per tracked hand and XR frame: its 25 WebXR joints (core.xr.WEBXR_JOINTS order); nothing for an "
                  "untracked hand", each=Each("side", values=SIDES)),
        ),
        subscriptions=(
            *(Topic(f"{{{stream}_topic}}", "sensor_msgs/msg/Image", SENSOR_DATA,
                    f"the {stream} feed, kept as received (newest only), JPEG-encoded while a browser shows it")
              for stream in STREAMS),
            Topic(DIAGNOSTICS_TOPIC, "diagnostic_msgs/msg/DiagnosticArray", QoS(50),
                  "every node's status: the session state the page shows"),
            Topic(ACTIVE_SOURCE_TOPIC, "std_msgs/msg/String", node_io.LATCHED, "the feed the camera switch shows"),
            Topic(EPISODE_TOPIC, "std_msgs/msg/String", node_io.LATCHED, "the recorder's newest episode directory"),
        ),
        clients=_operator_clients(),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        host = p["host"].strip()
        _check_host(host)
        token = p["token"]
        if host not in LOOPBACK and not token:
            token = secrets.token_urlsafe(16)
        self.operator = OperatorClient(self)
        self.hub = FrameHub(STREAMS)
        for stream in STREAMS:  # created here: the server's thread ticks them while diagnostics iterate the meters
            self.meter(f"browser.{stream}", latency_budget_ms=BROWSER_BUDGET_MS)
        for stream in STREAMS:
            self.io_subscription(f"{{{stream}_topic}}", lambda raw, s=stream: self._on_image(s, raw), raw=True)
        actions = {name: RECORDER_FIELDS.get(name, ()) for name in ACTIONS}
        rules = AccessRules(host, tuple(p["allowed_hosts"]), tuple(p["allowed_origins"]))  # ParameterError
        self._records: deque[ActionRecord] = deque()  # accepted actions not yet published (server -> executor)
        self._records_lock = threading.Lock()
        self._current: ActionRecord | None = None  # the record being published (action.last; else the newest)
        self._refusal_logged: dict[str, float] = {}  # reason -> monotonic time [s] of its last log line
        self._record_ready = self.create_guard_condition(self._publish_records)
        self._xr_frame_id = p["xr.frame_id"]
        self._xr_poses_pub = self.io_publisher("{xr.poses_topic}")
        self._xr_hand_pubs = {s: self.io_publisher("{xr.hands_topic}", side=s) for s in SIDES}
        self.meter("xr")  # created here: the server's thread ticks it while diagnostics iterate the meters
        ssl_context = self._tls(host, p)
        self.server = ConsoleServer(host, p["port"], token, self.hub, self.operator.snapshot, self._perform,
                                    actions, on_decoded=self._on_decoded, rules=rules,
                                    on_refused=self._on_refused, on_action=self._on_action,
                                    on_xr_frame=self._on_xr_frame if p["xr.enabled"] else None, clock=self.now_s,
                                    ssl_context=ssl_context)
        try:
            self.server.start()
        except ConsoleError as exc:
            raise ParameterError("port", f"console: {exc} (parameters host, port)") from None
        self._cpu_last = (time.monotonic(), time.process_time(), self._server_cpu())
        self._cpu = (0.0, 0.0)
        self.get_logger().info(f"console: open {self.server.url}")
        self.get_logger().info(f"console: XR headset page {self.server.xr_url}")

    def _tls(self, host: str, p) -> Any:
        """The HTTPS context: the given certificate, or off loopback a self-signed one (None: plain HTTP)."""
        if not p["tls.cert_file"] and not p["tls.key_file"] and host in LOOPBACK:
            return None
        try:
            if p["tls.cert_file"] or p["tls.key_file"]:
                files = tls.given(p["tls.cert_file"], p["tls.key_file"])
            else:
                files = tls.self_signed(p["tls.dir"], tls.server_names(host))
            context = tls.server_context(files)
        except ConfigurationError as exc:
            raise ParameterError("tls.cert_file", f"console: {exc}") from None
        made = "made a self-signed certificate" if files.generated else "certificate"
        self.get_logger().info(f"console: HTTPS, {made} {files.cert}; SHA-256 fingerprint {files.fingerprint} "
                               "(compare it with the one the headset's browser shows before accepting it)")
        return context

    # ------------------------------------------------------------------ ROS side
    def _on_image(self, stream: str, raw: bytes) -> None:
        self.hub.put(stream, header_stamp_ns(raw), time.time() * 1e3, lambda: _rgb(raw))

    def _on_xr_frame(self, frame: XRFrame, stamp: float) -> None:  # server thread: published at once
        """Publish one accepted XR frame: the head and wrists, and each tracked hand's 25 joints."""
        stamp_ns = int(round(stamp * 1e9))
        poses = frame_world_poses(frame)
        self._xr_poses_pub.publish(pose_array_cdr(stamp_ns, self._xr_frame_id, poses.positions, poses.quaternions))
        for side, joints in frame.hands.items():
            if joints is not None:
                hand = to_world(joints)
                self._xr_hand_pubs[side].publish(pose_array_cdr(stamp_ns, self._xr_frame_id, hand.positions,
                                                                hand.quaternions))
        now = self.now_s()
        self.meter("xr").tick(now, now - stamp)

    def _on_decoded(self, stream: str, latency: float) -> None:  # server thread
        self.meter(f"browser.{stream}").tick(self.now_s(), latency)

    def _perform(self, name: str, fields) -> Any:  # server worker thread
        return self.operator.perform(name, fields)

    def _on_action(self, record: ActionRecord) -> None:  # server thread: log, and publish from the executor
        log = self.get_logger()
        if record.ok:  # one call site per severity: rclpy refuses a call site whose severity changes
            log.info(f"console action: {record.to_json()}")
        else:
            log.warning(f"console action: {record.to_json()}")
        with self._records_lock:
            self._records.append(record)
        self._record_ready.trigger()

    def _publish_records(self) -> None:  # executor: one diagnostics message per action, so the episode has each
        with self.lock:
            try:
                while True:
                    with self._records_lock:
                        if not self._records:
                            return
                        self._current = self._records.popleft()
                    self._publish_diagnostics()
            finally:
                self._current = None

    def _on_refused(self, refusal: Refusal, client: str) -> None:  # server thread
        now = time.monotonic()
        if now - self._refusal_logged.get(refusal.reason, -REFUSED_LOG_S) >= REFUSED_LOG_S:
            self._refusal_logged[refusal.reason] = now
            self.get_logger().warning(f"console refused a request ({refusal.reason}, {refusal.status}) from "
                                      f"{client}: {refusal.message} (counted in diagnostics refused.*; this "
                                      f"reason logged at most every {REFUSED_LOG_S:g} s)")

    # ------------------------------------------------------------------ diagnostics
    def _server_cpu(self) -> float:
        """CPU time [s] of the server's threads (its loop and the JPEG encoders)."""
        total = 0.0
        for thread in threading.enumerate():
            if thread.name.startswith(("console-server", "console-encode")) and thread.ident is not None:
                try:
                    total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                except (OSError, AttributeError):
                    pass  # the thread ended, or the platform has no per-thread clocks
        return total

    def diagnostic_values(self):
        now, process, server = time.monotonic(), time.process_time(), self._server_cpu()
        t0, p0, s0 = self._cpu_last
        if now - t0 >= CPU_WINDOW_S:
            self._cpu = (100.0 * (process - p0) / (now - t0), 100.0 * max(0.0, server - s0) / (now - t0))
            self._cpu_last = (now, process, server)
        values = {"browsers": self.server.clients,
                  "cpu_process_percent": f"{self._cpu[0]:.1f}", "cpu_server_percent": f"{self._cpu[1]:.1f}",
                  "requests_refused": self.server.requests_refused}
        refused = dict(self.server.refused)
        for reason in REASONS:
            values[f"refused.{reason}"] = refused.get(reason, 0)
        for s in STREAMS:
            values[f"{s}.sent"] = self.server.frames_sent[s]
            values[f"{s}.skipped"] = self.server.frames_skipped[s]
            values[f"{s}.acks_missed"] = self.server.acks_missed[s]
        values["actions.accepted"] = self.server.audit.accepted
        current = self._current or self.server.audit.last  # the 1 Hz status repeats the newest
        if current is not None:
            values["action.last"] = current.to_json()
        xr = self.server.xr_state()
        values["xr.client"] = xr["client"] or "none"
        values["xr.frames"] = xr["frames"]
        for reason in XR_REASONS:
            values[f"xr.refused.{reason}"] = xr["refused"].get(reason, 0)
        return ConsoleStatus(url=self.server.url.split("?")[0]).values(values)

    def diagnostic_level(self):
        last = self.server.last_refused
        if last is not None and time.time() - last["time"] < REFUSED_WARN_S:
            shown = ", ".join(f"{r} {n}" for r, n in self.server.refused.items() if n)
            return DiagnosticStatus.WARN, f"refused requests ({shown}); last: {last['reason']} from {last['client']}"
        last = self.server.xr_last_refused
        if last is not None and time.time() - last["time"] < REFUSED_WARN_S:
            shown = ", ".join(f"{r} {n}" for r, n in self.server.xr_refused.items() if n)
            return DiagnosticStatus.WARN, f"refused XR frames ({shown}); last: {last['reason']} from {last['client']}"
        return DiagnosticStatus.OK, "running"

    def destroy_node(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()
        super().destroy_node()


def _check_host(host: str) -> None:
    if host == "localhost":
        return
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ParameterError("host", f"host must be an IP address or localhost, got {host!r}") from None


def _rgb(raw: bytes) -> np.ndarray:
    """A serialized sensor_msgs/Image -> (H, W, 3) RGB uint8 (depth and mono scaled to grey)."""
    image = image_array(deserialize_message(raw, Image))
    if image.ndim == 3:
        return np.ascontiguousarray(image)
    if image.dtype != np.uint8:
        image = cv2.convertScaleAbs(image, alpha=255.0 / max(1, int(image.max())))
    return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)


def main(args=None) -> int:
    return run_single(ConsoleNode, args)
