"""Body-tracker backends: a synthetic operator, a rosbag2 replay and SteamVR/OpenVR.

:data:`TRACKER_BACKENDS` holds them by name (each registers itself in its own module, and any module added
to this package is found); :func:`make_tracker_source` builds one by name from constructor arguments.
"""

from __future__ import annotations

from .base import TRACKER_BACKENDS, TrackerContext, TrackerSource
from .openvr_source import OpenVRSource
from .replay import ReplaySource
from .synthetic import SyntheticOperator

#: a not-yet-started tracker source of a backend, built with constructor keyword arguments
#: (UnknownBackendError: no such backend; ConfigurationError: bad arguments)
make_tracker_source = TRACKER_BACKENDS.make


__all__ = [
    "TRACKER_BACKENDS",
    "OpenVRSource",
    "ReplaySource",
    "SyntheticOperator",
    "TrackerContext",
    "TrackerSource",
    "make_tracker_source",
]
