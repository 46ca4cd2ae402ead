"""Camera data shapes: pinhole intrinsics, one captured frame, "WxHxFPS" profiles (ROS-free).

Conventions (those of ``sensor_msgs/CameraInfo`` and realsense-ros):

* pixel coordinates (u, v): u to the right, v down, origin at the CENTRE of
  the top-left pixel (OpenCV's convention);
* the optical frame: x right, y down, z forward (``camera_color_optical_frame``);
* colour images are RGB (channel 0 is red), uint8, shape (H, W, 3);
* depth images are uint16 in units of ``depth_scale`` metres (1 mm for the
  RealSense D400 series and every source here), 0 = no measurement; the depth
  value is the z coordinate in the optical frame, not the range along the ray.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np

from ..errors import ConfigurationError

DEFAULT_FOCAL_PER_WIDTH = 615.0 / 640.0  # [px] / [px]: D435 colour focal length ~615 px at 640 px width
DEFAULT_DEPTH_SCALE = 0.001  # [m] per depth unit (1 mm)
DISTORTION_MODELS = ("plumb_bob", "rational_polynomial", "equidistant")
"""``CameraInfo.distortion_model`` values used here (``sensor_msgs/distortion_models.hpp``)."""


class CameraIntrinsics(NamedTuple):
    """Pinhole intrinsics of one image stream (the fields of ``sensor_msgs/CameraInfo``)."""

    width: int  # [px]
    height: int  # [px]
    fx: float  # [px] focal length along u
    fy: float  # [px] focal length along v
    cx: float  # [px] principal point, u (pixel-centre origin)
    cy: float  # [px] principal point, v
    distortion_model: str = "plumb_bob"
    coeffs: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)  # CameraInfo.d: plumb_bob (k1, k2, t1, t2, k3)

    def K(self) -> np.ndarray:
        """(3, 3) camera matrix [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] (CameraInfo.k)."""
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    def P(self) -> np.ndarray:
        """(3, 4) projection matrix [K | 0] of a monocular camera (CameraInfo.p)."""
        return np.hstack([self.K(), np.zeros((3, 1))])

    def scaled(self, width: int, height: int) -> CameraIntrinsics:
        """The intrinsics of the same camera after resizing its images to ``width`` x ``height`` [px].

        Focal lengths scale with the size; the principal point maps like
        ``cv2.resize`` maps pixel centres: c' = (c + 0.5) * s - 0.5. Distortion
        coefficients act on normalised coordinates and are kept.

        Raises:
            ConfigurationError: a size that is not positive.
        """
        width, height = int(width), int(height)
        if width <= 0 or height <= 0:
            raise ConfigurationError(f"camera intrinsics: cannot scale to {width}x{height}; sizes must be > 0")
        sx, sy = width / self.width, height / self.height
        return self._replace(
            width=width,
            height=height,
            fx=self.fx * sx,
            fy=self.fy * sy,
            cx=(self.cx + 0.5) * sx - 0.5,
            cy=(self.cy + 0.5) * sy - 0.5,
        )

    def check(self) -> CameraIntrinsics:
        """Itself, once its values are checked (positive sizes and focal lengths, finite numbers).

        Raises:
            ConfigurationError: naming the bad field.
        """
        if int(self.width) <= 0 or int(self.height) <= 0:
            raise ConfigurationError(f"camera intrinsics: size {self.width}x{self.height} must be positive")
        for name in ("fx", "fy", "cx", "cy"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or (name in ("fx", "fy") and value <= 0.0):
                raise ConfigurationError(f"camera intrinsics: {name} = {value} is not a finite (positive) number")
        if not all(math.isfinite(float(c)) for c in self.coeffs):
            raise ConfigurationError(f"camera intrinsics: distortion coefficients {self.coeffs} are not finite")
        return self


def default_intrinsics(width: int, height: int) -> CameraIntrinsics:
    """Intrinsics of a RealSense D435 colour camera at ``width`` x ``height`` [px], without distortion.

    The law used when nothing better is known (the synthetic scene, a video
    or image folder, a bag without ``CameraInfo``): fx = fy = 615 * width / 640
    [px], cx = width / 2, cy = height / 2, plumb_bob with zero coefficients.
    """
    focal = DEFAULT_FOCAL_PER_WIDTH * int(width)
    return CameraIntrinsics(int(width), int(height), focal, focal, width / 2.0, height / 2.0).check()


class CameraFrame(NamedTuple):
    """One captured image, with its depth image when the source has depth."""

    stamp: float  # [s] capture time on the caller's clock (the ``now`` values given to read)
    color: np.ndarray  # (H, W, 3) uint8 RGB
    depth: np.ndarray | None = None  # (H', W') uint16 in depth_scale units (mm), 0 = invalid; None without depth
    depth_scale: float = DEFAULT_DEPTH_SCALE  # [m] per depth unit


class Profile(NamedTuple):
    """A stream profile, as written "WIDTHxHEIGHTxFPS"."""

    width: int  # [px]
    height: int  # [px]
    fps: int  # [Hz]

    def __str__(self) -> str:
        return f"{self.width}x{self.height}x{self.fps}"


_PROFILE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_profile(text: str) -> Profile:
    """``"640x480x30"`` -> ``Profile(width=640, height=480, fps=30)`` (realsense-ros syntax).

    Raises:
        ConfigurationError: anything but three positive integers joined by 'x'.
    """
    match = _PROFILE.match(str(text))
    values = tuple(int(g) for g in match.groups()) if match else ()
    if not values or min(values) <= 0:
        raise ConfigurationError(
            f"bad camera profile {text!r}: expected WIDTHxHEIGHTxFPS with positive integers, e.g. '640x480x30'"
        )
    return Profile(*values)


def profile_problem(text: str) -> str | None:
    """A :attr:`~.params.Param.check` of a profile parameter: None if :func:`parse_profile` reads it."""
    try:
        parse_profile(text)
    except ConfigurationError:
        return "is not WIDTHxHEIGHTxFPS with positive integers, e.g. '640x480x30'"
    return None
