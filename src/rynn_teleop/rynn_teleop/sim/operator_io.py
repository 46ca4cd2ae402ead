"""The scripted operator's plan as a person's inputs: tracker poses and the time base (ROS-free, MuJoCo-free).

:mod:`.operator_plan` says what the robot's wrists (``{side}_palm_link`` in ``base_link``) and hands (closure in
[0, 1]) should do. The synthetic tracker and glove sources (``sources.trackers.synthetic``,
``sources.hands.synthetic``) turn that into what a person's trackers and glove would report, so that the stack's
own path (calibration, IK, Ruckig, retargeting, the drivers' safety layer) stays in the loop:

* **wrists**: arm_ik calibrates on the operator's held posture (:func:`~rynn_teleop.core.calibration.calibrate`
  of the wrist and upper-arm tracker poses in the chest tracker's frame against the robot's hands and upper arms
  at ``home_position``) and then maps a wrist tracker pose ``W`` (chest frame) to the hand target
  ``p = s R p_W + t + dp_side``, ``R_hand = R R_W R_off_side`` in ``torso_link``
  (:meth:`~rynn_teleop.core.calibration.Calibration.map_wrist`). Given the held posture, that calibration is
  deterministic: :class:`TrackerMapping` computes it the same way and inverts it
  (:meth:`TrackerMapping.chest_wrist`). The clutch captures no offset when it engages with the operator in the
  held posture and the arms at home (the calibration maps one onto the other exactly), so arm_ik's targets are
  the plan's wrists (up to the trackers' noise in the captured calibration);
* **time**: both sources follow the twin's ``/twin/scene`` (:func:`parse_twin_scene`: scene, seed and the time
  the twin set that layout) and start the same plan (:func:`plan_for`) at the same instant, ``stamp +
  task_delay`` (:class:`OperatorTask`), so the glove closes when the wrist has arrived.

Frames: plan wrists in ``base_link``; arm_ik's targets and the calibration in ``torso_link`` (its IK's base).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..core.arm_teleop import ArmTeleop
from ..core.calibration import Calibration, calibrate
from ..core.layout import N_ARM, SIDES
from ..core.params import Param
from ..core.robot_model import GROUPS, RobotModel
from ..core.transforms import invert, make_transform
from ..errors import ConfigurationError
from .operator_plan import OperatorPlan, PlanSample, PlanTiming, plan_task
from .scene import load_scene

#: what a synthetic source does: ``none`` its own script, ``twin`` the twin scene's task (the tracker's and the
#: glove's ``synthetic.task`` choices)
TASKS = ("none", "twin")


def twin_task_params(task_help: str, other: str) -> tuple[Param, Param, Param]:
    """The settings every synthetic source that plays the twin's task declares, once: ``task`` (described by
    ``task_help``), ``task_delay_s`` (which must equal the ``other`` source's) and ``twin_scene_topic``."""
    return (
        Param("task", str, "none", task_help, choices=TASKS),
        Param("task_delay_s", float, 5.0, "(task twin) the plan starts this long after the twin set its layout "
              f"(the stamp of its /twin/scene); the {other}'s task_delay_s must be the same", "s",
              min=0.0, max=600.0),
        Param("twin_scene_topic", str, "/twin/scene", "(task twin) the twin's scene, seed and layout time"),
    )


_LOG = logging.getLogger(__name__)

EPISODE_GAP = 0.5
"""[s] a plan that would start while the previous one is still being played starts this long after it ends."""

IK_BASE_FRAME = "torso_link"
"""The frame of arm_ik's targets and of the calibration's robot side (``ArmIK``'s default base frame)."""


class TwinScene(NamedTuple):
    """What the twin's ``/twin/scene`` says about the episode (the rest of its JSON is not needed here)."""

    scene: str  # the twin's ``scene`` parameter: a name in config/sim or a path
    seed: int  # the layout's seed
    stamp: float | None  # [s] the twin's clock when it set this layout (start or ~/reset); None if not given
    resets: int | None = None  # [-] the twin's resets before this layout (0: its start-up layout); None: not given


def parse_twin_scene(text: str) -> TwinScene:
    """The :class:`TwinScene` of one ``/twin/scene`` message's JSON text.

    Raises:
        ValueError: not JSON, or no usable ``scene`` (text) or ``seed`` (integer >= 0); a ``stamp`` that is not a
            finite number; ``resets`` that is not an integer >= 0.
    """
    try:
        doc = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"/twin/scene is not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise ValueError(f"/twin/scene must be a JSON object, got {type(doc).__name__}")
    scene, seed, stamp, resets = doc.get("scene"), doc.get("seed"), doc.get("stamp"), doc.get("resets")
    if not isinstance(scene, str) or not scene:
        raise ValueError(f"/twin/scene: 'scene' must be a non-empty string, got {scene!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"/twin/scene: 'seed' must be an integer >= 0, got {seed!r}")
    if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, (int, float))
                              or not math.isfinite(stamp)):
        raise ValueError(f"/twin/scene: 'stamp' must be a number of seconds, got {stamp!r}")
    if resets is not None and (isinstance(resets, bool) or not isinstance(resets, int) or resets < 0):
        raise ValueError(f"/twin/scene: 'resets' must be an integer >= 0, got {resets!r}")
    return TwinScene(scene, seed, None if stamp is None else float(stamp), resets)


