"""Assemble the whole robot's state from partial joint-state messages.

The arm driver and the hand driver each publish ``/joint_states`` with their
own subset of joints; consumers that need the 54-vector (markers, the world
model) merge them here. ROS-free: callers pass names, positions and stamps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .robot_model import CANONICAL_JOINT_NAMES, N_JOINTS


class JointStateBuffer:
    """Latest position of every canonical joint, with per-joint update times."""

    def __init__(self, initial: np.ndarray) -> None:
        """
        Args:
            initial: (54,) positions [rad] used until a joint is first heard of.
        """
        self.position = np.array(initial, dtype=float)
        if self.position.shape != (N_JOINTS,):
            raise ValueError(f"initial must have shape ({N_JOINTS},)")
        self.stamp = np.full(N_JOINTS, -np.inf)  # [s], per joint
        self._index = {n: i for i, n in enumerate(CANONICAL_JOINT_NAMES)}
        self.unknown_names: set[str] = set()
        self.rejected = 0  # messages dropped for bad shape or non-finite values

    def update(self, names: Sequence[str], positions: Sequence[float], stamp: float) -> bool:
        """Merge one message; returns False (and counts it) if it is malformed.

        Names that are not canonical joints are remembered in
        :attr:`unknown_names` and skipped; a message whose positions do not
        match its names or contain NaN/inf changes nothing.
        """
        pos = np.asarray(positions, dtype=float)
        if pos.shape != (len(names),) or not np.all(np.isfinite(pos)):
            self.rejected += 1
            return False
        for name, value in zip(names, pos):
            i = self._index.get(name)
            if i is None:
                self.unknown_names.add(name)
                continue
            self.position[i] = value
            self.stamp[i] = stamp
        return True

    def fresh(self, now: float, timeout: float, future_tolerance: float = 0.05) -> np.ndarray:
        """Boolean mask of joints updated within ``timeout`` [s] before ``now`` [s].

        A stamp more than ``future_tolerance`` [s] after ``now`` (clock skew)
        does not count as fresh.
        """
        age = now - self.stamp
        return (age <= timeout) & (age >= -future_tolerance)

    @property
    def latest_stamp(self) -> float:
        """Newest stamp merged [s] (-inf if none)."""
        return float(self.stamp.max())
