"""Body-tracker sources: a synthetic operator, a rosbag2 replay and SteamVR/OpenVR.

:func:`make_tracker_source` builds one by name; a new backend (e.g.
libsurvive) subclasses :class:`TrackerSource` and registers itself in
:data:`TRACKER_SOURCES`.
"""

from __future__ import annotations

from ..factory import SourceRegistry
from .base import TrackerSource
from .openvr_source import OpenVRSource
from .replay import ReplaySource
from .synthetic import SyntheticOperator

TRACKER_SOURCES = SourceRegistry("tracker source", (SyntheticOperator, ReplaySource, OpenVRSource))

#: a not-yet-started tracker source of a kind, built with keyword arguments (ConfigurationError: bad kind or arguments)
make_tracker_source = TRACKER_SOURCES.make


__all__ = [
    "TRACKER_SOURCES",
    "OpenVRSource",
    "ReplaySource",
    "SyntheticOperator",
    "TrackerSource",
    "make_tracker_source",
]
