"""Head-camera backends: a synthetic tabletop, a replay (rosbag2, video, image folder) and a RealSense.

Every backend yields :class:`~rynn_teleop.core.camera.CameraFrame` records (RGB colour, optional uint16 depth
in mm). :data:`CAMERA_BACKENDS` holds them by name (each registers itself in its own module, and any module
added to this package is found); :func:`make_camera_source` builds one by name from constructor arguments.
The RealSense adapter (:mod:`.realsense`) imports its vendor SDK only when it starts.
"""

from __future__ import annotations

from .base import CAMERA_BACKENDS, DEFAULT_MAX_BACKLOG, CameraContext, CameraSource
from .realsense import RealSenseCamera
from .replay import ReplayCamera
from .synthetic import SceneObject, SyntheticScene

#: a not-yet-started camera source of a backend, built with constructor keyword arguments
#: (UnknownBackendError: no such backend; ConfigurationError: bad arguments)
make_camera_source = CAMERA_BACKENDS.make


__all__ = [
    "CAMERA_BACKENDS",
    "DEFAULT_MAX_BACKLOG",
    "CameraContext",
    "CameraSource",
    "RealSenseCamera",
    "ReplayCamera",
    "SceneObject",
    "SyntheticScene",
    "make_camera_source",
]
