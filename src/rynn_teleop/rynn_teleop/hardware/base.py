"""The interface every joint backend implements (vendor SDK adapters and the simulation).

A driver node owns one backend and, every control cycle, calls :meth:`JointBackend.read`
(publishes the measurement), runs the safety layer (``core.safety``) and calls
:meth:`JointBackend.write` with the target actually sent. Joint order is the
backend's :attr:`joint_names` (canonical names); units are SI (radians, rad/s,
N·m or A for effort), whatever the vendor uses inside.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import numpy as np


class JointReading(NamedTuple):
    """One measurement of the backend's joints."""

    position: np.ndarray  # (n,) [rad]
    velocity: np.ndarray | None  # (n,) [rad/s] or None if the hardware does not report it
    effort: np.ndarray | None  # (n,) [N·m] (arms) or [A] (Wuji motor current), or None
    stamp: float  # [s] capture time (the caller's clock)


class JointBackend(ABC):
    """Hardware (or simulated hardware) for a fixed list of joints.

    Life cycle: ``connect()`` (raises ``HardwareUnavailableError`` naming what is
    missing: SDK path, module, device, controller), ``enable()``, then per cycle
    ``read()`` / ``write(targets)``; ``stop()`` is the emergency stop (must be
    safe to call at any time, repeatedly); ``disable()`` and ``close()`` on
    shutdown (idempotent). Usable as a context manager (``__exit__`` closes).
    """

    kind: ClassVar[str]  # e.g. "sim", "marvin", "wuji"
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

    def __enter__(self) -> JointBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
