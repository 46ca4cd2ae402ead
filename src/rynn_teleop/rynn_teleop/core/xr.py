"""XR headset input (WebXR hand tracking): the frames a headset sends, their frames of reference, the 25 -> 21
hand-joint mapping, a body model for what trackers measured, and the headset's clock (ROS-free).

One XR frame (:class:`XRFrame`, parsed and checked by :func:`parse_frame`) holds the head (viewer) pose and,
per tracked hand, the 25 WebXR hand joints, in the session's reference space, with the frame's time on the
browser's clock. Frames of reference:

* **WebXR reference space** (``local-floor``): y up, -z forward (the headset's heading when the session
  started), x right, metres. Joint poses: each joint's own axes are WebXR's (-z along the bone towards the
  finger tip, -y out of the palm, x = y cross z).
* **XR world** (:data:`XR_TO_WORLD`, what the console publishes, frame id ``xr_world``): the same space turned
  to ROS axes (REP 103): x forward, y left, z up. A pose keeps its own axes (``T_world = C @ T_xr``).
* **Wrist frame of the glove path** (:data:`XR_JOINT_TO_WRIST`): origin at the wrist, +z towards the fingers,
  +x out of the palm, +y = z cross x (towards the thumb on a right hand; a left hand is its mirror image),
  as :mod:`rynn_teleop.sources.hands.synthetic` and :func:`~.hand_skeleton.palm_frame` have it.

Hand joints (:data:`WEBXR_JOINTS`, 25: wrist; thumb metacarpal, proximal, distal, tip; four per finger of
metacarpal, proximal, intermediate, distal, tip) map onto the 21 MediaPipe keypoints
(:data:`~.hand_skeleton.NAMES`) by :data:`MEDIAPIPE_FROM_WEBXR`: a WebXR joint sits at the base of its bone,
so the thumb's metacarpal joint is the CMC, a finger's proximal phalanx joint its MCP (knuckle),
intermediate the PIP, distal the DIP; the four finger metacarpal joints (at the carpus) have no MediaPipe
point and are left out.

Body model (:class:`BodyModel`): a headset measures the head and the wrists, trackers measured the chest and
the upper arms. The chest reference is derived from the head: the neck pivot (a fixed point of the head frame,
so nodding or turning the head does not move it), the shoulder line a fixed drop below it, heading fixed to
the reference space (``heading="space"``) or following the head's yaw (``"head"``). Each upper-arm "tracker"
is estimated: the shoulder sits at a fixed offset from the chest reference, the elbow is the point at
``upper_arm`` from the shoulder and ``forearm`` from the wrist that hangs lowest (tilted ``elbow_out``
outwards), the tracker is the middle of the upper arm. The arm's IK (``core.arm_ik``) takes it as its elbow
hint like a worn tracker's; the calibration fits it like one.

Clock (:class:`FrameClock`): the browser's frame times are mapped onto this machine's clock by the smallest
``receive - frame time`` over a sliding window (the network's fastest delivery), so stamps keep the headset's
frame spacing, never lie after the frame's receipt and never go backwards.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..errors import RynnTeleopError
from .layout import SIDES

WEBXR_JOINTS: tuple[str, ...] = (
    "wrist",
    "thumb-metacarpal", "thumb-phalanx-proximal", "thumb-phalanx-distal", "thumb-tip",
    *(f"{finger}-finger-{part}" for finger in ("index", "middle", "ring", "pinky")
      for part in ("metacarpal", "phalanx-proximal", "phalanx-intermediate", "phalanx-distal", "tip")),
)
"""The 25 WebXR hand joints in ``XRHand`` order (WebXR Hand Input, ``XRHandJoint``)."""
N_XR_JOINTS = len(WEBXR_JOINTS)

MEDIAPIPE_FROM_WEBXR: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 24)
"""For each MediaPipe keypoint (0 wrist, 1-4 thumb CMC..tip, 5-8 index MCP..tip, ...), its WebXR joint index."""

XR_TO_WORLD = np.array([[0.0, 0.0, -1.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
"""Rotation WebXR reference space (y up, -z forward) -> XR world (x forward, y left, z up): ``p_world = C @ p``."""

XR_JOINT_TO_WRIST = np.array([[0.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
"""Rows: the glove path's wrist axes x (out of the palm = -y), y (= -x), z (towards the fingers = -z) in the
axes of the WebXR wrist joint; ``p_glove = M @ p_joint`` (a proper rotation, the same for both hands)."""

XR_POSE_NAMES: tuple[str, ...] = ("head", "left_wrist", "right_wrist")
"""The poses of one ``/xr/poses`` message, in order (an untracked one: all-NaN)."""

XR_REASONS: tuple[str, ...] = ("oversized", "malformed", "not_finite", "not_unit", "out_of_range", "order", "rate",
                               "busy", "disabled")
"""Why an XR frame is refused (the console counts refusals per reason and tells the headset)."""

MAX_COORDINATE = 20.0  # [m] farthest joint or head from the reference space's origin (room scale)
UNIT_TOLERANCE = 0.01  # [-] a quaternion whose norm is further than this from 1 is refused (float32, rounding)


class XRFrameError(RynnTeleopError, ValueError):
    """An XR frame refused as a whole (nothing of it is used).

    Attributes:
        reason: one of :data:`XR_REASONS`.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class XRFrame(NamedTuple):
    """One frame of a headset, as sent (WebXR reference space)."""

    seq: int  # [-] the page's frame counter
    t_ms: float  # [ms] the frame's time on the browser's clock (Unix epoch: performance.timeOrigin + frame time)
    head: np.ndarray | None  # (7,) viewer pose: position [m], quaternion (x, y, z, w); None: not tracked
    hands: Mapping[str, np.ndarray | None]  # side -> (25, 7) joint poses in WEBXR_JOINTS order; None: not tracked


