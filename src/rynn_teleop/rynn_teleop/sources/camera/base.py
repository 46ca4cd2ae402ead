"""Common interface of the head-camera sources (ROS-free).

A source yields :class:`~rynn_teleop.core.camera.CameraFrame` records: an RGB
image and, when the source has depth, a uint16 depth image (conventions in
:mod:`rynn_teleop.core.camera`). :attr:`CameraSource.intrinsics` describes the
colour image; :attr:`CameraSource.depth_intrinsics` the depth image, which
equals it when the depth is registered to the colour image (aligned).

Times are caller-supplied [s] (``now`` arguments), so tests and replays can
drive a source without a wall clock. A new backend is a module of this package
(or an entry point of group ``rynn_teleop.head_camera``) with a subclass of
:class:`CameraSource` decorated ``@CAMERA_BACKENDS.register``: it sets ``name``
and its ``SETTINGS``, builds itself from them and the :class:`CameraContext`
(:meth:`~rynn_teleop.core.plugins.Backend.from_settings`), implements
``start``, ``read`` and ``close``, and sets ``_intrinsics`` (and
``_depth_intrinsics``) in ``start``. The head_camera node offers it as
``backend:=<name>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from ...core.camera import CameraFrame, CameraIntrinsics
from ...core.plugins import BackendRegistry
from ..base import MessageInput as MessageInput  # re-exported: the camera sources' topics besides the joints
from ..base import PolledSource

if TYPE_CHECKING:
    from ...core.robot_model import RobotModel

DEFAULT_MAX_BACKLOG = 30  # [frames] a late read returns at most this many (the newest); older ones are dropped


class CameraContext(NamedTuple):
    """What the head_camera node tells the backend it builds."""

    robot: Callable[[], RobotModel]  # the node's robot description (built on the first call)


class CameraSource(PolledSource[CameraFrame]):
    """A non-blocking supplier of camera frames.

    Life cycle and context manager: :class:`~rynn_teleop.sources.base.PolledSource`.
    """

    #: :meth:`prepare_next` runs on the node's tick between two frames (the node polls twice per frame,
    #: :meth:`poll_rate`); otherwise right after frames were delivered
    prepare_between_frames: ClassVar[bool] = False
    #: measured joint states the frames show (the node subscribes and calls :meth:`set_joint_positions`);
    #: None: the source needs none
    joint_states_topic: str | None = None

    def __init__(self) -> None:
        self._intrinsics: CameraIntrinsics | None = None
        self._depth_intrinsics: CameraIntrinsics | None = None
        self.dropped = 0  # frames skipped because a read came too late (see the source's max_backlog)

    def prepare_next(self) -> None:
        """Do the work of the next :meth:`read` now, off the frame's delivery path (a synthetic scene renders
        its next frame); the node calls it after delivering frames. Default: nothing to prepare."""
        return None

    def poll_rate(self, poll_hz: float) -> float:
        """How often [Hz] the node polls this source, given its ``poll_hz`` parameter (default: that)."""
        return poll_hz

    @property
    def nominal_fps(self) -> float | None:
        """The frame rate [Hz] the node meters the stream against (None: not known ahead, e.g. a replay)."""
        return None

    @property
    def joint_positions(self) -> np.ndarray:
        """(54,) [rad] the joints shown until :meth:`set_joint_positions` (with :attr:`joint_states_topic`)."""
        raise NotImplementedError(f"{type(self).__name__} shows no joints")

    def set_joint_positions(self, q: np.ndarray, stamp: float | None = None) -> None:
        """The measured joints (54,) [rad] the next frames show, stamped ``stamp`` [s] (with
        :attr:`joint_states_topic`)."""
        raise NotImplementedError(f"{type(self).__name__} shows no joints")

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


#: the head_camera node's backends (``backend`` parameter): every module of this package, and entry points of
#: group ``rynn_teleop.head_camera``
CAMERA_BACKENDS = BackendRegistry("head_camera", "head_camera backend", package=__package__, base=CameraSource)

