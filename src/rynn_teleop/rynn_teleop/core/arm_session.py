"""The rules of an arm teleoperation session around :class:`~.arm_teleop.ArmTeleop` (ROS-free).

The arm_ik node converts messages and calls one :class:`ArmSession`; every time is the caller's [s]:

* input: :meth:`ArmSession.add_frame` takes one ``<prefix>/trackers`` frame ((5, 4, 4) matrices in
  :data:`~.trackers.ROLES` order, all-NaN for a role without a sample) and hands each side's chest-relative
  wrist and elbow poses (fresh at the frame's own stamp) to the controller;
* start (``start_from = "measured"``): no command until every arm joint has a measured position fresher than
  ``measured_timeout`` and none is more than ``start_tolerance`` outside its limit (those within are clipped);
* clutch: the service (:meth:`ArmSession.set_clutch`) or a pedal topic (:meth:`ArmSession.clutch_topic`, a
  deadman when ``clutch_topic_timeout`` > 0); ``auto_calibrate`` captures the calibration once the operator
  holds the posture still; ``auto_engage`` engages once, as soon as a calibration exists.

What the node should log comes out of :meth:`ArmSession.take_notices` (repeated warnings rate-limited).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigurationError, RynnTeleopError
from .arm_teleop import ArmCommand, ArmTeleop
from .calibration import StillnessDetector
from .joint_state import JointStateBuffer
from .layout import SIDES
from .robot_model import GROUPS
from .status import ArmIKStatus
from .trackers import ChestRelativeArms

NOTICE_REPEAT = 2.0  # [s] a repeated warning of the same kind is reported at most this often
STILL_CHECK_PERIOD = 0.05  # [s] how often a pending auto-calibration re-checks the stillness


class SessionSettings(NamedTuple):
    """Tuning of :class:`ArmSession` (units beside each field)."""

    start_from: str = "measured"  # "measured": wait for the measured arm positions; "home": start at home
    start_tolerance: float = 0.01  # [rad] a measured position this far outside its limit is clipped; further blocks
    measured_timeout: float = 0.5  # [s] measured positions older than this do not count for the start
    clutch_topic_timeout: float = 0.0  # [s] deadman pedal: an engagement on the topic ends after this silence; 0 = off
    auto_calibrate: bool = False  # capture the calibration automatically (not saved)
    auto_calibrate_delay: float = 1.0  # [s] after both wrists are first seen
    auto_calibrate_retry: float = 0.5  # [s] between failed attempts
    auto_engage: bool = False  # engage once as soon as a calibration exists
    still_window: float = 0.5  # [s] how long the posture must have been held for auto-calibration
    still_position: float = 0.01  # [m] largest distance of a tracker from its mean position over the window
    still_rotation: float = 0.05  # [rad] largest rotation of a tracker from its newest orientation over the window


class Notice(NamedTuple):
    """Something the node should log."""

    level: str  # "info", "warning" or "error"
    text: str


class SessionStatus(NamedTuple):
    """The session's health for diagnostics."""

    level: str  # "ok", "warning" or "error"
    message: str


