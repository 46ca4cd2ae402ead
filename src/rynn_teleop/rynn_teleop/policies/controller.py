"""The rules of running a policy on the robot (ROS-free; every time is the caller's clock [s]).

The policy node converts messages and calls one :class:`PolicyController`; the policy itself runs elsewhere (the
node's inference thread). The controller decides what reaches the drivers:

* **states** (:data:`STATES`): ``idle`` (not acting), ``running`` (acting on fresh observations), ``holding``
  (running, but the observation is stale), ``estopped`` (an e-stop is latched), ``error`` (the policy failed).
* **start** (:meth:`PolicyController.start`) is refused while e-stopped, after a fatal policy failure, and without
  a fresh observation: every camera of the policy with a frame and every joint with a measurement stamped within
  ``stale_timeout`` of now, the arms within ``start_tolerance`` of their limits. The arm follower starts at rest at
  the measured arm positions.
* **acting**: :meth:`PolicyController.policy_tick` (at the policy's frame rate) says whether an action is due; an
  action (:meth:`PolicyController.take_action`, the robot's 54 joints) sets the arms' target and the hands'
  command. The arms follow their target through a :class:`~..core.motion.JerkLimitedFollower` stepped by
  :meth:`PolicyController.arm_step` at the arm rate, as teleoperation's arms do: a jumping target never makes the
  commanded arm motion exceed its velocity, acceleration or jerk limits, and targets are kept ``target_margin``
  inside the position limits. A hand command is kept within the hands' position limits and changes by at most
  their velocity limit times the time since the previous action. What is clipped is counted.
* **stale observation** (a camera or a joint older than ``stale_timeout``) holds, never jumps: no action is asked
  for, the arms brake to a stop and stay there, the hands keep their command; fresh again, acting resumes from
  there.
* **stop** (the operator's, ``max_episode`` elapsed, a policy error): the arms brake to a stop, the hands keep
  their command until the arms are at rest; then nothing more is commanded (the drivers hold, their watchdog).
* **e-stop** (the ``/estop`` topic, or a driver reporting its e-stop latched): nothing more is commanded at once
  (the drivers hold); it clears once every driver heard from reports its e-stop released, in a report received at
  least ``estop_grace`` after the latch (so that no report sent before the drivers latched clears it). The policy
  is then idle: it acts again only when started again.

An action computed for an earlier start (a result that arrives after a stop) is discarded. What the node should
log and do (start or end an episode) comes out of :meth:`PolicyController.take_events`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..core.joint_state import JointStateBuffer
from ..core.motion import JerkLimitedFollower, MotionState
from ..core.robot_model import CANONICAL_JOINT_NAMES, N_JOINTS, JointLimits
from ..errors import ConfigurationError

STATES = ("idle", "running", "holding", "estopped", "error")
ARMS = np.arange(0, 14)  # canonical indices of the arm joints (left 1-7, right 1-7)
HANDS = np.arange(14, N_JOINTS)  # of the hand joints (left 20, right 20)
ARM_NAMES = tuple(CANONICAL_JOINT_NAMES[i] for i in ARMS)
HAND_NAMES = tuple(CANONICAL_JOINT_NAMES[i] for i in HANDS)
MAX_HAND_DT = 1.0  # [s] the longest time a hand command's change is allowed for (a resumed policy)


def path_setting_of(backend: str) -> str | None:
    """The setting of policy backend ``backend`` that a policy's path gives (``rynn-teleop policy eval PATH``, the
    policy node's ``path``, ``run --policy PATH``): ``path`` of ``lerobot``, ``dataset`` of ``replay``; None for a
    backend that loads nothing from a path (``constant``).

    Raises:
        UnknownBackendError: no such backend.
    """
    from . import POLICY_BACKENDS
    from .cli import path_setting

    key = path_setting(backend)
    return key if key in {p.name for p in POLICY_BACKENDS.backend(backend).SETTINGS} else None


class ControllerSettings(NamedTuple):
    """Tuning of :class:`PolicyController` (units beside each field)."""

    arm_rate_hz: float = 200.0  # [Hz] arm_step cycle (Ruckig's nominal cycle time 1 / arm_rate_hz)
    stale_timeout: float = 0.5  # [s] a camera frame or joint measurement older than this is stale: hold
    max_episode: float = 0.0  # [s] a run stops by itself after this long (0: never)
    start_tolerance: float = 0.01  # [rad] measured arm positions this far outside a limit are clipped; further: refused
    target_margin: float = 0.02  # [rad] arm targets stay this far inside the position limits
    future_tolerance: float = 0.05  # [s] a stamp further in the future than this is not fresh (clock skew)
    estop_grace: float = 0.5  # [s] driver reports received this long after an e-stop reflect it


class Event(NamedTuple):
    """Something the node should log (``level``) and act on (``kind``)."""

    kind: str  # "started" (a run began: start an episode), "ended" (it ended: end the episode), "note"
    level: str  # "info", "warning" or "error"
    text: str


class Decision(NamedTuple):
    """What a policy tick decided."""

    act: bool  # ask the policy for an action now
    generation: int  # the run it is for (an action of another run is discarded)


class ControllerStatus(NamedTuple):
    """Counters and state for diagnostics."""

    state: str  # one of STATES
    reason: str  # why (stale input, the e-stop's cause, how the last run ended); '' when running
    generation: int  # [-] runs started
    steps: int  # [-] actions taken in the current (or last) run
    overruns: int  # [-] frames whose action was not asked for: the previous act() was still running
    discarded: int  # [-] actions that came too late (after a stop, or for a stale observation)
    holds: int  # [-] running -> holding transitions (stale observation)
    errors: int  # [-] policy failures
    last_error: str  # the newest failure ('' none)
    arm_targets_clipped: int  # [-] actions with an arm target outside the position limits (less the margin)
    hand_commands_limited: int  # [-] actions whose hand command was clipped to the limits or the velocity limit
    commanding: bool  # arm and hand commands are being sent


class PolicyController:
    """See the module doc.

    Args:
        limits: the robot's joint limits (54 joints, canonical order): the hands' command is kept within them.
        arm_motion: the arms' motion limits for the follower (14 joints: the robot's position limits, velocity,
            acceleration and jerk at most the robot's).
        cameras: the camera keys of the policy (each must have fresh frames).
        settings: tuning.

    Raises:
        ConfigurationError: limits of the wrong size, a setting out of range, no camera.
    """

    def __init__(self, limits: JointLimits, arm_motion: JointLimits, cameras: Sequence[str],
                 settings: ControllerSettings | None = None) -> None:
        s = ControllerSettings() if settings is None else settings
        if np.asarray(limits.lower).shape != (N_JOINTS,):
            raise ConfigurationError(f"the robot's limits must be of {N_JOINTS} joints")
        for name in ("arm_rate_hz", "stale_timeout"):
            if not (math.isfinite(getattr(s, name)) and getattr(s, name) > 0):
                raise ConfigurationError(f"{name} must be a positive number, got {getattr(s, name)}")
        for name in ("max_episode", "start_tolerance", "target_margin", "estop_grace", "future_tolerance"):
            if not (math.isfinite(getattr(s, name)) and getattr(s, name) >= 0):
                raise ConfigurationError(f"{name} must be a number >= 0, got {getattr(s, name)}")
        if not cameras:
            raise ConfigurationError("a policy without a camera cannot be run: its observation is a camera frame")
        self.settings = s
        self.limits = limits
        self.hand_limits = limits[HANDS]
        self.follower = JerkLimitedFollower(arm_motion, 1.0 / s.arm_rate_hz, target_margin=s.target_margin)
        self._arm_lo = np.asarray(arm_motion.lower, float) + s.target_margin
        self._arm_hi = np.asarray(arm_motion.upper, float) - s.target_margin
        self.cameras = tuple(cameras)
        self.measured = JointStateBuffer(np.zeros(N_JOINTS))
        self.frames: dict[str, float] = {}  # camera -> newest frame stamp [s]
        self.state = "idle"
        self.reason = "not started"
        self.generation = 0
        self.steps = self.overruns = self.discarded = self.holds = self.errors = 0
        self.arm_targets_clipped = self.hand_commands_limited = 0
        self.last_error = ""
        self.fatal = ""  # why the policy cannot be used any more ('' while it can)
        self.started_at = -math.inf  # [s] of the current run
        self.arm_target: np.ndarray | None = None  # (14,) [rad] the newest action's arm joints
        self.hand_command: np.ndarray | None = None  # (40,) [rad] the hands' command
        self._hand_at = -math.inf  # [s] when hand_command was set
        self._commanding = False  # arm and hand commands go out (from a start until the arms rest after a stop)
        self._last_arm: float | None = None  # [s] time of the previous arm_step
        self._latched_at = -math.inf  # [s] when the e-stop latched
        self._reports: dict[str, tuple[bool, float]] = {}  # driver -> (e-stop latched, received at [s])
        self._events: list[Event] = []

    # ------------------------------------------------------------------ input
    def measure(self, names: Sequence[str], positions: Sequence[float], stamp: float) -> None:
        """A measurement of joints ``names`` [rad] taken at ``stamp`` [s] (a malformed one is counted, not used)."""
        self.measured.update(names, positions, stamp)

    def frame(self, camera: str, stamp: float) -> None:
        """A frame of ``camera`` captured at ``stamp`` [s] (the newest counts)."""
        if camera in self.cameras:
            self.frames[camera] = max(stamp, self.frames.get(camera, -math.inf))

    def stale_reason(self, now: float) -> str:
        """Why the observation at ``now`` [s] is not fresh ('' when it is): a camera or a joint without a frame or
        measurement stamped within ``stale_timeout``."""
        s = self.settings
        for camera in self.cameras:
            stamp = self.frames.get(camera)
            if stamp is None:
                return f"no {camera} camera frame yet"
            age = now - stamp
            if age > s.stale_timeout or age < -s.future_tolerance:
                return f"the {camera} camera frame is {age:.2f} s old (stale_timeout {s.stale_timeout:g} s)"
        fresh = self.measured.fresh(now, s.stale_timeout, s.future_tolerance)
        if not fresh.all():
            j = int(np.argmin(fresh))
            stamp = self.measured.stamp[j]
            what = "never measured" if not math.isfinite(stamp) else f"measured {now - stamp:.2f} s ago"
            missing = int(np.count_nonzero(~fresh))
            return (f"joint {CANONICAL_JOINT_NAMES[j]} {what}" + (f" ({missing} joints stale)" if missing > 1 else "")
                    + f" (stale_timeout {s.stale_timeout:g} s)")
        return ""

    # ------------------------------------------------------------------ operator
    def start(self, now: float) -> tuple[bool, str]:
        """Start acting at ``now`` [s]; (success, message). Refused (see the module doc) with the reason."""
        if self.state == "estopped":
            return False, (f"refused: e-stop latched ({self.reason}); release it (reset) first: the policy can start "
                           "once the drivers report it released")
        if self.fatal:
            return False, f"refused: the policy failed and cannot be used ({self.fatal}); restart the policy node"
        if self.state in ("running", "holding"):
            return True, "already running"
        stale = self.stale_reason(now)
        if stale:
            return False, f"refused: no fresh observation: {stale}"
        measured = self.measured.position[ARMS]
        lim = self.follower.limits
        excess = np.maximum(np.asarray(lim.lower) - measured, measured - np.asarray(lim.upper))
        if np.any(excess > self.settings.start_tolerance):
            j = int(np.argmax(excess))
            return False, (f"refused: measured {ARM_NAMES[j]} = {measured[j]:.4f} rad is {excess[j]:.4f} rad outside "
                           f"its limits [{lim.lower[j]:.4f}, {lim.upper[j]:.4f}]")
        if np.any(excess > 0):
            clipped = ", ".join(f"{ARM_NAMES[j]} by {excess[j]:.4f} rad" for j in np.nonzero(excess > 0)[0])
            self._say("note", "warning", f"measured arm positions clipped into the limits: {clipped}")
        self.follower.reset(measured)
        self._last_arm = None
        self.generation += 1
        self.state, self.reason = "running", ""
        self.started_at = now
        self.steps = 0
        self.arm_target = None
        self.hand_command = self.measured.position[HANDS].copy()  # the previous command of the velocity limit
        self._hand_at = now
        self._commanding = True
        self._say("started", "info", f"policy started (run {self.generation})")
        return True, f"started (run {self.generation})"

    def stop(self, now: float, reason: str = "stopped by the operator") -> tuple[bool, str]:
        """Stop acting at ``now`` [s]: the arms brake to a stop, the hands keep their command (see the module
        doc); (success, message)."""
        if self.state in ("running", "holding"):
            self._end("idle", reason, "info")
            return True, f"stopped: the arms brake to a stop ({self.steps} steps)"
        if self.state == "estopped":
            return True, f"not running (e-stop latched: {self.reason})"
        return True, "not running"

    def estop(self, now: float, reason: str) -> None:
        """An e-stop latched at ``now`` [s]: command nothing more (the drivers hold), until it is released."""
        self._latched_at = now
        if self.state == "estopped":
            return
        if self.state in ("running", "holding"):
            self._say("ended", "error", f"policy run {self.generation} ended by the e-stop ({reason})")
        else:
            self._say("note", "warning", f"e-stop: {reason}")
        self.state, self.reason = "estopped", reason
        self._commanding = False
        self.arm_target = None

    def driver_report(self, driver: str, estopped: bool, now: float) -> None:
        """A driver's status received at ``now`` [s]: whether its e-stop is latched."""
        self._reports[driver] = (bool(estopped), now)
        if estopped and self.state != "estopped":
            self.estop(now, f"e-stop latched in {driver}")

    def fail(self, now: float, message: str, *, fatal: bool = False) -> None:
        """The policy failed at ``now`` [s] (its act() or reset() raised, or its action is unusable): the run ends
        as a stop does (error state); ``fatal``: the policy cannot be used any more (starts are refused)."""
        self.errors += 1
        self.last_error = message
        if fatal:
            self.fatal = message
        if self.state in ("running", "holding"):
            self._end("error", f"the policy failed: {message}", "error")
        elif self.state != "estopped":
            self.state, self.reason = "error", f"the policy failed: {message}"
            self._say("note", "error", self.reason)

    def _end(self, state: str, reason: str, level: str) -> None:
        self.state, self.reason = state, reason
        self.arm_target = None  # the arms brake (arm_step), the hands keep their command until they rest
        self._say("ended", level, f"policy run {self.generation} ended: {reason} ({self.steps} steps)")

    # ------------------------------------------------------------------ cycles
    def policy_tick(self, now: float) -> Decision:
        """The policy's cycle at ``now`` [s] (its frame rate): e-stop release, the run's time limit, stale input;
        whether an action is due."""
        self._update_estop(now)
        if self.state in ("running", "holding"):
            limit = self.settings.max_episode
            if limit > 0 and now - self.started_at >= limit:
                self._end("idle", f"max_episode_s ({limit:g} s) reached", "info")
                return Decision(False, self.generation)
            stale = self.stale_reason(now)
            if stale and self.state == "running":
                self.state, self.reason = "holding", stale
                self.holds += 1
                self.arm_target = None  # brake and stay: hold, never jump to an old target
                self._say("note", "warning", f"holding: {stale}")
            elif stale:
                self.reason = stale
            elif self.state == "holding":
                self.state, self.reason = "running", ""
                self._say("note", "info", "the observation is fresh again: acting")
        return Decision(self.state == "running", self.generation)

    def overrun(self) -> None:
        """An action was due while the previous act() still ran: this frame is skipped."""
        self.overruns += 1

    def take_action(self, generation: int, action: np.ndarray, now: float) -> bool:
        """An action [rad] (54 joints, canonical order) computed for run ``generation``, available at ``now`` [s];
        False (counted) when it came too late (another run, not running, or the observation went stale).

        An action that is not 54 finite numbers fails the run (:meth:`fail`).
        """
        if generation != self.generation or self.state != "running":
            self.discarded += 1
            return False
        a = np.asarray(action, dtype=float).reshape(-1)
        if a.shape != (N_JOINTS,) or not np.all(np.isfinite(a)):
            bad = int(np.count_nonzero(~np.isfinite(a))) if a.size else 0
            self.fail(now, f"the policy's action is not {N_JOINTS} finite joint positions (shape "
                           f"{np.shape(action)}, {bad} not finite)")
            return False
        arm = a[ARMS]
        if np.any((arm < self._arm_lo) | (arm > self._arm_hi)):
            self.arm_targets_clipped += 1
            if self.arm_targets_clipped == 1:
                outside = np.nonzero((arm < self._arm_lo) | (arm > self._arm_hi))[0]
                self._say("note", "warning", "an arm target outside the position limits (less "
                          f"{self.settings.target_margin:g} rad) is clipped: {', '.join(ARM_NAMES[i] for i in outside)}"
                          " (counted in arm_targets_clipped from now on)")
        self.arm_target = arm.copy()
        self._set_hands(a[HANDS], now)
        self.steps += 1
        return True

    def _set_hands(self, goal: np.ndarray, now: float) -> None:
        lim = self.hand_limits
        inside = np.clip(goal, lim.lower, lim.upper)
        previous = self.hand_command if self.hand_command is not None else inside
        dt = min(max(now - self._hand_at, 1.0 / self.settings.arm_rate_hz), MAX_HAND_DT)
        step = np.asarray(lim.velocity, float) * dt
        sent = previous + np.clip(inside - previous, -step, step)
        if np.any(sent != goal):
            self.hand_commands_limited += 1
        self.hand_command, self._hand_at = sent, now

    def arm_step(self, now: float) -> MotionState | None:
        """The arms' command at ``now`` [s] (the arm rate): the follower advanced by the time since the previous
        step towards the newest target (braking without one); None: command nothing (e-stop, not started, at
        rest after a stop)."""
        if not self._commanding:
            return None
        last, self._last_arm = self._last_arm, now
        dt = now - last if last is not None and now > last else None
        if self.state == "running" and self.arm_target is not None:
            out = self.follower.step(self.arm_target, dt=dt)
        else:
            out = self.follower.step(None, dt=dt)
        if self.state not in ("running", "holding") and self.follower.at_rest():
            self._commanding = False  # this command is the last: the arms are at rest
        return out

    def hand_step(self) -> np.ndarray | None:
        """The hands' command (40 joints, canonical order) [rad] now: the newest action's while commanding;
        None before the first action of a run, and while nothing is commanded."""
        if not self._commanding or self.steps == 0:
            return None
        return self.hand_command

    @property
    def commanding(self) -> bool:
        """Arm commands go out (from a start until the arms rest after its end; never while e-stopped)."""
        return self._commanding

    def _update_estop(self, now: float) -> None:
        if self.state != "estopped":
            return
        after = self._latched_at + self.settings.estop_grace
        reports = self._reports
        if reports and all(not latched and received >= after for latched, received in reports.values()):
            self.state, self.reason = "idle", "the e-stop was released: start the policy again"
            self._say("note", "info", "e-stop released by every driver: the policy is idle (start it again)")

    # ------------------------------------------------------------------ reading
    def take_events(self) -> list[Event]:
        """What happened since the last call, oldest first (and forget it)."""
        out, self._events = self._events, []
        return out

    def _say(self, kind: str, level: str, text: str) -> None:
        self._events.append(Event(kind, level, text))

    def status(self) -> ControllerStatus:
        return ControllerStatus(self.state, self.reason, self.generation, self.steps, self.overruns, self.discarded,
                                self.holds, self.errors, self.last_error, self.arm_targets_clipped,
                                self.hand_commands_limited, self._commanding)
