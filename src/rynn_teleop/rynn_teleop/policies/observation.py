"""A policy's observation from the robot's newest messages, laid out as the LeRobot export writes a frame (ROS-free).

The export (``rynn-teleop episodes export``) makes one dataset row per frame of its first camera key: the frame
(RGB, resized with :func:`~rynn_teleop.core.image.resize_rgb` when exported with ``--image-size``), and as
``observation.state`` the newest measured position of every joint stamped at or before that frame's capture
stamp (:meth:`~rynn_teleop.recording.frames.JointTrack.sample`). :class:`ObservationBuilder` does the same with
live messages: joint states are kept for :attr:`history_ns` and sampled at the newest frame's stamp, so the
policy sees the state that belongs to the image, not a newer one. Feeding it a recorded episode's messages gives,
frame by frame, the rows the export wrote (tested against LeRobot's own reader).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..core.image import resize_rgb
from ..core.robot_model import CANONICAL_JOINT_NAMES
from .base import STATE_KEY, PolicySpec, image_key

_INDEX = {n: i for i, n in enumerate(CANONICAL_JOINT_NAMES)}


class Observation(NamedTuple):
    """One policy input."""

    values: dict[str, np.ndarray]  # LeRobot feature name -> array (see PolicyRunner.act)
    stamp_ns: int  # capture stamp of the primary camera's frame (the row's stamp) [ns]


class ObservationBuilder:
    """Collects joint states and camera frames; :meth:`build` gives the observation of the newest frame.

    The primary camera is the spec's first image key (the export's first ``--images`` key: its frames are the
    rows); other cameras contribute their newest frame stamped at or before the primary's.
    """

    def __init__(self, spec: PolicySpec, *, history_s: float = 2.0) -> None:
        if not spec.images:
            raise ValueError("the policy takes no camera image")
        self.spec = spec
        self.history_ns = int(history_s * 1e9)
        self.cameras = tuple(spec.images)
        self._states: deque[tuple[int, np.ndarray, np.ndarray]] = deque()  # (stamp, indices, positions)
        self._frames: dict[str, deque[tuple[int, np.ndarray]]] = {k: deque(maxlen=8) for k in self.cameras}

    def reset(self) -> None:
        """Forget every message (a new episode)."""
        self._states.clear()
        for q in self._frames.values():
            q.clear()

    def add_joint_state(self, names: Sequence[str], positions: Sequence[float], stamp_ns: int) -> None:
        """A JointState (any subset of the robot's joints; others ignored) stamped ``stamp_ns``."""
        idx = np.array([_INDEX.get(n, -1) for n in names], dtype=np.int64)
        pos = np.asarray(positions, np.float64)
        if len(pos) != len(idx):
            raise ValueError(f"a joint state with {len(idx)} names has {len(pos)} positions")
        keep = idx >= 0
        self._states.append((int(stamp_ns), idx[keep], pos[keep]))
        newest = max(s for s, _, _ in self._states) if len(self._states) < 64 else int(stamp_ns)
        while len(self._states) > 1 and self._states[0][0] < newest - self.history_ns:
            self._states.popleft()

    def add_image(self, camera: str, rgb: np.ndarray, stamp_ns: int) -> None:
        """A colour frame ((H, W, 3) uint8 RGB, any size) of camera key ``camera``, captured at ``stamp_ns``."""
        if camera not in self._frames:
            return
        height, width = self.spec.images[camera]
        self._frames[camera].append((int(stamp_ns), resize_rgb(rgb, height, width)))

    def state_at(self, stamp_ns: int) -> np.ndarray | None:
        """(54,) newest measured position of each joint stamped at or before ``stamp_ns``; None while a joint has
        none."""
        out = np.full(len(CANONICAL_JOINT_NAMES), np.nan)
        for stamp, idx, pos in sorted(self._states, key=lambda s: s[0]):
            if stamp > stamp_ns:
                break
            out[idx] = pos
        return None if np.isnan(out).any() else out

    def build(self) -> Observation | None:
        """The observation of the newest primary frame; None until that frame, a frame of every other camera at or
        before it and a state of every joint at or before it have arrived."""
        primary = self._frames[self.cameras[0]]
        if not primary:
            return None
        stamp, image = max(primary, key=lambda f: f[0])
        state = self.state_at(stamp)
        if state is None:
            return None
        values = {STATE_KEY: state.astype(np.float32), image_key(self.cameras[0]): image}
        for camera in self.cameras[1:]:
            older = [f for f in self._frames[camera] if f[0] <= stamp]
            if not older:
                return None
            values[image_key(camera)] = max(older, key=lambda f: f[0])[1]
        return Observation(values, stamp)
