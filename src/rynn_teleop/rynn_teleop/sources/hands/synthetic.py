"""A procedural pair of human hands performing gestures (deterministic, ROS-free).

Hand model (:func:`hand_points`): an adult human hand (not the robot's), 20 joint angles, forward kinematics
to the 21 MediaPipe keypoints. Wrist frame of a right hand: origin at the wrist (keypoint 0), +z towards the
fingers, +y towards the thumb side, +x = y x z out of the palm (fingers flex towards +x), as
:func:`rynn_teleop.core.hand_skeleton.palm_frame` and ``{side}_palm_link``; the left hand is its exact
mirror image (y -> -y, a left-handed frame, like the core's left palm frame).

Joint angles (:data:`JOINT_NAMES`): (5, 4) [rad], rows thumb ... pinky, columns proximal to distal like the
Wuji SDK: fingers 2-5 (MCP flexion, MCP abduction, PIP, DIP); thumb (CMC flexion, CMC abduction, MCP, IP).
Flexion is positive towards the palm, finger abduction towards the thumb side; thumb CMC flexion swings the
thumb across the palm, CMC abduction lifts it out of the palm plane (both 0 along the palm's radial side).

Gestures: each ``cycle_s`` runs :data:`SCRIPT` (OPEN -> FIST -> OPEN -> PINCH -> OPEN -> GRASP); each segment
holds its pose for :data:`HOLD_FRACTION`, then blends the angles to the next (minimum jerk). The right hand
runs ``phase_shift_s`` behind the left and holds OPEN until its script starts.

With ``task: twin`` the hands do the physical twin's task instead, with the synthetic tracker operator
(``sources.trackers.synthetic``, same ``task_delay_s``): from each ``/twin/scene`` message the same plan
(:mod:`rynn_teleop.sim.operator_plan`) gives each hand's closure over time, and the closure becomes the hand pose
of :func:`task_angles`: human key poses tuned so that the stack's retargeting
(:class:`~rynn_teleop.core.hand_retarget.HandRetargeter`) gives the robot hand the grasp the twin validated
(closure 1: :data:`~rynn_teleop.sim.operator_plan.GRASP_POSTURE`; 0: ``OPEN_POSTURE``; in between close to the
linear blend of the two).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ...core.arm_teleop import DEFAULT_HOME
from ...core.hand_skeleton import BONES, FINGERS, N_POINTS
from ...core.layout import SIDES
from ...core.node_io import LATCHED, NodeIO, Topic, when
from ...core.params import Param
from ...core.robot_model import RobotModel
from ...errors import ConfigurationError
from ...sim.operator_io import TASKS, TwinEpisodes, home_wrists, twin_task_params
from ..base import MessageInput
from .base import HAND_BACKENDS, HandContext, HandSample, HandSource, check_sides

_LOG = logging.getLogger(__name__)

# ------------------------------------------------------------------ the hand model (right hand, scale 1)

METACARPAL: dict[str, float] = {"index": 0.085, "middle": 0.086, "ring": 0.080, "pinky": 0.074}
"""Wrist -> MCP distance [m] of fingers 2-5."""

MCP_DIRECTION: dict[str, float] = {
    "index": math.radians(16.0),
    "middle": math.radians(3.0),
    "ring": math.radians(-10.0),
    "pinky": math.radians(-24.0),
}
"""Angle [rad] of the wrist -> MCP line from +z towards +y (the thumb side), in the palm plane (x = 0)."""

PHALANGES: dict[str, tuple[float, float, float]] = {
    "thumb": (0.045, 0.032, 0.028),  # CMC->MCP (metacarpal), MCP->IP, IP->tip [m]
    "index": (0.040, 0.023, 0.020),  # MCP->PIP, PIP->DIP, DIP->tip [m]
    "middle": (0.045, 0.027, 0.021),
    "ring": (0.042, 0.026, 0.021),
    "pinky": (0.033, 0.018, 0.018),
}
"""Bone lengths [m] distal of the MCP (fingers 2-5) or of the CMC (thumb)."""

THUMB_CMC = np.array([0.012, 0.020, 0.026])
"""Thumb CMC position [m] in the wrist frame (palmar and radial of the wrist; |.| = 0.035 m)."""


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _thumb_base() -> np.ndarray:
    """(3, 3) thumb frame at zero angles: z along the metacarpal, x its flexion direction."""
    z = _unit(np.array([0.10, 0.60, 0.80]))  # up the radial side of the palm, slightly palmar
    x = np.array([0.7, -0.7, 0.0])  # flexion: towards the palm centre (palmar and ulnar)
    x = _unit(x - (x @ z) * z)
    return np.column_stack([x, np.cross(z, x), z])


THUMB_BASE = _thumb_base()
"""(3, 3) orientation of the thumb metacarpal at zero CMC angles in the wrist frame (columns x, y, z)."""

FINGER_BASE = np.eye(3)
"""Orientation of fingers 2-5 at zero angles: straight along +z, flexing towards +x."""

JOINT_NAMES: tuple[tuple[str, str, str, str], ...] = (
    ("thumb_cmc_flex", "thumb_cmc_abd", "thumb_mcp", "thumb_ip"),
    *(
        (f"{f}_mcp_flex", f"{f}_mcp_abd", f"{f}_pip", f"{f}_dip")
        for f in FINGERS[1:]
    ),
)
"""Names of the (5, 4) joint-angle array's entries (rows thumb ... pinky)."""


