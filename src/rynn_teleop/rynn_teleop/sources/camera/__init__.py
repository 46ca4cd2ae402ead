"""Head-camera sources: a synthetic tabletop, a replay (rosbag2, video, image folder) and a RealSense.

Every source yields :class:`~rynn_teleop.core.camera.CameraFrame` records
(RGB colour, optional uint16 depth in mm). :func:`make_camera_source` builds
one by name; the RealSense adapter (:mod:`.realsense`) imports its vendor SDK
only when it starts. A new backend
subclasses :class:`CameraSource` and is added to :func:`camera_source_types`.
"""

from __future__ import annotations

from typing import Any

from ..factory import build_source
from .base import DEFAULT_MAX_BACKLOG, CameraSource
from .realsense import RealSenseCamera
from .replay import ReplayCamera
from .synthetic import SceneObject, SyntheticScene

CAMERA_KINDS: tuple[str, ...] = ("synthetic", "replay", "realsense")


def camera_source_types() -> dict[str, type[CameraSource]]:
    """kind -> class of every camera source (the RealSense SDK is imported when its source starts)."""
    return {cls.kind: cls for cls in (SyntheticScene, ReplayCamera, RealSenseCamera)}


def make_camera_source(kind: str, **kwargs: Any) -> CameraSource:
    """A not-yet-started camera source of the given ``kind`` built with ``kwargs``.

    Raises:
        ConfigurationError: unknown kind, arguments that kind does not take,
            or invalid values (from the source's constructor).
    """
    return build_source(camera_source_types(), kind, "camera source", kwargs)


__all__ = [
    "CAMERA_KINDS",
    "DEFAULT_MAX_BACKLOG",
    "CameraSource",
    "ReplayCamera",
    "SceneObject",
    "SyntheticScene",
    "camera_source_types",
    "make_camera_source",
]
