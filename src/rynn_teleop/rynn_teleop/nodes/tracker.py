"""tracker node: five Vive trackers -> one pose frame per capture.

Polls a tracker backend (``backend`` parameter, registered in ``sources.trackers``: ``openvr`` = SteamVR,
``replay`` = a rosbag2 of a recorded session, ``synthetic`` = a procedural
operator; each with its settings under ``<backend>.``) at ``rate_hz`` on its own loop thread, maps serials to roles
(``serials.*``), reports stale trackers (``dropout_timeout_s``) and publishes
every sampled frame (the samples of one capture time) as one PoseArray on ``<topic_prefix>/trackers``
(stamp: the capture time; poses: the five roles in ``ROLES`` order, all-NaN for a role without a sample).

Bounded lag: frames older than ``max_lag_s`` when a (late) tick publishes them are dropped, counted
(diagnostics ``late_dropped``) and logged; the newest frame is never dropped (``core.trackers``).
The chest-relative arm poses are computed by the consumer (arm_ik, ``core.trackers.ChestRelativeArms``).

A configured serial that does not show up within ``discovery_timeout_s``
stops the node with a message listing the serials that were seen.
"""

from __future__ import annotations

import importlib
import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import QoSProfile, ReliabilityPolicy

from ..core.layout import ROLES
from ..core.node_io import NodeIO, QoS, Topic
from ..core.params import Param
from ..core.plugins import BackendSchema
from ..core.trackers import TrackerSet, drop_late_frames, frame_poses, group_frames
from ..errors import ConfigurationError
from ..recording.cdr import pose_array_cdr
from ..sources.trackers import TRACKER_BACKENDS, TrackerContext
from .base import TeleopNode, run_single
from .io import interface_class, qos_profile

# Serials of the five trackers; the synthetic source impersonates these.
DEFAULT_SERIALS = {
    "chest": "LHR-00000001",
    "left_elbow": "LHR-00000002",
    "right_elbow": "LHR-00000003",
    "left_wrist": "LHR-00000004",
    "right_wrist": "LHR-00000005",
}

# 100: ~0.8 s of frames for a subscriber that falls behind
FRAME_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)  # the inputs of a message backend (xr)