class WorldPoses(NamedTuple):
    """Poses turned to the XR world (:data:`XR_TO_WORLD`)."""

    positions: np.ndarray  # (n, 3) [m]
    quaternions: np.ndarray  # (n, 4) x, y, z, w (NaN rows stay NaN)


# ---------------------------------------------------------------------- parsing
def _poses(value: Any, n: int, where: str) -> np.ndarray:
    """``value`` (n lists of 7 JSON numbers) as an (n, 7) array, quaternions normalised; XRFrameError if not."""
    if not isinstance(value, list) or len(value) != n:
        raise XRFrameError("malformed", f"{where}: expected {n} poses of 7 numbers")
    flat = []
    for row in value:
        if not isinstance(row, list) or len(row) != 7:
            raise XRFrameError("malformed", f"{where}: a pose is 7 numbers (x, y, z, qx, qy, qz, qw)")
        for v in row:
            if type(v) is not float and type(v) is not int:  # bool, str, null, lists: refused
                raise XRFrameError("malformed" if v is not None else "not_finite",
                                   f"{where}: {v!r} is not a number" + (" (NaN sent as null)" if v is None else ""))
        flat.append(row)
    a = np.array(flat, dtype=float)
    if not np.isfinite(a).all():
        raise XRFrameError("not_finite", f"{where}: NaN or infinite coordinates")
    if np.abs(a[:, :3]).max() > MAX_COORDINATE:
        raise XRFrameError("out_of_range", f"{where}: a position is more than {MAX_COORDINATE:g} m from the origin")
    norms = np.linalg.norm(a[:, 3:], axis=1)
    if np.abs(norms - 1.0).max() > UNIT_TOLERANCE:
        raise XRFrameError("not_unit", f"{where}: a quaternion is not of unit length (norm {norms.min():.3g}.."
                           f"{norms.max():.3g})")
    a[:, 3:] /= norms[:, None]
    return a


