"""The 21-point MediaPipe hand layout, its checks and its palm frame (ROS-free).

Layout: 0 WRIST; 1-4 THUMB CMC, MCP, IP, TIP; 5-8 INDEX MCP, PIP, DIP, TIP;
9-12 MIDDLE; 13-16 RING; 17-20 PINKY (chains 0-1-2-3-4, 0-5-6-7-8, ...).

The Wuji hand maps one-to-one onto it (:func:`robot_keypoint_frames`): the
wrist is ``{side}_palm_link``; fingers 2-5 give MCP = ``link1`` (the MCP
flexion joint), PIP = ``link3``, DIP = ``link4``, TIP = ``tip_link``; the
thumb gives CMC = ``link1``, MCP = ``link3``, IP = ``link4``, TIP =
``tip_link``. The world model draws the same 21 points.

The palm frame (:func:`palm_frame`) is built from the points alone, the same
way for a human and for the robot: origin at the wrist, z towards the middle
MCP, y from the pinky MCP towards the index MCP (made orthogonal to z), x = y
x z. For a left hand it is the mirror image of a right hand's, exactly like
the robot's left and right hands, so expressing both in it handles
handedness.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

N_POINTS = 21
NAMES = (
    "wrist",
    "thumb_cmc", "thumb_mcp", "thumb_ip", "thumb_tip",
    "index_mcp", "index_pip", "index_dip", "index_tip",
    "middle_mcp", "middle_pip", "middle_dip", "middle_tip",
    "ring_mcp", "ring_pip", "ring_dip", "ring_tip",
    "pinky_mcp", "pinky_pip", "pinky_dip", "pinky_tip",
)
FINGERS = ("thumb", "index", "middle", "ring", "pinky")  # = Wuji finger1..finger5
CHAINS = tuple(tuple([0] + [1 + 4 * f + k for k in range(4)]) for f in range(5))  # wrist -> tip, per finger
TIPS = (4, 8, 12, 16, 20)
WRIST, INDEX_MCP, MIDDLE_MCP, PINKY_MCP = 0, 5, 9, 17
BONES = tuple((chain[k], chain[k + 1]) for chain in CHAINS for k in range(4))  # 20 (parent, child) pairs

MIN_PALM_SIZE = 0.01  # [m] wrist->middle MCP and pinky->index MCP below this: not a hand
MIN_PALM_ANGLE = math.radians(10.0)  # [rad] pinky->index direction must be at least this far off the wrist->middle line
HAND_SIZE_RANGE = (0.03, 0.25)  # [m] plausible wrist -> middle MCP distance (catches mm-for-m and similar)
MIN_BONE = 0.003  # [m] a bone shorter than this: points collapsed (e.g. undetected fingers set to 0)
WRONG_SIDE_MARGIN = 0.005  # [m] thumb this far on the other side of the palm plane: a mirrored (other) hand


REASONS = ("count", "nan", "degenerate_palm", "implausible_size", "collapsed", "wrong_side")


class SkeletonProblem(NamedTuple):
    """Why a skeleton was rejected (``reason`` is one of :data:`REASONS`)."""

    reason: str
    detail: str


def check(points: np.ndarray, side: str | None = None) -> SkeletonProblem | None:
    """None if ``points`` is a usable (21, 3) skeleton of a hand (of ``side``, if given), else why not.

    Rejected: a wrong number of points, NaN/infinite coordinates, a degenerate
    palm (wrist and knuckles nearly collinear), an implausible size (wrist to
    middle knuckle outside :data:`HAND_SIZE_RANGE`: e.g. millimetres given as
    metres), collapsed points (a bone shorter than :data:`MIN_BONE`: e.g.
    undetected fingers reported at the wrist) and, with ``side``, the mirror
    image of that side's hand (the thumb clearly on the back of the palm
    frame: a mislabelled glove or a left-handed tracker frame).
    """
    p = np.asarray(points, dtype=float)
    if p.shape != (N_POINTS, 3):
        return SkeletonProblem("count", f"expected {N_POINTS} points of 3 coordinates, got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        return SkeletonProblem("nan", "skeleton contains NaN or infinite coordinates")
    with np.errstate(over="ignore"):  # absurd scales overflow to inf: rejected just below
        size = float(np.linalg.norm(p[MIDDLE_MCP] - p[WRIST]))
    if not HAND_SIZE_RANGE[0] <= size <= HAND_SIZE_RANGE[1]:
        return SkeletonProblem(
            "implausible_size", f"wrist to middle knuckle is {size:.4g} m, outside {HAND_SIZE_RANGE} m (units?)"
        )
    R = _palm_axes(p)
    if R is None:
        return SkeletonProblem("degenerate_palm", "wrist, index, middle and pinky MCP are (nearly) collinear")
    bones = np.array(BONES)
    shortest = float(np.linalg.norm(p[bones[:, 1]] - p[bones[:, 0]], axis=1).min())
    if shortest < MIN_BONE:
        return SkeletonProblem("collapsed", f"a bone is {shortest * 1000:.1f} mm long: points collapsed")
    if side is not None:
        thumb_x = float(((p[2:5] - p[WRIST]) @ R[:, 0]).mean())  # thumb MCP, IP, tip along the palm normal
        expected = 1.0 if side == "right" else -1.0  # x = y (to the index) x z (to the fingers): palmar for a right hand
        if thumb_x * expected < -WRONG_SIDE_MARGIN:
            return SkeletonProblem(
                "wrong_side", f"this is a mirrored hand: not a {side} hand (thumb {abs(thumb_x) * 1000:.0f} mm on "
                "the wrong side of the palm); check the glove's side or the tracker's frame handedness"
            )
    return None


def _palm_axes(p: np.ndarray) -> np.ndarray | None:
    z = p[MIDDLE_MCP] - p[WRIST]
    across = p[INDEX_MCP] - p[PINKY_MCP]
    nz, na = math.sqrt(z @ z), math.sqrt(across @ across)
    if nz < MIN_PALM_SIZE or na < MIN_PALM_SIZE:
        return None
    z = z / nz
    y = across - (across @ z) * z
    ny = math.sqrt(y @ y)
    if ny < na * math.sin(MIN_PALM_ANGLE):
        return None
    y = y / ny
    x = (y[1] * z[2] - y[2] * z[1], y[2] * z[0] - y[0] * z[2], y[0] * z[1] - y[1] * z[0])  # y x z
    return np.array([x, y, z]).T


def palm_frame(points: np.ndarray) -> np.ndarray | None:
    """(4, 4) palm frame of a skeleton in its points' frame, or None if the palm is degenerate."""
    p = np.asarray(points, dtype=float)
    R = _palm_axes(p)
    if R is None:
        return None
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = p[WRIST]
    return T


def in_palm_frame(points: np.ndarray) -> np.ndarray | None:
    """The (21, 3) points expressed in their own :func:`palm_frame` (None if degenerate)."""
    T = palm_frame(points)
    if T is None:
        return None
    return (np.asarray(points, dtype=float) - T[:3, 3]) @ T[:3, :3]


def robot_keypoint_frames(side: str) -> tuple[str, ...]:
    """The 21 Wuji frames matching the MediaPipe points, in MediaPipe order."""
    frames = [f"{side}_palm_link"]
    for finger in range(1, 6):
        base = f"{side}_finger{finger}"
        frames += [f"{base}_link1", f"{base}_link3", f"{base}_link4", f"{base}_tip_link"]
    return tuple(frames)
