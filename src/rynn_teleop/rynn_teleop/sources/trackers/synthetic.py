"""A procedural tele-operator wearing five trackers (deterministic, ROS-free).

The operator stands in a z-up world (x forward of the operator, y to the
operator's left) and, after holding the HOME posture for ``hold_s``, repeats a
bimanual pick-and-place: reach a table object, grasp (pause while the wrist
rolls), carry (lift and move ~0.2 m to the operator's left), place (lower,
pause, release) and return home. Waypoints are joined by minimum-jerk
(quintic) segments, so positions, velocities and accelerations are continuous.

Frames (all (4, 4) poses in the world frame ``world_frame``):

* body: origin on the sternum at about (0, 0, 1.35) m, x forward, y left,
  z up; it breathes and sways by about +-1 cm and +-2 deg.
* chest tracker: at the body origin, rotated by the fixed :data:`CHEST_MOUNT`
  (T_body_tracker: axes swapped and tilted by 20 deg), so its axes are NOT the
  body axes.
* wrist trackers: on the back of the wrist; the tracker frame is the wrist
  frame, which at HOME has x forward along the forearm and z up (the body axes).
* elbow trackers: on the middle of the upper arm, :data:`ELBOW_TRACKER_OFFSET`
  outside its axis; x along the upper arm (shoulder -> elbow), z pointing
  outward (away from the body), y = z x x.

The wrist task is scripted in body axes relative to each shoulder; the elbow
comes from the two-link arm (:data:`UPPER_ARM`, :data:`FOREARM`) with the
elbow hanging below the shoulder-wrist line, slightly outward.
"""

from __future__ import annotations

import logging
import math
from typing import Mapping, Sequence

import numpy as np
from scipy.spatial.transform import Rotation

from ...core.transforms import make_transform
from ...errors import ConfigurationError
from .base import ROLES, SIDES, TrackerSample, TrackerSource

_LOG = logging.getLogger(__name__)

CHEST_HEIGHT = 1.35  # [m] height of the sternum (body origin) at rest
SHOULDER_OFFSET = {"left": np.array([0.0, 0.18, -0.05]), "right": np.array([0.0, -0.18, -0.05])}  # [m] body axes
UPPER_ARM = 0.30  # [m] shoulder -> elbow
FOREARM = 0.27  # [m] elbow -> wrist
ELBOW_TRACKER_OFFSET = 0.04  # [m] elbow tracker distance from the upper-arm axis
ELBOW_OUTWARD_BIAS = 0.15  # [-] weight of "outward" in the elbow swivel direction (vs 1 for "down")
HOME_WRIST_OFFSET = np.array([FOREARM, 0.0, -UPPER_ARM])  # [m] wrist - shoulder at HOME, body axes

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


def _rotvec_matrix(rv: np.ndarray) -> np.ndarray:
    """(3, 3) rotation of a rotation vector [rad] (Rodrigues; fast for one vector)."""
    angle = float(np.linalg.norm(rv))
    if angle < 1e-12:
        return np.eye(3)
    k = rv / angle
    K = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + math.sin(angle) * K + (1.0 - math.cos(angle)) * (K @ K)


def _min_jerk(tau: float) -> float:
    """Minimum-jerk progress 0..1 for normalised time ``tau`` in 0..1."""
    return tau**3 * (10.0 - 15.0 * tau + 6.0 * tau * tau)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _elbow_position(shoulder: np.ndarray, wrist: np.ndarray, outward: np.ndarray) -> np.ndarray:
    """Elbow [m] of the two-link arm, hanging below the shoulder-wrist line, slightly outward."""
    d_vec = wrist - shoulder
    d = float(np.clip(np.linalg.norm(d_vec), abs(UPPER_ARM - FOREARM) + 1e-6, UPPER_ARM + FOREARM - 1e-6))
    u = _unit(d_vec)
    along = (UPPER_ARM**2 - FOREARM**2 + d * d) / (2.0 * d)  # shoulder -> elbow projection on u
    radius = math.sqrt(max(UPPER_ARM**2 - along**2, 0.0))
    swivel = np.array([0.0, 0.0, -1.0]) + ELBOW_OUTWARD_BIAS * outward
    n = swivel - float(swivel @ u) * u
    if np.linalg.norm(n) < 1e-9:  # wrist straight below the shoulder: swing outward
        n = outward - float(outward @ u) * u
    return shoulder + along * u + radius * _unit(n)


