"""A scripted operator that does a scene's task: wrist targets and finger closure over time (ROS-free).

From the objects' poses and the target region (:mod:`.scene`, :mod:`.physics`) a planner builds a list of
:class:`Waypoint` s, one per phase (:data:`PHASES`: approach, pre-grasp, grasp, lift, carry, place, release,
retreat); :meth:`OperatorPlan.sample` interpolates them (minimum-jerk timing, straight lines and slerp). The
output is what a person's inputs give: per hand a wrist pose (``{side}_palm_link`` in ``base_link``, 4x4) and
a closure in [0, 1] (0 open, 1 the grasp); :func:`hand_posture` turns a closure into the 20 finger joint
targets the grasp was validated with, for driving the twin directly (:mod:`.rollout`).

The grasp (found by a search over offsets and postures in the twin, validated over seeds with
``rynn-teleop sim run``): the palm faces down (:data:`PALM_DOWN`), fingers forward; the object's centre sits
at :func:`grasp_offset` in the palm frame (its top just inside the palm face, its far face where the
fingertips hook; validated for 6-7 cm sections): the four fingers' distal phalanges hook its far face
(MCP 0.3, PIP 1.5, DIP 1.2 rad), the thumb's last two phalanges press its near face and the palm its top.
While the hand is open the thumb lies bent back in the palm's plane, clear of the object.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from scipy.spatial.transform import Rotation, Slerp

from ..core.layout import SIDES
from ..errors import ConfigurationError
from .scene import ObjectSpec, Scene, TargetRegion

PHASES: tuple[str, ...] = ("start", "approach", "pre_grasp", "grasp", "lift", "carry", "place", "release",
                           "retreat", "home")
"""The phases of a plan, in order (``start`` and ``home`` hold the wrists where they began)."""

PALM_DOWN = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
"""Rotation of a grasping palm in ``base_link`` at yaw 0: palm x (out of the palm) down, palm z (fingers)
forward, palm y left (the right thumb points left, the left thumb right: both towards the middle)."""

PALM_FACE = 0.010
"""[m] the palm's face along palm x (out of the palm), from the description's palm box."""

GRASP_PRESS = 0.005
"""[m] at the grasp the object's top is this far inside the palm face: the palm presses it onto its support
until the fingers lift it against the palm."""

GRASP_FAR_FACE = 0.125
"""[m] the object's far face along the fingers (palm z) at the grasp: where the hooked fingertips close."""

GRASP_THUMB_SHIFT = 0.01
"""[m] the object's centre towards the thumb side of the palm's centre line."""

OPEN_POSTURE = np.array([0.15, -0.13, -0.3, -0.3] + [0.0, 0.0, 0.0, 0.0] * 4)
"""(20,) [rad] the open hand: fingers straight, the thumb bent back in the palm's plane (nothing below the
palm face, so it never lands on the object's top)."""

GRASP_POSTURE = np.array([0.6, 0.5, 0.8, 0.6] + [0.3, 0.0, 1.5, 1.2] * 4)
"""(20,) [rad] the closed grasp (closure 1): fingers hooked, the thumb swung towards the fingers."""


BIMANUAL_LENGTH = 0.2
"""[m] objects at least this long (a box's x or y size) are carried with both hands."""

GRASP_END_MARGIN = 0.08
"""[m] the two hands of a bimanual grasp hold a box this far in from its ends, so that all four fingers hook it
(the little finger sits 6.4 cm outwards of the palm's centre). The open thumbs stick out 12 cm towards the
middle: the box must be long enough (about 0.5 m) for them to stay apart."""


class PlanTiming(NamedTuple):
    """Durations [s] and distances [m] of a plan (units beside each field)."""

    start: float = 0.3  # [s] hold the initial wrist poses
    approach: float = 2.0  # [s] to above the grasp
    pre_grasp: float = 1.0  # [s] down to just above the grasp
    grasp: float = 0.5  # [s] down to the grasp
    close: float = 0.8  # [s] closing the hand (part of the grasp phase)
    lift: float = 1.2  # [s]
    carry: float = 2.0  # [s]
    place: float = 1.2  # [s]
    release: float = 0.6  # [s] opening the hand
    retreat: float = 0.8  # [s] up, away from the object
    home: float = 2.0  # [s] back to the initial wrist poses
    approach_height: float = 0.12  # [m] the approach waypoint above the grasp
    pre_grasp_height: float = 0.02  # [m] the pre-grasp above the grasp
    lift_height: float = 0.12  # [m] the object's bottom above its support while carried
    place_height: float = 0.004  # [m] the object's bottom above the target surface when released
    retreat_height: float = 0.10  # [m]


