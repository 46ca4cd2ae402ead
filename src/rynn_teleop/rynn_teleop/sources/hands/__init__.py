"""Hand-skeleton backends of the hand_retarget node: a synthetic glove pair and a rosbag2 replay (polled),
PoseArray skeletons of any hand tracker and the Manus gloves' messages (subscribed).

Every backend yields the 21 MediaPipe keypoints of each hand in its wrist frame (:class:`HandSample`).
:data:`HAND_BACKENDS` holds them by name (each registers itself in its own module, and any module added to
this package is found); :func:`make_hand_source` builds one by name from constructor arguments.
:func:`manus_to_mediapipe` converts one Manus glove message.
"""

from __future__ import annotations

from .base import HAND_BACKENDS, HandContext, HandMessageError, HandSample, HandSource, MessageHands
from .manus import ManusGloves, ManusHand, ManusSkeletonError, manus_to_mediapipe
from .replay import ReplayHands
from .skeleton import SkeletonTopics
from .synthetic import KEY_POSES, SyntheticGlove

#: a not-yet-started hand backend, built with constructor keyword arguments
#: (UnknownBackendError: no such backend; ConfigurationError: bad arguments)
make_hand_source = HAND_BACKENDS.make


__all__ = [
    "HAND_BACKENDS",
    "KEY_POSES",
    "HandContext",
    "HandMessageError",
    "HandSample",
    "HandSource",
    "ManusGloves",
    "ManusHand",
    "ManusSkeletonError",
    "MessageHands",
    "ReplayHands",
    "SkeletonTopics",
    "SyntheticGlove",
    "make_hand_source",
    "manus_to_mediapipe",
]
