"""The synthetic head camera: a procedurally drawn tabletop on a fixed frame grid (deterministic, ROS-free).

The scene (geometry, ray caster, units) is :mod:`.scene`; this module is the camera source that plays it:
frame k shows the scene at t = k / fps [s], with the ball sliding along x when ``moving``. Depth is uint16
millimetres, exact (no sensor noise or holes), registered to the colour image.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ...core.camera import DEFAULT_DEPTH_SCALE, CameraFrame, CameraIntrinsics
from ...errors import ConfigurationError
from .base import DEFAULT_MAX_BACKLOG, CameraSource
from .scene import SceneObject, TabletopScene

__all__ = ["SceneObject", "SyntheticScene"]

_LOG = logging.getLogger(__name__)


class SyntheticScene(CameraSource):
    """The tabletop of :class:`~.scene.TabletopScene` as a camera source on a fixed frame grid.

    Frames exist at t_k = t_start + k / fps [s]; :meth:`read` returns the ones
    not yet returned with t_k <= now, oldest first, at most ``max_backlog``
    per call (the newest; older due frames are dropped and counted in
    :attr:`dropped`). A frame depends only on (seed, k / fps), never on when
    :meth:`read` is called.

    Attributes:
        scene: the geometry and ray caster.
        camera_intrinsics: intrinsics of colour and depth (known before :meth:`start`).
        T_world_camera: (4, 4) the optical frame in the scene's world frame [m].
        objects: the scene's objects (cube, cylinder, bowl, ball).
    """

    kind = "synthetic"

    def __init__(
        self,
        width: int = 640,
        height: int = 480,
        fps: float = 30.0,
        seed: int = 0,
        depth: bool = True,
        moving: bool = True,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
    ) -> None:
        """
        Args:
            width, height: image size [px] (16..4096).
            fps: frame rate [Hz] (> 0).
            seed: seed of the object layout (and the wood pattern).
            depth: produce depth images.
            moving: the ball slides (otherwise every frame is the same).
            max_backlog: most frames one :meth:`read` returns [frames] (>= 1).

        Raises:
            ConfigurationError: a size, rate or backlog out of range.
        """
        super().__init__()
        self.scene = TabletopScene(width, height, seed)
        if not (math.isfinite(fps) and fps > 0):
            raise ConfigurationError(f"synthetic camera: fps must be > 0, got {fps}")
        if int(max_backlog) < 1:
            raise ConfigurationError(f"synthetic camera: max_backlog must be >= 1, got {max_backlog}")
        self.width, self.height = self.scene.width, self.scene.height
        self.fps = float(fps)
        self.seed = self.scene.seed
        self.depth = bool(depth)
        self.moving = bool(moving)
        self.max_backlog = int(max_backlog)
        self.camera_intrinsics: CameraIntrinsics = self.scene.intrinsics
        self.T_world_camera = self.scene.T_world_camera
        self.objects = self.scene.objects
        self._t_start: float | None = None
        self._next_k = 0
        self._ahead: tuple[int, CameraFrame] | None = None  # (k, frame) rendered ahead of time
        self._closed = False

    def ball_center(self, t: float) -> np.ndarray:
        """(3,) world position [m] of the ball's centre at ``t`` [s since start] (its t = 0 place unless moving)."""
        return self.scene.ball_center(t if self.moving else 0.0)

    def render(self, t: float) -> CameraFrame:
        """The frame at ``t`` [s since start] (stamp = t); identical for identical (seed, t)."""
        image = self.scene.render(self.ball_center(t), depth=self.depth)
        return CameraFrame(float(t), image.color, image.depth, DEFAULT_DEPTH_SCALE)

    # ----------------------------------------------------------------------------- source
    def start(self, now: float) -> None:
        """Start the timeline at ``now`` [s] (restarting it if already started); renders the static scene."""
        self.scene.prepare()
        self._intrinsics = self.camera_intrinsics
        self._depth_intrinsics = self.camera_intrinsics if self.depth else None
        self._t_start = float(now)
        self._next_k = 0
        self._ahead = None
        self._closed = False

    def read(self, now: float) -> list[CameraFrame]:
        """Every grid frame with t_k <= ``now`` [s] not returned yet, oldest first (at most ``max_backlog``)."""
        if self._t_start is None or self._closed:
            raise RuntimeError("SyntheticScene.read() called before start() or after close()")
        last_k = math.floor((now - self._t_start) * self.fps + 1e-9)
        if last_k - self._next_k + 1 > self.max_backlog:
            skipped = last_k - self.max_backlog + 1 - self._next_k
            self.dropped += skipped
            _LOG.debug("synthetic camera: %d frames due; dropped the oldest %d", last_k - self._next_k + 1, skipped)
            self._next_k += skipped
        out: list[CameraFrame] = []
        while self._next_k <= last_k:
            t = self._next_k / self.fps
            ahead = self._ahead
            frame = ahead[1] if ahead is not None and ahead[0] == self._next_k else self.render(t)
            out.append(frame._replace(stamp=self._t_start + t))
            self._next_k += 1
        return out

    def prepare_next(self) -> None:
        """Render the next grid frame now, so the next :meth:`read` returns it without rendering."""
        if self._t_start is None or self._closed:
            return
        if self._ahead is None or self._ahead[0] != self._next_k:
            self._ahead = (self._next_k, self.render(self._next_k / self.fps))

    def close(self) -> None:
        """Stop producing frames (idempotent); the rendered static scene is kept for a restart."""
        self._closed = True
