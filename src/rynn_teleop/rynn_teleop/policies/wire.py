"""The framing of the messages between a policy runner and its worker process (stdlib and numpy only).

Both ends import this file: the runner in the stack's Python (3.11, numpy 2.4) and the LeRobot worker in
LeRobot's own Python (3.12, numpy 2.2), which loads it by file location, not as part of the package. So it
must import nothing but the standard library and numpy, and never pickles: arrays cross as raw bytes
described in the header, which any numpy version reads the same.

One message on a byte stream::

    4 bytes   N, the header's length [bytes], unsigned big-endian
    N bytes   the header: a UTF-8 JSON object; its "arrays" entry lists the arrays that follow
              ([{"key": str, "dtype": "<f4", "shape": [..]}, ...], in order)
    ...       each array's bytes, C order, little-endian, back to back (size = itemsize x prod(shape))

Only boolean, integer, float and complex arrays cross (no object, string or structured dtypes).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any, BinaryIO, NamedTuple

import numpy as np

MAX_HEADER_BYTES = 1 << 24  # [bytes] a longer header is a corrupt stream, not a message
MAX_ARRAY_BYTES = 1 << 31  # [bytes] per array: larger is a corrupt stream (a 4K RGB frame is 25 MB)
_LENGTH = struct.Struct(">I")
_KINDS = "biufc"  # numpy dtype kinds that may cross: bool, signed, unsigned, float, complex


class WireError(Exception):
    """A stream that does not hold a well-formed message (or an array that cannot be sent)."""


class Message(NamedTuple):
    """One decoded message."""

    header: dict[str, Any]  # the JSON header, without its "arrays" entry
    arrays: dict[str, np.ndarray]  # key -> array (writable, native byte order), in the order sent


def _wire_array(key: str, value: Any) -> np.ndarray:
    """``value`` as a C-contiguous little-endian array, or WireError naming ``key``."""
    array = np.asarray(value)
    if array.dtype.kind not in _KINDS or array.dtype.fields is not None:
        raise WireError(f"array {key!r} has dtype {array.dtype}, which does not cross the wire "
                        "(bool, int, uint, float and complex only)")
    little = array.dtype.newbyteorder("<")
    return np.asarray(array, dtype=little, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)


def encode(header: Mapping[str, Any], arrays: Mapping[str, Any] | None = None) -> list[bytes | memoryview]:
    """The buffers of one message, to be written in order.

    Args:
        header: JSON-serialisable values (its key "arrays" is reserved).
        arrays: key -> array-like (see the module docstring for the dtypes that cross).

    Raises:
        WireError: a header that is not JSON, uses "arrays", or an array that cannot cross.
    """
    if "arrays" in header:
        raise WireError("the header key 'arrays' is reserved for the array list")
    wired = {str(k): _wire_array(str(k), v) for k, v in (arrays or {}).items()}
    meta = [{"key": k, "dtype": a.dtype.str, "shape": list(a.shape)} for k, a in wired.items()]
    try:
        text = json.dumps({**header, "arrays": meta}, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise WireError(f"the header is not JSON-serialisable: {exc}") from exc
    head = text.encode("utf-8")
    if len(head) > MAX_HEADER_BYTES:
        raise WireError(f"the header is {len(head)} bytes, more than {MAX_HEADER_BYTES}")
    out: list[bytes | memoryview] = [_LENGTH.pack(len(head)), head]
    for a in wired.values():
        if a.nbytes:
            out.append(memoryview(a.reshape(-1).view(np.uint8)))
    return out


def write_message(stream: BinaryIO, header: Mapping[str, Any], arrays: Mapping[str, Any] | None = None) -> None:
    """Write one message to the buffered binary ``stream`` and flush it (see :func:`encode`)."""
    for buffer in encode(header, arrays):
        stream.write(buffer)
    stream.flush()


def _read_into(stream: BinaryIO, buffer: memoryview, *, at_start: bool = False) -> bool:
    """Fill ``buffer`` from ``stream``. False at a clean end of stream before the first byte (``at_start``)."""
    done = 0
    while done < len(buffer):
        got = stream.readinto(buffer[done:])
        if not got:
            if at_start and done == 0:
                return False
            raise WireError(f"the stream ended inside a message ({done} of {len(buffer)} bytes read)")
        done += got
    return True


def read_message(stream: BinaryIO) -> Message | None:
    """The next message of the binary ``stream``; None at the end of the stream (between messages).

    Raises:
        WireError: the stream ends inside a message or holds something else than a message.
    """
    prefix = bytearray(_LENGTH.size)
    if not _read_into(stream, memoryview(prefix), at_start=True):
        return None
    (length,) = _LENGTH.unpack(prefix)
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a header of {length} bytes announced (at most {MAX_HEADER_BYTES}): not a message stream")
    head = bytearray(length)
    _read_into(stream, memoryview(head))
    try:
        header = json.loads(head.decode("utf-8"))
        meta = header.pop("arrays")
        specs = [(str(m["key"]), np.dtype(m["dtype"]), tuple(int(n) for n in m["shape"])) for m in meta]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WireError(f"a malformed header: {exc!r}") from exc
    arrays: dict[str, np.ndarray] = {}
    for key, dtype, shape in specs:
        if dtype.kind not in _KINDS or dtype.fields is not None or any(n < 0 for n in shape):
            raise WireError(f"array {key!r}: dtype {dtype} / shape {shape} does not cross the wire")
        nbytes = dtype.itemsize * math.prod(shape)
        if nbytes > MAX_ARRAY_BYTES:
            raise WireError(f"array {key!r} of {nbytes} bytes announced (at most {MAX_ARRAY_BYTES})")
        buffer = bytearray(nbytes)
        _read_into(stream, memoryview(buffer))
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        arrays[key] = array if dtype.isnative else array.astype(dtype.newbyteorder("="))
    return Message(header, arrays)
