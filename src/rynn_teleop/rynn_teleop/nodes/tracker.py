"""tracker node: five Vive trackers -> tracker poses and arm poses in the chest frame.

Polls a tracker source (``sources.trackers``: ``openvr`` = SteamVR,
``replay`` = a rosbag2 of a recorded session, ``synthetic`` = a procedural
operator) at ``rate_hz``, maps serials to roles (``serials.*``), drops stale
trackers (``dropout_timeout_s``) and publishes, stamped with each sample's
capture time:

Topics:
    /operator/trackers/<role>              geometry_msgs/PoseStamped, tracking world frame
    /operator/wrist_in_chest/{left,right}  geometry_msgs/PoseStamped, frame ``chest_frame``
    /operator/elbow_in_chest/{left,right}  geometry_msgs/PoseStamped (upper-arm tracker), frame ``chest_frame``

A configured serial that does not show up within ``discovery_timeout_s``
stops the node with a message listing the serials that were seen.
"""

from __future__ import annotations

import time

from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseStamped
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.time import Time

from ..core.params import STR_LIST, Param, ParamSchema
from ..core.trackers import TrackerSet
from ..errors import ConfigurationError, ParameterError
from ..sources.trackers import ROLES, SIDES, make_tracker_source
from .base import TeleopNode, run_single
from .conversions import matrix_to_pose

# Serials of the five trackers; the synthetic source impersonates these.
DEFAULT_SERIALS = {
    "chest": "LHR-00000001",
    "left_elbow": "LHR-00000002",
    "right_elbow": "LHR-00000003",
    "left_wrist": "LHR-00000004",
    "right_wrist": "LHR-00000005",
}

POSE_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)  # 100: ~0.8 s for a subscriber that falls behind


class TrackerNode(TeleopNode):
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
            *(Param(f"serials.{role}", str, DEFAULT_SERIALS[role], f"serial of the {role.replace('_', ' ')} tracker")
              for role in ROLES),
            Param("topic_prefix", str, "/operator", "prefix of every published topic"),
            Param("world_frame", str, "", "frame id of tracker poses; empty = the source's own "
                  "(vive_world, synthetic_world, or the recorded one)"),
            Param("chest_frame", str, "operator_chest", "frame id of the wrist/elbow-in-chest poses"),
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
        self.source = self._make_source(p, serials)
        self._pending: list = []  # samples read while discovering the trackers
        self.source.start(self.now_s())
        self._discover(p["discovery_timeout_s"])
        self.world_frame = p["world_frame"] or self.source.world_frame
        prefix = p["topic_prefix"].rstrip("/")
        self._pose_pubs = {r: self.create_publisher(PoseStamped, f"{prefix}/trackers/{r}", POSE_QOS) for r in ROLES}
        self._wrist_pubs = {
            s: self.create_publisher(PoseStamped, f"{prefix}/wrist_in_chest/{s}", POSE_QOS) for s in SIDES
        }
        self._elbow_pubs = {
            s: self.create_publisher(PoseStamped, f"{prefix}/elbow_in_chest/{s}", POSE_QOS) for s in SIDES
        }
        self._last_relative = {s: float("nan") for s in SIDES}
        self._stale: set[str] = set()
        self._finished_logged = False
        self._timer = self.create_timer(1.0 / p["rate_hz"], self._tick)
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
                path=p["replay.path"], serials=serials, topic_prefix=f"{p['topic_prefix'].rstrip('/')}/trackers",
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
        published = 0
        samples, self._pending = self._pending + self.source.read(now), []
        for i, sample in enumerate(samples):
            role = self.trackers.update(sample)
            if role is not None:
                msg = PoseStamped()
                msg.header.stamp = Time(nanoseconds=int(round(sample.stamp * 1e9))).to_msg()
                msg.header.frame_id = self.world_frame
                matrix_to_pose(sample.matrix, msg.pose)
                self._pose_pubs[role].publish(msg)
                self.meter(f"tracker.{role}").tick(now, now - sample.stamp)
                published += 1
            # relative poses once per sampled frame (all trackers of one stamp), even when a late tick
            # collects several frames: every wrist sample gets its wrist-in-chest pose
            if published and (i + 1 == len(samples) or samples[i + 1].stamp != sample.stamp):
                self._publish_relative(now, sample.stamp)
        stale = self.trackers.stale(now)
        for role in stale - self._stale:
            self.get_logger().warning(f"tracker {role} ({self.trackers.serials[role]}) is stale")
        for role in self._stale - stale:
            self.get_logger().info(f"tracker {role} tracking again")
        self._stale = stale
        if getattr(self.source, "finished", False) and not self._finished_logged:
            self._finished_logged = True
            self.get_logger().info("replay finished")

    def _publish_relative(self, now: float, frame_stamp: float) -> None:
        """Wrist/elbow-in-chest poses of the frame sampled at ``frame_stamp`` [s] (``now``: for the latency meter).

        Freshness is judged at the frame's own time: a frame that waited in a late tick's backlog is as
        fresh as when it was sampled (dropouts are frames that never came, reported by the stale check).
        """
        for side in SIDES:
            rel = self.trackers.relative(side, frame_stamp)
            if rel is None or rel.stamp == self._last_relative[side]:
                continue
            self._last_relative[side] = rel.stamp
            stamp = Time(nanoseconds=int(round(rel.stamp * 1e9))).to_msg()
            msg = PoseStamped()
            msg.header.stamp = stamp
            msg.header.frame_id = self.params["chest_frame"]
            matrix_to_pose(rel.wrist, msg.pose)
            self._wrist_pubs[side].publish(msg)
            self.meter(f"wrist_in_chest.{side}").tick(now, now - rel.stamp)
            if rel.elbow is not None:
                emsg = PoseStamped()
                emsg.header.stamp = stamp
                emsg.header.frame_id = self.params["chest_frame"]
                matrix_to_pose(rel.elbow, emsg.pose)
                self._elbow_pubs[side].publish(emsg)

    def diagnostic_values(self):
        t = self.trackers
        values = {"source": self.params["source"], "stale": ",".join(sorted(self._stale)) or "none",
                  "rejected": t.rejected}
        for role in ROLES:
            values[f"{role}.serial"] = t.serials[role]
            values[f"{role}.updates"] = t.updates[role]
            values[f"{role}.stale_events"] = t.stale_events[role]
        if t.unknown_serials:
            values["unknown_serials"] = ",".join(f"{s}({n})" for s, n in sorted(t.unknown_serials.items()))
        if getattr(self.source, "finished", False):
            values["replay"] = "finished"
        return values

    def diagnostic_level(self):
        if len(self._stale) == len(ROLES):
            return DiagnosticStatus.ERROR, "no tracker is tracking"
        if self._stale:
            return DiagnosticStatus.WARN, f"stale: {', '.join(sorted(self._stale))}"
        return DiagnosticStatus.OK, "tracking"

    def destroy_node(self) -> None:
        source = getattr(self, "source", None)  # absent when the constructor failed
        if source is not None:
            source.close()
        super().destroy_node()


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
