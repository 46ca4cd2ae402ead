"""Hand-skeleton sources: a synthetic glove pair and a rosbag2 replay, plus the Manus converter.

Every source yields the 21 MediaPipe keypoints of each hand in its wrist frame
(:class:`HandSample`). :func:`make_hand_source` builds one by name; a new
backend subclasses :class:`HandSource` and registers itself in
:data:`HAND_SOURCES`. Manus gloves arrive as ROS messages, so they have no
source here: :func:`manus_to_mediapipe` converts one message.
"""

from __future__ import annotations

from typing import Any

from ..factory import build_source
from .base import HandSample, HandSource
from .manus import ManusHand, ManusSkeletonError, manus_to_mediapipe
from .replay import ReplayHands
from .synthetic import KEY_POSES, SyntheticGlove

HAND_SOURCES: dict[str, type[HandSource]] = {cls.kind: cls for cls in (SyntheticGlove, ReplayHands)}


def make_hand_source(kind: str, **kwargs: Any) -> HandSource:
    """A not-yet-started hand source of ``kind`` built with ``kwargs`` (raises as :func:`..factory.build_source`)."""
    return build_source(HAND_SOURCES, kind, "hand source", kwargs)


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