def parse_frame(doc: Any) -> XRFrame:
    """An XR frame message (parsed JSON) checked and converted.

    ``{"type": "xr_frame", "seq": int, "t_ms": number, "head": [7 numbers] | null,
    "left": [25 x [7 numbers]] | null, "right": ...}`` (positions [m], quaternions x, y, z, w).

    Raises:
        XRFrameError: a missing or extra key, a wrong count or type, a non-finite number (JSON ``null`` is how a
            browser serialises NaN), a position beyond :data:`MAX_COORDINATE` or a quaternion that is not of unit
            length: the whole frame is refused (``reason``).
    """
    if not isinstance(doc, dict) or doc.get("type") != "xr_frame":
        raise XRFrameError("malformed", 'an XR frame is {"type": "xr_frame", ...}')
    extra = sorted(set(doc) - {"type", "seq", "t_ms", "head", *SIDES})
    if extra:
        raise XRFrameError("malformed", f"unknown key(s) {', '.join(map(repr, extra[:5]))}")
    seq, t_ms = doc.get("seq"), doc.get("t_ms")
    if type(seq) is not int or seq < 0:
        raise XRFrameError("malformed", "seq must be an integer >= 0")
    if type(t_ms) not in (int, float) or not math.isfinite(t_ms) or t_ms <= 0:
        raise XRFrameError("not_finite" if type(t_ms) is float else "malformed",
                           "t_ms must be the frame's time [ms] on the browser's clock")
    head = None if doc.get("head") is None else _poses([doc["head"]], 1, "head")[0]
    hands = {s: None if doc.get(s) is None else _poses(doc[s], N_XR_JOINTS, f"{s} hand") for s in SIDES}
    return XRFrame(seq, float(t_ms), head, hands)


# ---------------------------------------------------------------------- frames of reference
def quaternion_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton products ``a * b`` of (..., 4) quaternions (x, y, z, w)."""
    ax, ay, az, aw = np.moveaxis(np.asarray(a, dtype=float), -1, 0)
    bx, by, bz, bw = np.moveaxis(np.asarray(b, dtype=float), -1, 0)
    return np.stack([aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw,
                     aw * bw - ax * bx - ay * by - az * bz], axis=-1)


def rotation_matrices(q: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotations of (..., 4) unit quaternions (x, y, z, w)."""
    x, y, z, w = np.moveaxis(np.asarray(q, dtype=float), -1, 0)
    return np.stack([np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
                     np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
                     np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1)], -2)