def home_wrists(robot: RobotModel, home: np.ndarray) -> dict[str, np.ndarray]:
    """side -> (4, 4) ``{side}_palm_link`` in ``base_link`` [m] with the arms at ``home`` (14,) [rad] (left arm
    joints 1-7, then right; the hands as :meth:`RobotModel.neutral`): where a plan starts and ends."""
    q = _arms_at(robot, home)
    poses = robot.forward_kinematics(q, [f"{side}_palm_link" for side in SIDES])
    return dict(zip(SIDES, poses))


def _arms_at(robot: RobotModel, home: np.ndarray) -> np.ndarray:
    home = np.asarray(home, dtype=float)
    if home.shape != (2 * N_ARM,) or not np.all(np.isfinite(home)):
        raise ConfigurationError(f"home must be 14 finite arm joint positions [rad], got shape {home.shape}")
    q = robot.neutral()
    q[GROUPS.left_arm] = home[:N_ARM]
    q[GROUPS.right_arm] = home[N_ARM:]
    return q


@lru_cache(maxsize=8)
def _cached_scene(name: str):
    return load_scene(name)


def plan_for(scene: str, seed: int, start: Mapping[str, np.ndarray], timing: PlanTiming | None = None) -> OperatorPlan:
    """The plan of ``scene``'s task (a name in ``config/sim`` or a path) for the layout of ``seed``, from the
    objects' initial poses (what the twin starts with), beginning and ending at the wrists ``start`` (side ->
    (4, 4) in ``base_link``, :func:`home_wrists`).

    Raises:
        ConfigurationError: the scene cannot be read (a :class:`~.scene.SceneError`), or has no free layout.
    """
    spec = _cached_scene(str(scene))
    layout = spec.layout(int(seed))
    positions = {name: pose.position for name, pose in layout.objects.items()}
    quaternions = {name: pose.quaternion for name, pose in layout.objects.items()}
    return plan_task(spec, positions, quaternions, layout.targets, start, timing)


class OperatorTask:
    """A plan placed on the sources' clock: plan time 0 is at ``start`` [s] (node clock).

    Attributes:
        twin: the ``/twin/scene`` it was planned from.
        plan: the plan.
        start: [s] when its time 0 is.
    """

    def __init__(self, twin: TwinScene, plan: OperatorPlan, start: float) -> None:
        self.twin = twin
        self.plan = plan
        self.start = float(start)

    @property
    def end(self) -> float:
        """[s] when the plan is over (the wrists are back at their start poses, the hands open)."""
        return self.start + self.plan.duration

    def sample(self, now: float) -> PlanSample | None:
        """The plan at ``now`` [s] (node clock); None before it starts (the operator holds still)."""
        if now < self.start:
            return None
        return self.plan.sample(now - self.start)


def task_from_message(text: str, received: float, delay: float, start_wrists: Mapping[str, np.ndarray]
                      ) -> OperatorTask:
    """The :class:`OperatorTask` of one ``/twin/scene`` message: its plan (:func:`plan_for`) starting ``delay``
    [s] after the message's ``stamp`` (or after ``received`` [s], the time it arrived, when it has none).

    Raises:
        ValueError: an unusable message (:func:`parse_twin_scene`).
        ConfigurationError: its scene cannot be read or laid out.
    """
    twin = parse_twin_scene(text)
    anchor = twin.stamp if twin.stamp is not None else float(received)
    return OperatorTask(twin, plan_for(twin.scene, twin.seed, start_wrists), anchor + float(delay))


