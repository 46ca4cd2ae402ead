"""The interface every joint backend implements (vendor SDK adapters and the simulation).

A driver node owns one backend and, every control cycle, calls :meth:`JointBackend.read`
(publishes the measurement), runs the safety layer (``core.safety``) and calls
:meth:`JointBackend.write` with the target actually sent. Joint order is the
backend's :attr:`joint_names` (canonical names); units are SI (radians, rad/s,
N·m or A for effort), whatever the vendor uses inside.

The arm_driver and hand_driver nodes choose their backend by name (``backend`` parameter) from
:data:`ARM_BACKENDS` and :data:`HAND_BACKENDS`. A new backend is a module of this package (or an entry point
of group ``rynn_teleop.arm_driver`` / ``rynn_teleop.hand_driver``) with a subclass of :class:`JointBackend`
decorated ``@ARM_BACKENDS.register`` (or ``HAND_BACKENDS``): it sets ``name`` and its ``SETTINGS`` and builds
itself from them and the :class:`DriverContext` (:meth:`~rynn_teleop.core.plugins.Backend.from_settings`).
A vendor SDK is imported in :meth:`JointBackend.connect`, not at import.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from ..core.plugins import Backend, BackendRegistry

if TYPE_CHECKING:
    from ..core.robot_model import JointLimits


class JointReading(NamedTuple):
    """One measurement of the backend's joints."""

    position: np.ndarray  # (n,) [rad]
    velocity: np.ndarray | None  # (n,) [rad/s] or None if the hardware does not report it
    effort: np.ndarray | None  # (n,) [N·m] (arms) or [A] (Wuji motor current), or None
    stamp: float  # [s] capture time (the caller's clock)


class DriverContext(NamedTuple):
    """What a driver node tells the backend it builds."""

    joint_names: tuple[str, ...]  # the joints driven, canonical names, in the backend's order
    limits: JointLimits  # their limits (position [rad], velocity [rad/s], acceleration [rad/s^2])
    sides: tuple[str, ...]  # the arms or hands driven, in joint order
    rate_hz: float  # [Hz] the node's control rate (read and write once per cycle)
    #: monotonic time [s] for rate limiting the writes: the node gives the due time of its control loop's
    #: current tick (its deadline grid: a late tick and the on-time one after it count one period apart, as the
    #: loop meant them); None: ``time.monotonic``
    clock: Callable[[], float] | None = None


class JointBackend(Backend, ABC):
    """Hardware (or simulated hardware) for a fixed list of joints.

    Life cycle: ``connect()`` (raises ``HardwareUnavailableError`` naming what is
    missing: SDK path, module, device, controller), ``enable()``, then per cycle
    ``read()`` / ``write(targets)``; ``stop()`` is the emergency stop (must be
    safe to call at any time, repeatedly); ``disable()`` and ``close()`` on
    shutdown (idempotent). Usable as a context manager (``__exit__`` closes).

    The driver node's lifecycle transitions make these calls (``core.lifecycle``): configure ``connect()``,
    activate ``enable()`` (skipped while the e-stop is latched), deactivate ``stop()`` then ``disable()``,
    cleanup and shutdown ``stop()`` then ``close()``. While inactive (connected, not enabled) the node calls
    ``read()``, ``faults()``, ``status()`` and ``stop()``, never ``write()``. A backend is built once per node
    and may be connected again after ``close()`` (cleanup, then configure).
    """

    name: ClassVar[str]  # the backend name, e.g. "sim", "marvin", "wuji"
    joint_names: tuple[str, ...]

    @abstractmethod
    def connect(self) -> None:
        """Open the connection; raise HardwareUnavailableError with a clear message when impossible."""

    @abstractmethod
    def enable(self) -> None:
        """Servo on / position-following mode, holding the current position."""

    @abstractmethod
    def read(self, now: float) -> JointReading:
        """The newest measurement (non-blocking). ``now`` [s] stamps it when the hardware gives no time."""

    @abstractmethod
    def write(self, position: np.ndarray) -> None:
        """Send joint position targets (n,) [rad] (already within the limits; non-blocking)."""

    @abstractmethod
    def stop(self) -> None:
        """Emergency stop: halt motion now (vendor soft stop). Idempotent."""

    @abstractmethod
    def disable(self) -> None:
        """Servo off / idle. Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Release the hardware (disable first if still enabled). Idempotent."""

    def status(self) -> Mapping[str, Any]:
        """Key/values for diagnostics (mode, error codes, temperatures, ...)."""
        return {}

    def faults(self) -> list[str]:
        """Current faults in words (empty when healthy); the node reports them as ERROR."""
        return []

    def discontinuity(self) -> bool:
        """True (once) when the measured joints jumped since the last call without being driven there (a
        simulation reset): the driver then restarts its safety layer from the measurement. Hardware: never."""
        return False

    def __enter__(self) -> JointBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: the arm_driver node's backends: every module of this package, and entry points of group ``rynn_teleop.arm_driver``
ARM_BACKENDS = BackendRegistry("arm_driver", "arm_driver backend", package=__package__, base=JointBackend)
#: the hand_driver node's backends: every module of this package, and entry points of group
#: ``rynn_teleop.hand_driver``
HAND_BACKENDS = BackendRegistry("hand_driver", "hand_driver backend", package=__package__, base=JointBackend)
