"""camera_switch node: the consumer-facing head camera carries the physical or the generated stream.

Inputs (both stay available under their own names):
    <physical_ns>/color/image_raw, <physical_ns>/color/camera_info (+ depth/...)   from head_camera
    <generated_ns>/color/image_raw, <generated_ns>/color/camera_info               from the world model
Outputs (what recorders, viewers and policies subscribe to), SensorDataQoS:
    <output_ns>/color/image_raw, <output_ns>/color/camera_info
    <output_ns>/aligned_depth_to_color/image_raw (+ camera_info), <output_ns>/depth/image_rect_raw (+ camera_info)
                                        (only while the active source provides them)
    <output_ns>/active_source   std_msgs/String "physical" | "generated", transient local (latched)

Select at runtime with the parameter ``active_source`` (``ros2 param set
/camera_switch active_source generated``) or the services ``~/use_physical``,
``~/use_generated``, ``~/toggle`` (std_srvs/Trigger). The switch is immediate:
each incoming frame is forwarded only if its source is the active one when it
arrives, so the first frame after a switch comes from the new source and none
from the old one follows. Messages are forwarded unchanged (stamps, frame
ids; the serialized bytes are passed through without decoding). If the active source is silent for ``silent_timeout_s`` the diagnostics
say so, and with ``fallback`` the output shows the other source while the
chosen one is silent and returns to the chosen one once it is back (the
parameter keeps the operator's choice).
"""

from __future__ import annotations

import struct

from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import String
from std_srvs.srv import Trigger

from ..core.params import Param, ParamSchema
from .base import TeleopNode, run_single