class TwinEpisodes:
    """The episodes one synthetic source plays: one per ``/twin/scene`` message (see the module doc).

    A message handed to :meth:`feed` is planned at the next :meth:`update` (the source's next read, whose time stands
    for when it arrived). The twin's start-up layout (``resets`` 0) is not played: the sources start at different times
    and the tracker first holds the calibration posture, so they could not agree on playing it; each reset of the twin
    (``~/reset``, its ``seed`` parameter, the console's "Next layout") is an episode that both sources receive while
    running and start at the same instant. An episode being played is never cut short (the operator would jump back to
    the start posture, and arm_ik re-anchor its clutch there): the next one starts :data:`EPISODE_GAP` after it ends, if
    that is later than its stamp + delay. A message that gives no plan (unusable, a scene this machine cannot read, or a
    plan whose start has passed already: the other source may be playing it, and joining it half-way would make the arm
    jump) is logged and counted in :attr:`errors`; the operator then holds still until the next one.

    Attributes:
        task: the episode being played (None before the first, or after a message that gave none).
        queued: the next episode, planned while :attr:`task` is played (it follows at once when that ends).
        episodes: [-] messages planned.
        errors: [-] messages that gave no plan.
        startup_layouts: [-] start-up layouts (``resets`` 0) not played.
    """

    def __init__(self, delay: float, start_wrists: Mapping[str, np.ndarray], who: str) -> None:
        """
        Args:
            delay: [s] a plan starts this long after its message's stamp (>= 0).
            start_wrists: side -> (4, 4) where the plans start and end (``base_link``, :func:`home_wrists`).
            who: the source, for messages ("synthetic operator").

        Raises:
            ConfigurationError: a negative or non-finite delay.
        """
        if not (math.isfinite(delay) and delay >= 0):
            raise ConfigurationError(f"{who}: task_delay_s must be >= 0, got {delay}")
        self.delay = float(delay)
        self.start_wrists = {side: np.asarray(start_wrists[side], dtype=float) for side in SIDES}
        self.who = who
        self.task: OperatorTask | None = None
        self.queued: OperatorTask | None = None  # the next episode, while :attr:`task` is being played
        self.episodes = 0
        self.errors = 0
        self.startup_layouts = 0
        self._pending: str | None = None

    def feed(self, text: str) -> None:
        """The JSON text of one ``/twin/scene`` message (the newest one counts)."""
        self._pending = str(text)

    def update(self, now: float) -> None:
        """Plan the message fed since the last call, if any, as arrived at ``now`` [s] (node clock)."""
        if self._pending is not None:
            text, self._pending = self._pending, None
            self.follow(text, now)

    def follow(self, text: str, now: float) -> OperatorTask | None:
        """Plan the episode of one ``/twin/scene`` JSON text arrived at ``now`` [s]: played from its start, or
        once the one being played is over; None when it gives no plan (see the class doc)."""
        playing = self.task if self.task is not None and now < self.task.end else None
        try:
            if parse_twin_scene(text).resets == 0:
                self.startup_layouts += 1
                _LOG.info("%s: the twin's start-up layout: holding still until the twin is reset (console 'Next "
                          "layout', rynn-teleop call twin reset)", self.who)
                return None
            task = task_from_message(text, now, self.delay, self.start_wrists)
        except (ValueError, ConfigurationError) as exc:
            self.errors += 1
            _LOG.error("%s: no plan for the twin's scene: %s", self.who, exc)
            return None
        if playing is not None:
            if task.start < playing.end + EPISODE_GAP:
                task = OperatorTask(task.twin, task.plan, playing.end + EPISODE_GAP)
            self.queued = task
        elif task.start < now:
            self.errors += 1
            self.task = None
            _LOG.warning("%s: the episode of %s seed %d started %.1f s ago (task_delay_s %.1f s): holding still "
                         "until the next one", self.who, task.twin.scene, task.twin.seed, now - task.start,
                         self.delay)
            return None
        else:
            self.task, self.queued = task, None
        self.episodes += 1
        _LOG.info("%s: %s seed %d: %s, from %.2f s to %.2f s", self.who, task.twin.scene, task.twin.seed,
                  task.plan.task, task.start, task.end)
        return task

    def active(self, now: float) -> OperatorTask | None:
        """The episode at ``now`` [s] (times not decreasing from call to call): a queued one once the one before
        it has ended; None when there is none (it may not have started yet: :attr:`OperatorTask.start`)."""
        if self.queued is not None and (self.task is None or now >= self.task.end):
            self.task, self.queued = self.queued, None
        return self.task

    def sample(self, now: float) -> PlanSample | None:
        """The plan of the episode at ``now`` [s] (see :meth:`active`); None when there is none or it has not
        started."""
        task = self.active(now)
        return None if task is None else task.sample(now)


