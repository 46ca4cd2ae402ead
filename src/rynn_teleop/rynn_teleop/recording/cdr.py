"""Fields read straight from serialized (CDR) messages, and the few messages written as CDR, without
building rclpy message objects (ROS-free).

Messages whose first field is a ``std_msgs/Header`` (JointState, PoseStamped,
Image, CameraInfo, DiagnosticArray...) start, after the 4-byte CDR
encapsulation header, with ``header.stamp.sec`` (int32) and
``header.stamp.nanosec`` (uint32): the capture time set at the source.
Reading those 12 bytes is all the integrity statistics need (see
:mod:`rynn_teleop.recording.stats`); the feed switch's latency meter uses the
same helper. :func:`pose_array` and :func:`joint_state` read the fields
``arm_ik`` and the drivers use from their raw takes; :func:`pose_array_cdr`
writes the PoseArray the tracker and the hand skeletons publish as bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

HEADER_TYPE = "std_msgs/msg/Header"
_LE = struct.Struct("<iI")
_BE = struct.Struct(">iI")

_has_header: dict[tuple[Any, str], bool] = {}  # (typestore, type name) -> has a header


def header_stamp_ns(raw: bytes | bytearray | memoryview) -> int:
    """``header.stamp`` [ns] of a CDR message whose first field is a std_msgs/Header; 0 if too short.

    Little-endian when bit 0 of the encapsulation kind (``raw[1]``) is set
    (CDR_LE 0x01, PL_CDR_LE 0x03, CDR2_LE 0x07...), big-endian otherwise.
    """
    if len(raw) < 12:
        return 0
    sec, nanosec = (_LE if raw[1] & 1 else _BE).unpack_from(raw, 4)
    return sec * 1_000_000_000 + nanosec


_U32 = {True: struct.Struct("<I"), False: struct.Struct(">I")}


def first_name_after_header(raw: bytes | bytearray | memoryview) -> bytes:
    """The first string of the ``string[]`` field right after a std_msgs/Header (JointState's first joint
    name), as bytes without its NUL; ``b""`` if the sequence is empty or the message too short.

    Layout (offsets from the start of the data, after the 4-byte encapsulation header): stamp (8 bytes),
    ``frame_id`` (uint32 length with the NUL, the bytes), padding to 4, the sequence length (uint32), then
    the first string (uint32 length with the NUL, the bytes).
    """
    u32 = _U32[bool(raw[1] & 1)] if len(raw) >= 2 else _U32[True]
    try:
        pos = 4 + 8
        (n,) = u32.unpack_from(raw, pos)
        pos += 4 + n
        pos = 4 + ((pos - 4 + 3) & ~3)
        (count,) = u32.unpack_from(raw, pos)
        if count == 0:
            return b""
        (n,) = u32.unpack_from(raw, pos + 4)
        return bytes(raw[pos + 8: pos + 8 + max(n - 1, 0)])
    except struct.error:
        return b""


def has_header(typestore: Any, type_name: str) -> bool:
    """True if ``type_name``'s first field is ``header: std_msgs/msg/Header`` in ``typestore`` (cached per type).

    Unknown types have no header as far as the statistics are concerned.
    """
    key = (typestore, type_name)
    found = _has_header.get(key)
    if found is None:
        found = False
        fielddefs = getattr(typestore, "fielddefs", {}).get(type_name)
        if fielddefs and fielddefs[1]:
            name, (_, detail) = fielddefs[1][0]
            found = name == "header" and detail == HEADER_TYPE
        _has_header[key] = found
    return found


def pose_array(raw: bytes | bytearray | memoryview) -> tuple[int, np.ndarray, np.ndarray]:
    """A serialized (CDR) ``geometry_msgs/PoseArray`` -> (``header.stamp`` [ns], positions (n, 3) [m],
    quaternions (n, 4) (x, y, z, w)), without building the message.

    Layout (offsets from the start of the data, after the 4-byte encapsulation header): stamp (8 bytes),
    ``frame_id`` (uint32 length with the NUL, the bytes), padding to 4, the pose count (uint32), padding to 8,
    then 7 float64 per pose (position x, y, z, orientation x, y, z, w).

    Raises:
        ValueError: the bytes are too short for the header or for the poses they announce.
    """
    if len(raw) < 16:
        raise ValueError(f"a PoseArray needs at least 16 bytes, got {len(raw)}")
    little = bool(raw[1] & 1)
    u32 = _U32[little]
    sec, nanosec = (_LE if little else _BE).unpack_from(raw, 4)
    (n,) = u32.unpack_from(raw, 12)
    pos = 4 + ((12 + n + 3) & ~3)
    if pos + 4 > len(raw):
        raise ValueError("PoseArray bytes end inside the header")
    (count,) = u32.unpack_from(raw, pos)
    if count == 0:
        return sec * 1_000_000_000 + nanosec, np.empty((0, 3)), np.empty((0, 4))
    start = 4 + ((pos + 7) & ~7)  # the first float64, aligned to 8 from the start of the data
    if start + 56 * count > len(raw):
        raise ValueError(f"PoseArray announces {count} poses but holds {max(len(raw) - start, 0)} bytes of them")
    values = np.frombuffer(raw, dtype="<f8" if little else ">f8", count=7 * count, offset=start).reshape(count, 7)
    return sec * 1_000_000_000 + nanosec, values[:, :3].astype(float), values[:, 3:].astype(float)


def joint_state(raw: bytes | bytearray | memoryview, names: dict[bytes, tuple[str, ...]] | None = None
                ) -> tuple[int, tuple[str, ...], np.ndarray]:
    """A serialized (CDR) ``sensor_msgs/JointState`` -> (``header.stamp`` [ns], ``name``, ``position`` (n,)),
    without building the message (velocity and effort are not read).

    ``names``: a cache from the bytes of the ``name`` field to its decoded tuple, filled here; a stream of
    messages naming the same joints then decodes the names once.

    Layout (offsets from the start of the data, after the 4-byte encapsulation header): stamp (8 bytes),
    ``frame_id`` (uint32 length with the NUL, the bytes), then ``name``: padding to 4, the count (uint32) and
    per name, padded to 4, its length (uint32, with the NUL) and bytes; then ``position``: padding to 4, the
    count (uint32), padding to 8, the float64 values.

    Raises:
        ValueError: the bytes end before the fields they announce, or a name is not UTF-8.
    """
    if len(raw) < 16:
        raise ValueError(f"a JointState needs at least 16 bytes, got {len(raw)}")
    little = bool(raw[1] & 1)
    u32 = _U32[little]
    size = len(raw) - 4
    try:
        sec, nanosec = (_LE if little else _BE).unpack_from(raw, 4)
        (n,) = u32.unpack_from(raw, 12)
        at = (8 + 4 + n + 3) & ~3  # data offsets from here on
        names_start = at
        (count,) = u32.unpack_from(raw, 4 + at)
        at += 4
        for _ in range(count):
            at = (at + 3) & ~3
            (n,) = u32.unpack_from(raw, 4 + at)
            at += 4 + n
        if at > size:
            raise ValueError("JointState bytes end inside its names")
        key = bytes(raw[4 + names_start: 4 + at])
        at = (at + 3) & ~3
        (npos,) = u32.unpack_from(raw, 4 + at)
        at += 4
    except struct.error:
        raise ValueError("JointState bytes end inside its header or names") from None
    if npos:
        at = (at + 7) & ~7
    if at + 8 * npos > size:
        raise ValueError(f"JointState announces {npos} positions but holds {max(size - at, 0)} bytes of them")
    decoded = None if names is None else names.get(key)
    if decoded is None:
        decoded = _decode_names(key, u32)
        if names is not None:
            names[key] = decoded
    position = np.frombuffer(raw, dtype="<f8" if little else ">f8", count=npos, offset=4 + at).astype(float)
    return sec * 1_000_000_000 + nanosec, decoded, position


def _decode_names(block: bytes, u32: struct.Struct) -> tuple[str, ...]:
    """The strings of a CDR ``string[]`` whose bytes (from its count, at a 4-aligned data offset) are ``block``."""
    (count,) = u32.unpack_from(block, 0)
    at, out = 4, []
    for _ in range(count):
        at = (at + 3) & ~3
        (n,) = u32.unpack_from(block, at)
        try:
            out.append(block[at + 4: at + 4 + max(n - 1, 0)].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"JointState name {len(out)} is not UTF-8: {exc}") from None
        at += 4 + n
    return tuple(out)


_CDR_LE = b"\x00\x01\x00\x00"  # encapsulation: plain CDR, little-endian
_pose_array_heads: dict[str, tuple[bytes, int]] = {}  # frame_id -> (frame_id and padding bytes, data offset after)


def pose_array_cdr(stamp_ns: int, frame_id: str, positions: np.ndarray, quaternions: np.ndarray | None = None) -> bytes:
    """The serialized (CDR, little-endian) ``geometry_msgs/PoseArray`` of ``positions`` (n, 3) [m] and
    ``quaternions`` (n, 4) (x, y, z, w; None: identity) stamped ``stamp_ns`` [ns] in ``frame_id``: what a
    publisher sends as it is (``Publisher.publish(bytes)``), without building the message. The layout is
    :func:`pose_array`'s.
    """
    head = _pose_array_heads.get(frame_id)
    if head is None:
        name = frame_id.encode("utf-8") + b"\0"
        at = 8 + 4 + len(name)  # data offset after stamp, frame_id
        head = (struct.pack("<I", len(name)) + name + b"\0" * (-at % 4), (at + 3) & ~3)
        _pose_array_heads[frame_id] = head
    frame, at = head
    n = len(positions)
    values = np.empty((n, 7), dtype="<f8")
    values[:, :3] = positions
    if quaternions is None:
        values[:, 3:6] = 0.0
        values[:, 6] = 1.0
    else:
        values[:, 3:] = quaternions
    at += 4  # the pose count
    sec, nanosec = divmod(int(stamp_ns), 1_000_000_000)
    return b"".join((_CDR_LE, _LE.pack(sec, nanosec), frame, struct.pack("<I", n), b"\0" * (-at % 8),
                     values.tobytes()))
