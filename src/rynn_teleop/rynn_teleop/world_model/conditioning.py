"""Conditioning: the commanded joints as a depth-aware skeleton image (ROS-free, torch-free; numpy/OpenCV).

From a 54-D joint vector (canonical order, [rad]), forward kinematics gives, in ``base_link``, the 21 keypoints
of each Wuji hand in MediaPipe order (:func:`~rynn_teleop.core.hand_skeleton.robot_keypoint_frames`) and each
arm's chain (:func:`arm_chain_frames`: arm base, link1..7, flange, palm). The points are expressed in the head
camera's optical frame (``camera_color_optical_frame``: x right, y down, z forward; fixed to the torso, so its
pose is computed once), projected through the camera intrinsics
(:class:`~rynn_teleop.core.camera_view.CameraView`) and drawn as a skeleton
image (:func:`draw_skeleton`): bones between joints, each joint a disc whose colour and radius encode its depth
z [m] (near = larger and brighter; :class:`SkeletonStyle`). The operator's own 21-point skeletons, given in the
optical frame, are drawn the same way (:meth:`Conditioner.operator_image`).

Pixel coordinates follow :mod:`rynn_teleop.core.camera`: u right, v down, pixel centres at integer
coordinates. Images are RGB uint8 (H, W, 3).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import cv2
import numpy as np

from ..core import hand_skeleton
from ..core.camera import CameraIntrinsics
from ..core.camera_view import (
    DEFAULT_CAMERA_FRAME,
    DEFAULT_NEAR_CLIP,
    SUBPIXEL,
    SUBPIXEL_BITS,
    CameraView,
    fixed_point,
)
from ..core.layout import SIDES
from ..core.robot_model import RobotModel
from ..core.settings import Settings, setting
from ..errors import ParameterError

_LUT_SIZE = 256

HAND_BONES = np.array(hand_skeleton.BONES, dtype=np.int64)  # (20, 2) MediaPipe bones (parent, child)


def arm_chain_frames(side: str) -> tuple[str, ...]:
    """The 10 frames of one arm's chain, shoulder to hand: arm base, link1..7, flange, palm."""
    return (
        (f"{side}_arm_base_link",)
        + tuple(f"{side}_arm_link{i}" for i in range(1, 8))
        + (f"{side}_arm_flange", f"{side}_palm_link")
    )


N_ARM_POINTS = 10  # len(arm_chain_frames(side))


# ------------------------------------------------------------------------------------ style
def _colormap_lut(colormap: str | Sequence[Sequence[float]]) -> tuple[np.ndarray, str | tuple]:
    """(256, 3) uint8 RGB lookup table, far (index 0) to near (index 255), and the normalised colormap value."""
    if isinstance(colormap, str):
        name = colormap.strip().upper().removeprefix("COLORMAP_")
        code = getattr(cv2, f"COLORMAP_{name}", None)
        if not name or code is None:
            known = sorted(n.removeprefix("COLORMAP_").lower() for n in dir(cv2) if n.startswith("COLORMAP_"))
            raise ParameterError(
                "colormap",
                f"skeleton style: colormap {colormap!r} is not an OpenCV colour map; known: {', '.join(known)}",
            )
        ramp = np.arange(_LUT_SIZE, dtype=np.uint8).reshape(-1, 1)
        lut = cv2.applyColorMap(ramp, code).reshape(_LUT_SIZE, 3)[:, ::-1]  # BGR -> RGB
        return np.ascontiguousarray(lut), name.lower()
    try:
        colors = np.asarray(colormap, dtype=float)
    except (TypeError, ValueError):
        colors = np.empty(0)
    if colors.ndim != 2 or colors.shape[0] < 2 or colors.shape[1] != 3 or not np.all(np.isfinite(colors)) or (
        colors.min() < 0.0 or colors.max() > 255.0
    ):
        raise ParameterError(
            "colormap",
            f"skeleton style: colormap must be an OpenCV colour map name or at least 2 RGB colours (0..255, far to "
            f"near), got {colormap!r}",
        )
    x = np.linspace(0.0, 1.0, len(colors))
    t = np.linspace(0.0, 1.0, _LUT_SIZE)
    lut = np.stack([np.interp(t, x, colors[:, c]) for c in range(3)], axis=1)
    return np.round(lut).astype(np.uint8), tuple(tuple(float(v) for v in c) for c in colors)


