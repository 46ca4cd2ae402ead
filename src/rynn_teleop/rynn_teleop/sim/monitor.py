"""What the twin tells the rest of the stack: the scene as plain data, the objects' poses, the live outcome
(ROS-free).

* :func:`scene_description`: everything a renderer or a client needs to draw and name the scene (the twin
  node's ``/twin/scene``): objects with shape, size [m] and colour in the scene file's order, target regions
  as placed by the layout, the task.
* :func:`object_poses`: every object's pose in that order (movable ones from the physics, fixed ones where the
  layout put them), the twin node's ``/twin/objects``.
* :class:`TaskMonitor`: the task's outcome as the episode goes (the twin node's ``/twin/outcome``): ``success``
  True while the task's predicate (:mod:`.tasks`) holds, False once the task cannot succeed any more (the
  object fell off the table: below the table top by :data:`FELL_BELOW_M`), None (undecided) otherwise, with the
  predicate's reason. Decided from the physics state alone, never from who drove the robot.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .physics import PhysicsWorld
from .scene import Pose
from .tasks import Task, bottom_height, task_for

FELL_BELOW_M = 0.05  # [m] an object whose lowest point is this far below the table top fell off the table


class LiveOutcome(NamedTuple):
    """The task's outcome at one instant."""

    success: bool | None  # True: achieved now; False: cannot be achieved any more; None: not (yet) decided
    reason: str  # why, in words
    task: str  # the task, in words ("place red_cube in goal")
    time: float  # [s] simulated time of the judgement

    @property
    def label(self) -> str:
        """``success``, ``failure`` or ``undecided``."""
        return {True: "success", False: "failure", None: "undecided"}[self.success]

    def to_dict(self) -> dict[str, Any]:
        """The ``/twin/outcome`` document: success (true, false or null), reason, task, t [s]."""
        return {"success": self.success, "reason": self.reason, "task": self.task, "t": round(self.time, 4)}


class TaskMonitor:
    """Judges the scene's task on a world (see the module doc); :meth:`reset` after the world's layout changed."""

    def __init__(self, world: PhysicsWorld, task: Task | None = None) -> None:
        if world.scene is None:
            raise ValueError("a task monitor needs a world with a scene")
        self.world = world
        self.task = task or task_for(world.scene)
        self._failed: str | None = None

    def reset(self) -> None:
        """Forget a decided failure (the world was reset)."""
        self._failed = None

    def update(self) -> LiveOutcome:
        """The outcome in the world's current state."""
        world = self.world
        with world.lock:
            t = world.time
            if self._failed is None:
                self._failed = self._fell()
            if self._failed is not None:
                return LiveOutcome(False, self._failed, self.task.name, t)
            outcome = self.task.evaluate(world)
        return LiveOutcome(True if outcome.success else None, outcome.reason, self.task.name, t)

    def _fell(self) -> str | None:
        scene, world = self.world.scene, self.world
        for name in world.object_names():
            state = world.object_state(name)
            bottom = bottom_height(scene.object(name), state.position, state.quaternion)
            if name == self.task.object.name and bottom < scene.table.height - FELL_BELOW_M:
                return f"{name} fell off the table"
        return None


def object_poses(world: PhysicsWorld) -> list[Pose]:
    """Every object's pose in the world frame, in the scene file's order (see the module doc)."""
    if world.scene is None or world.layout is None:
        return []
    with world.lock:
        states = world.object_states()
        layout = world.layout
    return [states[o.name].pose if o.name in states else layout.objects[o.name] for o in world.scene.objects]


def scene_description(world: PhysicsWorld) -> dict[str, Any]:
    """The scene as plain data (JSON): see the module doc. Units: m, rad; colours RGBA in [0, 1]."""
    scene, layout = world.scene, world.layout
    if scene is None or layout is None:
        return {"scene": "", "seed": world.seed, "task": "", "objects": [], "targets": [], "table": None}
    table = scene.table
    return {
        "scene": scene.name,
        "seed": int(world.seed),
        "task": task_for(scene).name,
        "description": scene.description,
        "frame_id": "base_link",
        "table": {"center": [*table.center, table.height / 2], "size": [*table.size, table.height],
                  "top_z": table.height, "color": list(table.colour)},
        "objects": [{"name": o.name, "shape": o.shape, "size": list(o.size), "color": list(o.colour),
                     "mass": o.mass, "fixed": o.fixed} for o in scene.objects],
        "targets": [{"name": t.name, "center": _floats(layout.targets[t.name].center),
                     "size": list(t.size), "yaw": float(layout.targets[t.name].yaw), "support": t.support,
                     "color": list(t.colour)} for t in scene.targets],
    }


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in values]
