"""The interface every world-model backend implements (ROS-free, torch-free).

A backend turns a stream of actions into head-camera frames (RGB uint8, (height, width, 3)):

* :meth:`Generator.reset` starts a stream from a reference frame (what the head camera sees before the robot
  moves);
* :meth:`Generator.step` takes one action (the 54-D joint vector in
  :class:`~rynn_teleop.core.robot_model.RobotModel` joint order, [rad]) and its condition image, and returns
  the frames complete now, in action order: one per step for a frame-by-frame backend (``render``), a whole
  block once its actions are in for a block-wise one (``diffusion``). The returned frames belong to the oldest
  of the :attr:`Generator.pending` actions, so a caller can tie each frame to its action's command stamp;
* :meth:`Generator.observe` hands over the newest real camera frame (used at the next re-anchoring point of a
  backend that re-anchors), :meth:`Generator.reanchor` re-anchors now, and :meth:`Generator.timings` reports
  the time per stage [ms] of recent steps.

The world_model node chooses its backend by name (``backend`` parameter) from :data:`WORLD_MODEL_BACKENDS`. A
new backend is a module (or subpackage) of ``rynn_teleop.world_model``, or an entry point of group
``rynn_teleop.world_model``, with a subclass of :class:`Generator` decorated
``@WORLD_MODEL_BACKENDS.register``: it sets ``name`` and its ``SETTINGS`` and builds itself from them and the
:class:`WorldModelContext` (:meth:`~rynn_teleop.core.plugins.Backend.from_settings`). A backend that needs
torch imports it when it is built, not at import (registration stays cheap).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..core.plugins import Backend, BackendRegistry

if TYPE_CHECKING:
    from ..core.camera import CameraIntrinsics
    from ..core.robot_model import RobotModel


class StageTimer:
    """Wall time per named stage over the last ``window`` samples of each stage.

    ``with timer.stage("denoise"): ...`` records one sample; :meth:`mean_ms`
    and :meth:`split` summarise them. Thread-safe: a generation thread
    records while a diagnostics timer reads.
    """

    def __init__(self, window: int = 100) -> None:
        self._samples: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        """Record one sample of ``name`` measured elsewhere [s]."""
        with self._lock:
            self._samples[name].append(seconds)

    def _snapshot(self) -> dict[str, list[float]]:
        with self._lock:
            return {k: list(v) for k, v in self._samples.items() if v}

    def mean_ms(self) -> dict[str, float]:
        """Mean time per stage [ms] over the recent samples."""
        return {k: 1e3 * float(np.mean(v)) for k, v in self._snapshot().items()}

    def total_ms(self) -> dict[str, float]:
        """Summed time per stage [ms] over the recent samples."""
        return {k: 1e3 * float(np.sum(v)) for k, v in self._snapshot().items()}

    def split(self) -> dict[str, float]:
        """Each stage's share of the summed time of all stages (fractions adding up to 1)."""
        totals = self.total_ms()
        whole = sum(totals.values())
        return {k: v / whole for k, v in totals.items()} if whole > 0 else {}

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()


class WorldModelContext(NamedTuple):
    """What the world_model node tells the backend it builds."""

    robot: RobotModel  # the node's robot description
    intrinsics: CameraIntrinsics  # the generated camera (its size is the output frame size)


class Generator(Backend, ABC):
    """A world-model backend (see the module docstring)."""

    #: output frame size [px]
    width: int
    height: int
    #: whether :meth:`observe` frames are used (re-anchoring); callers need not convert real frames otherwise
    uses_real_frames: bool = False
    #: whether :meth:`step` uses its condition (skeleton) image; callers need not draw one otherwise
    uses_condition: bool = True

    def __init__(self) -> None:
        self.timer = StageTimer()

    @abstractmethod
    def reset(self, reference: np.ndarray) -> None:
        """Start a new stream whose first frame is ``reference`` (RGB uint8, any size: resized as needed)."""

    @abstractmethod
    def step(self, action: np.ndarray, condition: np.ndarray | None = None) -> list[np.ndarray]:
        """Take one action (54,) [rad] and its condition image; return the frames complete now (oldest first)."""

    @property
    def pending(self) -> int:
        """Actions taken whose frames have not been returned yet."""
        return 0

    def observe(self, frame: np.ndarray) -> None:
        """The newest real camera frame (used at the next re-anchoring point, if the backend has one)."""

    def reanchor(self, frame: np.ndarray) -> None:
        """Re-anchor on a real frame now (default: start a new stream from it)."""
        self.reset(frame)

    def timings(self) -> dict[str, float]:
        """Mean time per stage [ms] of recent steps."""
        return self.timer.mean_ms()

    def close(self) -> None:
        """Release resources (threads, device memory)."""


def as_rgb(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """``frame`` as a contiguous RGB uint8 (height, width, 3) array, resized if its size differs.

    Raises:
        ValueError: not an (H, W, 3) image.
    """
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"expected an RGB image of shape (H, W, 3), got {frame.shape}")
    if frame.dtype != np.uint8:
        frame = np.clip(frame, 0, 255).astype(np.uint8)
    if frame.shape[:2] != (height, width):
        import cv2

        frame = cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(frame)


#: the world_model node's backends (``backend`` parameter): every module and subpackage of ``rynn_teleop.world_model``,
#: and entry points of group ``rynn_teleop.world_model``
WORLD_MODEL_BACKENDS = BackendRegistry("world_model", "world_model backend", package="rynn_teleop.world_model",
                                       base=Generator)