@dataclass(frozen=True)
class SkeletonStyle(Settings):
    """How a skeleton is drawn: depth -> colour, depth -> radius, bone thickness.

    Colour: the depth z [m] maps linearly onto the colour map, ``far`` to its
    first entry and ``near`` to its last (clipped outside [near, far]). The
    default ``plasma`` runs from dark blue (far) to bright yellow (near), so
    near joints are brighter and warmer. ``colormap`` is an OpenCV colour map
    name (``plasma``, ``inferno``, ``turbo``..., case-insensitive) or a
    sequence of at least two RGB colours (0..255) listed far to near,
    interpolated linearly.

    Radius law: r(z) = ``radius`` * ``reference_depth`` / z [px], clipped to
    [``radius_min``, ``radius_max``]: a joint's disc shrinks like the image of
    a ball of fixed size.

    The numeric and boolean fields are declared as parameters (:mod:`~rynn_teleop.core.settings`).

    Raises:
        ParameterError: a bad field; ``key`` (and the message) name it.
    """

    SETTINGS_NAME: ClassVar[str] = "skeleton style"

    colormap: str | Sequence[Sequence[float]] = "plasma"
    near: float = setting(0.25, "depth drawn with the near (last) colour", units="m", min=1e-3, max=1e3)
    far: float = setting(1.2, "depth drawn with the far (first) colour", units="m", min=1e-3, max=1e3)
    radius: float = setting(6.0, "joint radius at reference_depth", units="px", min=1e-3, max=1e4)
    reference_depth: float = setting(0.6, "depth at which a joint's radius is `radius`", units="m", min=1e-3,
                                     max=1e3)
    radius_min: float = setting(1.5, "smallest joint radius", units="px", min=1e-3, max=1e4)
    radius_max: float = setting(16.0, "largest joint radius", units="px", min=1e-3, max=1e4)
    bone_thickness: int = setting(2, "line width of the bones", units="px", min=1, max=100)
    antialias: bool = setting(True, "draw with cv2.LINE_AA (else LINE_8)")
    _lut: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lut, normalised = _colormap_lut(self.colormap)
        object.__setattr__(self, "_lut", lut)
        object.__setattr__(self, "colormap", normalised)
        super().__post_init__()

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.far <= self.near:
            yield "far", f"far ({self.far} m) must be greater than near ({self.near} m)"
        if self.radius_max < self.radius_min:
            yield "radius_max", f"radius_max ({self.radius_max} px) must be >= radius_min ({self.radius_min} px)"

    @property
    def lut(self) -> np.ndarray:
        """(256, 3) uint8 RGB colours, far (row 0) to near (row 255)."""
        return self._lut

    @property
    def line_type(self) -> int:
        """The OpenCV line type of this style."""
        return cv2.LINE_AA if self.antialias else cv2.LINE_8

    def nearness(self, depth: np.ndarray) -> np.ndarray:
        """(N,) in [0, 1]: 1 at or before ``near``, 0 at or beyond ``far``, linear in between (depth [m])."""
        z = np.asarray(depth, dtype=float)
        return np.clip((self.far - z) / (self.far - self.near), 0.0, 1.0)

    def colors(self, depth: np.ndarray) -> np.ndarray:
        """(N, 3) uint8 RGB colours of depths (N,) [m]."""
        index = np.round(self.nearness(depth) * (_LUT_SIZE - 1)).astype(np.int64)
        return self._lut[index]

    def radii(self, depth: np.ndarray) -> np.ndarray:
        """(N,) joint radii [px] of depths (N,) [m] (z > 0)."""
        z = np.asarray(depth, dtype=float)
        with np.errstate(divide="ignore"):
            return np.clip(self.radius * self.reference_depth / z, self.radius_min, self.radius_max)