class TrackerNode(TeleopNode):
    PRIORITY = "input"  # feeds arm_ik
    SCHEMA = BackendSchema(
        "tracker",
        [
            Param("rate_hz", float, 120.0, "polling and publication rate (synthetic: sample rate)", "Hz",
                  min=10.0, max=1000.0),
            Param("dropout_timeout_s", float, 0.1, "a tracker not updated for this long is stale", "s",
                  min=0.005, max=5.0),
            Param("discovery_timeout_s", float, 5.0, "time allowed at start for every configured serial to appear",
                  "s", min=0.0, max=60.0),
            Param("max_lag_s", float, 0.05, "a frame older than this when a late tick would publish it is dropped "
                  "(counted, logged); the newest frame is always published", "s", min=0.005, max=1.0),
            *(Param(f"serials.{role}", str, DEFAULT_SERIALS[role], f"serial of the {role.replace('_', ' ')} tracker")
              for role in ROLES),
            Param("topic_prefix", str, "/operator", "prefix of the published topic <topic_prefix>/trackers"),
            Param("world_frame", str, "", "frame id of tracker poses; empty = the backend's own "
                  "(vive_world, synthetic_world, or the recorded one)"),
        ],
        backends=TRACKER_BACKENDS, default="synthetic", description="tracker backend", renamed={"source": "backend"},
    )
    IO = NodeIO(publishers=(
        Topic("{topic_prefix}/trackers", "geometry_msgs/msg/PoseArray", QoS(100),
              "one message per sampled frame: header.stamp its capture time, header.frame_id the tracking world "
              "frame (world_frame, or the backend's own), poses the five roles in ROLES order (chest, left_elbow, "
              "right_elbow, left_wrist, right_wrist), all-NaN for a role without an accepted sample; depth 100: "
              "~0.8 s for a subscriber that falls behind"),
    ))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        serials = {role: p[f"serials.{role}"].strip() for role in ROLES}
        unset = [role for role in ROLES if not serials[role]]
        if unset:
            raise ConfigurationError(
                f"no serial configured for tracker role(s) {', '.join(unset)} (parameters "
                f"{', '.join('serials.' + r for r in unset)}); {self._serials_seen_note(p, serials)}"
            )
        self.trackers = TrackerSet(serials, p["dropout_timeout_s"])
        self.source = self.close_on_destroy(self._make_source(p, serials))
        self._pending: list = []  # samples read while discovering the trackers
        self.source.start(self.now_s())
        self._discover(p["discovery_timeout_s"])
        self.world_frame = p["world_frame"] or self.source.world_frame
        self._pub = self.io_publisher("{topic_prefix}/trackers")
        self.topic = self._pub.topic_name
        self.frames_published = 0
        self.late_dropped = 0  # frames dropped for being older than max_lag_s at their tick
        self._stale: set[str] = set()
        self._finished_logged = False
        self._align_on_first_tick = self.source.aligns_to_ticks
        if self.source.follows_rate_hz:  # (a replay runs at its recording's rate)
            self.meter("frames", nominal_hz=p["rate_hz"])
        self._source_inputs: dict = {}  # polled subscriptions of the topics the backend follows -> topic
        self._loop = self.create_loop(p["rate_hz"], self._tick, "trackers")
        self._subscribe_source()
        self.get_logger().info(
            f"{p['backend']} trackers, {len(ROLES)} roles, world frame {self.world_frame!r}, {p['rate_hz']:.0f} Hz"
        )

    def _subscribe_source(self) -> None:
        """A backend fed by ROS messages (``message_type``, ``topics()``, ``feed()``: the xr headset): subscribe
        to its topics; each message is fed to it and its frame published at once, not at the next tick. Topics a
        polled backend follows (``message_inputs()``: the synthetic operator doing the twin's task) are polled
        and fed to it at every tick, before it is read."""
        inputs = {self.create_polled_subscription(interface_class(spec.type), topic, qos_profile(spec.qos)): topic
                  for topic, spec in self.source.message_inputs().items()}
        with self.lock:
            self._source_inputs = inputs
        message_type = getattr(self.source, "message_type", None)
        if message_type is None:
            return
        package, _, type_name = message_type.partition("/msg/")
        message_class = getattr(importlib.import_module(f"{package}.msg"), type_name)
        topics = {self.create_polled_subscription(message_class, t, FRAME_QOS): t for t in self.source.topics()}

        def on_ready(sub) -> None:
            for taken in self.take_all(sub):
                self.source.feed(topics[sub], taken.message)
            self._tick()

        self.create_event_loop(list(topics), on_ready, "input")

    def _make_source(self, p, serials):
        context = TrackerContext(serials, p["rate_hz"], f"{p['topic_prefix'].rstrip('/')}/trackers")
        return self.SCHEMA.create(p, context)

    def _serials_seen_note(self, p, serials) -> str:
        """For a configuration error: the serials a device reports (a backend that does not impersonate the
        configured ones)."""
        if TRACKER_BACKENDS.backend(p["backend"]).impersonates_serials:
            return f"backend {p['backend']!r} impersonates the configured serials"
        source = self._make_source(p, serials)
        try:
            source.start(self.now_s())
            deadline = time.monotonic() + p["discovery_timeout_s"]
            while time.monotonic() < deadline:
                source.read(self.now_s())
                time.sleep(0.05)
            seen = sorted(source.serials_seen())
        finally:
            source.close()
        return f"serials seen: {', '.join(seen) if seen else 'none'}"

    def _discover(self, timeout: float) -> None:
        """Read until every configured serial was seen, or fail listing the serials seen."""
        wanted = set(self.trackers.serials.values())
        deadline = time.monotonic() + timeout
        while True:
            self._pending.extend(self.source.read(self.now_s()))  # published by the first tick
            if wanted <= self.source.serials_seen() or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        try:
            self.trackers.check_discovered(self.source.serials_seen())
        except Exception:
            self.source.close()
            raise

    def _tick(self) -> None:
        now = self.now_s()
        if self._align_on_first_tick:  # (synthetic) its sample grid on this loop's ticks
            self._align_on_first_tick = False
            self._pending = []  # discovery samples of the timeline restarted here
            self.start_grid_on_this_tick(self.source, now)
        for sub, topic in self._source_inputs.items():
            for taken in self.take_all(sub):
                self.source.feed(topic, taken.message)
        samples, self._pending = self._pending + self.source.read(now), []
        frames, dropped = drop_late_frames(group_frames(samples), now, self.params["max_lag_s"])
        if dropped:
            self.late_dropped += dropped
            self.get_logger().warning(
                f"dropped {dropped} tracker frame(s) older than max_lag_s = {self.params['max_lag_s']} s "
                f"(a late tick; {self.late_dropped} in all)", throttle_duration_sec=5.0)
        for frame in frames:
            self._publish(frame.stamp, self.trackers.update_frame(frame))
            self.meter("frames").tick(now, now - frame.stamp)
        stale = self.trackers.stale(now)
        for role in stale - self._stale:
            self.get_logger().warning(f"tracker {role} ({self.trackers.serials[role]}) is stale")
        for role in self._stale - stale:
            self.get_logger().info(f"tracker {role} tracking again")
        self._stale = stale
        if self.source.finished and not self._finished_logged:
            self._finished_logged = True
            self.get_logger().info("replay finished")

    def _publish(self, stamp: float, matrices: np.ndarray) -> None:
        """One frame: (5, 4, 4) world poses in ROLES order (all-NaN: no sample), captured at ``stamp`` [s]."""
        positions, quaternions = frame_poses(matrices)
        # published as its CDR bytes: building a PoseArray of Pose objects for rclpy cost more than the rest
        self._pub.publish(pose_array_cdr(int(round(stamp * 1e9)), self.world_frame, positions, quaternions))
        self.frames_published += 1

    def diagnostic_values(self):
        t = self.trackers
        values = {"backend": self.params["backend"], "stale": ",".join(sorted(self._stale)) or "none",
                  "rejected": t.rejected, "frames": self.frames_published, "late_dropped": self.late_dropped}
        for role in ROLES:
            values[f"{role}.serial"] = t.serials[role]
            values[f"{role}.updates"] = t.updates[role]
            values[f"{role}.stale_events"] = t.stale_events[role]
        if t.unknown_serials:
            values["unknown_serials"] = ",".join(f"{s}({n})" for s, n in sorted(t.unknown_serials.items()))
        if self.source.finished:
            values["replay"] = "finished"
        return values

    def diagnostic_level(self):
        if len(self._stale) == len(ROLES):
            return DiagnosticStatus.ERROR, "no tracker is tracking"
        if self._stale:
            return DiagnosticStatus.WARN, f"stale: {', '.join(sorted(self._stale))}"
        return DiagnosticStatus.OK, "tracking"


def main(args=None) -> int:
    return run_single(TrackerNode, args)
