"""The 21-point MediaPipe hand layout, its checks and its palm frame (ROS-free).

Layout: 0 WRIST; 1-4 THUMB CMC, MCP, IP, TIP; 5-8 INDEX MCP, PIP, DIP, TIP; 9-12 MIDDLE; 13-16 RING;
17-20 PINKY (chains 0-1-2-3-4, 0-5-6-7-8, ...). The Wuji hand maps one-to-one onto it
(:func:`robot_keypoint_frames`): the wrist is ``{side}_palm_link``; fingers 2-5 give MCP = ``link1`` (the
MCP flexion joint), PIP = ``link3``, DIP = ``link4``, TIP = ``tip_link``; the thumb gives CMC = ``link1``,
MCP = ``link3``, IP = ``link4``, TIP = ``tip_link``. The world model draws the same 21 points.

The palm frame (:func:`palm_frame`) is built from the points alone, the same way for a human and for the
robot: origin at the wrist, z towards the middle MCP, y from the pinky MCP towards the index MCP (made
orthogonal to z), x = y x z. A left hand's is the mirror image of a right hand's, like the robot's hands, so
expressing both in it handles handedness.
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
N_BONES = len(BONES)

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
    return check_details(points, side).problem


class CheckedSkeleton(NamedTuple):
    """:func:`check_details`: the verdict and, for a usable skeleton, what the checks computed."""

    problem: SkeletonProblem | None  # None: usable
    axes: np.ndarray | None  # (3, 3) palm axes (columns x, y, z: the rotation of palm_frame); None if rejected
    bones: np.ndarray | None  # (20, 3) [m] child - parent point of each of BONES; None if rejected


def check_details(points: np.ndarray, side: str | None = None) -> CheckedSkeleton:
    """:func:`check` of ``points``, with the palm axes and bone vectors of a usable skeleton."""
    p = np.asarray(points, dtype=float)
    if p.shape != (N_POINTS, 3):
        return _rejected("count", f"expected {N_POINTS} points of 3 coordinates, got shape {p.shape}")
    if not np.logical_and.reduce(np.isfinite(p), None):
        return _rejected("nan", "skeleton contains NaN or infinite coordinates")
    xyz = p.tolist()  # Python floats: cheaper than numpy calls on single 3-vectors (their overflow gives inf)
    wrist, middle = xyz[WRIST], xyz[MIDDLE_MCP]
    z = (middle[0] - wrist[0], middle[1] - wrist[1], middle[2] - wrist[2])
    size = math.sqrt(z[0] * z[0] + z[1] * z[1] + z[2] * z[2])
    if not HAND_SIZE_RANGE[0] <= size <= HAND_SIZE_RANGE[1]:
        return _rejected(
            "implausible_size", f"wrist to middle knuckle is {size:.4g} m, outside {HAND_SIZE_RANGE} m (units?)"
        )
    axes = _axes(z, size, xyz[INDEX_MCP], xyz[PINKY_MCP])
    if axes is None:
        return _rejected("degenerate_palm", "wrist, index, middle and pinky MCP are (nearly) collinear")
    bones = bone_vectors(p)
    shortest = math.sqrt(np.minimum.reduce(np.add.reduce(bones * bones, 1)))
    if shortest < MIN_BONE:
        return _rejected("collapsed", f"a bone is {shortest * 1000:.1f} mm long: points collapsed")
    if side is not None:
        # thumb MCP, IP, tip along the palm normal x, on average
        (x0, x1, x2), (w0, w1, w2) = axes[0], wrist
        thumb_x = sum([(t0 - w0) * x0 + (t1 - w1) * x1 + (t2 - w2) * x2 for t0, t1, t2 in xyz[2:5]]) / 3.0
        # x = y (to the index) x z (to the fingers): palmar for a right hand
        expected = 1.0 if side == "right" else -1.0
        if thumb_x * expected < -WRONG_SIDE_MARGIN:
            return _rejected(
                "wrong_side", f"this is a mirrored hand: not a {side} hand (thumb {abs(thumb_x) * 1000:.0f} mm on "
                "the wrong side of the palm); check the glove's side or the tracker's frame handedness"
            )
    return CheckedSkeleton(None, np.array(axes).T, bones)


def _rejected(reason: str, detail: str) -> CheckedSkeleton:
    return CheckedSkeleton(SkeletonProblem(reason, detail), None, None)


def difference_matrix(pairs, n: int) -> np.ndarray:
    """(len(pairs), n) matrix D with ``D @ x == x[b] - x[a]`` for each (a, b) in ``pairs`` (a != b).

    For finite ``x`` the product is exact up to the one rounding of each difference (the other terms are
    multiples of 0 or 1), so it equals the indexed subtraction bit for bit, in one call.
    """
    D = np.zeros((len(pairs), n))
    for k, (a, b) in enumerate(pairs):
        D[k, b], D[k, a] = 1.0, -1.0
    D.flags.writeable = False
    return D


_BONE_DIFFERENCE = difference_matrix(BONES, N_POINTS)
_SIN_MIN_PALM_ANGLE = math.sin(MIN_PALM_ANGLE)


def bone_vectors(points: np.ndarray) -> np.ndarray:
    """(20, 3) vectors [m] parent -> child point of each of :data:`BONES`, for (21, 3) finite ``points`` [m]."""
    return _BONE_DIFFERENCE @ points


def _axes(z: tuple[float, float, float], nz: float, index: list[float], pinky: list[float]):
    """Palm axes x, y, z (three 3-tuples of floats) from wrist->middle MCP ``z`` of length ``nz`` [m] and the
    index and pinky MCP positions [m], or None for a degenerate palm (see :func:`palm_frame`)."""
    across = (index[0] - pinky[0], index[1] - pinky[1], index[2] - pinky[2])
    na = math.sqrt(across[0] * across[0] + across[1] * across[1] + across[2] * across[2])
    if nz < MIN_PALM_SIZE or na < MIN_PALM_SIZE:
        return None
    z = (z[0] / nz, z[1] / nz, z[2] / nz)
    along = across[0] * z[0] + across[1] * z[1] + across[2] * z[2]
    y = (across[0] - along * z[0], across[1] - along * z[1], across[2] - along * z[2])  # across, orthogonal to z
    ny = math.sqrt(y[0] * y[0] + y[1] * y[1] + y[2] * y[2])
    if ny < na * _SIN_MIN_PALM_ANGLE:
        return None
    y = (y[0] / ny, y[1] / ny, y[2] / ny)
    x = (y[1] * z[2] - y[2] * z[1], y[2] * z[0] - y[0] * z[2], y[0] * z[1] - y[1] * z[0])  # y x z
    return x, y, z


def _palm_axes(p: np.ndarray) -> np.ndarray | None:
    """(3, 3) palm axes (columns x, y, z) of the (21, 3) points ``p``, or None for a degenerate palm."""
    wrist, index, middle, pinky = p[_PALM_POINTS].tolist()
    z = (middle[0] - wrist[0], middle[1] - wrist[1], middle[2] - wrist[2])
    axes = _axes(z, math.sqrt(z[0] * z[0] + z[1] * z[1] + z[2] * z[2]), index, pinky)
    return None if axes is None else np.array(axes).T


_PALM_POINTS = np.array([WRIST, INDEX_MCP, MIDDLE_MCP, PINKY_MCP])


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