def _quaternion_of(R: np.ndarray) -> np.ndarray:
    """Unit quaternion (x, y, z, w), w >= 0, of a proper rotation matrix (Shepperd's method)."""
    m = np.asarray(R, dtype=float)
    trace = np.trace(m)
    if trace > 0:
        s = 2.0 * math.sqrt(trace + 1.0)
        q = [(m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s, 0.25 * s]
    else:
        i = int(np.argmax(np.diag(m)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(1.0 + m[i, i] - m[j, j] - m[k, k])
        q = [0.0, 0.0, 0.0, (m[k, j] - m[j, k]) / s]
        q[i], q[j], q[k] = 0.25 * s, (m[j, i] + m[i, j]) / s, (m[k, i] + m[i, k]) / s
    q = np.array(q) / np.linalg.norm(q)
    return -q if q[3] < 0 else q


_Q_C = _quaternion_of(XR_TO_WORLD)


def to_world(poses: np.ndarray) -> WorldPoses:
    """(n, 7) poses in the WebXR reference space -> the same poses in the XR world (their own axes kept)."""
    p = np.asarray(poses, dtype=float).reshape(-1, 7)
    return WorldPoses(p[:, :3] @ XR_TO_WORLD.T, quaternion_multiply(_Q_C, p[:, 3:]))


def pose_matrix(position: np.ndarray, quaternion: np.ndarray) -> np.ndarray:
    """(4, 4) transform of a position [m] and a unit quaternion (x, y, z, w)."""
    T = np.eye(4)
    T[:3, :3] = rotation_matrices(quaternion)
    T[:3, 3] = position
    return T


def hand_keypoints(positions: np.ndarray, wrist_quaternion: np.ndarray) -> np.ndarray:
    """The 21 MediaPipe keypoints [m] in the glove path's wrist frame from one hand's 25 WebXR joints.

    Args:
        positions: (25, 3) joint positions [m] in :data:`WEBXR_JOINTS` order, in any one frame of reference.
        wrist_quaternion: (4,) the wrist joint's orientation (x, y, z, w) in that same frame (normalised here).
    Returns:
        (21, 3): ``M @ R_wrist^T @ (p_j - p_wrist)`` for the joints of :data:`MEDIAPIPE_FROM_WEBXR`
        (``M`` = :data:`XR_JOINT_TO_WRIST`); the wrist is the origin.
    """
    p = np.asarray(positions, dtype=float).reshape(N_XR_JOINTS, 3)
    q = np.asarray(wrist_quaternion, dtype=float)
    R = rotation_matrices(q / np.linalg.norm(q))
    local = (p[list(MEDIAPIPE_FROM_WEBXR)] - p[0]) @ R  # rows: R^T (p - p0), in the wrist joint's axes
    return local @ XR_JOINT_TO_WRIST.T


# ---------------------------------------------------------------------- body model
class BodyModel(NamedTuple):
    """An operator's upper body, from the head and the wrists (lengths [m] of an adult; see the module)."""

    # [m] the neck pivot in the head's axes (x right, y up, z back): turning or nodding the head does not move it
    head_to_neck: tuple[float, float, float] = (0.0, -0.10, 0.09)
    neck_to_shoulders: float = 0.10  # [m] the shoulder line (chest reference) below the neck pivot
    shoulder_width: float = 0.38  # [m] between the shoulder joints
    upper_arm: float = 0.30  # [m] shoulder -> elbow
    forearm: float = 0.27  # [m] elbow -> wrist
    elbow_out: float = 0.15  # [-] outward share of the direction the elbow hangs in (0: straight down)
    heading: str = "space"  # chest heading: "space" (the reference space's forward) or "head" (the head's yaw)


DEFAULT_BODY = BodyModel()


class UpperBody(NamedTuple):
    """Poses of the tracker roles estimated from a head pose and wrist positions (XR world)."""

    chest: np.ndarray  # (4, 4) chest reference: origin mid-shoulders, x forward, y left, z up
    shoulders: dict[str, np.ndarray]  # side -> (3,) shoulder joint [m]
    elbows: dict[str, np.ndarray]  # side -> (3,) estimated elbow [m] (only sides with a wrist)
    upper_arms: dict[str, np.ndarray]  # side -> (4, 4) the upper-arm "tracker": mid upper arm, chest orientation


def chest_pose(head: np.ndarray, model: BodyModel = DEFAULT_BODY) -> np.ndarray:
    """(4, 4) chest reference in the XR world from the (4, 4) head pose there (head axes: WebXR's)."""
    R_head, p_head = head[:3, :3], head[:3, 3]
    neck = p_head + R_head @ np.asarray(model.head_to_neck, dtype=float)
    T = np.eye(4)
    if model.heading == "head":
        right = R_head[:, 0]  # the head's x axis (to the right), horizontal part
        n = math.hypot(right[0], right[1])
        if n > 1e-6:
            rx, ry = right[0] / n, right[1] / n
            T[:3, :3] = np.array([[-ry, -rx, 0.0], [rx, -ry, 0.0], [0.0, 0.0, 1.0]])  # columns: forward, left, up
    T[:3, 3] = neck - np.array([0.0, 0.0, model.neck_to_shoulders])
    return T


def estimate_elbow(shoulder: np.ndarray, wrist: np.ndarray, down_out: np.ndarray, upper_arm: float,
                   forearm: float) -> np.ndarray:
    """(3,) elbow [m]: at ``upper_arm`` from ``shoulder`` and ``forearm`` from ``wrist`` (the distance clamped to
    what the two lengths can span), on the circle of such points the one farthest along ``down_out`` (a unit
    vector: where an elbow hangs); along the arm's line when the arm points along ``down_out`` itself."""
    s, w = np.asarray(shoulder, dtype=float), np.asarray(wrist, dtype=float)
    a, b = float(upper_arm), float(forearm)
    d_vec = w - s
    d = float(np.linalg.norm(d_vec))
    lo, hi = abs(a - b) + 1e-6, a + b - 1e-6
    if d < 1e-9:
        return s + a * down_out
    u = d_vec / d
    d = min(max(d, lo), hi)
    along = (a * a - b * b + d * d) / (2.0 * d)  # shoulder -> circle centre along u [m]
    radius = math.sqrt(max(a * a - along * along, 0.0))
    g = down_out - (down_out @ u) * u
    n = float(np.linalg.norm(g))
    if n < 1e-6:  # the arm points (almost) along down_out: any side; take one orthogonal to u
        g = np.cross(u, [1.0, 0.0, 0.0] if abs(u[0]) < 0.9 else [0.0, 1.0, 0.0])
        n = float(np.linalg.norm(g))
    return s + along * u + radius * g / n


def upper_body(head: np.ndarray, wrists: Mapping[str, np.ndarray], model: BodyModel = DEFAULT_BODY) -> UpperBody:
    """The chest reference, shoulders, elbows and upper-arm trackers from the (4, 4) head pose and each tracked
    side's (3,) wrist position [m] (XR world)."""
    chest = chest_pose(head, model)
    R, c = chest[:3, :3], chest[:3, 3]
    shoulders, elbows, uppers = {}, {}, {}
    for side in SIDES:
        sign = 1.0 if side == "left" else -1.0  # y points left
        shoulders[side] = c + R @ np.array([0.0, sign * 0.5 * model.shoulder_width, 0.0])
        if side not in wrists:
            continue
        down_out = R @ np.array([0.0, sign * model.elbow_out, -1.0])
        down_out /= np.linalg.norm(down_out)
        elbows[side] = estimate_elbow(shoulders[side], wrists[side], down_out, model.upper_arm, model.forearm)
        T = np.eye(4)
        T[:3, :3] = R
        T[:3, 3] = 0.5 * (shoulders[side] + elbows[side])
        uppers[side] = T
    return UpperBody(chest, shoulders, elbows, uppers)


# ---------------------------------------------------------------------- clock
class FrameClock:
    """A headset's frame times [ms, browser clock] -> stamps [s] on this machine's clock (see the module).

    Args:
        window_s: how long [s] a fast delivery keeps setting the offset (the clocks may drift apart).
    """

    def __init__(self, window_s: float = 10.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = float(window_s)
        self._minima: deque[tuple[float, float]] = deque()  # (received [s], offset [s]), offsets increasing
        self._last = -math.inf

    @property
    def offset(self) -> float:
        """[s] this clock minus the browser's, as estimated now (NaN before the first frame)."""
        return self._minima[0][1] if self._minima else math.nan

    def stamp(self, t_ms: float, received_s: float) -> float:
        """The stamp [s] of a frame of browser time ``t_ms`` [ms] received at ``received_s`` [s] (this clock):
        ``t + min(received - t)`` over the window, at most ``received_s``, after the previous stamp."""
        t = t_ms * 1e-3
        offset = received_s - t
        minima = self._minima
        while minima and minima[-1][1] >= offset:
            minima.pop()
        minima.append((received_s, offset))
        while minima[0][0] < received_s - self.window_s:
            minima.popleft()
        stamp = min(max(t + minima[0][1], self._last + 1e-6), received_s)
        self._last = stamp
        return stamp


def frame_world_poses(frame: XRFrame) -> WorldPoses:
    """The ``/xr/poses`` of a frame: head, left wrist, right wrist (:data:`XR_POSE_NAMES`) in the XR world; an
    untracked one is all-NaN."""
    rows = np.full((len(XR_POSE_NAMES), 7), np.nan)
    if frame.head is not None:
        rows[0] = frame.head
    for i, side in enumerate(SIDES, start=1):
        joints = frame.hands.get(side)
        if joints is not None:
            rows[i] = joints[0]
    return to_world(rows)