# ------------------------------------------------------------------------------------ drawing
def draw_skeleton(
    image: np.ndarray,
    points_cam: np.ndarray,
    bones: np.ndarray | Sequence[tuple[int, int]],
    style: SkeletonStyle,
    camera: CameraView,
) -> np.ndarray:
    """Draw a skeleton (or several, concatenated) into ``image`` in place, and return it.

    Bones are drawn first, far to near (by the mean depth of their ends), each
    in the colour of that mean depth; then the joints, far to near, so that a
    nearer joint covers a farther one. A joint with z <= ``camera.near`` (behind
    the camera) or a non-finite coordinate is not drawn; a bone with one end
    behind the near plane is clipped at it, a bone with both ends behind or a
    non-finite end is not drawn.

    Args:
        image: (H, W, 3) uint8 RGB, drawn into.
        points_cam: (N, 3) joint positions [m] in the camera's optical frame.
        bones: (M, 2) index pairs into ``points_cam``.
        style: colours, radii and thickness.
        camera: the intrinsics and near plane to project with.
    """
    p = np.asarray(points_cam, dtype=float).reshape(-1, 3)
    b = np.asarray(bones, dtype=np.int64).reshape(-1, 2)
    if b.size and (b.min() < 0 or b.max() >= len(p)):
        raise ValueError(f"draw_skeleton: bone indices must lie in [0, {len(p)}), got {b.min()}..{b.max()}")
    near = camera.near
    finite = np.isfinite(p).all(axis=1)
    z = np.where(finite, p[:, 2], -np.inf)
    shift, line = SUBPIXEL_BITS, style.line_type

    if len(b):
        a, c = p[b[:, 0]], p[b[:, 1]]
        za, zc = z[b[:, 0]], z[b[:, 1]]
        keep = finite[b[:, 0]] & finite[b[:, 1]] & ((za > near) | (zc > near))
        a, c, za, zc = a[keep], c[keep], za[keep], zc[keep]
        if len(a):
            # clip each bone to the part in front of the near plane (at most one end is behind it)
            with np.errstate(divide="ignore", invalid="ignore"):
                s_a = np.where(za > near, 0.0, (near - za) / (zc - za))
                s_c = np.where(zc > near, 1.0, (near - za) / (zc - za))
            a, c = a + s_a[:, None] * (c - a), a + s_c[:, None] * (c - a)
            a[:, 2], c[:, 2] = np.maximum(a[:, 2], near), np.maximum(c[:, 2], near)
            ends = [tuple(e) for e in fixed_point(camera.project_unmasked(np.concatenate([a, c]))).tolist()]
            mid = 0.5 * (a[:, 2] + c[:, 2])
            order = np.argsort(-mid, kind="stable")
            colors = style.colors(mid).tolist()
            n = len(a)
            thickness = style.bone_thickness
            for k in order.tolist():
                cv2.line(image, ends[k], ends[n + k], colors[k], thickness, line, shift)

    joints = np.nonzero(finite & (z > near))[0]
    if len(joints):
        zj = z[joints]
        centres = [tuple(e) for e in fixed_point(camera.project_unmasked(p[joints])).tolist()]
        radii = np.round(style.radii(zj) * SUBPIXEL).astype(np.int64).tolist()
        colors = style.colors(zj).tolist()
        for k in np.argsort(-zj, kind="stable").tolist():
            cv2.circle(image, centres[k], radii[k], colors[k], -1, line, shift)
    return image


