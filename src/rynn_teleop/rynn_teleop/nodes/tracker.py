"""tracker node: five Vive trackers -> one pose frame per capture.

Polls a tracker source (``sources.trackers``: ``openvr`` = SteamVR,
``replay`` = a rosbag2 of a recorded session, ``synthetic`` = a procedural
operator) at ``rate_hz`` on its own loop thread, maps serials to roles
(``serials.*``), reports stale trackers (``dropout_timeout_s``) and publishes
every sampled frame (the samples of one capture time) as one message:

Topics:
    <topic_prefix>/trackers  geometry_msgs/PoseArray, one per sampled frame (default /operator/trackers):
        header.stamp    the frame's capture time
        header.frame_id the tracking world frame (``world_frame``, or the source's own)
        poses           the five roles in ``ROLES`` order: chest, left_elbow, right_elbow, left_wrist,
                        right_wrist; a role without an accepted sample in that frame has a pose whose
                        position and orientation are all NaN

Bounded lag: frames older than ``max_lag_s`` when a (late) tick publishes them are dropped, counted
(diagnostics ``late_dropped``) and logged; the newest frame is never dropped (``core.trackers``).
The chest-relative arm poses are computed by the consumer (arm_ik, ``core.trackers.ChestRelativeArms``).

A configured serial that does not show up within ``discovery_timeout_s``
stops the node with a message listing the serials that were seen.
"""

from __future__ import annotations

import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseArray
from rclpy.qos import QoSProfile, ReliabilityPolicy

from ..core.layout import ROLES
from ..core.params import STR_LIST, Param, ParamSchema
from ..core.trackers import TrackerSet, drop_late_frames, frame_poses, group_frames
from ..errors import ConfigurationError, ParameterError
from ..recording.cdr import pose_array_cdr
from ..sources.trackers import make_tracker_source
from .base import TeleopNode, run_single

# Serials of the five trackers; the synthetic source impersonates these.
DEFAULT_SERIALS = {
    "chest": "LHR-00000001",
    "left_elbow": "LHR-00000002",
    "right_elbow": "LHR-00000003",
    "left_wrist": "LHR-00000004",
    "right_wrist": "LHR-00000005",
}

# 100: ~0.8 s of frames for a subscriber that falls behind
FRAME_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)


class TrackerNode(TeleopNode):
    PRIORITY = "input"  # feeds arm_ik
    SCHEMA = ParamSchema(
        "tracker",
        [
            Param("source", str, "synthetic", "tracker source", choices=("synthetic", "replay", "openvr")),
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
            Param("world_frame", str, "", "frame id of tracker poses; empty = the source's own "
                  "(vive_world, synthetic_world, or the recorded one)"),
            Param("synthetic.seed", int, 0, "random seed of the synthetic operator", min=0, max=2**31 - 1),
            Param("synthetic.position_noise", float, 0.0005, "tracker position noise (std)", "m", min=0.0, max=0.05),
            Param("synthetic.rotation_noise", float, 0.003, "tracker rotation noise (std)", "rad", min=0.0, max=0.2),
            Param("synthetic.hold_s", float, 2.0, "time the synthetic operator holds the calibration posture", "s",
                  min=0.0, max=60.0),
            Param("synthetic.cycle_s", float, 8.0, "duration of one synthetic pick-and-place", "s",
                  min=2.0, max=120.0),
            Param("synthetic.dropouts", STR_LIST, [],
                  "simulated tracking losses, each 'role:start_s:end_s' (seconds after start)"),
            Param("replay.path", str, "", "rosbag2 directory of a recorded session (source replay)"),
            Param("replay.rate_scale", float, 1.0, "replay speed factor", min=0.05, max=20.0),
            Param("replay.loop", bool, False, "restart the replay at its end"),
            Param("openvr.universe", str, "standing", "OpenVR tracking universe",
                  choices=("standing", "seated", "raw")),
        ],
    )

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
        self.topic = f"{p['topic_prefix'].rstrip('/')}/trackers"
        self._pub = self.create_publisher(PoseArray, self.topic, FRAME_QOS)
        self.frames_published = 0
        self.late_dropped = 0  # frames dropped for being older than max_lag_s at their tick
        self._stale: set[str] = set()
        self._finished_logged = False
        self._align_on_first_tick = p["source"] == "synthetic"
        if p["source"] != "replay":  # a replay runs at its recording's rate
            self.meter("frames", nominal_hz=p["rate_hz"])
        self._loop = self.create_loop(p["rate_hz"], self._tick, "trackers")
        self.get_logger().info(
            f"{p['source']} trackers, {len(ROLES)} roles, world frame {self.world_frame!r}, {p['rate_hz']:.0f} Hz"
        )

    def _make_source(self, p, serials):
        kind = p["source"]
        if kind == "synthetic":
            kwargs = dict(
                serials=serials, rate_hz=p["rate_hz"], seed=p["synthetic.seed"],
                position_noise=p["synthetic.position_noise"], rotation_noise=p["synthetic.rotation_noise"],
                hold_s=p["synthetic.hold_s"], cycle_s=p["synthetic.cycle_s"],
                dropouts=[_parse_dropout(d) for d in p["synthetic.dropouts"]],
            )
        elif kind == "replay":
            kwargs = dict(
                path=p["replay.path"], serials=serials, topic=f"{p['topic_prefix'].rstrip('/')}/trackers",
                rate_scale=p["replay.rate_scale"], loop=p["replay.loop"],
            )
        else:
            kwargs = dict(universe=p["openvr.universe"])
        return make_tracker_source(kind, **kwargs)

    def _serials_seen_note(self, p, serials) -> str:
        """For a configuration error: the serials a live source reports (openvr only)."""
        if p["source"] != "openvr":
            return f"source {p['source']!r} impersonates the configured serials"
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
        if self._align_on_first_tick:  # synthetic: its sample grid on this loop's ticks
            self._align_on_first_tick = False
            self._pending = []  # discovery samples of the timeline restarted here
            self.start_grid_on_this_tick(self.source, now)
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
        values = {"source": self.params["source"], "stale": ",".join(sorted(self._stale)) or "none",
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



def _parse_dropout(text: str) -> tuple[str, float, float]:
    """'role:start_s:end_s' -> (role, start, end); ParameterError naming the entry otherwise."""
    parts = text.split(":")
    try:
        role, t0, t1 = parts[0], float(parts[1]), float(parts[2])
        if len(parts) != 3 or role not in ROLES or not 0 <= t0 < t1:
            raise ValueError
    except (ValueError, IndexError):
        raise ParameterError(
            "synthetic.dropouts", f"synthetic.dropouts entry {text!r} must be 'role:start_s:end_s' with a role of "
            f"{', '.join(ROLES)} and 0 <= start_s < end_s"
        ) from None
    return role, t0, t1


def main(args=None) -> int:
    return run_single(TrackerNode, args)