class SyntheticOperator(TrackerSource):
    """Five trackers on a scripted operator, sampled on a fixed time grid with noise.

    Samples exist at t_k = t_start + k / rate_hz [s]; :meth:`read` returns the
    ones not yet returned with t_k <= now (catching up after a late call),
    five per grid time (chest, elbows, wrists in :data:`ROLES` order) minus
    dropouts. The noise comes from ``numpy.random.default_rng(seed)`` drawn
    in grid order, so the samples do not depend on when ``read`` is called.
    """

    kind = "synthetic"

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
    ) -> None:
        """
        Args:
            serials: role -> tracker serial, for every role in :data:`ROLES`.
            rate_hz: sample rate [Hz] of every tracker.
            seed: seed of the noise generator.
            position_noise: std of the Gaussian position noise [m] per axis.
            rotation_noise: std of the random rotation-vector noise [rad] per axis.
            hold_s: time [s] the operator holds HOME before the first task cycle.
            cycle_s: duration [s] of one pick-and-place cycle.
            dropouts: (role, t0, t1): no samples of that role for t0 <= t < t1 [s since start].
            world_frame: frame id of the tracking world.
            phase_shift_s: the right arm runs this much [s] behind the left one.

        Raises:
            ConfigurationError: a role lacks a serial, a role is unknown, a serial
                is repeated, or a number is out of range.
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
                np.array([w[0] for w in _SCRIPT[side]]),
                np.array([w[1] for w in _SCRIPT[side]]),
                np.array([w[2] for w in _SCRIPT[side]]),
            )
            for side in SIDES
        }
        self._t_start: float | None = None
        self._next_k = 0
        self._rng: np.random.Generator | None = None
        self._closed = False

    # ---------------------------------------------------------------- motion
    def body_pose_at(self, t: float) -> np.ndarray:
        """(4, 4) world pose of the operator's body frame at ``t`` [s since start] (no noise)."""
        w = 2.0 * math.pi
        position = (
            0.006 * math.sin(w * t / 7.3),
            0.005 * math.sin(w * t / 5.1 + 0.4),
            CHEST_HEIGHT + 0.008 * math.sin(w * t / 4.0),  # breathing
        )
        rv = np.array(
            [0.020 * math.sin(w * t / 6.1), 0.030 * math.sin(w * t / 4.0 + 1.0), 0.035 * math.sin(w * t / 9.7)]
        )  # up to about 2 deg
        return make_transform(position, _rotvec_matrix(rv))

    def _wrist_in_body(self, side: str, t: float) -> np.ndarray:
        """(4, 4) wrist frame in body axes at ``t`` [s since start] (no noise)."""
        fractions, offsets, rotvecs = self._script[side]
        task_t = t - self.hold_s - (self.phase_shift_s if side == "right" else 0.0)
        if task_t <= 0.0:
            offset, rv = offsets[0], rotvecs[0]
        else:
            phase = (task_t % self.cycle_s) / self.cycle_s
            i = int(np.searchsorted(fractions, phase, side="right")) - 1
            i = min(max(i, 0), len(fractions) - 2)
            s = _min_jerk((phase - fractions[i]) / (fractions[i + 1] - fractions[i]))
            offset = offsets[i] + s * (offsets[i + 1] - offsets[i])
            rv = rotvecs[i] + s * (rotvecs[i + 1] - rotvecs[i])
        return make_transform(SHOULDER_OFFSET[side] + offset, _rotvec_matrix(rv))

    def _elbow_tracker_in_body(self, side: str, wrist: np.ndarray) -> np.ndarray:
        """(4, 4) upper-arm tracker in body axes for a wrist position [m] (body axes)."""
        shoulder = SHOULDER_OFFSET[side]
        outward = np.array([0.0, 1.0 if side == "left" else -1.0, 0.0])
        elbow = _elbow_position(shoulder, wrist, outward)
        x = _unit(elbow - shoulder)
        z = _unit(outward - float(outward @ x) * x)
        y = np.cross(z, x)
        position = shoulder + 0.5 * UPPER_ARM * x + ELBOW_TRACKER_OFFSET * z
        return make_transform(position, np.column_stack([x, y, z]))

    def pose_at(self, t: float) -> dict[str, np.ndarray]:
        """Noise-free (4, 4) world poses of every role at ``t`` [s since start]."""
        T_world_body = self.body_pose_at(t)
        in_body = {"chest": CHEST_MOUNT}
        for side in SIDES:
            wrist = self._wrist_in_body(side, t)
            in_body[f"{side}_wrist"] = wrist
            in_body[f"{side}_elbow"] = self._elbow_tracker_in_body(side, wrist[:3, 3])
        return {role: T_world_body @ in_body[role] for role in ROLES}

    def home_pose(self) -> dict[str, np.ndarray]:
        """Noise-free world poses of every role at t = 0 (the HOME posture)."""
        return self.pose_at(0.0)

    def shoulder_in_body(self, side: str) -> np.ndarray:
        """Shoulder position [m] in body axes (a copy)."""
        return SHOULDER_OFFSET[side].copy()

    # ---------------------------------------------------------------- source
    def start(self, now: float) -> None:
        """Start the timeline at ``now`` [s] (restarting it, and the noise, if already started)."""
        self._t_start = float(now)
        self._next_k = 0
        self._rng = np.random.default_rng(self.seed)
        self._closed = False

    def _dropped(self, role: str, t: float) -> bool:
        return any(r == role and t0 <= t < t1 for r, t0, t1 in self.dropouts)

    def read(self, now: float) -> list[TrackerSample]:
        """Every grid sample with t_k <= ``now`` [s] not returned yet, oldest first."""
        if self._t_start is None or self._closed or self._rng is None:
            raise RuntimeError("SyntheticOperator.read() called before start() or after close()")
        last_k = math.floor((now - self._t_start) * self.rate_hz + 1e-9)
        out: list[TrackerSample] = []
        while self._next_k <= last_k:
            k = self._next_k
            self._next_k += 1
            t = k / self.rate_hz
            noise = self._rng.standard_normal((len(ROLES), 6))  # drawn even for dropped roles
            poses = self.pose_at(t)
            for i, role in enumerate(ROLES):
                if self._dropped(role, t):
                    continue
                T = poses[role]
                T[:3, 3] += self.position_noise * noise[i, :3]
                T[:3, :3] = T[:3, :3] @ _rotvec_matrix(self.rotation_noise * noise[i, 3:])
                out.append(TrackerSample(self.serials[role], self._t_start + t, T))
                self._saw(self.serials[role])
        return out

    def close(self) -> None:
        """Stop producing samples (idempotent)."""
        if not self._closed and self._t_start is not None:
            _LOG.debug("synthetic operator closed after %d grid steps", self._next_k)
        self._closed = True