class Waypoint(NamedTuple):
    """The operator's inputs at the end of one phase."""

    time: float  # [s] from the plan's start
    phase: str  # one of PHASES
    wrists: dict[str, np.ndarray]  # side -> (4, 4) wrist (palm_link) pose in base_link [m]
    closure: dict[str, float]  # side -> [0, 1]


class PlanSample(NamedTuple):
    """The operator's inputs at one instant."""

    phase: str  # the phase in progress
    wrists: dict[str, np.ndarray]  # side -> (4, 4) [m]
    closure: dict[str, float]  # side -> [0, 1]


def _min_jerk(s: float) -> float:
    """Minimum-jerk time scaling of s in [0, 1]."""
    s = min(max(s, 0.0), 1.0)
    return min(s * s * s * (10.0 - 15.0 * s + 6.0 * s * s), 1.0)  # rounding can give 1 + 2e-16 (Slerp refuses it)


class OperatorPlan:
    """Waypoints with interpolation (see the module doc)."""

    def __init__(self, task: str, waypoints: Sequence[Waypoint], hands: Sequence[str]) -> None:
        """
        Args:
            task: what the plan does (for messages).
            waypoints: in time order, the first at time 0; every waypoint has both sides.
            hands: the sides that grasp.
        """
        times = [w.time for w in waypoints]
        if not waypoints or times[0] != 0.0 or any(b < a for a, b in zip(times, times[1:])):
            raise ConfigurationError(f"plan {task!r}: waypoint times must start at 0 and not decrease, got {times}")
        self.task = task
        self.waypoints = tuple(waypoints)
        self.hands = tuple(hands)
        self._slerps = {}
        for side in SIDES:
            for k in range(len(waypoints) - 1):
                a, b = waypoints[k].wrists[side], waypoints[k + 1].wrists[side]
                self._slerps[side, k] = Slerp([0.0, 1.0], Rotation.from_matrix(np.stack([a[:3, :3], b[:3, :3]])))

    @property
    def duration(self) -> float:
        """[s] time of the last waypoint."""
        return self.waypoints[-1].time

    def phase_time(self, phase: str) -> float:
        """[s] the end of the first waypoint of ``phase``."""
        for w in self.waypoints:
            if w.phase == phase:
                return w.time
        raise ConfigurationError(f"plan {self.task!r} has no phase {phase!r}")

    def sample(self, t: float) -> PlanSample:
        """The wrist poses and closures at time ``t`` [s] (held before 0 and after :attr:`duration`)."""
        wps = self.waypoints
        if t <= 0.0:
            return PlanSample(wps[0].phase, {s: wps[0].wrists[s].copy() for s in SIDES}, dict(wps[0].closure))
        k = next((i for i in range(1, len(wps)) if wps[i].time >= t), None)
        if k is None:
            last = wps[-1]
            return PlanSample(last.phase, {s: last.wrists[s].copy() for s in SIDES}, dict(last.closure))
        a, b = wps[k - 1], wps[k]
        s = _min_jerk((t - a.time) / (b.time - a.time)) if b.time > a.time else 1.0
        wrists = {}
        for side in SIDES:
            T = np.eye(4)
            T[:3, :3] = self._slerps[side, k - 1](s).as_matrix()
            T[:3, 3] = (1.0 - s) * a.wrists[side][:3, 3] + s * b.wrists[side][:3, 3]
            wrists[side] = T
        closure = {side: (1.0 - s) * a.closure[side] + s * b.closure[side] for side in SIDES}
        return PlanSample(b.phase, wrists, closure)


def hand_posture(closure: float, side: str = "right") -> np.ndarray:
    """(20,) finger joint targets [rad] of a closure in [0, 1]: :data:`OPEN_POSTURE` to :data:`GRASP_POSTURE`
    linearly (both hands use the same joint values: the left hand is the right's mirror image)."""
    if side not in SIDES:
        raise ConfigurationError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    c = min(max(float(closure), 0.0), 1.0)
    return OPEN_POSTURE + c * (GRASP_POSTURE - OPEN_POSTURE)