def _rot_x(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _rot_y(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _mcp_positions() -> dict[str, np.ndarray]:
    return {
        f: METACARPAL[f] * np.array([0.0, math.sin(MCP_DIRECTION[f]), math.cos(MCP_DIRECTION[f])])
        for f in FINGERS[1:]
    }


MCP_POSITIONS = _mcp_positions()
"""MCP positions [m] of fingers 2-5 in the right wrist frame (scale 1)."""

_BASE_POS = np.array([THUMB_CMC] + [MCP_POSITIONS[f] for f in FINGERS[1:]])  # (5, 3) first joint [m]
_BASE_ROT = np.array([THUMB_BASE] + [FINGER_BASE] * 4)  # (5, 3, 3) frame of each finger's first joint
_PHALANX_LENGTHS = np.array([PHALANGES[f] for f in FINGERS])  # (5, 3) [m]
_BASE_ROT_0 = _BASE_ROT[:, None, :, 0]  # (5, 1, 3) flexion direction of each finger at zero angles
_BASE_ROT_1, _BASE_ROT_2 = _BASE_ROT[:, :, 1], _BASE_ROT[:, :, 2]  # (5, 3) abduction plane of each finger
_BASE_POINTS = np.zeros((N_POINTS, 3))  # the wrist and each finger's first joint; the other points 0
_BASE_POINTS[1::4] = _BASE_POS
_ABDUCTION_FLEXIONS = np.array([1, 0, 2, 3])  # joint-angle columns: abduction, then the three flexions


def _blend(a: str, b: str, s: float) -> np.ndarray:
    """(5, 4) joint angles [rad] at fraction ``s`` [-] of the way, linearly in the angles, from key pose ``a``
    to key pose ``b`` (names in :data:`KEY_POSES`)."""
    qa = KEY_POSES[a]
    return qa + s * (KEY_POSES[b] - qa)


def as_angle_array(angles: np.ndarray | Mapping[str, float]) -> np.ndarray:
    """A (5, 4) joint-angle array [rad] from an array-like or a name -> angle mapping.

    A mapping may leave joints out (they are 0); unknown names raise ValueError.
    """
    if isinstance(angles, Mapping):
        out = np.zeros((5, 4))
        index = {name: (i, j) for i, row in enumerate(JOINT_NAMES) for j, name in enumerate(row)}
        unknown = sorted(set(angles) - set(index))
        if unknown:
            raise ValueError(f"unknown joint name(s) {', '.join(unknown)}; see JOINT_NAMES")
        for name, value in angles.items():
            out[index[name]] = float(value)
        return out
    out = np.asarray(angles, dtype=float)
    if out.shape != (5, 4):
        raise ValueError(f"joint angles must have shape (5, 4), got {out.shape}")
    return out


def hand_points(angles: np.ndarray | Mapping[str, float], side: str = "right", scale: float = 1.0) -> np.ndarray:
    """(21, 3) MediaPipe keypoints [m] in the wrist frame for joint angles [rad] (no noise).

    Args:
        angles: (5, 4) array or name -> angle mapping (see :data:`JOINT_NAMES`).
        side: "left" gives the mirror image (y -> -y) of the right hand.
        scale: hand size factor [-]; every length is multiplied by it.
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    return _hand_points(as_angle_array(angles)[None], (side == "left",), scale)[0]


def _hand_points(q: np.ndarray, mirrored: Sequence[bool], scale: float) -> np.ndarray:
    """:func:`hand_points` of k hands at once: (k, 21, 3) [m] for joint angles ``q`` (k, 5, 4) [rad], the
    hands whose ``mirrored`` flag is set being left hands."""
    # Each finger: base rotation R (thumb CMC frame or the wrist frame) @ Rx(-abd) @ Ry(flex1); flex2 and
    # flex3 rotate about the same y axis, so the k-th phalanx points along z of R @ Rx(-abd) @ Ry(phi_k) with
    # phi_k the cumulative flexion: z(phi) = sin(phi) * col0 + cos(phi) * col2 of R @ Rx(-abd).
    # Column 0 of ``angle`` is the abduction, columns 1-3 the cumulative flexions phi_1..phi_3.
    angle = q[..., _ABDUCTION_FLEXIONS]
    np.add.accumulate(angle[..., 1:], axis=-1, out=angle[..., 1:])
    sin, cos = np.sin(angle), np.cos(angle)
    col2 = _BASE_ROT_1 * sin[..., :1] + _BASE_ROT_2 * cos[..., :1]  # (k, 5, 3)
    # (k, 5, 3 phalanges, 3) directions
    phalanx = sin[..., 1:, None] * _BASE_ROT_0 + cos[..., 1:, None] * col2[..., None, :]
    phalanx *= _PHALANX_LENGTHS[:, :, None]
    np.add.accumulate(phalanx, axis=-2, out=phalanx)  # -> each phalanx's end relative to the finger's first joint
    n = len(q)
    p = np.broadcast_to(_BASE_POINTS, (n, N_POINTS, 3)).copy()
    chains = p[:, 1:].reshape(n, 5, 4, 3)  # view: per finger its first joint, then the ends of its phalanges
    np.add(_BASE_POS[:, None, :], phalanx, out=chains[:, :, 1:])
    if any(mirrored):
        p *= np.array([(scale, -scale if m else scale, scale) for m in mirrored])[:, None, :]  # left: y -> -y
    elif scale != 1.0:
        p *= scale
    return p


def bone_lengths(scale: float = 1.0) -> np.ndarray:
    """(20,) model bone lengths [m] in :data:`rynn_teleop.core.hand_skeleton.BONES` order."""
    p = hand_points(np.zeros((5, 4)), "right", scale)
    return np.array([np.linalg.norm(p[b] - p[a]) for a, b in BONES])


# ------------------------------------------------------------------ key poses and the gesture script


def _pose(thumb: Sequence[float], fingers: Mapping[str, Sequence[float]]) -> np.ndarray:
    """(5, 4) [rad] from degrees: thumb (cmc_flex, cmc_abd, mcp, ip); finger (mcp_flex, abd, pip); DIP = 2/3 PIP."""
    q = np.zeros((5, 4))
    q[0] = thumb
    for f, finger in enumerate(FINGERS[1:], start=1):
        mcp, abd, pip = fingers[finger]
        q[f] = (mcp, abd, pip, pip * 2.0 / 3.0)
    return np.radians(q)


KEY_POSES: dict[str, np.ndarray] = {
    # fingers straight and slightly spread, thumb relaxed beside the palm
    "open": _pose(
        (-10.0, 3.0, 11.0, 13.0),
        {"index": (5.0, 8.0, 5.0), "middle": (5.0, 1.0, 5.0), "ring": (5.0, -6.0, 5.0), "pinky": (5.0, -12.0, 5.0)},
    ),
    # every finger closed, the thumb folded over the index and middle middle phalanges
    "fist": _pose(
        (16.0, -6.5, 68.5, 55.0),
        {"index": (85.0, 2.0, 95.0), "middle": (85.0, 0.0, 95.0), "ring": (85.0, -2.0, 95.0),
         "pinky": (85.0, -4.0, 95.0)},
    ),
    # thumb tip on the index tip, the other fingers relaxed and partly curled
    "pinch": _pose(
        (19.6, -5.6, 27.5, 27.7),
        {"index": (40.0, 0.0, 45.0), "middle": (30.0, 0.0, 40.0), "ring": (35.0, -3.0, 45.0),
         "pinky": (40.0, -6.0, 50.0)},
    ),
    # power grasp around a ~6 cm cylinder, thumb opposed
    "grasp": _pose(
        (3.8, 46.3, 70.6, 62.2),
        {"index": (52.0, 0.0, 52.0), "middle": (54.0, 0.0, 52.0), "ring": (56.0, -2.0, 52.0),
         "pinky": (58.0, -4.0, 52.0)},
    ),
}
"""Key poses: (5, 4) joint angles [rad] (see :data:`JOINT_NAMES`)."""

TASK_CLOSURES: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Closures [-] of the task key poses (:data:`TASK_POSES`)."""

TASK_POSES: np.ndarray = np.radians(np.array([
    # thumb (cmc_flex, cmc_abd, mcp, ip), then index, middle, ring, pinky (mcp_flex, mcp_abd, pip, dip) [deg]
    [[-5.2, 40.11, -28.38, -25.81], [3.36, 7.44, 3.54, -1.43], [-1.86, -1.65, 3.35, -2.66],
     [-0.8, -7.33, 3.48, -2.33], [2.23, -11.39, 3.84, -1.05]],
    [[-0.92, 28.82, -9.49, -12.27], [11.7, 3.84, 20.67, 9.31], [2.74, -0.92, 26.59, 16.37],
     [4.85, -5.63, 25.02, 14.5], [14.36, -6.6, 19.19, 6.6]],
    [[-3.85, 16.38, 17.58, 14.38], [17.38, -1.94, 40.13, 21.09], [8.74, -1.51, 47.77, 31.63],
     [11.01, -5.28, 45.15, 28.69], [23.72, -3.1, 35.58, 13.42]],
    [[0.84, 2.45, 32.84, 34.51], [21.34, -9.29, 59.83, 32.68], [13.45, -3.01, 72.26, 46.65],
     [15.03, -6.36, 68.82, 44.69], [26.18, -1.98, 60.53, 27.6]],
    [[12.31, -13.54, 32.99, 56.42], [22.57, -16.03, 81.65, 47.5], [19.91, 0.74, 98.51, 52.2],
     [20.27, -4.38, 90.68, 56.1], [28.62, -5.78, 83.74, 41.22]],
]))
"""(5, 5, 4) [rad] the task's human hand poses at :data:`TASK_CLOSURES`: the stack's retargeting (default
settings) turns each into ``OPEN_POSTURE + c (GRASP_POSTURE - OPEN_POSTURE)`` of :mod:`rynn_teleop.sim.operator_plan`
(c its closure) within 0.01 rad; a pose between two of them (linear in the angles) within 0.06 rad of the blend.
Found by least squares on the retargeter's converged solution (tests/test_sim_operator.py checks them): closure 0
spreads the thumb back along the palm (the robot thumb's open pose), closure 1 hooks the four fingers (MCP 20-29,
PIP 82-99 deg) with the thumb flexed towards them."""


def task_angles(closure: float) -> np.ndarray:
    """(5, 4) [rad] the task hand pose of a closure in [0, 1] (clipped): :data:`TASK_POSES` interpolated
    piecewise linearly in the angles."""
    c = min(max(float(closure), 0.0), 1.0)
    k = min(int(c * (len(TASK_CLOSURES) - 1)), len(TASK_CLOSURES) - 2)
    s = (c - TASK_CLOSURES[k]) / (TASK_CLOSURES[k + 1] - TASK_CLOSURES[k])
    return TASK_POSES[k] + s * (TASK_POSES[k + 1] - TASK_POSES[k])



SCRIPT: tuple[str, ...] = ("open", "fist", "open", "pinch", "open", "grasp")
"""Key pose at the start of each of the equal segments of a cycle (the cycle ends back at OPEN)."""

HOLD_FRACTION = 0.3
"""Part [-] of each segment spent holding its key pose before moving to the next."""


class GesturePhase(NamedTuple):
    """Where a hand is in the gesture script."""

    pose: str  # key pose the hand is leaving (or holding)
    target: str  # key pose it moves to next
    blend: float  # minimum-jerk progress [-] from ``pose`` (0) to ``target`` (1); 0 while holding


def _min_jerk(tau: float) -> float:
    """Minimum-jerk progress 0..1 for normalised time ``tau`` in 0..1."""
    return tau**3 * (10.0 - 15.0 * tau + 6.0 * tau * tau)


@HAND_BACKENDS.register
class SyntheticGlove(HandSource):
    """Two scripted human hands sampled on a fixed time grid with noise.

    Samples exist at t_k = t_start + k / rate_hz [s]; :meth:`read` returns the
    ones not yet returned with t_k <= now (catching up after a late call), one
    per configured side per grid time (left before right). The noise comes
    from ``numpy.random.default_rng(seed)``, drawn in grid order for both
    sides (even an unconfigured one), so the samples do not depend on when
    ``read`` is called nor on which sides are configured. Noise is added to
    keypoints 1-20; the wrist stays at the origin of its own frame.
    """

    name = "synthetic"
    aligns_to_ticks = True  # its frame grid starts on a tick of the node's loop
    follows_rate_hz = True
    SETTINGS = (
        Param("seed", int, 0, "random seed of the synthetic glove", min=0, max=2**31 - 1),
        Param("noise", float, 0.001, "keypoint noise (std)", "m", min=0.0, max=0.02),
        Param("cycle_s", float, 6.0, "duration of one gesture cycle", "s", min=1.0, max=120.0),
        *twin_task_params("none: a gesture script (cycle_s); twin: the hands of the physical twin's task "
                          "(twin_scene_topic), once after each twin reset (its start-up layout is not played), closing "
                          "on the grasp the twin validated", other="synthetic tracker"),
    )
    IO = NodeIO(subscriptions=(
        Topic("{twin_scene_topic}", "std_msgs/msg/String", LATCHED,
              "(task twin) the twin's episode as JSON: scene, seed, stamp (when the layout was set); each message "
              "starts a new episode task_delay_s after its stamp", when=(when("task", "twin"),)),
    ))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: HandContext) -> SyntheticGlove:
        """The node's hands, sampled at its ``rate_hz``."""
        return cls(sides=context.sides, rate_hz=context.rate_hz, seed=settings["seed"], noise=settings["noise"],
                   cycle_s=settings["cycle_s"], task=settings["task"], task_delay_s=settings["task_delay_s"],
                   twin_scene_topic=settings["twin_scene_topic"])

    def __init__(
        self,
        sides: Sequence[str] = SIDES,
        rate_hz: float = 90.0,
        seed: int = 0,
        noise: float = 0.001,
        cycle_s: float = 6.0,
        phase_shift_s: float = 0.5,
        scale: float = 1.0,
        task: str = "none",
        task_delay_s: float = 5.0,
        twin_scene_topic: str = "/twin/scene",
    ) -> None:
        """
        Args:
            sides: the hands to produce ("left", "right").
            rate_hz: sample rate [Hz] of each hand.
            seed: seed of the noise generator.
            noise: std of the Gaussian noise [m] per keypoint coordinate.
            cycle_s: duration [s] of one gesture cycle (six segments).
            phase_shift_s: the right hand runs this much [s] behind the left one.
            scale: hand size factor [-] (1 = the adult hand of this module).
            task: ``none`` (the gesture script) or ``twin`` (the twin scene's task, see the module doc).
            task_delay_s: (twin) the plan starts this long [s] after the twin's layout stamp.
            twin_scene_topic: (twin) the topic of :meth:`topics`.

        Raises:
            ConfigurationError: no side, an unknown or repeated side, a
                number out of range, or an unknown task.
        """
        sides = check_sides(sides, "synthetic hand source")
        if not rate_hz > 0:
            raise ConfigurationError(f"synthetic hand source: rate_hz must be > 0, got {rate_hz}")
        if not cycle_s > 0 or not phase_shift_s >= 0:
            raise ConfigurationError("synthetic hand source: need cycle_s > 0 and phase_shift_s >= 0")
        if not noise >= 0:
            raise ConfigurationError(f"synthetic hand source: noise must be >= 0 [m], got {noise}")
        if not (scale > 0 and math.isfinite(scale)):
            raise ConfigurationError(f"synthetic hand source: scale must be > 0, got {scale}")
        self.sides = tuple(s for s in SIDES if s in sides)
        self.rate_hz = float(rate_hz)
        self.seed = int(seed)
        self.noise = float(noise)
        self.cycle_s = float(cycle_s)
        self.phase_shift_s = float(phase_shift_s)
        self.scale = float(scale)
        self._t_start: float | None = None
        self._next_k = 0
        self._rng: np.random.Generator | None = None
        self._closed = False
        self._held_points: dict[tuple[str, str], np.ndarray] = {}  # (side, key pose) -> its noise-free points
        if task not in TASKS:
            raise ConfigurationError(f"synthetic hand source: task must be one of {', '.join(TASKS)}, got {task!r}")
        self.task = task
        self.twin_scene_topic = twin_scene_topic
        self.twin: TwinEpisodes | None = None  # (task twin) the episodes of the twin's scene messages
        if task == "twin":
            # the closures do not depend on where the wrists start: the default robot at the default home
            self.twin = TwinEpisodes(task_delay_s, home_wrists(RobotModel.default(), np.asarray(DEFAULT_HOME)),
                                     "synthetic glove")

    # ---------------------------------------------------------------- motion
    def gesture_at(self, t: float, side: str = "left") -> GesturePhase:
        """Where ``side`` is in the script at ``t`` [s since start]."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
        task_t = max(float(t) - (self.phase_shift_s if side == "right" else 0.0), 0.0)
        segment = self.cycle_s / len(SCRIPT)
        phase = (task_t % self.cycle_s) / segment
        i = min(int(phase), len(SCRIPT) - 1)
        tau = (phase - i - HOLD_FRACTION) / (1.0 - HOLD_FRACTION)
        blend = _min_jerk(min(max(tau, 0.0), 1.0))
        return GesturePhase(SCRIPT[i], SCRIPT[(i + 1) % len(SCRIPT)], float(blend))

    def joint_angles_at(self, side: str, t: float) -> np.ndarray:
        """(5, 4) joint angles [rad] of ``side`` at ``t`` [s since start] (see :data:`JOINT_NAMES`)."""
        if self.twin is not None:
            return task_angles(self.closure_at(side, t))
        g = self.gesture_at(t, side)
        return _blend(g.pose, g.target, g.blend)

    def closure_at(self, side: str, t: float) -> float:
        """(task twin) the closure [0, 1] of ``side`` at ``t`` [s since start]: the episode's plan, 0 (open)
        before it starts or without one."""
        if self.twin is None or self._t_start is None:
            return 0.0
        sample = self.twin.sample(self._t_start + t)
        return 0.0 if sample is None else float(sample.closure[side])

    # ---------------------------------------------------------------- the twin's episodes (task twin)
    def message_inputs(self) -> dict[str, MessageInput]:
        """(task twin) the twin's scene, latched: a node that starts after the twin still gets the layout."""
        return {self.twin_scene_topic: MessageInput("std_msgs/msg/String", LATCHED)} if self.twin is not None else {}

    def feed(self, topic: str, message: Any) -> None:
        """One ``/twin/scene`` message (``std_msgs/String``, read as ``message.data``): planned at the next
        :meth:`read`, whose time stands for when it arrived."""
        if self.twin is not None:
            self.twin.feed(getattr(message, "data", message))

    def points_for(self, angles: np.ndarray | Mapping[str, float], side: str) -> np.ndarray:
        """(21, 3) noise-free keypoints [m] of this glove's hand (its ``scale``) for given angles [rad]."""
        return hand_points(angles, side, self.scale)

    def pose_blend(self, a: str, b: str, s: float, side: str) -> np.ndarray:
        """(21, 3) keypoints [m] at fraction ``s`` [-] of the way (linear in the angles) from key pose a to b."""
        for name in (a, b):
            if name not in KEY_POSES:
                raise ValueError(f"unknown key pose {name!r}; key poses are {', '.join(KEY_POSES)}")
        return self.points_for(_blend(a, b, float(s)), side)

    def points_at(self, side: str, t: float) -> np.ndarray:
        """(21, 3) noise-free keypoints [m] of ``side`` at ``t`` [s since start]."""
        return self._points_at((side,), t)[0]

    def _points_at(self, sides: Sequence[str], t: float) -> list[np.ndarray]:
        """:meth:`points_at` of each of ``sides`` (the hands between key poses computed together)."""
        if self.twin is not None:  # (task twin) the closures of the plan
            sample = None if self._t_start is None else self.twin.sample(self._t_start + t)
            closure = {side: 0.0 if sample is None else float(sample.closure[side]) for side in sides}
            points = _hand_points(np.array([task_angles(closure[side]) for side in sides]),
                                  [side == "left" for side in sides], self.scale)
            return list(points)
        out: list[np.ndarray | None] = []
        blending, angles = [], []
        for side in sides:
            g = self.gesture_at(t, side)
            if g.blend == 0.0:  # holding a key pose (its angles exactly): its points, computed once
                held = self._held_points.get((side, g.pose))
                if held is None:
                    held = self._held_points[side, g.pose] = self.points_for(KEY_POSES[g.pose], side)
                out.append(held.copy())
            else:
                blending.append(len(out))
                out.append(None)
                angles.append(_blend(g.pose, g.target, g.blend))
        if angles:
            points = _hand_points(np.array(angles), [sides[i] == "left" for i in blending], self.scale)
            for i, p in zip(blending, points):
                out[i] = p
        return out

    def bone_lengths(self) -> np.ndarray:
        """(20,) bone lengths [m] of this glove's hands, in ``core.hand_skeleton.BONES`` order."""
        return bone_lengths(self.scale)

    # ---------------------------------------------------------------- source
    def start(self, now: float) -> None:
        """Start the timeline at ``now`` [s] (restarting it, and the noise, if already started)."""
        self._t_start = float(now)
        self._next_k = 0
        self._rng = np.random.default_rng(self.seed)
        self._closed = False

    def read(self, now: float) -> list[HandSample]:
        """Every grid sample with t_k <= ``now`` [s] not returned yet, oldest first."""
        if self._t_start is None or self._closed or self._rng is None:
            raise RuntimeError("SyntheticGlove.read() called before start() or after close()")
        if self.twin is not None:
            self.twin.update(now)
        last_k = math.floor((now - self._t_start) * self.rate_hz + 1e-9)
        out: list[HandSample] = []
        while self._next_k <= last_k:
            k = self._next_k
            self._next_k += 1
            t = k / self.rate_hz
            noise = self.noise * self._rng.standard_normal((len(SIDES), N_POINTS - 1, 3))  # drawn for both sides
            for side, p in zip(self.sides, self._points_at(self.sides, t)):
                p[1:] += noise[SIDES.index(side)]
                out.append(HandSample(side, self._t_start + t, p))
        return out

    def close(self) -> None:
        """Stop producing samples (idempotent)."""
        if not self._closed and self._t_start is not None:
            _LOG.debug("synthetic glove closed after %d grid steps", self._next_k)
        self._closed = True
