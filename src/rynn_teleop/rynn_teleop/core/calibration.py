"""Operator-to-robot calibration (ROS-free).

In the calibration posture (the robot's home: upper arms down, elbows bent 90 degrees, forearms forward, palms
facing each other) the wrist and upper-arm tracker poses in the chest tracker's frame are captured. The
similarity (rotation, translation, uniform scale; Umeyama least squares) best mapping those four points onto the
robot's home hand and upper-arm points in the torso frame gives the alignment and the arm-length scale; per
side, a wrist rotation offset and the fit's position residual make the home pose map exactly onto the robot's::

    p = s * R @ p_wrist + t + dp_side
    R_hand = R @ R_wrist @ R_offset_side

Saved as YAML (:meth:`Calibration.save` / :meth:`Calibration.load`); an automatic capture waits for the
posture to be held (:class:`StillnessDetector`).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import ConfigurationError
from .layout import SIDES
from .transforms import Similarity, fit_similarity, is_rigid, make_transform
from .yamlfile import read_yaml

FORMAT_VERSION = 1


@dataclass
class Calibration:
    """Chest-to-torso alignment, arm-length scale and per-side wrist offsets."""

    rotation: np.ndarray = field(default_factory=lambda: np.eye(3))  # chest -> torso (3, 3)
    translation: np.ndarray = field(default_factory=lambda: np.zeros(3))  # [m], torso frame
    scale: float = 1.0  # [-] robot length per operator length
    wrist_rotation: dict[str, np.ndarray] = field(default_factory=lambda: {s: np.eye(3) for s in SIDES})
    wrist_position: dict[str, np.ndarray] = field(default_factory=lambda: {s: np.zeros(3) for s in SIDES})  # [m]
    elbow_position: dict[str, np.ndarray] = field(default_factory=lambda: {s: np.zeros(3) for s in SIDES})  # [m]
    fit_residual: float = 0.0  # [m] RMS distance of the four points after the similarity fit
    created: str = ""  # ISO 8601 time of capture
    is_default: bool = True  # False once captured or loaded

    @property
    def similarity(self) -> Similarity:
        return Similarity(self.rotation, self.translation, self.scale)

    # ------------------------------------------------------------------ mapping
    def map_wrist(self, side: str, T_chest_wrist: np.ndarray) -> np.ndarray:
        """Operator wrist pose in the chest frame -> robot hand target (4, 4) in the torso frame."""
        p = self.scale * self.rotation @ T_chest_wrist[:3, 3] + self.translation + self.wrist_position[side]
        R = self.rotation @ T_chest_wrist[:3, :3] @ self.wrist_rotation[side]
        return make_transform(p, R)

    def map_elbow(self, side: str, p_chest: np.ndarray) -> np.ndarray:
        """Operator upper-arm tracker position in the chest frame -> robot upper-arm point [m] (torso)."""
        return self.scale * self.rotation @ np.asarray(p_chest) + self.translation + self.elbow_position[side]

    # ------------------------------------------------------------------ YAML
    def to_dict(self) -> dict[str, Any]:
        def vec(v):
            return [float(x) for x in np.ravel(v)]

        return {
            "format_version": FORMAT_VERSION,
            "created": self.created,
            "alignment": {
                "rotation": [vec(r) for r in self.rotation],
                "translation": vec(self.translation),
                "scale": float(self.scale),
                "fit_residual": float(self.fit_residual),
            },
            "wrist_offsets": {
                s: {"rotation": [vec(r) for r in self.wrist_rotation[s]], "position": vec(self.wrist_position[s])}
                for s in SIDES
            },
            "elbow_offsets": {s: vec(self.elbow_position[s]) for s in SIDES},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "calibration") -> Calibration:
        """Inverse of :meth:`to_dict`; ConfigurationError naming the bad entry."""
        try:
            if data.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format_version must be {FORMAT_VERSION}, got {data.get('format_version')!r}")
            al = data["alignment"]
            rotation = _rotation(al["rotation"], "alignment.rotation")
            translation = _vector(al["translation"], "alignment.translation")
            scale = float(al["scale"])
            if not (np.isfinite(scale) and 0.2 <= scale <= 5.0):
                raise ValueError(f"alignment.scale must be within 0.2..5, got {scale}")
            wo = data["wrist_offsets"]
            eo = data["elbow_offsets"]
            return cls(
                rotation=rotation,
                translation=translation,
                scale=scale,
                wrist_rotation={s: _rotation(wo[s]["rotation"], f"wrist_offsets.{s}.rotation") for s in SIDES},
                wrist_position={s: _vector(wo[s]["position"], f"wrist_offsets.{s}.position") for s in SIDES},
                elbow_position={s: _vector(eo[s], f"elbow_offsets.{s}") for s in SIDES},
                fit_residual=float(al.get("fit_residual", 0.0)),
                created=str(data.get("created", "")),
                is_default=False,
            )
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ConfigurationError(f"{source}: invalid calibration: {what}") from None

    def save(self, path: str | Path) -> Path:
        """Write the YAML file (parent folders created); returns the path."""
        path = Path(path).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(path.suffix + ".tmp")
            header = "# rynn_teleop operator calibration (arm_ik ~/calibrate). Units: m, rotation matrices.\n"
            tmp.write_text(header + yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")
            tmp.replace(path)
        except OSError as exc:
            raise ConfigurationError(f"cannot write calibration file {path}: {exc}") from exc
        return path

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        path = Path(path).expanduser()
        return cls.from_dict(read_yaml(path, "calibration file", mapping=True), str(path))


def calibrate(
    operator_wrists: Mapping[str, np.ndarray],
    operator_elbows: Mapping[str, np.ndarray],
    robot_hands: Mapping[str, np.ndarray],
    robot_elbows: Mapping[str, np.ndarray],
    *,
    max_residual: float = 0.10,
) -> Calibration:
    """Capture a calibration from the operator's pose in the calibration posture.

    Args:
        operator_wrists: side -> (4, 4) wrist tracker pose in the chest tracker frame.
        operator_elbows: side -> (3,) upper-arm tracker position in the chest frame [m].
        robot_hands: side -> (4, 4) robot hand (IK tip) pose at home, torso frame.
        robot_elbows: side -> (3,) robot point matching the upper-arm tracker at home [m].
        max_residual: largest RMS point distance accepted after the fit [m]; a
            larger one means the operator is not in the calibration posture.
    Raises:
        ConfigurationError naming the problem (non-finite or degenerate input,
        a posture that does not match the robot's).
    """
    for name, group, shape in (
        ("operator wrist", operator_wrists, (4, 4)),
        ("operator upper-arm", operator_elbows, (3,)),
        ("robot hand", robot_hands, (4, 4)),
        ("robot upper-arm", robot_elbows, (3,)),
    ):
        for s in SIDES:
            if s not in group:
                raise ConfigurationError(f"calibration needs the {s} {name} pose")
            v = np.asarray(group[s], dtype=float)
            if v.shape != shape or not np.all(np.isfinite(v)) or (shape == (4, 4) and not is_rigid(v, 1e-3)):
                raise ConfigurationError(f"calibration: the {s} {name} pose is not a finite {shape} pose")
    src = np.array([operator_wrists[s][:3, 3] for s in SIDES] + [np.asarray(operator_elbows[s]) for s in SIDES])
    dst = np.array([robot_hands[s][:3, 3] for s in SIDES] + [np.asarray(robot_elbows[s]) for s in SIDES])
    try:
        sim = fit_similarity(src, dst)
    except ValueError as exc:
        raise ConfigurationError(
            f"calibration pose is degenerate: {exc}; bend the elbows and hold the forearms forward"
        ) from None
    mapped = sim.apply(src)
    residual = float(np.sqrt(np.mean(np.sum((mapped - dst) ** 2, axis=1))))
    if residual > max_residual:
        raise ConfigurationError(
            f"calibration rejected: the tracker points match the robot's home posture only to "
            f"{residual * 100:.1f} cm RMS (limit {max_residual * 100:.0f} cm); stand in the calibration posture "
            "(upper arms down, elbows at 90 deg, forearms forward) and retry"
        )
    if not 0.2 <= sim.scale <= 5.0:
        raise ConfigurationError(f"calibration rejected: arm-length scale {sim.scale:.2f} is outside 0.2..5")
    cal = Calibration(
        rotation=sim.rotation,
        translation=sim.translation,
        scale=sim.scale,
        fit_residual=residual,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        is_default=False,
    )
    for k, s in enumerate(SIDES):
        cal.wrist_rotation[s] = (sim.rotation @ operator_wrists[s][:3, :3]).T @ robot_hands[s][:3, :3]
        cal.wrist_position[s] = dst[k] - mapped[k]
        cal.elbow_position[s] = dst[2 + k] - mapped[2 + k]
    return cal


class StillnessDetector:
    """Whether every one of a set of tracked poses has held still over a time window.

    Fed with poses per key (e.g. ``left_wrist``) and their stamps [s]; :meth:`still` is true at ``now``
    [s] when, for every key, the poses cover the window ``[now - window, now]`` (one at or before its
    start, the newest at most ``max_gap`` before ``now``), every position lies within
    ``position_tolerance`` [m] of their mean and every orientation within ``rotation_tolerance`` [rad] of
    the newest one. Times are caller-supplied.
    """

    def __init__(self, keys: Iterable[str], window: float, position_tolerance: float, rotation_tolerance: float,
                 max_gap: float) -> None:
        """
        Args:
            keys: the poses that must all be still.
            window: how long they must have been still [s], > 0.
            position_tolerance: largest distance of a position from the window's mean [m], > 0.
            rotation_tolerance: largest rotation from the newest orientation [rad], > 0.
            max_gap: largest age of the newest pose at :meth:`still` [s], > 0.

        Raises:
            ConfigurationError: no key or a value that is not > 0.
        """
        self.keys = tuple(keys)
        if not self.keys:
            raise ConfigurationError("stillness detector: no pose to watch")
        for name, value in (("window", window), ("position_tolerance", position_tolerance),
                            ("rotation_tolerance", rotation_tolerance), ("max_gap", max_gap)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"stillness detector: {name} must be > 0, got {value}")
        self.window = float(window)  # [s]
        self.position_tolerance = float(position_tolerance)  # [m]
        self.rotation_tolerance = float(rotation_tolerance)  # [rad]
        self.max_gap = float(max_gap)  # [s]
        self._history: dict[str, deque[tuple[float, np.ndarray]]] = {k: deque() for k in self.keys}

    def add(self, key: str, stamp: float, pose: np.ndarray) -> None:
        """Record the (4, 4) ``pose`` of ``key`` at ``stamp`` [s] (stamps of one key non-decreasing)."""
        h = self._history[key]
        h.append((float(stamp), np.array(pose, dtype=float)))
        start = float(stamp) - self.window
        while len(h) >= 2 and h[1][0] <= start:  # keep the newest pose at or before the window's start
            h.popleft()

    def clear(self) -> None:
        """Forget every pose."""
        for h in self._history.values():
            h.clear()

    def still(self, now: float) -> bool:
        """True when every key has held still over the window ending at ``now`` [s] (see the class)."""
        for h in self._history.values():
            if not h or now - h[-1][0] > self.max_gap or h[0][0] > now - self.window:
                return False
            poses = np.stack([T for _, T in h])
            p = poses[:, :3, 3]
            if np.sqrt(((p - p.mean(axis=0)) ** 2).sum(axis=1)).max() > self.position_tolerance:
                return False
            # angle between each orientation and the newest: cos = (trace(R_new^T R) - 1) / 2
            trace = np.einsum("ij,nij->n", poses[-1, :3, :3], poses[:, :3, :3])
            if np.arccos(np.clip(0.5 * (trace.min() - 1.0), -1.0, 1.0)) > self.rotation_tolerance:
                return False
        return True


def _vector(value: Any, name: str) -> np.ndarray:
    v = np.asarray(value, dtype=float)
    if v.shape != (3,) or not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be 3 finite numbers")
    return v


def _rotation(value: Any, name: str) -> np.ndarray:
    R = np.asarray(value, dtype=float)
    if R.shape != (3, 3) or not is_rigid(make_transform(rotation=R), 1e-6):
        raise ValueError(f"{name} must be a 3x3 rotation matrix")
    return R
