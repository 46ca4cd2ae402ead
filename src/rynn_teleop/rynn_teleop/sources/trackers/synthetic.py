"""A procedural tele-operator wearing five trackers (deterministic, ROS-free).

The operator stands in a z-up world (x forward, y to the operator's left), holds HOME for ``hold_s``, then
repeats a bimanual pick-and-place (reach, grasp with a wrist roll, carry ~0.2 m to the left, place, release,
return) along minimum-jerk segments: positions, velocities and accelerations are continuous.

Frames ((4, 4) poses in ``world_frame``):

* body: origin on the sternum at about (0, 0, 1.35) m, x forward, y left, z up; it breathes and sways;
* chest tracker: the body origin rotated by the fixed :data:`CHEST_MOUNT` (its axes are not the body's);
* wrist trackers: the wrist frame (at HOME x along the forearm, z up);
* elbow trackers: mid upper arm, :data:`ELBOW_TRACKER_OFFSET` outside its axis; x shoulder -> elbow, z away
  from the body, y = z x x.

The wrist task is scripted in body axes relative to each shoulder; the elbow follows from the two-link arm
(:data:`UPPER_ARM`, :data:`FOREARM`), hanging below the shoulder-wrist line, slightly outward.

With ``task: twin`` the operator does the task of the physical twin's scene instead: it holds HOME (the
calibration posture) until a ``/twin/scene`` message (``twin_scene_topic``: scene, seed, the time the twin set
the layout) says which layout the twin has, then plays the task's plan (:mod:`rynn_teleop.sim.operator_plan`:
approach, pre-grasp, grasp, lift, carry, place, release, retreat, home) from ``task_delay_s`` after that time.
The plan's wrist targets (``base_link``) become wrist tracker poses through the inverse of the calibration
arm_ik computes from the held posture (:class:`rynn_teleop.sim.operator_io.TrackerMapping`), so arm_ik's
targets are the plan's; the synthetic glove (``sources.hands.synthetic``, same ``task`` and ``task_delay_s``)
closes the hands on the same clock. Each new ``/twin/scene`` (a twin reset) starts a new episode.

Like a person, the operator looks where the arms are before an episode: it starts each plan from the wrists of
arm_ik's newest command (``arms_topic``) and aims relative to them. Normally they are where the held posture puts
them; after arm_ik re-anchored its clutch (tracking resumed after a stall longer than its ``stale_timeout_s``,
the arm lagging), they are off by that offset, which the operator then takes out of its own aim for the whole
episode (position added, rotation applied in the hand frame, as arm_ik's clutch does), so one stall costs at
most the episode it happened in, never the next ones.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy.spatial.transform import Rotation

from ...core.arm_teleop import DEFAULT_HOME
from ...core.layout import ROLES, SIDES
from ...core.node_io import LATCHED, NodeIO, QoS, Topic, when
from ...core.params import FLOAT_LIST, STR_LIST, Param
from ...core.robot_model import RobotModel, arm_joint_names
from ...core.trackers import TrackerSample
from ...core.transforms import invert, make_transform
from ...errors import ConfigurationError
from ...sim.operator_io import TASKS, OperatorTask, TrackerMapping, TwinEpisodes, plan_for, twin_task_params
from ...sim.operator_plan import OperatorPlan
from ..base import MessageInput
from .base import TRACKER_BACKENDS, TrackerContext, TrackerSource

_LOG = logging.getLogger(__name__)

CHEST_HEIGHT = 1.35  # [m] height of the sternum (body origin) at rest
SHOULDER_OFFSET = {"left": np.array([0.0, 0.18, -0.05]), "right": np.array([0.0, -0.18, -0.05])}  # [m] body axes
UPPER_ARM = 0.30  # [m] shoulder -> elbow
FOREARM = 0.27  # [m] elbow -> wrist
ELBOW_TRACKER_OFFSET = 0.04  # [m] elbow tracker distance from the upper-arm axis
ELBOW_OUTWARD_BIAS = 0.15  # [-] weight of "outward" in the elbow swivel direction (vs 1 for "down")
HOME_WRIST_OFFSET = np.array([FOREARM, 0.0, -UPPER_ARM])  # [m] wrist - shoulder at HOME, body axes
ARMS_QOS = QoS(5, reliable=False)  # (task twin) arm_ik's commands: the newest counts; best effort takes any
ARMS_WINDOW = 100  # [commands] where an episode starts from: the mean of the newest (0.5 s of arm_ik's 200 Hz)
_ARM_JOINTS = tuple(n for side in SIDES for n in arm_joint_names(side))


class _Episode(NamedTuple):
    """An episode as the operator plays it (task twin)."""

    task: OperatorTask  # the twin's episode (scene, seed, start time)
    plan: OperatorPlan | None  # from the wrists arm_ik had at its start (``task.plan``'s timing); None: skipped
    offsets: dict[str, tuple[np.ndarray, np.ndarray]]  # side -> arm_ik's clutch offset (position [m], rotation)

# T_body_tracker of the chest tracker: tracker x = body left, y = body up,
# z = body forward (out of the chest), then tilted 20 deg about the body's
# left axis (the sternum slopes) and turned 10 deg about the body's up axis.
_R_SWAP = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
CHEST_MOUNT = make_transform(
    (0.0, 0.0, 0.0),
    Rotation.from_euler("zy", [10.0, 20.0], degrees=True).as_matrix() @ _R_SWAP,
)

# Wrist script per side: (cycle fraction, wrist - shoulder [m] in body axes,
# rotation vector [rad] of the wrist frame relative to HOME, in body axes).
_HOME = tuple(HOME_WRIST_OFFSET)
_ZERO = (0.0, 0.0, 0.0)
_SCRIPT = {
    "left": (
        (0.00, _HOME, _ZERO),  # home
        (0.20, (0.42, 0.04, -0.26), (0.00, 0.30, 0.00)),  # reach the left object (pitch down)
        (0.28, (0.42, 0.04, -0.26), (0.35, 0.30, 0.00)),  # grasp: roll the wrist
        (0.50, (0.38, 0.24, -0.13), (0.35, 0.10, 0.45)),  # carry: lift, 0.2 m to the left
        (0.62, (0.40, 0.24, -0.25), (0.35, 0.35, 0.35)),  # place: lower
        (0.70, (0.40, 0.24, -0.25), (0.10, 0.35, 0.35)),  # release
        (1.00, _HOME, _ZERO),  # return home
    ),
    "right": (
        (0.00, _HOME, _ZERO),
        (0.20, (0.38, -0.02, -0.24), (0.00, 0.30, 0.00)),  # the right object differs
        (0.28, (0.38, -0.02, -0.24), (-0.35, 0.30, 0.00)),
        (0.50, (0.36, 0.18, -0.12), (-0.35, 0.10, 0.45)),
        (0.62, (0.38, 0.18, -0.24), (-0.30, 0.35, 0.40)),
        (0.70, (0.38, 0.18, -0.24), (-0.10, 0.35, 0.40)),
        (1.00, _HOME, _ZERO),
    ),
}


# The motion is evaluated in plain Python floats: for 3-vectors and 3x3 rotations that is several times
# cheaper than numpy's per-call overhead. A rotation is a tuple of three row tuples, a position a 3-tuple.
Vec = tuple[float, float, float]
Rot = tuple[Vec, Vec, Vec]
_IDENTITY: Rot = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))


def _rotvec_rot(x: float, y: float, z: float) -> Rot:
    """Rotation of the rotation vector (x, y, z) [rad] (Rodrigues)."""
    angle = math.sqrt(x * x + y * y + z * z)
    if angle < 1e-12:
        return _IDENTITY
    x, y, z = x / angle, y / angle, z / angle
    s, c = math.sin(angle), math.cos(angle)
    C = 1.0 - c
    return (
        (c + x * x * C, x * y * C - z * s, x * z * C + y * s),
        (y * x * C + z * s, c + y * y * C, y * z * C - x * s),
        (z * x * C - y * s, z * y * C + x * s, c + z * z * C),
    )


def _rot_mul(a: Rot, b: Rot) -> Rot:
    """The product a @ b of two rotations."""
    (a00, a01, a02), (a10, a11, a12), (a20, a21, a22) = a
    (b00, b01, b02), (b10, b11, b12), (b20, b21, b22) = b
    return (
        (a00 * b00 + a01 * b10 + a02 * b20, a00 * b01 + a01 * b11 + a02 * b21, a00 * b02 + a01 * b12 + a02 * b22),
        (a10 * b00 + a11 * b10 + a12 * b20, a10 * b01 + a11 * b11 + a12 * b21, a10 * b02 + a11 * b12 + a12 * b22),
        (a20 * b00 + a21 * b10 + a22 * b20, a20 * b01 + a21 * b11 + a22 * b21, a20 * b02 + a21 * b12 + a22 * b22),
    )


def _rot_apply(a: Rot, v: Vec) -> Vec:
    """a @ v."""
    x, y, z = v
    (a00, a01, a02), (a10, a11, a12), (a20, a21, a22) = a
    return (a00 * x + a01 * y + a02 * z, a10 * x + a11 * y + a12 * z, a20 * x + a21 * y + a22 * z)


def _matrix(R: Rot, p: Vec) -> np.ndarray:
    """(4, 4) numpy transform of a rotation and a position [m]."""
    (r00, r01, r02), (r10, r11, r12), (r20, r21, r22) = R
    return np.array(
        ((r00, r01, r02, p[0]), (r10, r11, r12, p[1]), (r20, r21, r22, p[2]), (0.0, 0.0, 0.0, 1.0))
    )


def _min_jerk(tau: float) -> float:
    """Minimum-jerk progress 0..1 for normalised time ``tau`` in 0..1."""
    return tau**3 * (10.0 - 15.0 * tau + 6.0 * tau * tau)


def _unit(v: Vec) -> Vec:
    n = math.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
    return (v[0] / n, v[1] / n, v[2] / n)


def _dot(a: Vec, b: Vec) -> float:
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _elbow_position(shoulder: Vec, wrist: Vec, outward: Vec) -> Vec:
    """Elbow [m] of the two-link arm, hanging below the shoulder-wrist line, slightly outward."""
    d_vec = (wrist[0] - shoulder[0], wrist[1] - shoulder[1], wrist[2] - shoulder[2])
    norm = math.sqrt(_dot(d_vec, d_vec))
    d = min(max(norm, abs(UPPER_ARM - FOREARM) + 1e-6), UPPER_ARM + FOREARM - 1e-6)
    u = (d_vec[0] / norm, d_vec[1] / norm, d_vec[2] / norm)
    along = (UPPER_ARM**2 - FOREARM**2 + d * d) / (2.0 * d)  # shoulder -> elbow projection on u
    radius = math.sqrt(max(UPPER_ARM**2 - along**2, 0.0))
    swivel = (ELBOW_OUTWARD_BIAS * outward[0], ELBOW_OUTWARD_BIAS * outward[1], -1.0 + ELBOW_OUTWARD_BIAS * outward[2])
    k = _dot(swivel, u)
    n = (swivel[0] - k * u[0], swivel[1] - k * u[1], swivel[2] - k * u[2])
    if math.sqrt(_dot(n, n)) < 1e-9:  # wrist straight below the shoulder: swing outward
        k = _dot(outward, u)
        n = (outward[0] - k * u[0], outward[1] - k * u[1], outward[2] - k * u[2])
    n = _unit(n)
    return tuple(shoulder[i] + along * u[i] + radius * n[i] for i in range(3))  # type: ignore[return-value]


_CHEST_MOUNT_ROT: Rot = tuple(tuple(float(v) for v in row) for row in CHEST_MOUNT[:3, :3])  # type: ignore[assignment]
_SHOULDER: dict[str, Vec] = {
    side: tuple(float(v) for v in p) for side, p in SHOULDER_OFFSET.items()  # type: ignore[misc]
}
_OUTWARD: dict[str, Vec] = {"left": (0.0, 1.0, 0.0), "right": (0.0, -1.0, 0.0)}


def parse_dropout(text: str) -> tuple[str, float, float] | None:
    """``'role:start_s:end_s'`` -> (role, start, end) [s after start]; None if malformed."""
    parts = text.split(":")
    try:
        role, t0, t1 = parts[0], float(parts[1]), float(parts[2])
    except (ValueError, IndexError):
        return None
    if len(parts) != 3 or role not in ROLES or not 0 <= t0 < t1:
        return None
    return role, t0, t1


def _dropouts_problem(entries: list[str]) -> str | None:
    bad = [e for e in entries if parse_dropout(e) is None]
    if bad:
        return (f"has entry {bad[0]!r}: each must be 'role:start_s:end_s' with a role of {', '.join(ROLES)} and "
                "0 <= start_s < end_s")
    return None


@TRACKER_BACKENDS.register
class SyntheticOperator(TrackerSource):
    """Five trackers on a scripted operator, sampled on a fixed time grid with noise.

    Samples exist at t_k = t_start + k / rate_hz [s]; :meth:`read` returns the
    ones not yet returned with t_k <= now (catching up after a late call),
    five per grid time (chest, elbows, wrists in :data:`ROLES` order) minus
    dropouts. The noise comes from ``numpy.random.default_rng(seed)`` drawn
    in grid order, so the samples do not depend on when ``read`` is called.

    With ``task="twin"`` (see the module doc) it follows the twin's ``/twin/scene`` and arm_ik's commands
    (:meth:`message_inputs`; the node hands each message to :meth:`feed`); the next :meth:`read` plans the
    episode (:attr:`twin`).
    """

    name = "synthetic"
    aligns_to_ticks = True  # its sample grid starts on a tick of the node's loop
    impersonates_serials = True
    SETTINGS = (
        Param("seed", int, 0, "random seed of the synthetic operator", min=0, max=2**31 - 1),
        Param("position_noise", float, 0.0005, "tracker position noise (std)", "m", min=0.0, max=0.05),
        Param("rotation_noise", float, 0.003, "tracker rotation noise (std)", "rad", min=0.0, max=0.2),
        Param("hold_s", float, 2.0, "time the synthetic operator holds the calibration posture (task twin: at least, "
              "after it appears, before an episode: arm_ik calibrates on it)", "s", min=0.0, max=60.0),
        Param("cycle_s", float, 8.0, "duration of one synthetic pick-and-place", "s", min=2.0, max=120.0),
        Param("dropouts", STR_LIST, [], "simulated tracking losses, each 'role:start_s:end_s' (seconds after start)",
              check=_dropouts_problem),
        *twin_task_params("none: a procedural pick-and-place motion (hold_s, cycle_s); twin: the task of the "
                          "physical twin's scene (twin_scene_topic), once after each twin reset (its start-up layout "
                          "is not played), through the calibration arm_ik computes from the held posture",
                          other="synthetic glove"),
        Param("arms_topic", str, "/arms/command", "(task twin) arm_ik's commands: each episode starts from the "
              "wrists they put the arms at, and aims relative to them"),
        Param("home_position", FLOAT_LIST, list(DEFAULT_HOME), "(task twin) the arm_ik node's home_position: "
              "the robot side of the calibration the held posture gives", "rad", min=-3.2, max=3.2, length=14),
    )
    IO = NodeIO(subscriptions=(
        Topic("{twin_scene_topic}", "std_msgs/msg/String", LATCHED,
              "(task twin) the twin's episode as JSON: scene, seed, stamp (when the layout was set); each message "
              "starts a new episode task_delay_s after its stamp", when=(when("task", "twin"),)),
        Topic("{arms_topic}", "sensor_msgs/msg/JointState", ARMS_QOS,
              "(task twin) arm_ik's newest command, where each episode starts from (drained at every tick)",
              when=(when("task", "twin"),)),
    ))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: TrackerContext) -> SyntheticOperator:
        """The operator impersonating the node's serials, sampled at its ``rate_hz``."""
        return cls(serials=context.serials, rate_hz=context.rate_hz, seed=settings["seed"],
                   position_noise=settings["position_noise"], rotation_noise=settings["rotation_noise"],
                   hold_s=settings["hold_s"], cycle_s=settings["cycle_s"],
                   dropouts=[parse_dropout(d) for d in settings["dropouts"]], task=settings["task"],
                   task_delay_s=settings["task_delay_s"], twin_scene_topic=settings["twin_scene_topic"],
                   arms_topic=settings["arms_topic"], home_position=settings["home_position"])

    def __init__(
        self,
        serials: Mapping[str, str],
        rate_hz: float = 120.0,
        seed: int = 0,
        position_noise: float = 0.0005,
        rotation_noise: float = 0.003,
        hold_s: float = 2.0,
        cycle_s: float = 8.0,
        dropouts: Sequence[tuple[str, float, float]] = (),
        world_frame: str = "synthetic_world",
        phase_shift_s: float = 0.3,
        task: str = "none",
        task_delay_s: float = 5.0,
        twin_scene_topic: str = "/twin/scene",
        arms_topic: str = "/arms/command",
        home_position: Sequence[float] = DEFAULT_HOME,
        robot: RobotModel | None = None,
    ) -> None:
        """
        Args:
            serials: role -> tracker serial, for every role in :data:`ROLES`.
            rate_hz: sample rate [Hz] of every tracker.
            seed: seed of the noise generator.
            position_noise: std of the Gaussian position noise [m] per axis.
            rotation_noise: std of the random rotation-vector noise [rad] per axis.
            hold_s: time [s] the operator holds HOME before the first task cycle (task twin: an episode starting
                sooner after the first :meth:`start` is skipped, so that arm_ik calibrates on a still operator).
            cycle_s: duration [s] of one pick-and-place cycle.
            dropouts: (role, t0, t1): no samples of that role for t0 <= t < t1 [s since start].
            world_frame: frame id of the tracking world.
            phase_shift_s: the right arm runs this much [s] behind the left one.
            task: ``none`` (the procedural motion) or ``twin`` (the twin scene's task, see the module doc).
            task_delay_s: (twin) the plan starts this long [s] after the twin's layout stamp.
            twin_scene_topic: (twin) the twin's scene.
            arms_topic: (twin) arm_ik's commands.
            home_position: (twin) (14,) [rad] arm_ik's home posture (the robot side of its calibration).
            robot: (twin) arm_ik's robot description (default :meth:`RobotModel.default`).

        Raises:
            ConfigurationError: a role lacks a serial, a role is unknown, a serial
                is repeated, a number is out of range, or an unknown task.
        """
        super().__init__(world_frame)
        missing = [r for r in ROLES if not str(serials.get(r, "") or "").strip()]
        if missing:
            raise ConfigurationError(f"synthetic tracker source: no serial for role(s) {', '.join(missing)}")
        unknown = sorted(set(serials) - set(ROLES))
        if unknown:
            raise ConfigurationError(
                f"synthetic tracker source: unknown role(s) {', '.join(unknown)}; roles are {', '.join(ROLES)}"
            )
        if len({serials[r] for r in ROLES}) != len(ROLES):
            raise ConfigurationError("synthetic tracker source: two roles share a serial")
        if not rate_hz > 0:
            raise ConfigurationError(f"synthetic tracker source: rate_hz must be > 0, got {rate_hz}")
        if not cycle_s > 0 or not hold_s >= 0 or not phase_shift_s >= 0:
            raise ConfigurationError("synthetic tracker source: need cycle_s > 0, hold_s >= 0, phase_shift_s >= 0")
        if not (position_noise >= 0 and rotation_noise >= 0):
            raise ConfigurationError("synthetic tracker source: noise levels must be >= 0")
        for drop in dropouts:
            if len(drop) != 3 or drop[0] not in ROLES or not drop[1] < drop[2]:
                raise ConfigurationError(
                    f"synthetic tracker source: bad dropout {drop!r}; expected (role, t0, t1) with t0 < t1 [s]"
                )
        self.serials = {r: str(serials[r]) for r in ROLES}
        self.rate_hz = float(rate_hz)
        self.seed = int(seed)
        self.position_noise = float(position_noise)
        self.rotation_noise = float(rotation_noise)
        self.hold_s = float(hold_s)
        self.cycle_s = float(cycle_s)
        self.phase_shift_s = float(phase_shift_s)
        self.dropouts = tuple((str(r), float(t0), float(t1)) for r, t0, t1 in dropouts)
        self._script = {
            side: (
                [float(w[0]) for w in _SCRIPT[side]],
                [tuple(float(v) for v in w[1]) for w in _SCRIPT[side]],
                [tuple(float(v) for v in w[2]) for w in _SCRIPT[side]],
            )
            for side in SIDES
        }
        self._dropouts_by_role = {r: [(t0, t1) for rr, t0, t1 in self.dropouts if rr == r] for r in ROLES}
        self._serial_list = [self.serials[r] for r in ROLES]
        if task not in TASKS:
            raise ConfigurationError(f"synthetic tracker source: task must be one of {', '.join(TASKS)}, got {task!r}")
        self.task = task
        self.twin_scene_topic = twin_scene_topic
        self.arms_topic = arms_topic
        self.mapping: TrackerMapping | None = None  # (task twin) arm_ik's calibration and its inverse
        self.twin: TwinEpisodes | None = None  # (task twin) the episodes of the twin's scene messages
        self.episode: _Episode | None = None  # (task twin) the episode being played, as aimed
        self._arm_commands: deque[np.ndarray] = deque(maxlen=ARMS_WINDOW)  # (14,) [rad] arm_ik's newest commands
        if task == "twin":
            chest_home = {side: invert(CHEST_MOUNT) @ _matrix(*self._home_in_body(side)) for side in SIDES}
            elbows = {side: (invert(CHEST_MOUNT) @ _matrix(*self._elbow_tracker_in_body(
                side, self._home_in_body(side)[1])))[:3, 3] for side in SIDES}
            self.mapping = TrackerMapping(robot or RobotModel.default(), np.asarray(home_position, float),
                                          chest_home, elbows)
            self.twin = TwinEpisodes(task_delay_s, self.mapping.start_wrists, "synthetic operator")
        self._t_start: float | None = None
        self._appeared = 0.0  # [s] the first start(): the operator appeared
        self._next_k = 0
        self._rng: np.random.Generator | None = None
        self._closed = False

    # ---------------------------------------------------------------- motion
    def _body_at(self, t: float) -> tuple[Rot, Vec]:
        """Rotation and position [m] of the body frame in the world at ``t`` [s since start]."""
        w = 2.0 * math.pi
        position = (
            0.006 * math.sin(w * t / 7.3),
            0.005 * math.sin(w * t / 5.1 + 0.4),
            CHEST_HEIGHT + 0.008 * math.sin(w * t / 4.0),  # breathing
        )
        R = _rotvec_rot(
            0.020 * math.sin(w * t / 6.1), 0.030 * math.sin(w * t / 4.0 + 1.0), 0.035 * math.sin(w * t / 9.7)
        )  # up to about 2 deg
        return R, position

    def body_pose_at(self, t: float) -> np.ndarray:
        """(4, 4) world pose of the operator's body frame at ``t`` [s since start] (no noise)."""
        return _matrix(*self._body_at(t))

    def _home_in_body(self, side: str) -> tuple[Rot, Vec]:
        """The wrist frame (rotation, position [m]) in body axes at HOME."""
        shoulder, offset = _SHOULDER[side], self._script[side][1][0]
        return _IDENTITY, (shoulder[0] + offset[0], shoulder[1] + offset[1], shoulder[2] + offset[2])

    def _task_wrist_in_body(self, side: str, wrist: np.ndarray) -> tuple[Rot, Vec]:
        """The wrist frame in body axes whose tracker arm_ik maps to the robot wrist ``wrist`` (4, 4) in
        ``base_link`` (task twin)."""
        T = CHEST_MOUNT @ self.mapping.chest_wrist(side, wrist)
        R = tuple(tuple(float(v) for v in row) for row in T[:3, :3])
        return R, (float(T[0, 3]), float(T[1, 3]), float(T[2, 3]))  # type: ignore[return-value]

    def _wrist_in_body(self, side: str, t: float) -> tuple[Rot, Vec]:
        """Wrist frame (rotation, position [m]) in body axes at ``t`` [s since start] (no noise)."""
        fractions, offsets, rotvecs = self._script[side]
        task_t = t - self.hold_s - (self.phase_shift_s if side == "right" else 0.0)
        if task_t <= 0.0:
            offset, rv = offsets[0], rotvecs[0]
        else:
            phase = (task_t % self.cycle_s) / self.cycle_s
            i = bisect.bisect_right(fractions, phase) - 1
            i = min(max(i, 0), len(fractions) - 2)
            s = _min_jerk((phase - fractions[i]) / (fractions[i + 1] - fractions[i]))
            o0, o1, r0, r1 = offsets[i], offsets[i + 1], rotvecs[i], rotvecs[i + 1]
            offset = tuple(o0[j] + s * (o1[j] - o0[j]) for j in range(3))
            rv = tuple(r0[j] + s * (r1[j] - r0[j]) for j in range(3))
        shoulder = _SHOULDER[side]
        return _rotvec_rot(*rv), (shoulder[0] + offset[0], shoulder[1] + offset[1], shoulder[2] + offset[2])

    def _elbow_tracker_in_body(self, side: str, wrist: Vec) -> tuple[Rot, Vec]:
        """Upper-arm tracker (rotation, position [m]) in body axes for a wrist position [m] (body axes)."""
        shoulder, outward = _SHOULDER[side], _OUTWARD[side]
        elbow = _elbow_position(shoulder, wrist, outward)
        x = _unit((elbow[0] - shoulder[0], elbow[1] - shoulder[1], elbow[2] - shoulder[2]))
        k = _dot(outward, x)
        z = _unit((outward[0] - k * x[0], outward[1] - k * x[1], outward[2] - k * x[2]))
        y = (z[1] * x[2] - z[2] * x[1], z[2] * x[0] - z[0] * x[2], z[0] * x[1] - z[1] * x[0])
        position = tuple(shoulder[i] + 0.5 * UPPER_ARM * x[i] + ELBOW_TRACKER_OFFSET * z[i] for i in range(3))
        return ((x[0], y[0], z[0]), (x[1], y[1], z[1]), (x[2], y[2], z[2])), position  # type: ignore[return-value]

    def _poses(self, t: float) -> list[tuple[Rot, Vec]]:
        """Noise-free world (rotation, position [m]) of every role at ``t`` [s since start], in ROLES order."""
        R_body, p_body = self._body_at(t)
        in_body: dict[str, tuple[Rot, Vec]] = {"chest": (_CHEST_MOUNT_ROT, (0.0, 0.0, 0.0))}
        aims = self._aims(self._t_start + t) if self.twin is not None and self._t_start is not None else None
        for side in SIDES:
            if self.mapping is None:
                wrist = self._wrist_in_body(side, t)
            elif aims is None:  # (task twin) waiting for the plan: the held posture
                wrist = self._home_in_body(side)
            else:
                wrist = self._task_wrist_in_body(side, aims[side])
            in_body[f"{side}_wrist"] = wrist
            in_body[f"{side}_elbow"] = self._elbow_tracker_in_body(side, wrist[1])
        out = []
        for role in ROLES:
            R, p = in_body[role]
            q = _rot_apply(R_body, p)
            out.append((_rot_mul(R_body, R), (q[0] + p_body[0], q[1] + p_body[1], q[2] + p_body[2])))
        return out

    def pose_at(self, t: float) -> dict[str, np.ndarray]:
        """Noise-free (4, 4) world poses of every role at ``t`` [s since start]."""
        return {role: _matrix(R, p) for role, (R, p) in zip(ROLES, self._poses(t))}

    def home_pose(self) -> dict[str, np.ndarray]:
        """Noise-free world poses of every role at t = 0 (the HOME posture)."""
        return self.pose_at(0.0)

    def shoulder_in_body(self, side: str) -> np.ndarray:
        """Shoulder position [m] in body axes (a copy)."""
        return SHOULDER_OFFSET[side].copy()

    # ---------------------------------------------------------------- the twin's episodes (task twin)
    def message_inputs(self) -> dict[str, MessageInput]:
        """(task twin) the twin's scene (latched: a node that starts after the twin still gets the layout) and
        arm_ik's commands."""
        if self.twin is None:
            return {}
        return {self.twin_scene_topic: MessageInput("std_msgs/msg/String", LATCHED),
                self.arms_topic: MessageInput("sensor_msgs/msg/JointState", ARMS_QOS)}

    def feed(self, topic: str, message: Any) -> None:
        """A ``/twin/scene`` message (``message.data``: planned at the next :meth:`read`, whose time stands for
        when it arrived) or an arm command (``message.name``, ``message.position``: the 14 arm joints)."""
        if self.twin is None:
            return
        if topic == self.arms_topic:
            names, position = list(message.name), list(message.position)
            if len(names) == len(position) and set(_ARM_JOINTS) <= set(names):
                q = np.array([position[names.index(n)] for n in _ARM_JOINTS], dtype=float)
                if np.all(np.isfinite(q)):
                    self._arm_commands.append(q)
        else:
            self.twin.feed(getattr(message, "data", message))

    def _aims(self, now: float) -> dict[str, np.ndarray] | None:
        """side -> (4, 4) the robot wrist (``base_link``) the operator aims arm_ik at ``now`` [s] (task twin):
        the episode's plan, started from where arm_ik's command had the wrists when it began, with the clutch
        offset found there taken out (see the module doc); None before an episode starts."""
        task = self.twin.active(now)
        if task is None or now < task.start:
            return None
        episode = self.episode
        if episode is None or episode.task is not task:
            episode = self.episode = self._begin(task)
        if episode.plan is None:  # skipped: still holding the calibration posture
            return None
        sample = episode.plan.sample(now - task.start)
        aims = {}
        for side in SIDES:
            W, (p_off, R_off) = sample.wrists[side], episode.offsets[side]
            aims[side] = make_transform(W[:3, 3] - p_off, W[:3, :3] @ R_off.T)
        return aims

    def _begin(self, task: OperatorTask) -> _Episode:
        """The episode of ``task`` as aimed from where arm_ik's newest commands (their mean: the trackers' noise
        moves each by millimetres) have the wrists; from the held posture's wrists without any."""
        home = self.mapping.start_wrists
        if task.start < self._appeared + self.hold_s:
            _LOG.warning("synthetic operator: the episode of %s seed %d starts %.1f s after the operator appeared, "
                         "before its %.1f s in the calibration posture (hold_s): skipped", task.twin.scene,
                         task.twin.seed, task.start - self._appeared, self.hold_s)
            return _Episode(task, None, {})
        if not self._arm_commands:
            return _Episode(task, task.plan, {side: (np.zeros(3), np.eye(3)) for side in SIDES})
        robot = self.mapping.arm_wrists(np.mean(self._arm_commands, axis=0))
        offsets = {side: (robot[side][:3, 3] - home[side][:3, 3], home[side][:3, :3].T @ robot[side][:3, :3])
                   for side in SIDES}
        shift = max(float(np.linalg.norm(p)) for p, _ in offsets.values())
        if shift > 0.01:
            _LOG.warning("synthetic operator: arm_ik's wrists are %.3f m off the held posture's (a re-anchored "
                         "clutch): aiming relative to them this episode", shift)
        return _Episode(task, plan_for(task.twin.scene, task.twin.seed, robot), offsets)

    # ---------------------------------------------------------------- source
    def start(self, now: float) -> None:
        """Start the timeline at ``now`` [s] (restarting it, and the noise, if already started)."""
        if self._t_start is None:
            self._appeared = float(now)  # [s] when the operator first appeared (task twin: hold_s counts from here)
        self._t_start = float(now)
        self._next_k = 0
        self._rng = np.random.default_rng(self.seed)
        self._closed = False

    def _dropped(self, role: str, t: float) -> bool:
        return any(t0 <= t < t1 for t0, t1 in self._dropouts_by_role[role])

    def read(self, now: float) -> list[TrackerSample]:
        """Every grid sample with t_k <= ``now`` [s] not returned yet, oldest first."""
        if self._t_start is None or self._closed or self._rng is None:
            raise RuntimeError("SyntheticOperator.read() called before start() or after close()")
        if self.twin is not None:
            self.twin.update(now)
        last_k = math.floor((now - self._t_start) * self.rate_hz + 1e-9)
        out: list[TrackerSample] = []
        n = last_k - self._next_k + 1
        if n <= 0:
            return out
        # drawn in grid order, also for dropped roles: one batch equals n draws of (5, 6)
        noise = self._rng.standard_normal((n, len(ROLES), 6)).tolist()
        pn, rn = self.position_noise, self.rotation_noise
        for j in range(n):
            k = self._next_k + j
            t = k / self.rate_hz
            stamp = self._t_start + t
            for i, (role, (R, p)) in enumerate(zip(ROLES, self._poses(t))):
                if self._dropouts_by_role[role] and self._dropped(role, t):
                    continue
                e = noise[j][i]
                p = (p[0] + pn * e[0], p[1] + pn * e[1], p[2] + pn * e[2])
                R = _rot_mul(R, _rotvec_rot(rn * e[3], rn * e[4], rn * e[5]))
                out.append(TrackerSample(self._serial_list[i], stamp, _matrix(R, p)))
        self._next_k = last_k + 1
        for serial in {s.serial for s in out}:
            self._saw(serial)
        return out

    def close(self) -> None:
        """Stop producing samples (idempotent)."""
        if not self._closed and self._t_start is not None:
            _LOG.debug("synthetic operator closed after %d grid steps", self._next_k)
        self._closed = True
