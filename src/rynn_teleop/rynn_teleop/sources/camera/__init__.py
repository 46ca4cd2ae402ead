"""Head-camera sources: a synthetic tabletop, a replay (rosbag2, video, image folder) and a RealSense.

Every source yields :class:`~rynn_teleop.core.camera.CameraFrame` records
(RGB colour, optional uint16 depth in mm). :func:`make_camera_source` builds
one by name; the RealSense adapter (:mod:`.realsense`) imports its vendor SDK
only when it starts. A new backend
subclasses :class:`CameraSource` and is added to :data:`CAMERA_SOURCES`.
"""

from __future__ import annotations

from ..factory import SourceRegistry
from .base import DEFAULT_MAX_BACKLOG, CameraSource
from .realsense import RealSenseCamera
from .replay import ReplayCamera
from .synthetic import SceneObject, SyntheticScene

CAMERA_SOURCES = SourceRegistry("camera source", (SyntheticScene, ReplayCamera, RealSenseCamera))
CAMERA_KINDS: tuple[str, ...] = tuple(CAMERA_SOURCES)

#: a not-yet-started camera source of a kind, built with keyword arguments (ConfigurationError: bad kind or arguments)
make_camera_source = CAMERA_SOURCES.make


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
