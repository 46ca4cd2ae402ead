"""Body-tracker sources: a synthetic operator, a rosbag2 replay and SteamVR/OpenVR.

:func:`make_tracker_source` builds one by name; a new backend (e.g.
libsurvive) subclasses :class:`TrackerSource` and registers itself in
:data:`TRACKER_SOURCES`.
"""

from __future__ import annotations

from typing import Any

from ..factory import build_source
from .base import TrackerSource
from .openvr_source import OpenVRSource
from .replay import ReplaySource
from .synthetic import SyntheticOperator

TRACKER_SOURCES: dict[str, type[TrackerSource]] = {
    cls.kind: cls for cls in (SyntheticOperator, ReplaySource, OpenVRSource)
}


def make_tracker_source(kind: str, **kwargs: Any) -> TrackerSource:
    """A not-yet-started tracker source of ``kind`` built with ``kwargs`` (raises as :func:`..factory.build_source`)."""
    return build_source(TRACKER_SOURCES, kind, "tracker source", kwargs)


__all__ = [
    "TRACKER_SOURCES",
    "OpenVRSource",
    "ReplaySource",
    "SyntheticOperator",
    "TrackerSource",
    "make_tracker_source",
]