SOURCES = ("physical", "generated")
STREAMS = (  # (name, topic under a camera namespace, type): realsense-ros layout
    ("color", "color/image_raw", Image),
    ("color_info", "color/camera_info", CameraInfo),
    ("aligned_depth", "aligned_depth_to_color/image_raw", Image),
    ("aligned_depth_info", "aligned_depth_to_color/camera_info", CameraInfo),
    ("depth", "depth/image_rect_raw", Image),
    ("depth_info", "depth/camera_info", CameraInfo),
)
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class CameraSwitchNode(TeleopNode):
    SCHEMA = ParamSchema(
        "camera_switch",
        [
            Param("active_source", str, "physical", "stream on the output topics (runtime-settable)",
                  choices=SOURCES, dynamic=True),
            Param("physical_ns", str, "/head_camera/physical", "physical camera topics"),
            Param("generated_ns", str, "/head_camera/generated", "generated (world model) camera topics"),
            Param("output_ns", str, "/head_camera", "consumer-facing camera topics"),
            Param("silent_timeout_s", float, 0.5, "an active source without frames for this long is reported silent",
                  "s", min=0.05, max=30.0),
            Param("fallback", bool, False, "switch to the other source while the active one is silent"),
        ],
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.active = p["active_source"]
        self.preferred = self.active  # the operator's choice; fallback changes only ``active``
        self.fallen_back = False
        out = p["output_ns"].rstrip("/")
        qos = qos_profile_sensor_data
        self._pubs = {stream: self.create_publisher(kind, f"{out}/{topic}", qos) for stream, topic, kind in STREAMS}
        self._active_pub = self.create_publisher(String, f"{out}/active_source", LATCHED)
        self.last_frame: dict[str, float] = {s: float("-inf") for s in SOURCES}
        self.forwarded = {s: 0 for s in SOURCES}
        self._alive_since: dict[str, float | None] = {s: None for s in SOURCES}
        self.switches = 0
        self.last_switch_time = float("-inf")  # [s] node time of the last switch
        for source in SOURCES:
            ns = p[f"{source}_ns"].rstrip("/")
            for stream, topic, kind in STREAMS:
                # raw: the serialized bytes are forwarded as they are (no (de)serialization of 1 MB images)
                self.create_subscription(kind, f"{ns}/{topic}",
                                         lambda m, s=source, st=stream: self._forward(s, st, m), qos, raw=True)
        for name, target in (("use_physical", "physical"), ("use_generated", "generated"), ("toggle", None)):
            self.create_service(Trigger, f"~/{name}", lambda req, res, t=target: self._srv_select(t, res))
        self.add_post_set_parameters_callback(self._on_parameters)
        self._timer = self.create_timer(0.1, self._watch)
        self._publish_active()

    # ------------------------------------------------------------------ selection
    def select(self, source: str, why: str) -> bool:
        """The operator's choice: make ``source`` preferred and active; True if the output changed."""
        self.preferred = source
        self.fallen_back = False
        if self.get_parameter("active_source").value != source:  # keep the parameter in step
            self.set_parameters([Parameter("active_source", Parameter.Type.STRING, source)])
        return self._activate(source, why)

    def _activate(self, source: str, why: str) -> bool:
        if source == self.active:
            return False
        self.active = source
        self.switches += 1
        self.last_switch_time = self.now_s()
        self._publish_active()
        self.get_logger().info(f"camera feed: {source} ({why})")
        return True

    def _publish_active(self) -> None:
        self._active_pub.publish(String(data=self.active))

    def _srv_select(self, target: str | None, response: Trigger.Response) -> Trigger.Response:
        source = target or ("generated" if self.active == "physical" else "physical")
        changed = self.select(source, "service")
        response.success = True
        response.message = f"active source: {source}" + ("" if changed else " (unchanged)")
        return response

    def _on_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        for param in parameters:
            if param.name == "active_source" and (param.value != self.preferred or self.fallen_back):
                self.select(param.value, "parameter")
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------ frames
    def _forward(self, source: str, stream: str, raw: bytes) -> None:
        """Forward one serialized message (CDR) of ``source`` if it is the active one."""
        now = self.now_s()
        if stream == "color":
            if self._alive_since[source] is None or now - self.last_frame[source] > self.params["silent_timeout_s"]:
                self._alive_since[source] = now
            self.last_frame[source] = now
        if source != self.active:
            return
        self._pubs[stream].publish(raw)
        if stream == "color":
            self.forwarded[source] += 1
            self.meter("output").tick(now, now - cdr_header_stamp(raw))

    def silent(self, source: str, now: float | None = None) -> bool:
        now = self.now_s() if now is None else now
        return now - self.last_frame[source] > self.params["silent_timeout_s"]

    def _watch(self) -> None:
        """Fallback: while the preferred source is silent and the other alive, show the other; go back
        to the preferred one once it has been alive again for a timeout. Never within one timeout
        of a switch (a freshly selected source gets time to deliver)."""
        if not self.params["fallback"]:
            return
        now = self.now_s()
        timeout = self.params["silent_timeout_s"]
        if now - self.last_switch_time < timeout:
            return
        preferred = self.preferred
        other = "generated" if preferred == "physical" else "physical"
        if not self.fallen_back and self.silent(preferred, now) and not self.silent(other, now):
            self.fallen_back = True
            self._activate(other, f"fallback: {preferred} silent")
        elif self.fallen_back and not self.silent(preferred, now) and self._alive_for(preferred, now) >= timeout:
            self.fallen_back = False
            self._activate(preferred, f"{preferred} is back")

    def _alive_for(self, source: str, now: float) -> float:
        """How long ``source`` has delivered without a gap longer than the timeout [s]."""
        return now - self._alive_since[source] if self._alive_since[source] is not None else 0.0

    def active_was_silent(self, now: float) -> str:
        age = now - self.last_frame[self.active]
        return f"{self.active} silent for {age:.1f} s" if age != float("inf") else f"{self.active} never seen"

    # ------------------------------------------------------------------ diagnostics
    def diagnostic_values(self):
        now = self.now_s()
        values = {"active_source": self.active, "preferred_source": self.preferred,
                  "fallback_active": self.fallen_back, "switches": self.switches}
        for s in SOURCES:
            values[f"{s}.forwarded"] = self.forwarded[s]
            values[f"{s}.silent"] = self.silent(s, now)
        return values

    def diagnostic_level(self):
        now = self.now_s()
        if self.silent(self.active, now):
            return DiagnosticStatus.WARN, f"active source {self.active!r} is silent ({self.active_was_silent(now)})"
        if self.fallen_back:
            return DiagnosticStatus.WARN, f"fallback active: {self.preferred} is silent, showing {self.active}"
        return DiagnosticStatus.OK, f"forwarding {self.active}"


def cdr_header_stamp(raw: bytes) -> float:
    """``header.stamp`` [s] of a serialized (CDR) message whose first field is a std_msgs/Header.

    Layout: 4-byte encapsulation header (0x0001 = little-endian CDR), then
    ``stamp.sec`` (int32) and ``stamp.nanosec`` (uint32).
    """
    little = bool(raw[1] & 1)  # CDR_LE 0x01, PL_CDR_LE 0x03, CDR2_LE 0x07...
    sec, nanosec = struct.unpack("<iI" if little else ">iI", raw[4:12])
    return sec + 1e-9 * nanosec


def main(args=None) -> int:
    return run_single(CameraSwitchNode, args)