def grasp_offset(obj: ObjectSpec, side: str = "right") -> np.ndarray:
    """(3,) [m] where the centre of ``obj`` sits in the ``side`` palm frame at the grasp: its top
    :data:`GRASP_PRESS` inside the palm face, its far face (the palm-down hand is turned with the object, so
    its depth is its x size) at :data:`GRASP_FAR_FACE`, :data:`GRASP_THUMB_SHIFT` towards the thumb (the left
    palm frame is the right's mirror image: y flips). A 6 cm cube: (0.035, 0.01, 0.095); 7 cm: (0.04, 0.01, 0.09)."""
    depth = obj.size[0] if obj.shape == "box" else 2 * obj.size[0]
    thumb = -GRASP_THUMB_SHIFT if side == "left" else GRASP_THUMB_SHIFT
    return np.array([obj.height / 2 + PALM_FACE - GRASP_PRESS, thumb, GRASP_FAR_FACE - depth / 2])


def grasp_wrist(point: np.ndarray, yaw: float, offset: np.ndarray) -> np.ndarray:
    """(4, 4) wrist pose in ``base_link`` that puts the palm-frame point ``offset`` (3,) [m]
    (:func:`grasp_offset`) at ``point`` (3,) [m], with the palm down and turned by ``yaw`` [rad] about z."""
    c, s = math.cos(yaw), math.sin(yaw)
    R = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ PALM_DOWN
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = np.asarray(point, dtype=float) - R @ offset
    return T


def grasp_yaw(obj: ObjectSpec, quaternion: np.ndarray) -> float:
    """[rad] the palm's yaw for grasping ``obj`` at orientation ``quaternion`` (x, y, z, w): the object's yaw
    folded by its symmetry (a quarter turn for a square box, half a turn for any other box) to the one closest
    to 0; 0 for round objects."""
    if obj.shape != "box":
        return 0.0
    x, y, z, w = quaternion
    yaw = math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    period = math.pi / 2 if math.isclose(obj.size[0], obj.size[1]) else math.pi
    return (yaw + period / 2) % period - period / 2


def _shift(T: np.ndarray, dz: float = 0.0, dxy: np.ndarray | None = None) -> np.ndarray:
    out = T.copy()
    out[2, 3] += dz
    if dxy is not None:
        out[:2, 3] += dxy
    return out


class _Builder:
    """Accumulates waypoints; sides not given keep their last pose and closure."""

    def __init__(self, start: Mapping[str, np.ndarray]) -> None:
        self.t = 0.0
        self.wrists = {s: np.asarray(start[s], dtype=float).copy() for s in SIDES}
        self.closure = {s: 0.0 for s in SIDES}
        self.waypoints: list[Waypoint] = [Waypoint(0.0, "start", dict(self.wrists), dict(self.closure))]

    def add(self, phase: str, duration: float, wrists: Mapping[str, np.ndarray] | None = None,
            closure: Mapping[str, float] | None = None) -> None:
        self.t += duration
        self.wrists.update(wrists or {})
        self.closure.update(closure or {})
        self.waypoints.append(Waypoint(self.t, phase, dict(self.wrists), dict(self.closure)))


def _heights(obj: ObjectSpec, point: np.ndarray, target: TargetRegion, timing: PlanTiming) -> tuple[float, float]:
    """[m] (lift, place) rises of the object's centre from ``point``: lifted until its bottom is ``lift_height``
    above the higher of its support and the target's surface; placed with its bottom ``place_height`` above
    the target's surface."""
    bottom = float(point[2]) - obj.height / 2
    lift = max(bottom, float(target.center[2])) + timing.lift_height - bottom
    place = float(target.center[2]) + timing.place_height - bottom
    return lift, place


def _carry_phases(b: _Builder, hands: dict[str, np.ndarray], lift_dz: float, carry_xy: np.ndarray,
                  place_dz: float, start: Mapping[str, np.ndarray], timing: PlanTiming) -> None:
    """Lift, carry, place, release, retreat and home for the wrists ``hands`` (side -> grasp pose)."""
    both = {s: 1.0 for s in hands}
    lifted = {s: _shift(T, lift_dz) for s, T in hands.items()}
    carried = {s: _shift(T, 0.0, carry_xy) for s, T in lifted.items()}
    placed = {s: _shift(T, place_dz - lift_dz) for s, T in carried.items()}
    b.add("lift", timing.lift, lifted, both)
    b.add("carry", timing.carry, carried)
    b.add("place", timing.place, placed)
    b.add("release", timing.release, closure={s: 0.0 for s in hands})
    b.add("retreat", timing.retreat, {s: _shift(T, timing.retreat_height) for s, T in placed.items()})
    b.add("home", timing.home, {s: np.asarray(start[s], float) for s in hands})


