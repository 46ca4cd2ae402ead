"""The safety layer between commands and joint hardware (ROS-free, shared by both drivers).

Every control cycle a driver calls :meth:`SafetyController.step` with the newest measurement and the cycle's
time ``now`` [s]; it decides the target actually sent. Each cycle advances by its measured period, so the
targets keep the velocity, acceleration and jerk limits in wall-clock time however the loop's ticks jitter:

* **e-stop** (:meth:`SafetyController.estop`): latched within the cycle until :meth:`SafetyController.reset`,
  then restarts from the measured position (the driver stops its backend and sends nothing while latched);
* **watchdog**: no command for ``command_timeout`` -> jerk-limited stop and hold, until a newer command;
* **start-up**: hold the measured position until the first command; a command further than ``ramp_threshold``
  is approached at ``ramp_speed`` (a fraction of the velocity limits), also when resuming after a hold;
* **smoothing and clamp**: a Ruckig follower turns the goals into targets within the limits; the pure
  :func:`clamp_command` keeps each within the position limits and ``velocity * dt`` of the previous one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import ConfigurationError
from .robot_model import JointLimits

_log = logging.getLogger(__name__)

MODES = ("waiting", "hold", "ramp", "track", "watchdog", "estop")
# [rad] a step clip no larger than this is floating-point rounding of a trajectory at its velocity limit: the
# clipped target is sent, but the follower keeps its state (a reset would zero its velocity)
STEP_ROUNDING = 1e-12


class ClampResult(NamedTuple):
    """What :func:`clamp_command` sent and why it differs from what was asked."""

    sent: np.ndarray  # (n,) target actually sent [rad]
    position_clipped: np.ndarray  # (n,) bool: asked outside the position limits
    step_clipped: np.ndarray  # (n,) bool: asked further than max_step from the previous target

    @property
    def clipped(self) -> bool:
        return bool(np.count_nonzero(self.position_clipped) or np.count_nonzero(self.step_clipped))

    def describe(self, names: Sequence[str], asked: np.ndarray) -> str:
        """Human-readable list of the clipped joints: 'name asked -> sent (reason)'."""
        parts = []
        for i in np.nonzero(self.position_clipped | self.step_clipped)[0]:
            why = "position limit" if self.position_clipped[i] else "max step"
            parts.append(f"{names[i]} {asked[i]:+.4f} -> {self.sent[i]:+.4f} rad ({why})")
        return ", ".join(parts)


def clamp_command(
    asked: np.ndarray, previous: np.ndarray, lower: np.ndarray, upper: np.ndarray, max_step: np.ndarray
) -> ClampResult:
    """The target to send for ``asked``: within [lower, upper] and within ``max_step`` of ``previous``.

    Args:
        asked: (n,) requested positions [rad] (non-finite entries keep ``previous``).
        previous: (n,) the target sent last cycle [rad].
        lower, upper: (n,) position limits [rad].
        max_step: (n,) largest change this cycle [rad] (velocity limit [rad/s] x the cycle's period [s]).
    """
    asked = np.asarray(asked, dtype=float)
    finite = np.isfinite(asked)
    if finite.size and np.count_nonzero(finite) == finite.size:  # nothing to take from ``previous``
        in_limits = np.minimum(np.maximum(asked, lower), upper)
        position_clipped = in_limits != asked
    else:
        wanted = np.where(finite, asked, previous)
        in_limits = np.minimum(np.maximum(wanted, lower), upper)
        position_clipped = (in_limits != wanted) | ~finite
    step = in_limits - previous
    limited = np.minimum(np.maximum(step, -max_step), max_step)
    # within the limits whenever ``previous`` is; from outside (a joint measured just past a
    # limit at start) it comes in by at most max_step per cycle instead of jumping
    sent = previous + limited
    return ClampResult(sent, position_clipped, limited != step)


class Watchdog:
    """Trips when no command arrived for ``timeout`` seconds; re-arms on a command newer than the trip."""

    def __init__(self, timeout: float) -> None:
        if not timeout > 0:
            raise ConfigurationError(f"command timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.last_command: float | None = None
        self.tripped_at: float | None = None
        self.trips = 0

    def feed(self, stamp: float) -> None:
        """A command was received at ``stamp`` [s]."""
        self.last_command = stamp

    def check(self, now: float) -> bool:
        """True while commands may be followed (fresh and, after a trip, renewed)."""
        if self.last_command is None:
            return False
        if self.tripped_at is not None:
            if self.last_command > self.tripped_at and now - self.last_command <= self.timeout:
                self.tripped_at = None  # fresh again
            else:
                return False
        if now - self.last_command > self.timeout:
            self.tripped_at = now
            self.trips += 1
            return False
        return True

    @property
    def tripped(self) -> bool:
        return self.tripped_at is not None


class SafetyOutput(NamedTuple):
    """One cycle's decision."""

    target: np.ndarray | None  # (n,) position target to send [rad]; None: send nothing (no valid measurement yet)
    mode: str  # one of MODES
    clamp: ClampResult | None  # the final clamp (None when nothing is sent)


class SafetyController:
    """Watchdog, e-stop latch, start-up hold and ramp, jerk-limited smoothing and clamping for one set of joints.

    The decision of each cycle is a goal per joint (follow its command, or
    stop); a Ruckig follower (:class:`~.motion.JerkLimitedFollower`) turns it
    into targets within the velocity, acceleration and jerk limits (a hold is
    a jerk-limited stop, never an instantaneous one), and :func:`clamp_command`
    is the final guarantee of the position limits and the per-cycle step.
    Each :meth:`step` advances by the measured period since the previous one
    (see there), so the limits hold over the real times the targets are sent.
    Joints are commanded independently (a message may name only some, e.g. one
    hand): a joint whose last command is older than ``command_timeout`` stops.
    """

    def __init__(
        self,
        names: Sequence[str],
        limits: JointLimits,
        dt: float,
        *,
        command_timeout: float = 0.2,
        ramp_threshold: float = 0.05,
        ramp_speed: float = 0.2,
    ) -> None:
        """
        Args:
            names: joint names (for messages).
            limits: their position [rad], velocity [rad/s], acceleration [rad/s^2] and jerk [rad/s^3] limits.
            dt: nominal control cycle [s]: the period of the first cycle (and of the first after re-seeding,
                and of a cycle whose ``now`` is not later than the previous one's).
            command_timeout: watchdog timeout [s].
            ramp_threshold: a command further than this [rad] from the position when a hold ends is ramped to.
            ramp_speed: ramp speed as a fraction of the velocity limits (0..1].
        """
        from .motion import JerkLimitedFollower  # core.motion imports ruckig

        if not dt > 0:
            raise ConfigurationError(f"control cycle must be positive, got {dt}")
        if not 0 < ramp_speed <= 1:
            raise ConfigurationError(f"ramp_speed must be in (0, 1], got {ramp_speed}")
        self.names = tuple(names)
        n = len(self.names)
        self.lower = np.asarray(limits.lower, dtype=float)
        self.upper = np.asarray(limits.upper, dtype=float)
        if self.lower.shape != (n,):
            raise ConfigurationError(f"{n} joint names but {self.lower.shape} limits")
        self.dt = float(dt)  # [s] nominal cycle
        self._velocity = np.asarray(limits.velocity, dtype=float)  # [rad/s]
        self.follower = JerkLimitedFollower(limits, dt, target_margin=0.0)
        self.max_dt = self.follower.max_dt  # [s] longest period a cycle advances by
        self.last_dt = self.dt  # [s] the period the latest cycle advanced by
        self.max_step = self._velocity * self.dt  # (n,) [rad] the latest cycle's step bound (velocity x last_dt)
        self._last_now: float | None = None  # [s] ``now`` of the previous cycle (None: none since seeding)
        self.ramp_threshold = ramp_threshold
        self.ramp_speed = ramp_speed
        self.watchdog = Watchdog(command_timeout)
        self.timeout = command_timeout
        self._command = np.full(n, np.nan)
        self._command_time = np.full(n, -np.inf)  # [s] receive time of each joint's last command
        # derived from _command by _derive_command, before the next step whenever _command_changed
        self._command_changed = False
        self._given = np.zeros(n, dtype=bool)  # (n,) joints with a command
        self._given_all = False  # every joint has one (until reset: a joint's command is only ever replaced)
        self._goal = np.full(n, np.nan)  # (n,) [rad] the commands clipped into the position limits (NaN: none)
        self._outside = np.ones(n, dtype=bool)  # (n,) commands outside the position limits, or none
        self._any_outside = False  # some joint's command is outside the limits
        self._age = np.empty(n)  # (n,) [s] scratch of step: the age of each joint's command
        self._sent: np.ndarray | None = None
        self._estop = False
        self._ramping = False
        self._resuming = True  # the next followed command comes after a hold (start-up)
        self.mode = "waiting"
        self.clamp_counts = {"position": 0, "step": 0}  # cycles with clipping, by reason
        self._last_clip_log = -np.inf
        self.estops = 0

    # ------------------------------------------------------------------ inputs
    def command(self, position: np.ndarray, stamp: float, joints: slice | np.ndarray | None = None) -> None:
        """A new command received at ``stamp`` [s].

        Args:
            position: with ``joints`` None, (n,) positions [rad] where NaN entries are joints not commanded by
                it; otherwise the positions [rad] of ``joints``, all finite.
            stamp: receive time [s].
            joints: which joints ``position`` gives: a slice or an array of distinct indices into the n joints
                (None: all n, see ``position``).
        Raises:
            ValueError: ``position`` has the wrong shape, commands no joint, or has a non-finite value.
        """
        position = np.asarray(position, dtype=float)
        if joints is None:
            if position.shape != self._command.shape:
                raise ValueError(f"command has shape {position.shape}, expected {self._command.shape}")
            finite = np.isfinite(position)
            if finite.size and np.count_nonzero(finite) == finite.size:  # every joint
                self._command[:] = position
                self._command_time.fill(stamp)
            else:
                given = ~np.isnan(position)
                if not given.any() or not finite[given].all():
                    raise ValueError("command has no joint or non-finite values")
                self._command[given] = position[given]
                self._command_time[given] = stamp
        else:
            expected = self._command[joints].shape
            if position.shape != expected:
                raise ValueError(f"command has shape {position.shape}, expected {expected}")
            if not position.size or np.count_nonzero(np.isfinite(position)) != position.size:
                raise ValueError("command has no joint or non-finite values")
            self._command[joints] = position
            self._command_time[joints] = stamp
        self._command_changed = True
        self.watchdog.feed(stamp)

    def _derive_command(self) -> None:
        """Recompute what :meth:`step` needs from the commands (after they changed)."""
        c = self._command
        n_given = c.size
        if not self._given_all:
            np.isnan(c, out=self._given)
            np.logical_not(self._given, out=self._given)
            n_given = np.count_nonzero(self._given)
            self._given_all = n_given == c.size
        self._goal = np.minimum(np.maximum(c, self.lower), self.upper)
        np.not_equal(self._goal, c, out=self._outside)  # NaN (no command) != NaN too
        self._any_outside = np.count_nonzero(self._outside) > c.size - n_given
        self._command_changed = False

    def estop(self) -> bool:
        """Latch the emergency stop; True if it was not latched before."""
        new = not self._estop
        self._estop = True
        self.estops += int(new)
        return new

    def reset(self, now: float | None = None) -> None:
        """Release the e-stop at ``now`` [s] (default: after the newest command seen). The next cycle starts
        again from the measured position (the robot moved while it stopped); motion resumes, ramped, only
        with commands received after this call (a command received before it but handed over later, e.g.
        drained from a queue, does not count)."""
        if not self._estop:
            return
        self._estop = False
        self.restart(now)

    def restart(self, now: float | None = None) -> None:
        """Start again at ``now`` [s] as after a reset, whether or not the e-stop is latched (it stays as it is):
        forget every command, re-seed from the next measurement, follow (ramped) only commands received after
        ``now``. A driver calls it when it starts commanding again (lifecycle activation) and when it stops."""
        self._command[:] = np.nan
        self._command_time[:] = -np.inf
        self._command_changed = True
        self._given_all = False
        self._sent = None  # re-seed from the measurement
        self._resuming = True
        last = self.watchdog.last_command
        self.watchdog.tripped_at = max(last if last is not None else -np.inf, now if now is not None else -np.inf)
        self.mode = "estop" if self._estop else "waiting"

    @property
    def estopped(self) -> bool:
        return self._estop

    # ------------------------------------------------------------------ cycle
    def _seed(self, measured: np.ndarray) -> None:
        self.follower.reset(measured, clip=False)
        self._sent = measured.copy()
        self._last_now = None  # the first cycle from a seed advances by the nominal period

    def period(self, now: float) -> float:
        """The period [s] the cycle at ``now`` [s] advances by: ``now`` minus the previous cycle's ``now``.

        The nominal ``dt`` for the first cycle after seeding (start-up, :meth:`reset`) and for a ``now`` that is
        not finite or not later than the previous cycle's (a clock stepping backwards or repeating); at most
        ``max_dt`` (the follower's: a stall longer than that is not caught up, the targets then move slower).
        """
        last = self._last_now
        if last is None or not math.isfinite(now) or not now > last:
            return self.dt
        return min(now - last, self.max_dt)

    def step(self, now: float, measured: np.ndarray) -> SafetyOutput:
        """This cycle's target, given the newest measured positions (n,) [rad] at ``now`` [s].

        The target is the smoothed trajectory's state :meth:`period` after the previous cycle's, and is clamped
        to at most ``velocity * period`` [rad] from the previous target, so targets differenced over the
        ``now`` values they were computed at stay within the velocity and acceleration limits (``now`` must be
        the time the target is sent, e.g. the loop's wall clock, not a nominal tick count).
        Returns ``target=None`` (send nothing) until a finite measurement of every joint arrives.
        """
        measured = np.asarray(measured, dtype=float)
        n = self.lower.size
        if self._sent is None:
            if measured.shape != self.lower.shape or np.count_nonzero(np.isfinite(measured)) != n:
                self.mode = "waiting"
                return SafetyOutput(None, self.mode, None)  # nothing valid to start from: send nothing
            self._seed(measured)
        dt = self.period(now)
        if math.isfinite(now):
            self._last_now = float(now)  # also after a backwards step: the next period is measured from here
        self.last_dt = dt
        self.max_step = self._velocity * dt
        fresh = self.watchdog.check(now)
        if self._command_changed:
            self._derive_command()
        active = None
        n_active = 0
        if fresh and not self._estop:
            # a joint is followed while its own command is fresh
            active = np.less_equal(np.subtract(now, self._command_time, out=self._age), self.timeout)
            if not self._given_all:
                np.logical_and(active, self._given, out=active)
            n_active = np.count_nonzero(active)
        if n_active == 0:
            if self._estop:
                self.mode = "estop"
            else:
                self.mode = "waiting" if self.watchdog.last_command is None else "watchdog"
            self._resuming = True
            state = self.follower.step(None, dt=dt)  # jerk-limited stop
        else:
            every = n_active == n
            goal = self._goal if every else np.where(active, self._goal, np.nan)
            if self._resuming:  # leaving a hold: ramp (until arrived) if the command is far
                far = np.fmax.reduce(np.abs(goal - self.follower.state.position))  # the largest, NaN ignored
                self._ramping = bool(far > self.ramp_threshold)
                self.follower.set_velocity_scale(self.ramp_speed if self._ramping else 1.0)
                self._resuming = False
            state = self.follower.step(goal, active, dt=dt)
            if self._ramping:
                self.mode = "ramp"
                off = np.abs(goal - state.position) if every else np.abs(np.where(active, goal - state.position, 0.0))
                arrived = np.fmax.reduce(off) < 1e-6
                if arrived and self.follower.at_rest(1e-3):
                    self._ramping = False
                    self.follower.set_velocity_scale(1.0)
            else:
                self.mode = "track"
            if self._any_outside:
                outside = active & self._outside
                if np.count_nonzero(outside):
                    self.clamp_counts["position"] += 1
                    if now - self._last_clip_log >= 1.0:  # at most once a second
                        self._last_clip_log = now
                        clipped = [f"{self.names[i]} {self._command[i]:+.4f} rad" for i in np.nonzero(outside)[0]]
                        _log.warning("commands outside the position limits, clipped: %s", ", ".join(clipped))
        result = clamp_command(state.position, self._sent, self.lower, self.upper, self.max_step)
        if np.count_nonzero(result.step_clipped) and (
                np.abs(result.sent - state.position)[result.step_clipped] > STEP_ROUNDING).any():
            # only if the follower and the clamp disagree (not by rounding): keep them consistent
            self.clamp_counts["step"] += 1
            self.follower.reset(result.sent, clip=False)
        self._sent = result.sent
        return SafetyOutput(result.sent, self.mode, result)