class TrackerMapping:
    """The calibration arm_ik computes from the operator's held posture, and its inverse (see the module doc).

    Attributes:
        calibration: what ``ArmTeleop.capture_calibration`` gives for the noise-free held posture.
        T_base_ik: (4, 4) arm_ik's base frame (:data:`IK_BASE_FRAME`) in ``base_link`` [m].
        start_wrists: side -> (4, 4) the robot's wrists at home in ``base_link`` (where a plan starts).
    """

    def __init__(self, robot: RobotModel, home: np.ndarray, operator_wrists: Mapping[str, np.ndarray],
                 operator_elbows: Mapping[str, np.ndarray]) -> None:
        """
        Args:
            robot: the robot's description (the arm_ik node's).
            home: (14,) [rad] the arm_ik node's ``home_position`` (the robot side of the calibration).
            operator_wrists: side -> (4, 4) the wrist trackers in the chest tracker's frame in the held posture.
            operator_elbows: side -> (3,) [m] the upper-arm trackers in the chest tracker's frame, same instant.

        Raises:
            ConfigurationError: a bad ``home``, or a posture the calibration rejects (as arm_ik would).
        """
        home = np.asarray(home, dtype=float)
        q = _arms_at(robot, home)
        arms = np.r_[GROUPS.left_arm, GROUPS.right_arm]
        teleop = ArmTeleop(robot, home, robot.limits[arms])  # the same robot points arm_ik calibrates against
        self._ik = teleop.ik
        hands, elbows = teleop.robot_home_points()
        self.calibration: Calibration = calibrate(operator_wrists, operator_elbows, hands, elbows)
        self.T_base_ik = robot.frame_pose(q, IK_BASE_FRAME)
        self._T_ik_base = invert(self.T_base_ik)
        self.start_wrists = {side: self.T_base_ik @ hands[side] for side in SIDES}

    def arm_wrists(self, q: np.ndarray) -> dict[str, np.ndarray]:
        """side -> (4, 4) ``{side}_palm_link`` in ``base_link`` at the arm joints ``q`` (14,) [rad] (left 1-7,
        then right: an arm command)."""
        q = np.asarray(q, dtype=float)
        return {side: self.T_base_ik @ self._ik[side].forward(q[k * N_ARM:(k + 1) * N_ARM])
                for k, side in enumerate(SIDES)}

    def robot_wrist(self, side: str, T_chest_wrist: np.ndarray) -> np.ndarray:
        """(4, 4) the hand target in ``base_link`` that arm_ik maps a wrist tracker pose (chest frame) to."""
        return self.T_base_ik @ self.calibration.map_wrist(side, np.asarray(T_chest_wrist, dtype=float))

    def chest_wrist(self, side: str, T_base_wrist: np.ndarray) -> np.ndarray:
        """(4, 4) the wrist tracker pose in the chest tracker's frame that arm_ik maps to the hand target
        ``T_base_wrist`` (``{side}_palm_link`` in ``base_link``): the inverse of :meth:`robot_wrist`."""
        cal = self.calibration
        target = self._T_ik_base @ np.asarray(T_base_wrist, dtype=float)
        p = cal.rotation.T @ (target[:3, 3] - cal.translation - cal.wrist_position[side]) / cal.scale
        R = cal.rotation.T @ target[:3, :3] @ cal.wrist_rotation[side].T
        return make_transform(p, R)
