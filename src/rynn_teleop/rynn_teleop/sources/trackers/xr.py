"""An XR headset's head and wrists as the five trackers (ROS-free).

The operator console receives the headset's frames (WebXR, ``/xr`` page) and publishes each as one
``geometry_msgs/PoseArray`` on ``xr.topic`` (default ``/xr/poses``): head, left wrist, right wrist (an
untracked one all-NaN) in the ``xr_world`` frame (x forward, y left, z up; ``core.xr``), stamped with the
frame's time on the console's clock. This backend turns each message into one tracker frame with the same
contract as the Vive trackers (``sources.trackers.base``): the configured serials (it impersonates them), poses
in its world frame ``xr_world``, one stamp per frame:

* ``chest``: the chest reference derived from the head (``core.xr.chest_pose``: the neck pivot, the shoulder
  line below it; heading fixed to the headset's reference space, or the head's yaw with ``heading: head``);
* ``left_wrist`` / ``right_wrist``: the WebXR wrist joints (their own axes; the calibration captures the
  offset to the robot's hands as it does for a worn tracker);
* ``left_elbow`` / ``right_elbow``: no sensor; the middle of the upper arm of a body model (``core.xr.BodyModel``:
  shoulder from the chest reference, elbow hanging lowest between the shoulder and the wrist). arm_ik uses it
  as the elbow hint and the calibration fits it like a worn tracker's, so ``~/calibrate`` (the robot's home
  posture) and the clutch work unchanged. An arm whose elbow the model places wrongly (an elbow raised
  sideways) is steered towards the model's elbow: the wrist pose is still reached, only the elbow's swivel
  follows the model instead of the operator.

Lost tracking: a wrist the headset does not track has no sample (nor its elbow); without the head, no chest.
arm_ik then finds that side stale and brakes to a hold; when tracking resumes it re-anchors the side (the
arm continues from where it held, never jumps to where the hand went meanwhile).

The node subscribes to :meth:`XRHeadset.topics` with :attr:`XRHeadset.message_type` and hands each message to
:meth:`XRHeadset.feed`; :meth:`XRHeadset.read` returns what was fed since (samples stamped with the messages'
stamps). :meth:`XRHeadset.feed_frame` takes the same frame as arrays (tests, tools).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ...core.layout import ROLES, SIDES
from ...core.node_io import NodeIO, QoS, Topic
from ...core.params import Param
from ...core.trackers import TrackerSample, frame_matrices
from ...core.xr import DEFAULT_BODY, XR_POSE_NAMES, BodyModel, upper_body
from ...errors import ConfigurationError
from .base import TRACKER_BACKENDS, TrackerContext, TrackerSource

MAX_PENDING = 512  # [frames] fed and not yet read: older ones are dropped (a reader that stopped)


@TRACKER_BACKENDS.register
class XRHeadset(TrackerSource):
    """Tracker frames from an XR headset's head and wrist poses, fed as ROS messages (see the module)."""

    name = "xr"
    impersonates_serials = True
    follows_rate_hz = False  # frames come at the headset's rate (72-120 Hz), not the node's
    #: the message type of :meth:`topics` (the node imports it when it subscribes)
    message_type: ClassVar[str] = "geometry_msgs/msg/PoseArray"
    SETTINGS = (
        Param("topic", str, "/xr/poses", "head, left wrist, right wrist of each headset frame (geometry_msgs/"
              "PoseArray from the console's /xr page)"),
        Param("heading", str, "space", "chest heading: space = the headset's reference space (turning the head "
              "moves nothing), head = the head's yaw", choices=("space", "head")),
        Param("shoulder_width", float, 0.38, "body model: between the shoulder joints", "m", min=0.2, max=0.6),
        Param("upper_arm", float, 0.30, "body model: shoulder to elbow", "m", min=0.15, max=0.5),
        Param("forearm", float, 0.27, "body model: elbow to wrist", "m", min=0.15, max=0.5),
        Param("neck_to_shoulders", float, 0.10, "body model: the shoulder line below the neck pivot", "m",
              min=0.0, max=0.4),
        Param("elbow_out", float, 0.15, "body model: outward share of the direction an elbow hangs in "
              "(0 = straight down)", min=0.0, max=2.0),
    )
    IO = NodeIO(subscriptions=(
        Topic("{topic}", "geometry_msgs/msg/PoseArray", QoS(100),
              "head, left wrist, right wrist of each headset frame (the console's xr.poses_topic); each message "
              "is published as a tracker frame at once"),
    ))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: TrackerContext) -> XRHeadset:
        """The headset impersonating the node's serials."""
        model = BodyModel(shoulder_width=settings["shoulder_width"], upper_arm=settings["upper_arm"],
                          forearm=settings["forearm"], neck_to_shoulders=settings["neck_to_shoulders"],
                          elbow_out=settings["elbow_out"], heading=settings["heading"])
        return cls(context.serials, topic=settings["topic"], model=model)

    def __init__(self, serials: Mapping[str, str], topic: str = "/xr/poses", model: BodyModel = DEFAULT_BODY,
                 world_frame: str = "xr_world") -> None:
        """
        Args:
            serials: role -> tracker serial, for every role in ROLES (reported as the samples' serials).
            topic: the PoseArray topic of :meth:`topics`.
            model: the body model of the chest and upper-arm estimates.
            world_frame: frame id of the XR world.

        Raises:
            ConfigurationError: a role without a serial, an unknown role, a repeated serial, an empty topic or a
                body model that cannot be (lengths not > 0, unknown heading).
        """
        super().__init__(world_frame)
        missing = [r for r in ROLES if not str(serials.get(r, "") or "").strip()]
        if missing:
            raise ConfigurationError(f"xr tracker source: no serial for role(s) {', '.join(missing)}")
        unknown = sorted(set(serials) - set(ROLES))
        if unknown:
            raise ConfigurationError(f"xr tracker source: unknown role(s) {', '.join(unknown)}; roles are "
                                     f"{', '.join(ROLES)}")
        if len({str(serials[r]) for r in ROLES}) != len(ROLES):
            raise ConfigurationError("xr tracker source: two roles share a serial")
        if not topic.strip():
            raise ConfigurationError("xr tracker source: the topic is empty")
        if model.heading not in ("space", "head"):
            raise ConfigurationError(f"xr tracker source: heading must be 'space' or 'head', got {model.heading!r}")
        lengths = (model.shoulder_width, model.upper_arm, model.forearm)
        if not all(math.isfinite(v) and v > 0 for v in lengths) or not model.neck_to_shoulders >= 0:
            raise ConfigurationError(f"xr tracker source: body lengths must be > 0 m, got {lengths}")
        self.serials = {r: str(serials[r]) for r in ROLES}
        self.topic = topic
        self.model = model
        self._pending: deque[TrackerSample] = deque()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self.frames = 0  # [-] frames fed
        self.dropped = 0  # [-] samples dropped unread (more than MAX_PENDING frames waiting)
        self.malformed = 0  # [-] messages without the three poses or with a non-finite stamp

    # ------------------------------------------------------------------ messages
    def topics(self) -> dict[str, str]:
        """Topic -> what it carries."""
        return {self.topic: "poses"}

    def feed(self, topic: str, message: Any) -> None:
        """One ``/xr/poses`` message (read by attribute: ``header.stamp``, ``poses[i].position`` and
        ``.orientation``); one without the three poses is counted in :attr:`malformed` and dropped."""
        poses = getattr(message, "poses", ())
        stamp = message.header.stamp
        positions = [[p.position.x, p.position.y, p.position.z] for p in poses]
        quaternions = [[p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w] for p in poses]
        if len(positions) != len(XR_POSE_NAMES):
            self.malformed += 1
            return
        matrices = frame_matrices(np.array(positions), np.array(quaternions))
        self.feed_frame(stamp.sec + stamp.nanosec * 1e-9, matrices[0], matrices[1], matrices[2])

    def feed_frame(self, stamp: float, head: np.ndarray, left_wrist: np.ndarray, right_wrist: np.ndarray) -> None:
        """One headset frame at ``stamp`` [s]: (4, 4) poses in the XR world, a non-finite one untracked."""
        if not math.isfinite(stamp):
            self.malformed += 1
            return
        wrists = {s: np.asarray(T, dtype=float) for s, T in zip(SIDES, (left_wrist, right_wrist))}
        wrists = {s: T for s, T in wrists.items() if np.isfinite(T).all()}
        head = np.asarray(head, dtype=float)
        poses: dict[str, np.ndarray] = {f"{s}_wrist": T for s, T in wrists.items()}
        if np.isfinite(head).all():
            body = upper_body(head, {s: T[:3, 3] for s, T in wrists.items()}, self.model)
            poses["chest"] = body.chest
            for side, T in body.upper_arms.items():
                poses[f"{side}_elbow"] = T
        samples = [TrackerSample(self.serials[r], stamp, poses[r]) for r in ROLES if r in poses]
        with self._lock:
            self.frames += 1
            self._pending.extend(samples)
            while len(self._pending) > MAX_PENDING * len(ROLES):
                self._pending.popleft()
                self.dropped += 1

    # ------------------------------------------------------------------ source
    def start(self, now: float) -> None:
        """Ready to be fed (every configured serial counts as seen: the headset stands in for all five)."""
        with self._lock:
            self._pending.clear()
        self._started, self._closed = True, False
        for serial in self.serials.values():
            self._saw(serial)

    def read(self, now: float) -> list[TrackerSample]:
        """Every sample fed since the previous call, oldest first."""
        if not self._started or self._closed:
            raise RuntimeError("XRHeadset.read() called before start() or after close()")
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
        return out

    def close(self) -> None:
        """Stop taking frames (idempotent)."""
        self._closed = True
