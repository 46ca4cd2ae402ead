"""Hand-skeleton sources: a synthetic glove pair and a rosbag2 replay, plus the Manus converter.

Every source yields the 21 MediaPipe keypoints of each hand in its wrist frame
(:class:`HandSample`). :func:`make_hand_source` builds one by name; a new
backend subclasses :class:`HandSource` and registers itself in
:data:`HAND_SOURCES`. Manus gloves arrive as ROS messages, so they have no
source here: :func:`manus_to_mediapipe` converts one message.
"""

from __future__ import annotations

from ..factory import SourceRegistry
from .base import HandSample, HandSource
from .manus import ManusHand, ManusSkeletonError, manus_to_mediapipe
from .replay import ReplayHands
from .synthetic import KEY_POSES, SyntheticGlove

HAND_SOURCES = SourceRegistry("hand source", (SyntheticGlove, ReplayHands))

#: a not-yet-started hand source of a kind, built with keyword arguments (ConfigurationError: bad kind or arguments)
make_hand_source = HAND_SOURCES.make


__all__ = [
    "HAND_SOURCES",
    "KEY_POSES",
    "HandSample",
    "HandSource",
    "ManusHand",
    "ManusSkeletonError",
    "ReplayHands",
    "SyntheticGlove",
    "make_hand_source",
    "manus_to_mediapipe",
]
