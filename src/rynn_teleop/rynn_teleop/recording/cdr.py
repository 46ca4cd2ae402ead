"""Header stamps straight from serialized (CDR) messages, without deserializing them (ROS-free).

Messages whose first field is a ``std_msgs/Header`` (JointState, PoseStamped,
Image, CameraInfo, DiagnosticArray...) start, after the 4-byte CDR
encapsulation header, with ``header.stamp.sec`` (int32) and
``header.stamp.nanosec`` (uint32): the capture time set at the source.
Reading those 12 bytes is all the integrity statistics need (see
:mod:`rynn_teleop.recording.stats`).
The feed switch's latency meter uses the same helper.
"""

from __future__ import annotations

import struct
from typing import Any

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
