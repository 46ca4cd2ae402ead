"""HTC Vive trackers through SteamVR / OpenVR (the ``openvr`` PyPI package).

OpenVR's tracking world is right-handed, in metres, with +y UP, +x to the
right and -z forward of the play area's (``standing``) or seated zero pose's
(``seated``) reference; it is NOT z-up. Nothing here converts it: the
calibration downstream maps whatever world frame a source reports onto the
robot. Only generic trackers are reported (no HMD, controllers or base
stations); their sample stamp is the ``now`` given to :meth:`OpenVRSource.read`
(OpenVR is polled for the current pose, no prediction).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ...core.params import Param
from ...core.trackers import TrackerSample
from ...errors import ConfigurationError, HardwareUnavailableError
from .base import TRACKER_BACKENDS, TrackerSource

_LOG = logging.getLogger(__name__)

UNIVERSES = {
    "standing": "TrackingUniverseStanding",
    "seated": "TrackingUniverseSeated",
    "raw": "TrackingUniverseRawAndUncalibrated",
}

_FALLBACK = "use backend:=synthetic or backend:=replay to run without trackers"


@TRACKER_BACKENDS.register
class OpenVRSource(TrackerSource):
    """Poses of every connected, validly tracked Vive tracker, one per device per read.

    A device whose pose is bit-identical to the one it last emitted is
    skipped (a frozen pose is not new data, so consumers see it go stale).
    """

    name = "openvr"
    SETTINGS = (Param("universe", str, "standing", "OpenVR tracking universe", choices=tuple(UNIVERSES)),)

    def __init__(
        self, universe: str = "standing", world_frame: str = "vive_world", openvr_module: Any = None
    ) -> None:
        """
        Args:
            universe: OpenVR tracking universe: "standing", "seated" or "raw".
            world_frame: frame id given to the OpenVR tracking world.
            openvr_module: the ``openvr`` module or a stand-in with the same
                attributes (tests); default: ``import openvr`` in :meth:`start`.

        Raises:
            ConfigurationError: unknown universe.
        """
        super().__init__(world_frame)
        if universe not in UNIVERSES:
            raise ConfigurationError(
                f"openvr tracker source: unknown universe {universe!r}; choose one of {', '.join(UNIVERSES)}"
            )
        self.universe = universe
        self._ov: Any = openvr_module
        self._vr: Any = None  # IVRSystem while initialised
        self._universe: Any = None
        self._class: dict[int, int] = {}  # device index -> device class, once known
        self._serial: dict[int, str] = {}  # device index -> serial
        self._last: dict[int, np.ndarray] = {}  # device index -> last emitted (3, 4)
        self._failed_serial: set[int] = set()  # indices whose serial lookup failed (logged once)

    def start(self, now: float) -> None:
        """Connect to the running SteamVR.

        Raises:
            HardwareUnavailableError: the ``openvr`` package or its native library
                cannot be loaded, or the OpenVR runtime is missing or SteamVR is
                not running (``openvr.init`` failed).
        """
        if self._vr is not None:
            return
        ov = self._ov
        if ov is None:
            try:
                import openvr as ov  # optional dependency
            except Exception as exc:  # ImportError, or OSError for a missing libopenvr_api
                raise HardwareUnavailableError(
                    f"the 'openvr' Python package cannot be loaded ({type(exc).__name__}: {exc}); "
                    f"install it (pip install openvr) or {_FALLBACK}"
                ) from exc
            self._ov = ov
        try:
            vr = ov.init(ov.VRApplication_Other)
        except Exception as exc:  # openvr.OpenVRError subclasses, e.g. InitError_Init_PathRegistryNotFound
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise HardwareUnavailableError(
                f"SteamVR / the OpenVR runtime is missing or not running (openvr.init failed: {detail}); "
                f"start SteamVR with the trackers paired, or {_FALLBACK}"
            ) from exc
        self._vr = vr
        self._universe = getattr(ov, UNIVERSES[self.universe])
        self._class.clear()
        self._serial.clear()
        self._last.clear()
        _LOG.info("OpenVR initialised (universe %s)", self.universe)

    def _device_serial(self, index: int) -> str | None:
        serial = self._serial.get(index)
        if serial is None:
            try:
                serial = str(self._vr.getStringTrackedDeviceProperty(index, self._ov.Prop_SerialNumber_String))
            except Exception as exc:  # noqa: BLE001 - TrackedPropertyError, a device that just left, ...: retried
                if index not in self._failed_serial:
                    _LOG.warning("OpenVR: no serial number for device %d yet (%s)", index, exc)
                    self._failed_serial.add(index)
                return None
            if not serial:
                return None
            self._serial[index] = serial
        return serial

    def _is_tracker(self, index: int) -> bool:
        cls = self._class.get(index)
        if cls is None:
            cls = self._vr.getTrackedDeviceClass(index)
            if cls != getattr(self._ov, "TrackedDeviceClass_Invalid", 0):
                self._class[index] = cls  # a slot keeps its class for the session
        return cls == self._ov.TrackedDeviceClass_GenericTracker

    def read(self, now: float) -> list[TrackerSample]:
        """Current pose of each tracker that moved since the last read; stamp = ``now`` [s]."""
        if self._vr is None:
            raise RuntimeError("OpenVRSource.read() called before start() or after close()")
        ov = self._ov
        poses = self._vr.getDeviceToAbsoluteTrackingPose(self._universe, 0, ov.k_unMaxTrackedDeviceCount)
        out: list[TrackerSample] = []
        for index in range(min(len(poses), ov.k_unMaxTrackedDeviceCount)):
            pose = poses[index]
            if not (pose.bDeviceIsConnected and pose.bPoseIsValid) or not self._is_tracker(index):
                continue
            m = pose.mDeviceToAbsoluteTracking
            top = np.array([[m[r][c] for c in range(4)] for r in range(3)], dtype=float)
            last = self._last.get(index)
            if last is not None and np.array_equal(last, top):
                continue
            serial = self._device_serial(index)
            if serial is None:
                continue
            self._last[index] = top
            T = np.eye(4)
            T[:3, :] = top
            out.append(TrackerSample(serial, float(now), T))
            self._saw(serial)
        return out

    def close(self) -> None:
        """Shut OpenVR down if it was initialised (idempotent)."""
        if self._vr is None:
            return
        self._vr = None
        try:
            self._ov.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down must not raise from a node's cleanup
            _LOG.warning("openvr.shutdown() failed: %s", exc)
