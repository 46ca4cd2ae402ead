"""camera_switch node: the consumer-facing head camera carries the physical or the generated stream.

Inputs: the realsense-ros layout (colour, aligned depth, depth and their camera infos) under ``physical_ns``
(head_camera) and ``generated_ns`` (the world model); both stay available under their own names. Outputs
(what recorders, viewers and policies subscribe to): the same layout under ``output_ns`` (a depth stream only
while the active source provides it) and the active source's name, latched.

Select with the parameter ``active_source`` (runtime-settable) or the services ``~/use_physical``,
``~/use_generated``, ``~/toggle`` (std_srvs/Trigger). The switch is immediate: a frame is forwarded only if
its source is active when it arrives. Messages are forwarded unchanged (serialized bytes, not decoded).
An active source silent for ``silent_timeout_s`` is reported; with ``fallback`` the output shows the other
source meanwhile and returns once the chosen one is back (the parameter keeps the operator's choice).
Status in /diagnostics: ``core.status.FeedStatus`` (active, preferred, fallback), which the console reads.
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import String
from std_srvs.srv import Trigger

from ..core import node_io
from ..core.feed_switch import SOURCES, FeedSwitch
from ..core.node_io import SENSOR_DATA, Each, NodeIO, Service, Topic
from ..core.params import Param, ParamSchema
from ..core.status import FeedStatus
from ..recording.cdr import header_stamp_ns
from .base import TeleopNode, run_single
from .io import qos_profile

STREAMS = (  # (name, topic under a camera namespace, type): realsense-ros layout
    ("color", "color/image_raw", Image),
    ("color_info", "color/camera_info", CameraInfo),
    ("aligned_depth", "aligned_depth_to_color/image_raw", Image),
    ("aligned_depth_info", "aligned_depth_to_color/camera_info", CameraInfo),
    ("depth", "depth/image_rect_raw", Image),
    ("depth_info", "depth/camera_info", CameraInfo),
)
LATCHED = qos_profile(node_io.LATCHED)  # of <output_ns>/active_source, for its subscribers (the demo, tests)
IMAGES = tuple(topic for _, topic, kind in STREAMS if kind is Image)
INFOS = tuple(topic for _, topic, kind in STREAMS if kind is CameraInfo)


def _stream(namespace_param: str, topic: str) -> tuple[str, dict[str, str]]:
    """The IO declaration's name of ``topic`` (one of STREAMS') under a namespace parameter, and its binding."""
    var = "image" if topic in IMAGES else "info"
    return f"{{{namespace_param}}}/{{{var}}}", {var: topic}


def _streams(namespace_param: str, what: str) -> tuple[Topic, ...]:
    return (Topic(f"{{{namespace_param}}}/{{image}}", "sensor_msgs/msg/Image", SENSOR_DATA, f"{what}: images",
                  each=Each("image", values=IMAGES)),
            Topic(f"{{{namespace_param}}}/{{info}}", "sensor_msgs/msg/CameraInfo", SENSOR_DATA,
                  f"{what}: camera infos", each=Each("info", values=INFOS)))
LATENCY_BUDGET_MS = 15.0  # capture -> forwarded on the consumer topic, p99 (shown against in diagnostics)


class CameraSwitchNode(TeleopNode):
    PRIORITY = "stream"
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
    IO = NodeIO(
        publishers=(
            *_streams("output_ns", "the active source's frames, forwarded unchanged (a depth stream only while the "
                      "active source provides it)"),
            Topic("{output_ns}/active_source", "std_msgs/msg/String", node_io.LATCHED,
                  "physical or generated, at every switch"),
        ),
        subscriptions=(*_streams("physical_ns", "the physical camera (head_camera)"),
                       *_streams("generated_ns", "the generated camera (world_model)")),
        services=(
            Service("~/use_physical", "std_srvs/srv/Trigger", "show the physical source"),
            Service("~/use_generated", "std_srvs/srv/Trigger", "show the generated source"),
            Service("~/toggle", "std_srvs/srv/Trigger", "show the other source"),
        ),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.feed = FeedSwitch(p["active_source"], p["silent_timeout_s"], p["fallback"])
        self._syncing_parameter = False
        self._pubs = {}
        for stream, topic, _ in STREAMS:
            name, each = _stream("output_ns", topic)
            self._pubs[stream] = self.io_publisher(name, **each)
        self.meter("output", latency_budget_ms=LATENCY_BUDGET_MS)
        self._active_pub = self.io_publisher("{output_ns}/active_source")
        self.forwarded = {s: 0 for s in SOURCES}
        self._inputs: dict[int, tuple[str, str]] = {}  # id(subscription) -> (source, stream)
        subs = []
        for source in SOURCES:
            for stream, topic, _ in STREAMS:
                # raw: the serialized bytes are forwarded as they are (no (de)serialization of 1 MB images)
                name, each = _stream(f"{source}_ns", topic)
                sub = self.io_polled_subscription(name, raw=True, **each)
                self._inputs[id(sub)] = (source, stream)
                subs.append(sub)
        # forwarded as they arrive, by a thread woken by the middleware (not one executor callback per message)
        self._relay = self.create_event_loop(subs, self._on_ready, "relay")
        for name, target in (("use_physical", "physical"), ("use_generated", "generated"), ("toggle", None)):
            self.io_service(f"~/{name}", lambda req, res, t=target: self._srv_select(t, res))
        self.add_post_set_parameters_callback(self._on_parameters)
        self._timer = self.create_timer(0.1, self._watch)
        self._publish_active()

    # ------------------------------------------------------------------ selection
    @property
    def active(self) -> str:
        return self.feed.active

    @property
    def last_switch_time(self) -> float:
        return self.feed.last_switch_time

    def select(self, source: str, why: str) -> bool:
        """The operator's choice; True if the output changed (``why`` is logged with the change)."""
        changed = self.feed.select(source, self.now_s())
        if self.get_parameter("active_source").value != source:  # keep the parameter in step (no second select)
            self._syncing_parameter = True
            try:
                self.set_parameters([Parameter("active_source", Parameter.Type.STRING, source)])
            finally:
                self._syncing_parameter = False
        if changed:
            self._announce(why)
        return changed

    def _announce(self, why: str) -> None:
        self._publish_active()
        self.get_logger().info(f"camera feed: {self.active} ({why})")

    def _publish_active(self) -> None:
        self._active_pub.publish(String(data=self.active))

    def _srv_select(self, target: str | None, response: Trigger.Response) -> Trigger.Response:
        source = target or ("generated" if self.active == "physical" else "physical")
        changed = self.select(source, "service")
        response.success = True
        response.message = f"active source: {source}" + ("" if changed else " (unchanged)")
        return response

    def _on_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        if self._syncing_parameter:  # select() keeping the parameter in step with its own choice
            return SetParametersResult(successful=True)
        for param in parameters:
            if param.name == "active_source" and (param.value != self.feed.preferred or self.feed.fallen_back):
                self.select(param.value, "parameter")
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------ frames
    def _on_ready(self, sub) -> None:
        source, stream = self._inputs[id(sub)]
        for taken in self.take_all(sub):
            self._forward(source, stream, taken.message)

    def _forward(self, source: str, stream: str, raw: bytes) -> None:
        """Forward one serialized message (CDR) of ``source`` if it is the active one."""
        now = self.now_s()
        if stream == "color":
            self.feed.frame(source, now)
        if source != self.active:
            return
        self._pubs[stream].publish(raw)
        if stream == "color":
            self.forwarded[source] += 1
            self.meter("output").tick(now, now - 1e-9 * header_stamp_ns(raw))

    def silent(self, source: str, now: float | None = None) -> bool:
        return self.feed.silent(source, self.now_s() if now is None else now)

    def _watch(self) -> None:
        why = self.feed.watch(self.now_s())
        if why:
            self._announce(why)

    def active_was_silent(self, now: float) -> str:
        age = now - self.feed.last_frame[self.active]
        return f"{self.active} silent for {age:.1f} s" if age != float("inf") else f"{self.active} never seen"

    # ------------------------------------------------------------------ diagnostics
    def diagnostic_values(self):
        now = self.now_s()
        values = {"switches": self.feed.switches}
        for s in SOURCES:
            values[f"{s}.forwarded"] = self.forwarded[s]
            values[f"{s}.silent"] = self.silent(s, now)
        return self.feed_status().values(values)

    def feed_status(self) -> FeedStatus:
        """The switch's typed status (the active feed the console and ``rynn-teleop call status`` show)."""
        return FeedStatus(active_source=self.active, preferred_source=self.feed.preferred,
                          fallback_active=self.feed.fallen_back)

    def diagnostic_level(self):
        now = self.now_s()
        if self.silent(self.active, now):
            return DiagnosticStatus.WARN, f"active source {self.active!r} is silent ({self.active_was_silent(now)})"
        if self.feed.fallen_back:
            return DiagnosticStatus.WARN, f"fallback active: {self.feed.preferred} is silent, showing {self.active}"
        return DiagnosticStatus.OK, f"forwarding {self.active}"


def main(args=None) -> int:
    return run_single(CameraSwitchNode, args)