def stack_skeletons(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate (points (N_i, 3), bones (M_i, 2)) skeletons into one, re-indexing the bones."""
    points, bones, offset = [], [], 0
    for pts, bns in parts:
        pts = np.asarray(pts, dtype=float).reshape(-1, 3)
        points.append(pts)
        bones.append(np.asarray(bns, dtype=np.int64).reshape(-1, 2) + offset)
        offset += len(pts)
    if not points:
        return np.empty((0, 3)), np.empty((0, 2), dtype=np.int64)
    return np.concatenate(points), np.concatenate(bones)


# ------------------------------------------------------------------------------------ the robot's skeleton
class RobotKeypoints(NamedTuple):
    """The robot's skeleton points at one configuration, in ``base_link`` [m]."""

    left_hand: np.ndarray  # (21, 3) MediaPipe order
    right_hand: np.ndarray  # (21, 3)
    left_arm: np.ndarray  # (10, 3) arm_chain_frames("left"): arm base, link1..7, flange, palm (= left_hand[0])
    right_arm: np.ndarray  # (10, 3)

    def hand(self, side: str) -> np.ndarray:
        return self.left_hand if side == "left" else self.right_hand

    def arm(self, side: str) -> np.ndarray:
        return self.left_arm if side == "left" else self.right_arm


# one side's drawn skeleton: arm base..flange (9 points), then the 21 hand points; the flange links to the wrist
_ARM_BONES = np.array([(i, i + 1) for i in range(N_ARM_POINTS - 1)], dtype=np.int64)  # last: flange -> wrist
SIDE_BONES = np.concatenate([_ARM_BONES, HAND_BONES + (N_ARM_POINTS - 1)])  # (29, 2) over 30 points


class Conditioner:
    """Skeleton images of the robot at a joint vector, and of the operator's hands, through the head camera."""

    def __init__(
        self,
        robot: RobotModel,
        intrinsics: CameraIntrinsics,
        style: SkeletonStyle | None = None,
        *,
        arms: bool = True,
        camera_frame: str = DEFAULT_CAMERA_FRAME,
        near: float = DEFAULT_NEAR_CLIP,
    ) -> None:
        """
        Args:
            robot: the robot model (joint order, forward kinematics).
            intrinsics: the head camera's intrinsics at the size of the images to draw.
            style: how joints and bones are drawn (default :class:`SkeletonStyle`).
            arms: draw the arm chains besides the hands.
            camera_frame: the camera's optical frame in the description.
            near: [m] near clip plane.
        """
        self.robot = robot
        self.view = CameraView.from_robot(robot, intrinsics, camera_frame, near)
        self.style = style if style is not None else SkeletonStyle()
        self.arms = bool(arms)
        self._frames = [
            f for side in SIDES for f in (*hand_skeleton.robot_keypoint_frames(side), *arm_chain_frames(side))
        ]
        # the drawn skeleton as rows of the forward-kinematics points (per side: arm base..flange, then the hand)
        # and its bones, fixed by `arms`
        n = hand_skeleton.N_POINTS + N_ARM_POINTS
        rows, bones = [], []
        for k, _ in enumerate(SIDES):
            hand = np.arange(k * n, k * n + hand_skeleton.N_POINTS)
            arm = np.arange(k * n + hand_skeleton.N_POINTS, (k + 1) * n)
            bones.append((SIDE_BONES if self.arms else HAND_BONES) + sum(len(r) for r in rows))
            rows.append(np.concatenate([arm[:-1], hand]) if self.arms else hand)
        self._skeleton_rows = np.concatenate(rows)
        self._skeleton_bones = np.concatenate(bones)

    @property
    def width(self) -> int:
        return int(self.view.intrinsics.width)

    @property
    def height(self) -> int:
        return int(self.view.intrinsics.height)

    def keypoints(self, q: np.ndarray) -> RobotKeypoints:
        """The hands' 21 points and the arm chains at ``q`` (54,) [rad], in ``base_link`` [m]."""
        p = self.robot.forward_kinematics(q, self._frames)[:, :3, 3]
        n = hand_skeleton.N_POINTS + N_ARM_POINTS
        return RobotKeypoints(p[:21], p[n : n + 21], p[21:n], p[n + 21 :])

    def skeleton(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(points (N, 3) [m] in the optical frame, bones (M, 2)) drawn for ``q``: per side, the arm then the hand."""
        p = self.robot.forward_kinematics(q, self._frames)[:, :3, 3]
        return self.view.to_camera(p[self._skeleton_rows]), self._skeleton_bones.copy()

    def blank(self) -> np.ndarray:
        """A black (H, W, 3) uint8 image of the camera's size."""
        return np.zeros((self.height, self.width, 3), dtype=np.uint8)

    def condition_image(self, q: np.ndarray) -> np.ndarray:
        """The skeleton image of the robot at ``q`` (54,) [rad]: (H, W, 3) uint8 RGB on black."""
        points, bones = self.skeleton(q)
        return draw_skeleton(self.blank(), points, bones, self.style, self.view)

    def operator_image(self, skeletons: Sequence[np.ndarray]) -> np.ndarray:
        """The skeleton image of 21-point hand skeletons given in the camera's optical frame [m] (MediaPipe order).

        Non-finite points (undetected joints) and their bones are left out.

        Raises:
            ValueError: a skeleton that is not (21, 3).
        """
        parts = []
        for k, s in enumerate(skeletons):
            s = np.asarray(s, dtype=float)
            if s.shape != (hand_skeleton.N_POINTS, 3):
                raise ValueError(f"operator skeleton {k}: expected shape (21, 3), got {s.shape}")
            parts.append((s, HAND_BONES))
        points, bones = stack_skeletons(parts)
        return draw_skeleton(self.blank(), points, bones, self.style, self.view)
