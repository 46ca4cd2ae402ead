"""Success of a task, decided from the twin's physics state alone (ROS-free).

A task never asks the script or the person who drove it: :meth:`Task.evaluate` reads the world
(:class:`~.physics.PhysicsWorld`) and returns an :class:`Outcome` with the reason. One class per task kind
(:data:`~.scene.TASK_KINDS`); :func:`task_for` builds the scene's.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np

from ..core.transforms import rotation_from_quat
from ..errors import ConfigurationError
from .physics import PhysicsWorld
from .scene import ObjectSpec, Scene, TaskSpec


class Outcome(NamedTuple):
    """The result of a task."""

    success: bool
    reason: str  # why, in words ("red_cube rests in goal, released")

    @property
    def label(self) -> str:
        """``"success"`` or ``"failure"`` (the recorder's ``episode.yaml`` outcome)."""
        return "success" if self.success else "failure"


class Task(ABC):
    """A success predicate over the physics state."""

    name: str

    @abstractmethod
    def evaluate(self, world: PhysicsWorld) -> Outcome:
        """The task's outcome in the world's current state."""


def bottom_height(obj: ObjectSpec, position: np.ndarray, quaternion: np.ndarray) -> float:
    """[m] z of the lowest point of ``obj`` at ``position`` [m] and ``quaternion`` (x, y, z, w)."""
    R = rotation_from_quat(quaternion)
    z = float(position[2])
    if obj.shape == "sphere":
        return z - obj.size[0]
    if obj.shape == "cylinder":
        r, h = obj.size
        cz = abs(float(R[2, 2]))  # the axis' vertical share
        return z - (h / 2 * cz + r * math.sqrt(max(0.0, 1.0 - cz * cz)))
    half = np.asarray(obj.size) / 2
    return z - float(np.abs(R[2]) @ half)


class PlaceTask(Task):
    """An object rests in a target region, released.

    Success needs, in this order (the first that fails is the reason): the object's centre lies inside the
    region (x, y); its bottom is within ``height_tolerance`` of the region's surface and it touches that
    surface's body (the table, or the fixed object the region lies on); no hand touches it; its speed is
    below ``max_speed`` and its angular speed below ``max_angular_speed``.
    """

    def __init__(self, scene: Scene, spec: TaskSpec | None = None) -> None:
        self.spec = spec or scene.task
        self.scene = scene
        self.object = scene.object(self.spec.object)
        self.target = scene.target(self.spec.target)
        self.name = f"place {self.object.name} in {self.target.name}"

    def evaluate(self, world: PhysicsWorld) -> Outcome:
        spec, name = self.spec, self.object.name
        if world.layout is None:
            raise ConfigurationError("the world has no scene layout")
        region = world.layout.targets[self.target.name]
        with world.lock:
            state = world.object_state(name)
            contacts = world.object_contacts(name)
        if not region.contains(state.position):
            dist = float(np.linalg.norm(state.position[:2] - region.center[:2]))
            return Outcome(False, f"{name} is outside {region.name} ({dist:.3f} m from its centre)")
        gap = bottom_height(self.object, state.position, state.quaternion) - float(region.center[2])
        supported = contacts.table if self.target.support == "table" else self.target.support in contacts.others
        if abs(gap) > spec.height_tolerance or not supported:
            return Outcome(False, f"{name} is over {region.name} but not resting on it (bottom {gap:+.3f} m from "
                                  f"its surface, {'touching' if supported else 'not touching'} {self.target.support})")
        if contacts.hands:
            return Outcome(False, f"{name} rests in {region.name} but the {' and '.join(contacts.hands)} hand "
                                  "still touches it")
        speed, spin = float(np.linalg.norm(state.linear_velocity)), float(np.linalg.norm(state.angular_velocity))
        if speed > spec.max_speed or spin > spec.max_angular_speed:
            return Outcome(False, f"{name} is still moving in {region.name} ({speed:.3f} m/s, {spin:.2f} rad/s)")
        return Outcome(True, f"{name} rests in {region.name}, released")


def task_for(scene: Scene) -> Task:
    """The task of ``scene`` (its ``task.kind``)."""
    kinds = {"place": PlaceTask}
    try:
        return kinds[scene.task.kind](scene)
    except KeyError:
        raise ConfigurationError(f"scene {scene.name}: no task of kind {scene.task.kind!r}") from None
