"""``sensor_msgs/Image`` pixel data as numpy arrays: the one decoder of the project (ROS-free).

Takes any object with the Image fields (``height``, ``width``, ``step``, ``encoding``, ``is_bigendian``,
``data``): an rclpy message, a rosbags one, or a stand-in. Colour comes out as (H, W, 3) uint8 RGB, depth as
(H, W) uint16 [mm].
"""

from __future__ import annotations

from typing import Any

import numpy as np

COLOR_ENCODINGS = ("rgb8", "bgr8", "rgba8", "bgra8", "mono8")
DEPTH_ENCODINGS = ("16UC1", "mono16", "32FC1")
_LAYOUT: dict[str, tuple[type, int]] = {  # encoding -> (element type, channels)
    "rgb8": (np.uint8, 3), "bgr8": (np.uint8, 3), "rgba8": (np.uint8, 4), "bgra8": (np.uint8, 4),
    "mono8": (np.uint8, 1), "16UC1": (np.uint16, 1), "mono16": (np.uint16, 1), "32FC1": (np.float32, 1),
}
_MAX_DEPTH_MM = 65535


def image_view(msg: Any) -> np.ndarray:
    """The pixels of ``msg`` without a copy: (H, W, C) in the encoding's channel order, or (H, W) for one
    channel, of the encoding's element type and byte order (read-only when ``data`` is bytes).

    Raises:
        ValueError: an encoding not in :data:`COLOR_ENCODINGS` or :data:`DEPTH_ENCODINGS`, or a data size
            that does not fit height, width and step.
    """
    enc = str(msg.encoding)
    if enc not in _LAYOUT:
        raise ValueError(f"encoding {enc!r} is not supported; use one of {', '.join(_LAYOUT)}")
    element, channels = _LAYOUT[enc]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    row = w * channels * np.dtype(element).itemsize
    data = _bytes(msg.data)
    if h <= 0 or w <= 0 or step < row or data.size < h * step:
        raise ValueError(f"image data of {data.size} bytes does not fit {w}x{h} {enc} with step {step}")
    rows = data[: h * step].reshape(h, step)[:, :row]
    dtype = np.dtype(element).newbyteorder(">" if msg.is_bigendian else "<")
    if dtype.itemsize > 1 and step % dtype.itemsize:
        rows = np.ascontiguousarray(rows)  # rows that do not start on an element boundary
    pixels = rows.view(dtype)
    return pixels.reshape(h, w, channels) if channels > 1 else pixels.reshape(h, w)


def _bytes(data: Any) -> np.ndarray:
    """``data`` (ndarray, bytes-like, array.array or a list of ints) as a flat uint8 array, a view if it can be."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        return np.asarray(data, dtype=np.uint8).reshape(-1)


def decode_image(msg: Any, depth: bool = False, *, copy: bool = True) -> np.ndarray:
    """The array of ``msg``.

    Colour (``depth=False``): (H, W, 3) uint8 RGB from rgb8, bgr8, rgba8, bgra8 or mono8. Depth: (H, W)
    uint16 [mm] from 16UC1 / mono16 (as is) or 32FC1 [m] (NaN, inf and values outside 0..65.535 m become 0).
    ``copy=False``: a view of the message's data where the encoding allows one (rgb8, bgr8 with its channels
    reversed, native-order 16UC1 / mono16), else a new array.

    Raises:
        ValueError: an encoding of the other kind or unknown, or a data size that does not fit height,
            width and step.
    """
    enc = str(msg.encoding)
    allowed = DEPTH_ENCODINGS if depth else COLOR_ENCODINGS
    if enc not in allowed:
        what = "depth" if depth else "colour"
        raise ValueError(f"encoding {enc!r} is not supported for {what}; use one of {', '.join(allowed)}")
    pixels = image_view(msg)
    if depth:
        if enc == "32FC1":
            mm = np.nan_to_num(pixels.astype(np.float64) * 1000.0, nan=0.0, posinf=0.0, neginf=0.0)
            return np.where((mm > 0) & (mm <= _MAX_DEPTH_MM), np.round(mm), 0).astype(np.uint16)
        return pixels.astype(np.uint16, copy=copy)
    if enc == "mono8":
        return np.repeat(pixels[..., None], 3, axis=2)
    rgb = pixels[..., :3] if enc in ("rgb8", "rgba8") else pixels[..., 2::-1]
    if copy or enc in ("rgba8", "bgra8"):
        return np.array(rgb, order="C")  # always a new array
    return rgb


def resize_rgb(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` ((H, W, 3) uint8 RGB) as (height, width, 3) uint8: area averaging when shrinking, bilinear when
    growing (OpenCV's INTER_AREA / INTER_LINEAR); the same array (no copy) when it already has that size.

    The one resize of camera frames for learned policies: the LeRobot export (``--image-size``) and the policy
    node's observations both call it, so a policy sees at run time the pixels it was trained on.
    """
    h, w = image.shape[:2]
    if (h, w) == (int(height), int(width)):
        return image
    import cv2  # imported here: most users of this module decode only

    interpolation = cv2.INTER_AREA if height <= h and width <= w else cv2.INTER_LINEAR
    return np.ascontiguousarray(cv2.resize(np.ascontiguousarray(image), (int(width), int(height)),
                                           interpolation=interpolation))
