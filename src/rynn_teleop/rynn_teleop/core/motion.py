"""Jerk-limited following of a moving joint target with Ruckig (ROS-free).

Every control cycle the newest target (e.g. the IK solution) becomes Ruckig's target and Ruckig's state one
cycle ahead becomes the command, so position, velocity and acceleration stay continuous and velocity,
acceleration and jerk never exceed their limits whatever the targets do. Joints without a target brake to a
standstill (Ruckig's velocity interface with target velocity 0).

Position limits: the community edition of Ruckig does not enforce them, so targets are clipped
``target_margin`` inside the limits and each joint is planned on its own time-optimal profile
(``Synchronization.No``). A joint on a time-optimal profile towards an in-limit target stops no later than that
target, and a time-optimal stop is the shortest one, so neither a new target nor a stop can carry it past a
limit (property-tested in ``tests/test_arm_motion.py``).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
from ruckig import ControlInterface, InputParameter, OutputParameter, Result, Ruckig, RuckigError, Synchronization

from ..errors import ConfigurationError, ParameterError
from .robot_model import GROUPS, JointLimits

_log = logging.getLogger(__name__)


class MotionState(NamedTuple):
    """Commanded joint state after one cycle."""

    position: np.ndarray  # [rad]
    velocity: np.ndarray  # [rad/s]
    acceleration: np.ndarray  # [rad/s^2]


class JerkLimitedFollower:
    """Ruckig online trajectory generation for ``n`` joints at a fixed cycle time."""

    def __init__(self, limits: JointLimits, dt: float, *, target_margin: float = 0.02,
                 max_dt: float = 0.25) -> None:
        """
        Args:
            limits: per-joint position [rad], velocity [rad/s], acceleration
                [rad/s^2] and jerk [rad/s^3] limits (all vectors of length n).
            dt: nominal cycle time [s].
            target_margin: targets are clipped this far inside the position limits [rad].
            max_dt: the longest step :meth:`step` takes [s].
        """
        vel, acc, jerk = (np.asarray(v, dtype=float) for v in (limits.velocity, limits.acceleration, limits.jerk))
        n = vel.size
        for name, v in (("velocity", vel), ("acceleration", acc), ("jerk", jerk)):
            if v.shape != (n,) or not np.all(np.isfinite(v)) or np.any(v <= 0):
                raise ConfigurationError(f"{name} limits must be {n} positive finite values, got {v.tolist()}")
        if not dt > 0:
            raise ConfigurationError(f"cycle time must be positive, got {dt}")
        self.n = n
        self.dt = dt
        self.max_dt = max(float(max_dt), dt)
        self.limits = limits
        self._lo = np.asarray(limits.lower, dtype=float) + target_margin
        self._hi = np.asarray(limits.upper, dtype=float) - target_margin
        if np.any(self._lo > self._hi):
            raise ConfigurationError("target_margin is larger than half a joint's position range")
        self._otg = Ruckig(n, dt)
        self._in = InputParameter(n)
        self._out = OutputParameter(n)
        self._in.max_velocity = vel.tolist()
        self._in.max_acceleration = acc.tolist()
        self._in.max_jerk = jerk.tolist()
        self._in.synchronization = Synchronization.No
        self._in.target_velocity = [0.0] * n
        self._in.target_acceleration = [0.0] * n
        self._in.control_interface = ControlInterface.Position
        self._per_dof = False  # a per-joint control interface list is set (some joints braking)
        self._all_braking = [ControlInterface.Velocity] * n  # the per-joint control interfaces of a stop
        self.errors = 0  # Ruckig calls that failed (the joints were then held)
        self._state = MotionState(np.zeros(n), np.zeros(n), np.zeros(n))
        self._initialised = False

    @property
    def state(self) -> MotionState:
        """The last commanded state."""
        return self._state

    @property
    def initialised(self) -> bool:
        return self._initialised

    def reset(self, position: np.ndarray, velocity: np.ndarray | None = None, *, clip: bool = True) -> None:
        """Start from ``position`` [rad] at ``velocity`` (default rest).

        ``clip``: clip the position into the limits (False: start where the joint
        really is, e.g. slightly outside, and let the clipped targets bring it in).
        """
        p = np.asarray(position, dtype=float)
        if clip:
            p = np.clip(p, self.limits.lower, self.limits.upper)
        v = np.zeros(self.n) if velocity is None else np.asarray(velocity, dtype=float)
        if p.shape != (self.n,) or v.shape != (self.n,) or not (np.all(np.isfinite(p)) and np.all(np.isfinite(v))):
            raise ValueError(f"reset needs {self.n} finite positions and velocities")
        self._in.current_position = p.tolist()
        self._in.current_velocity = v.tolist()
        self._in.current_acceleration = [0.0] * self.n
        self._state = MotionState(p, v, np.zeros(self.n))
        self._initialised = True

    def step(self, target: np.ndarray | None, active: np.ndarray | None = None, *,
             dt: float | None = None) -> MotionState:
        """Advance one cycle.

        Args:
            target: (n,) joint targets [rad] (clipped inside the limits), or
                None to bring every joint to a stop.
            active: optional (n,) booleans; joints marked False brake to a stop
                whatever their target. Non-finite targets also brake.
            dt: time since the previous step [s] (the measured period of a wall-clock loop; None: the nominal
                cycle time). The state returned is the trajectory's state ``dt`` after the previous one, so a
                command stamped at the time it is computed is true to its stamp however late the cycle ran;
                limited to ``max_dt`` (a stall longer than that is not caught up).
        Returns:
            The commanded :class:`MotionState` ``dt`` ahead.
        """
        if not self._initialised:
            raise RuntimeError("JerkLimitedFollower.step before reset")
        step_dt = self.dt if dt is None else min(max(float(dt), 1e-6), self.max_dt)
        if step_dt != self._otg.delta_time:
            self._otg.delta_time = step_dt
        inp = self._in
        if target is None:
            goal, n_follow = None, 0
        else:
            goal = np.asarray(target, dtype=float)
            follow = np.isfinite(goal)
            if active is not None:
                follow &= np.asarray(active, dtype=bool)
            n_follow = np.count_nonzero(follow)
        if goal is not None and n_follow == self.n:
            if self._per_dof:
                inp.per_dof_control_interface = None
                self._per_dof = False
            inp.target_position = np.minimum(np.maximum(goal, self._lo), self._hi).tolist()
        elif n_follow == 0:  # every joint brakes
            inp.per_dof_control_interface = self._all_braking
            self._per_dof = True
            inp.target_position = [0.0] * self.n
        else:
            goal = np.where(follow, np.clip(np.nan_to_num(goal), self._lo, self._hi), 0.0)
            inp.per_dof_control_interface = [
                ControlInterface.Position if f else ControlInterface.Velocity for f in follow.tolist()
            ]
            self._per_dof = True
            inp.target_position = goal.tolist()
        result = self._update()
        if result not in (Result.Working, Result.Finished):
            self.errors += 1
            _log.error("Ruckig failed (%s); braking all joints", result)
            inp.per_dof_control_interface = None
            inp.control_interface = ControlInterface.Velocity
            result = self._update()
            inp.control_interface = ControlInterface.Position
            self._per_dof = False
            if result not in (Result.Working, Result.Finished):
                _log.error("Ruckig brake failed (%s); holding position", result)
                self.reset(np.asarray(inp.current_position))
                return self._state
        out = self._out
        out.pass_to_input(inp)
        self._state = MotionState(
            np.asarray(out.new_position), np.asarray(out.new_velocity), np.asarray(out.new_acceleration)
        )
        return self._state

    def _update(self) -> Result | str:
        """One Ruckig update; a failure it raises (its Python binding raises ``RuckigError`` where the C++
        library returns an error code, e.g. a state from which a joint cannot keep within its velocity limit)
        comes back as its message, handled like a failed result: brake, else hold."""
        try:
            return self._otg.update(self._in, self._out)
        except RuckigError as exc:
            return str(exc).strip().splitlines()[0]

    def set_velocity_scale(self, scale: float) -> None:
        """Run at ``scale`` (0, 1] of the velocity limits from now on (e.g. a slow ramp)."""
        self._in.max_velocity = (np.asarray(self.limits.velocity, dtype=float) * scale).tolist()

    def at_rest(self, velocity_tol: float = 1e-6) -> bool:
        """True when every joint's velocity and acceleration are (nearly) zero."""
        return bool((np.abs(self._state.velocity) <= velocity_tol).all()
                    and (np.abs(self._state.acceleration) <= 1e3 * velocity_tol).all())


