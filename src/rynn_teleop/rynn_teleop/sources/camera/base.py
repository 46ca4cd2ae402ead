"""Common interface of the head-camera sources (ROS-free).

A source yields :class:`~rynn_teleop.core.camera.CameraFrame` records: an RGB
image and, when the source has depth, a uint16 depth image (conventions in
:mod:`rynn_teleop.core.camera`). :attr:`CameraSource.intrinsics` describes the
colour image; :attr:`CameraSource.depth_intrinsics` the depth image, which
equals it when the depth is registered to the colour image (aligned).

Times are caller-supplied [s] (``now`` arguments), so tests and replays can
drive a source without a wall clock. A new backend subclasses
:class:`CameraSource`, sets ``kind``, implements ``start``, ``read`` and
``close``, and sets ``_intrinsics`` (and ``_depth_intrinsics``) in ``start``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ...core.camera import CameraFrame, CameraIntrinsics
from ..base import PolledSource

DEFAULT_MAX_BACKLOG = 30  # [frames] a late read returns at most this many (the newest); older ones are dropped


class CameraSource(PolledSource[CameraFrame]):
    """A non-blocking supplier of camera frames.

    Life cycle and context manager: :class:`~rynn_teleop.sources.base.PolledSource`.
    """

    kind: ClassVar[str]  # "synthetic" | "replay" | "realsense"

    def __init__(self) -> None:
        self._intrinsics: CameraIntrinsics | None = None
        self._depth_intrinsics: CameraIntrinsics | None = None
        self.dropped = 0  # frames skipped because a read came too late (see the source's max_backlog)

    def prepare_next(self) -> None:
        """Do the work of the next :meth:`read` now, off the frame's delivery path (a synthetic scene renders
        its next frame); the node calls it after delivering frames. Default: nothing to prepare."""
        return None

    @property
    def intrinsics(self) -> CameraIntrinsics:
        """Intrinsics of the colour images (valid after :meth:`start`; RuntimeError before)."""
        if self._intrinsics is None:
            raise RuntimeError(f"{type(self).__name__}.intrinsics is known only after start()")
        return self._intrinsics

    @property
    def depth_intrinsics(self) -> CameraIntrinsics | None:
        """Intrinsics of the depth images, None when the source gives no depth (valid after :meth:`start`)."""
        if self._intrinsics is None:
            raise RuntimeError(f"{type(self).__name__}.depth_intrinsics is known only after start()")
        return self._depth_intrinsics

    @property
    def has_depth(self) -> bool:
        """True when the frames carry depth images (valid after :meth:`start`)."""
        return self.depth_intrinsics is not None

    def diagnostics(self) -> Mapping[str, Any]:
        """Key/values for the node's diagnostics (restarts, errors, dropped frames, ...)."""
        return {"dropped": self.dropped}