def plan_pick_place(obj: ObjectSpec, pose_position: np.ndarray, pose_quaternion: np.ndarray,
                    target: TargetRegion, start: Mapping[str, np.ndarray], *, hand: str | None = None,
                    timing: PlanTiming | None = None) -> OperatorPlan:
    """One hand picks ``obj`` (at ``pose_position`` [m], ``pose_quaternion`` x, y, z, w) and places it with its
    centre over the centre of ``target``; the other hand holds its start pose.

    Args:
        start: side -> (4, 4) initial wrist poses (the plan begins and ends there).
        hand: the grasping side (default: the side of the object, by the sign of its y).
    """
    timing = timing or PlanTiming()
    side = hand or ("left" if pose_position[1] > 0 else "right")
    point = np.asarray(pose_position, dtype=float)
    grasp = grasp_wrist(point, grasp_yaw(obj, pose_quaternion), grasp_offset(obj, side))
    b = _Builder(start)
    b.add("start", timing.start)
    b.add("approach", timing.approach, {side: _shift(grasp, timing.approach_height)})
    b.add("pre_grasp", timing.pre_grasp, {side: _shift(grasp, timing.pre_grasp_height)})
    b.add("grasp", timing.grasp, {side: grasp})
    b.add("grasp", timing.close, closure={side: 1.0})
    lift_dz, place_dz = _heights(obj, point, target, timing)
    _carry_phases(b, {side: grasp}, lift_dz, target.center[:2] - point[:2], place_dz, start, timing)
    return OperatorPlan(f"pick_place {obj.name} -> {target.name} ({side} hand)", b.waypoints, (side,))


def plan_bimanual(obj: ObjectSpec, pose_position: np.ndarray, pose_quaternion: np.ndarray, target: TargetRegion,
                  start: Mapping[str, np.ndarray], *, timing: PlanTiming | None = None) -> OperatorPlan:
    """Both hands grasp ``obj`` (a box longer along its y) :data:`GRASP_END_MARGIN` in from its ends, lift it,
    carry it over ``target`` and set it down there."""
    timing = timing or PlanTiming()
    if obj.shape != "box":
        raise ConfigurationError(f"the bimanual plan needs a box, {obj.name!r} is a {obj.shape}")
    yaw = grasp_yaw(obj, pose_quaternion)
    c, s = math.cos(yaw), math.sin(yaw)
    along = np.array([-s, c, 0.0])  # the object's y axis (the palm-down hands' yaw follows the object)
    if obj.size[1] < obj.size[0]:
        raise ConfigurationError(f"the bimanual plan grasps a box along its y axis; {obj.name!r} is longer along x")
    point = np.asarray(pose_position, dtype=float)
    half = obj.size[1] / 2 - GRASP_END_MARGIN
    grasps = {"left": grasp_wrist(point + half * along, yaw, grasp_offset(obj, "left")),
              "right": grasp_wrist(point - half * along, yaw, grasp_offset(obj, "right"))}
    b = _Builder(start)
    b.add("start", timing.start)
    b.add("approach", timing.approach, {k: _shift(T, timing.approach_height) for k, T in grasps.items()})
    b.add("pre_grasp", timing.pre_grasp, {k: _shift(T, timing.pre_grasp_height) for k, T in grasps.items()})
    b.add("grasp", timing.grasp, grasps)
    b.add("grasp", timing.close, closure={k: 1.0 for k in SIDES})
    lift_dz, place_dz = _heights(obj, point, target, timing)
    _carry_phases(b, grasps, lift_dz, target.center[:2] - point[:2], place_dz, start, timing)
    return OperatorPlan(f"bimanual {obj.name} -> {target.name}", b.waypoints, SIDES)


def plan_task(scene: Scene, positions: Mapping[str, np.ndarray], quaternions: Mapping[str, np.ndarray],
              targets: Mapping[str, TargetRegion], start: Mapping[str, np.ndarray],
              timing: PlanTiming | None = None) -> OperatorPlan:
    """The plan of ``scene``'s task from the objects' current poses (name -> position [m], quaternion x, y, z, w)
    and the layout's target regions: one hand for an object shorter than :data:`BIMANUAL_LENGTH`, both hands
    for a longer box."""
    task = scene.task
    obj = scene.object(task.object)
    target = targets[task.target]
    args = (obj, positions[obj.name], quaternions[obj.name], target, start)
    if obj.shape == "box" and max(obj.size[:2]) >= BIMANUAL_LENGTH:
        return plan_bimanual(*args, timing=timing)
    return plan_pick_place(*args, timing=timing)