class ExponentialSmoother:
    """Exponential moving average ``y <- alpha * x + (1 - alpha) * y`` of a vector.

    A convex combination of in-limit values stays within the limits, so it
    can smooth commands that were clipped before.
    """

    def __init__(self, alpha: float, initial: np.ndarray) -> None:
        """
        Args:
            alpha: weight of the newest sample, in (0, 1] (1 = no smoothing).
            initial: the starting value.
        """
        if not 0.0 < alpha <= 1.0:
            raise ConfigurationError(f"EMA factor must be in (0, 1], got {alpha}")
        self.alpha = float(alpha)
        self.value = np.array(initial, dtype=float)

    def update(self, x: np.ndarray) -> np.ndarray:
        """Blend in ``x``; returns the new value (a new array)."""
        self.value = self.alpha * np.asarray(x, dtype=float) + (1.0 - self.alpha) * self.value
        return self.value


def arm_motion_limits(robot_limits: JointLimits, settings: dict) -> JointLimits:
    """The arm follower's limits (both arms, 14 joints, left then right): the robot's position limits and the
    per-joint ``max_velocity``, ``max_acceleration`` and ``max_jerk`` of ``settings`` (7 values each, one arm's,
    mirrored to the other), each at most the robot's.

    Raises:
        ParameterError: naming the setting, the joint and the allowed range, for a value above the robot's limit.
    """
    arms = robot_limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]]
    chosen = {}
    for key, robot_values in (("max_velocity", arms.velocity), ("max_acceleration", arms.acceleration),
                              ("max_jerk", arms.jerk)):
        v = np.tile(np.asarray(settings[key], dtype=float), 2)
        over = np.nonzero(v > robot_values + 1e-9)[0]
        if over.size:
            j = int(over[0]) % 7
            raise ParameterError(key, f"{key}[{j}] = {v[j]} exceeds the robot's limit {robot_values[j]:.4f} for arm "
                                      f"joint {j + 1}; allowed range (0, {robot_values[j]:.4f}]")
        chosen[key] = v
    return JointLimits(arms.lower, arms.upper, chosen["max_velocity"], chosen["max_acceleration"], chosen["max_jerk"])