class ArmSession:
    """Start gating, clutch (service, pedal, deadman), auto-calibration and auto-engage around a controller."""

    def __init__(self, teleop: ArmTeleop, settings: SessionSettings | None = None) -> None:
        """
        Args:
            teleop: the controller (its calibration and clutch are the session's).
            settings: the rules' tuning (default: :class:`SessionSettings`' defaults).

        Raises:
            ConfigurationError: an unknown ``start_from`` or a value out of range.
        """
        settings = SessionSettings() if settings is None else settings
        if settings.start_from not in ("measured", "home"):
            raise ConfigurationError(f"start_from must be 'measured' or 'home', got {settings.start_from!r}")
        for name in ("start_tolerance", "clutch_topic_timeout", "auto_calibrate_delay"):
            if not getattr(settings, name) >= 0:
                raise ConfigurationError(f"{name} must be >= 0, got {getattr(settings, name)}")
        for name in ("measured_timeout", "auto_calibrate_retry"):
            if not getattr(settings, name) > 0:
                raise ConfigurationError(f"{name} must be > 0, got {getattr(settings, name)}")
        self.ctl = teleop
        self.settings = settings
        self.operator = ChestRelativeArms(teleop.settings.stale_timeout)
        self.measured = JointStateBuffer(teleop.robot.neutral())
        self.stillness = StillnessDetector(
            [f"{side}_{part}" for side in SIDES for part in ("wrist", "elbow")], settings.still_window,
            settings.still_position, settings.still_rotation, max_gap=teleop.settings.stale_timeout,
        )
        self.started = settings.start_from == "home"
        self.start_error = ""  # why a measured start is blocked ("" when it is not)
        self.first_seen: float | None = None  # [s] when both wrists had an operator pose
        self.auto_calibrated = False
        self._next_auto = -math.inf  # [s] earliest next auto-calibration attempt
        self._pedal: float | None = None  # [s] last true on the clutch topic while it holds the clutch
        self._arm_idx = np.r_[GROUPS.left_arm, GROUPS.right_arm]
        self._notices: list[Notice] = []
        self._last_said: dict[str, float] = {}  # kind of a rate-limited notice -> when it was last reported [s]

    # ------------------------------------------------------------------ state
    @property
    def engaged(self) -> bool:
        return self.ctl.clutch.engaged

    @property
    def needs_joint_states(self) -> bool:
        """True while the start waits for measured joint states."""
        return not self.started

    @property
    def pedal_holds(self) -> bool:
        """True while an engagement made on the clutch topic is held by it (deadman)."""
        return self._pedal is not None

    def take_notices(self) -> list[Notice]:
        """What happened since the last call, oldest first (and forget it)."""
        out, self._notices = self._notices, []
        return out

    def _say(self, level: str, text: str, *, kind: str | None = None, now: float | None = None) -> None:
        """Queue a notice; with ``kind`` and ``now`` [s], at most one per :data:`NOTICE_REPEAT` of that kind."""
        if kind is not None and now is not None:
            if now - self._last_said.get(kind, -math.inf) < NOTICE_REPEAT:
                return
            self._last_said[kind] = now
        self._notices.append(Notice(level, text))

    # ------------------------------------------------------------------ input
    def add_frame(self, stamp: float, matrices: np.ndarray) -> None:
        """One tracker frame captured at ``stamp`` [s]: (5, 4, 4) world poses in ROLES order (a role
        without a sample: non-finite). Each side whose wrist the frame updated gets its operator pose."""
        watch = self.settings.auto_calibrate and not self.auto_calibrated
        for side, rel in self.operator.update(stamp, matrices):
            elbow = None if rel.elbow is None else rel.elbow[:3, 3]
            if self.ctl.set_operator(side, rel.wrist, elbow, rel.stamp) and watch:
                self.stillness.add(f"{side}_wrist", rel.stamp, rel.wrist)
                if rel.elbow is not None:
                    self.stillness.add(f"{side}_elbow", rel.stamp, rel.elbow)

    def add_joint_states(self, names: Any, positions: Any, stamp: float) -> None:
        """Measured joint positions [rad] by name, measured at ``stamp`` [s] (used until the start)."""
        if not self.started:
            self.measured.update(names, positions, stamp)

    # ------------------------------------------------------------------ clutch and calibration
    def _set_clutch(self, engage: bool, now: float | None = None) -> tuple[bool, str]:
        was = self.ctl.clutch.engaged
        ok, message = self.ctl.engage() if engage else self.ctl.disengage()
        if self.ctl.clutch.engaged != was:
            self._say("info", message)
        elif not ok:
            self._say("warning", f"clutch: {message}", kind="clutch refused", now=now)
        return ok, message

    def set_clutch(self, engage: bool) -> tuple[bool, str]:
        """Engage (True) or disengage (False) on request (the service); ends a pedal's hold.
        Returns (success, message); engaging is refused while uncalibrated."""
        self._pedal = None
        return self._set_clutch(engage)

    def clutch_topic(self, engage: bool, now: float) -> None:
        """A clutch pedal message at ``now`` [s]: true engages (and, as a deadman, keeps the engagement
        alive), false disengages."""
        if engage:
            if not self.ctl.clutch.engaged:
                self._set_clutch(True, now)
            if self.ctl.clutch.engaged:
                self._pedal = now
        else:
            self._pedal = None
            self._set_clutch(False, now)

    def calibrate(self, now: float, save_to: str | Path | None = None) -> str:
        """Capture the calibration from the operator's poses at ``now`` [s], save it to ``save_to`` (if
        given) and use it (the clutch disengages); returns what was done.

        Raises:
            RynnTeleopError: no fresh poses, not the calibration posture, or the file cannot be written
                (then the previous calibration stays in use).
        """
        cal = self.ctl.capture_calibration(now)
        where = f"; saved to {cal.save(save_to)}" if save_to is not None else " (not saved)"
        self.ctl.set_calibration(cal)
        self._pedal = None
        return f"calibrated: arm-length scale {cal.scale:.3f}, fit residual {cal.fit_residual * 100:.1f} cm{where}"

    # ------------------------------------------------------------------ cycle
    def step(self, now: float) -> ArmCommand | None:
        """One control cycle at ``now`` [s]: the rules, then the controller's step. None while the start
        waits (no command may be sent)."""
        if not self.started and not self._try_start(now):
            return None
        if self.first_seen is None and all(self.ctl.operator(s) is not None for s in SIDES):
            self.first_seen = now
        self._auto_calibrate(now)
        timeout = self.settings.clutch_topic_timeout
        if timeout > 0 and self._pedal is not None and now - self._pedal > timeout:
            self._pedal = None
            self._say("warning", f"clutch pedal silent for {timeout} s: disengaging")
            self._set_clutch(False)
        if self.settings.auto_engage and not self.ctl.clutch.engaged and not self.ctl.calibration.is_default:
            if self.ctl.clutch.engagements == 0:  # once: a later disengage is the operator's choice
                self._set_clutch(True)
        return self.ctl.step(now)

    def _try_start(self, now: float) -> bool:
        """Start from the measured arm positions if every one is fresh and within tolerance of its limits."""
        if not self.measured.fresh(now, self.settings.measured_timeout)[self._arm_idx].all():
            return False
        measured = self.measured.position[self._arm_idx]
        lim = self.ctl.follower.limits
        names = self.ctl.joint_names
        excess = np.maximum(lim.lower - measured, measured - lim.upper)  # > 0: outside [rad]
        if np.any(excess > self.settings.start_tolerance):
            j = int(np.argmax(excess))
            message = (
                f"measured {names[j]} = {measured[j]:.4f} rad is {excess[j]:.4f} rad outside its limits "
                f"[{lim.lower[j]:.4f}, {lim.upper[j]:.4f}]; not commanding until it is back in range"
            )
            if message != self.start_error:
                self._say("error", message)
            self.start_error = message
            return False
        if np.any(excess > 0):
            clipped = [f"{names[j]} by {excess[j]:.4f} rad" for j in np.nonzero(excess > 0)[0]]
            self._say("warning", f"measured positions clipped into the limits: {', '.join(clipped)}")
        self.start_error = ""
        self.ctl.reset(measured)
        self.started = True
        self._say("info", "starting from the measured arm positions")
        return True

    def _auto_calibrate(self, now: float) -> None:
        s = self.settings
        if not s.auto_calibrate or self.auto_calibrated or self.first_seen is None:
            return
        if now - self.first_seen < s.auto_calibrate_delay or now < self._next_auto:
            return
        if not self.stillness.still(now):
            self._next_auto = now + STILL_CHECK_PERIOD
            self._say("info", "auto calibration: waiting for the operator to hold the calibration posture still",
                      kind="auto calibration waits", now=now)
            return
        try:
            message = self.calibrate(now)
        except RynnTeleopError as exc:  # e.g. poses not fresh yet on a loaded machine: retry
            self._next_auto = now + s.auto_calibrate_retry
            self._say("warning", f"auto calibration failed (retrying): {exc}", kind="auto calibration", now=now)
            return
        self.auto_calibrated = True
        self.stillness.clear()
        self._say("info", message)

    # ------------------------------------------------------------------ diagnostics
    def arm_status(self) -> ArmIKStatus:
        """The session's typed status (what the console, ``rynn-teleop call status`` and the demo read)."""
        ctl = self.ctl
        return ArmIKStatus(calibrated=not ctl.calibration.is_default, engaged=ctl.clutch.engaged,
                           started=self.started, following={side: st.active for side, st in ctl.sides.items()})

    def diagnostic_values(self) -> dict[str, Any]:
        """:meth:`arm_status` encoded, then counters and flags for people (``cycles`` / ``stale_cycles``:
        control cycles run, and those in which an engaged side was stale)."""
        ctl = self.ctl
        values: dict[str, Any] = {
            "ruckig_errors": ctl.follower.errors,
            "cycles": ctl.cycles,
            "stale_cycles": ctl.stale_cycles,
            "tracker_frames": self.operator.frames,
            "tracker_frames_malformed": self.operator.malformed,
            "tracker_poses_rejected": self.operator.trackers.rejected,
        }
        for side, st in ctl.sides.items():
            values[f"{side}.stale"] = st.stale
            values[f"{side}.unreachable"] = st.unreachable
            values[f"{side}.rejected"] = st.rejected
            values[f"{side}.outliers"] = st.outliers
            values[f"{side}.elbow_rejected"] = st.elbow_rejected
            values[f"{side}.unreachable_count"] = st.unreachable_count
            values[f"{side}.ik_reseeds"] = st.ik_reseeds
            values[f"{side}.stale_events"] = st.stale_events
        return self.arm_status().values(values)

    def status(self, joint_states_topic: str = "joint states") -> SessionStatus:
        """The session's health: an error while the start is blocked or Ruckig failed, a warning while
        waiting for ``joint_states_topic``, a side is unreachable (or stale while engaged), or uncalibrated."""
        ctl = self.ctl
        if self.start_error:
            return SessionStatus("error", self.start_error)
        if not self.started:
            return SessionStatus("warning", f"waiting for {joint_states_topic}")
        if ctl.follower.errors:
            return SessionStatus("error", "Ruckig errors")
        flags = [f"{s} unreachable" for s, st in ctl.sides.items() if st.unreachable]
        if ctl.clutch.engaged:
            flags += [f"{s} stale" for s, st in ctl.sides.items() if st.stale]
        if flags:
            return SessionStatus("warning", ", ".join(flags))
        if ctl.calibration.is_default:
            return SessionStatus("warning", "not calibrated")
        return SessionStatus("ok", "engaged" if ctl.clutch.engaged else "disengaged (holding)")
