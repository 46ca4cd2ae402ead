"""The ``render`` backend: the robot's arms and hands drawn over the reference frame (ROS-free, torch-free).

Each step poses the description's visual primitives at the commanded joints and paints them over a copy of
the reference frame through the head camera with the stack's robot renderer
(:class:`~rynn_teleop.core.robot_render.RobotRenderer`: flat-shaded boxes, cylinders and spheres, painted far
to near, faces crossing the near plane clipped; see :mod:`rynn_teleop.core.robot_render`).

The result depends only on (reference, joint vector): the same inputs give a bit-identical image. The robot
is not occluded by the scene (the reference frame has no depth here): it is always drawn on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.camera import CameraIntrinsics, default_intrinsics
from ..core.camera_view import DEFAULT_CAMERA_FRAME
from ..core.robot_model import RobotModel
from ..core.robot_render import RobotRenderer, Shading
from .generator import WORLD_MODEL_BACKENDS, Generator, WorldModelContext, as_rgb

DEFAULT_WIDTH, DEFAULT_HEIGHT = 640, 480  # [px]


@WORLD_MODEL_BACKENDS.register
class RenderGenerator(Generator):
    """The embedded default backend: the robot drawn over the reference frame, one frame per step.

    ``condition`` images are accepted and ignored: the frame is drawn from the
    joint vector itself (:attr:`uses_condition` is False, so callers need not
    draw them). Timings: stages ``fk`` (primitive poses) and ``draw``
    (copying the reference and painting) [ms].
    """

    name = "render"
    #: :meth:`step` ignores its ``condition`` image
    uses_condition = False

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: WorldModelContext) -> RenderGenerator:
        """The node's robot drawn through its camera."""
        return cls(context.robot, context.intrinsics)

    def __init__(
        self,
        robot: RobotModel | None = None,
        intrinsics: CameraIntrinsics | None = None,
        shading: Shading | None = None,
        *,
        width: int | None = None,
        height: int | None = None,
        camera_frame: str = DEFAULT_CAMERA_FRAME,
    ) -> None:
        """
        Args:
            robot: the robot model (default :meth:`RobotModel.default`).
            intrinsics: the head camera's intrinsics (default: the D435-like
                :func:`default_intrinsics` of the output size).
            shading: light, tessellation, anti-aliasing, near plane.
            width, height: output size [px], both or neither (default: the
                intrinsics' size, else 640x480); intrinsics of another size
                are scaled to it (:meth:`CameraIntrinsics.scaled`).
            camera_frame: the camera's optical frame in the description.
        """
        super().__init__()
        if (width is None) != (height is None):
            raise ValueError(f"render: give both width and height or neither, got {width} x {height}")
        self.robot = robot if robot is not None else RobotModel.default()
        if intrinsics is None:
            intrinsics = default_intrinsics(width or DEFAULT_WIDTH, height or DEFAULT_HEIGHT)
        width, height = int(width or intrinsics.width), int(height or intrinsics.height)
        if (width, height) != (intrinsics.width, intrinsics.height):
            intrinsics = intrinsics.scaled(width, height)
        self.width, self.height = width, height
        self.painter = RobotRenderer(self.robot, intrinsics, shading, camera_frame)
        self.shading = self.painter.shading
        self.geometry, self.view, self.renderer = self.painter.geometry, self.painter.view, self.painter.renderer
        self._reference: np.ndarray | None = None
        self._observed: np.ndarray | None = None

    @property
    def intrinsics(self) -> CameraIntrinsics:
        return self.view.intrinsics

    @property
    def reference(self) -> np.ndarray | None:
        """The current reference frame (read-only (H, W, 3) uint8 RGB), None before :meth:`reset`."""
        return self._reference

    @property
    def observed(self) -> np.ndarray | None:
        """The newest real frame handed to :meth:`observe` (read-only), None if none."""
        return self._observed

    def _own(self, frame: np.ndarray) -> np.ndarray:
        out = np.array(as_rgb(frame, self.width, self.height), copy=True)
        out.flags.writeable = False
        return out

    def reset(self, reference: np.ndarray) -> None:
        """Start a stream over ``reference`` (RGB uint8, any size: resized to the output size)."""
        self._reference = self._own(reference)

    def reanchor(self, frame: np.ndarray) -> None:
        """Replace the reference frame by ``frame`` now."""
        self._reference = self._own(frame)

    def observe(self, frame: np.ndarray) -> None:
        """Keep the newest real frame (it does not change the output until :meth:`reanchor`)."""
        self._observed = self._own(frame)

    def render(self, q: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """``reference`` (H, W, 3) uint8 (copied) with the robot at ``q`` (54,) [rad] painted over it."""
        with self.timer.stage("fk"):
            poses = self.painter.poses(q)
        with self.timer.stage("draw"):
            frame = reference.copy()
            self.renderer.draw(frame, poses)
        return frame

    def step(self, action: np.ndarray, condition: np.ndarray | None = None) -> list[np.ndarray]:
        """[the reference with the robot at ``action`` (54,) [rad] drawn over it]; ``condition`` is ignored.

        Raises:
            RuntimeError: called before :meth:`reset`.
            ValueError: not a finite (54,) joint vector.
        """
        if self._reference is None:
            raise RuntimeError("RenderGenerator.step() before reset(reference)")
        return [self.render(action, self._reference)]
