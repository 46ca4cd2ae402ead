"""Head-camera sources: a synthetic tabletop, a replay (rosbag2, video, image folder) and a RealSense.

Every source yields :class:`~rynn_teleop.core.camera.CameraFrame` records
(RGB colour, optional uint16 depth in mm). :func:`make_camera_source` builds
one by name; the RealSense adapter (:mod:`.realsense`) imports its vendor SDK
only when it starts. A new backend
subclasses :class:`CameraSource` and is added to :data:`CAMERA_SOURCES`.
"""

from __future__ import annotations

from typing import Any

from ..factory import build_source
from .base import DEFAULT_MAX_BACKLOG, CameraSource
from .realsense import RealSenseCamera
from .replay import ReplayCamera
from .synthetic import SceneObject, SyntheticScene

CAMERA_SOURCES: dict[str, type[CameraSource]] = {
    cls.kind: cls for cls in (SyntheticScene, ReplayCamera, RealSenseCamera)
}
CAMERA_KINDS: tuple[str, ...] = tuple(CAMERA_SOURCES)


def make_camera_source(kind: str, **kwargs: Any) -> CameraSource:
    """A not-yet-started camera source of ``kind`` built with ``kwargs`` (raises as :func:`..factory.build_source`)."""
    return build_source(CAMERA_SOURCES, kind, "camera source", kwargs)


__all__ = [
    "CAMERA_KINDS",
    "CAMERA_SOURCES",
    "DEFAULT_MAX_BACKLOG",
    "CameraSource",
    "RealSenseCamera",
    "ReplayCamera",
    "SceneObject",
    "SyntheticScene",
    "make_camera_source",
]
