"""Common interface of the head-camera sources (ROS-free).

A source yields :class:`~rynn_teleop.core.camera.CameraFrame` records: an RGB
image and, when the source has depth, a uint16 depth image (conventions in
:mod:`rynn_teleop.core.camera`). :attr:`CameraSource.intrinsics` describes the
colour image; :attr:`CameraSource.depth_intrinsics` the depth image, which
equals it when the depth is registered to the colour image (aligned).

Times are caller-supplied [s] (``now`` arguments), so tests and replays can
drive a source without a wall clock. A new backend subclasses
:class:`CameraSource`, sets ``kind``, implements ``start``, ``read`` and
``close``, and sets ``_intrinsics`` (and ``_depth_intrinsics``) in ``start``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping

from ...core.camera import CameraFrame, CameraIntrinsics

DEFAULT_MAX_BACKLOG = 30  # [frames] a late read returns at most this many (the newest); older ones are dropped


class CameraSource(ABC):
    """A non-blocking supplier of camera frames.

    Life cycle: construct (cheap, no device or file access) -> :meth:`start`
    -> any number of :meth:`read` -> :meth:`close`. Used as a context manager,
    ``__enter__`` returns the source *without* starting it and ``__exit__``
    closes it.
    """

    kind: ClassVar[str]  # "synthetic" | "replay" | "realsense"

    def __init__(self) -> None:
        self._intrinsics: CameraIntrinsics | None = None
        self._depth_intrinsics: CameraIntrinsics | None = None
        self.dropped = 0  # frames skipped because a read came too late (see the source's max_backlog)

    @abstractmethod
    def start(self, now: float) -> None:
        """Open the device or file at time ``now`` [s]; :attr:`intrinsics` is valid afterwards.

        Raises:
            HardwareUnavailableError: the SDK, runtime or device is missing.
            ConfigurationError: the configuration does not fit what was found.
        """

    @abstractmethod
    def read(self, now: float) -> list[CameraFrame]:
        """Every frame captured since the previous call, oldest first (never blocks).

        Raises RuntimeError when called before :meth:`start` or after :meth:`close`.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the device or file; calling it again does nothing."""

    @property
    def intrinsics(self) -> CameraIntrinsics:
        """Intrinsics of the colour images (valid after :meth:`start`; RuntimeError before)."""
        if self._intrinsics is None:
            raise RuntimeError(f"{type(self).__name__}.intrinsics is known only after start()")
        return self._intrinsics

    @property
    def depth_intrinsics(self) -> CameraIntrinsics | None:
        """Intrinsics of the depth images, None when the source gives no depth (valid after :meth:`start`)."""
        if self._intrinsics is None:
            raise RuntimeError(f"{type(self).__name__}.depth_intrinsics is known only after start()")
        return self._depth_intrinsics

    @property
    def has_depth(self) -> bool:
        """True when the frames carry depth images (valid after :meth:`start`)."""
        return self.depth_intrinsics is not None

    def diagnostics(self) -> Mapping[str, Any]:
        """Key/values for the node's diagnostics (restarts, errors, dropped frames, ...)."""
        return {"dropped": self.dropped}

    def __enter__(self) -> "CameraSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
