"""The robot model: canonical 54-joint layout, limits and forward kinematics.

ROS-free. The description is loaded once into Pinocchio; everything in the
stack that needs joint names, limits or frame poses goes through here.

Canonical joint order (the 54-D action of the world model, and the order of
every ``JointState`` the stack publishes for the whole robot)::

    left_arm_joint1..7, right_arm_joint1..7,
    left_finger1_joint1..left_finger5_joint4   (finger-major, 20),
    right_finger1_joint1..right_finger5_joint4 (20)

Units: positions [rad], velocities [rad/s], accelerations [rad/s^2], jerks
[rad/s^3], lengths [m]. Frame poses are 4x4 homogeneous matrices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pinocchio as pin

from ..errors import ConfigurationError, FrameNotFoundError, JointNotFoundError
from .layout import N_ARM, N_HAND, N_JOINTS
from .urdf_builder import build_urdf, load_arm_table, load_description_config


def arm_joint_names(side: str) -> tuple[str, ...]:
    """``{side}_arm_joint1..7``."""
    return tuple(f"{side}_arm_joint{i}" for i in range(1, N_ARM + 1))


def hand_joint_names(side: str) -> tuple[str, ...]:
    """``{side}_finger1_joint1 .. {side}_finger5_joint4``, finger-major (flat = (finger-1)*4 + joint-1)."""
    return tuple(f"{side}_finger{f}_joint{j}" for f in range(1, 6) for j in range(1, 5))


CANONICAL_JOINT_NAMES: tuple[str, ...] = (
    arm_joint_names("left") + arm_joint_names("right") + hand_joint_names("left") + hand_joint_names("right")
)


class JointGroups(NamedTuple):
    """Slices of the canonical 54-vector."""

    left_arm: slice = slice(0, 7)
    right_arm: slice = slice(7, 14)
    left_hand: slice = slice(14, 34)
    right_hand: slice = slice(34, 54)

    def arm(self, side: str) -> slice:
        return self.left_arm if side == "left" else self.right_arm

    def hand(self, side: str) -> slice:
        return self.left_hand if side == "left" else self.right_hand


GROUPS = JointGroups()


@dataclass(frozen=True)
class JointLimits:
    """Per-joint limit vectors in canonical order (each shape (54,) unless sliced)."""

    lower: np.ndarray  # [rad]
    upper: np.ndarray  # [rad]
    velocity: np.ndarray  # [rad/s]
    acceleration: np.ndarray  # [rad/s^2]
    jerk: np.ndarray  # [rad/s^3]

    def __getitem__(self, index: slice | Sequence[int] | np.ndarray) -> JointLimits:
        return JointLimits(*(np.asarray(v)[index] for v in self._vectors()))

    def _vectors(self) -> tuple[np.ndarray, ...]:
        return self.lower, self.upper, self.velocity, self.acceleration, self.jerk

    def clip_position(self, q: np.ndarray) -> np.ndarray:
        """``q`` clipped into [lower, upper]."""
        return np.clip(q, self.lower, self.upper)

    def within(self, q: np.ndarray, tol: float = 1e-9) -> bool:
        """True if every position lies in its limits (with tolerance ``tol`` [rad])."""
        return bool(np.all(q >= self.lower - tol) and np.all(q <= self.upper + tol))


class RobotModel:
    """Pinocchio model of the whole robot with the canonical joint layout.

    Build it with :meth:`default` (the generated description, cached) or
    :meth:`from_urdf` (any URDF string with the same joint names).
    """

    def __init__(self, urdf: str, extra_limits: Mapping[str, Any]) -> None:
        """
        Args:
            urdf: the URDF XML text.
            extra_limits: limits URDF cannot carry: ``arm_acceleration`` (14
                values or one) [rad/s^2], ``arm_jerk`` [rad/s^3],
                ``hand_acceleration`` [rad/s^2], ``hand_jerk`` [rad/s^3]
                (scalars apply to every joint of the group).
        """
        self.urdf = urdf
        self.model = pin.buildModelFromXML(urdf)
        self._data = self.model.createData()
        missing = [n for n in CANONICAL_JOINT_NAMES if not self.model.existJointName(n)]
        extra = [n for n in self.model.names[1:] if n not in CANONICAL_JOINT_NAMES]
        if missing or extra or self.model.nq != N_JOINTS:
            raise ConfigurationError(
                f"robot description must have exactly the 54 canonical 1-DoF joints; missing: {missing}, "
                f"unexpected: {extra}, nq = {self.model.nq}"
            )
        # canonical index -> Pinocchio configuration index
        self._q_index = np.array([self.model.joints[self.model.getJointId(n)].idx_q for n in CANONICAL_JOINT_NAMES])
        self._joint_index = {n: i for i, n in enumerate(CANONICAL_JOINT_NAMES)}
        self._frames: dict[str, int] = {}
        for fid, frame in enumerate(self.model.frames):
            if frame.type == pin.FrameType.BODY:
                self._frames.setdefault(frame.name, fid)
        qi = self._q_index
        n_arm = 2 * N_ARM
        self.limits = JointLimits(
            lower=self.model.lowerPositionLimit[qi].copy(),
            upper=self.model.upperPositionLimit[qi].copy(),
            velocity=self.model.velocityLimit[qi].copy(),
            acceleration=np.concatenate(
                [_group(extra_limits, "arm_acceleration", n_arm), _group(extra_limits, "hand_acceleration", 2 * N_HAND)]
            ),
            jerk=np.concatenate(
                [_group(extra_limits, "arm_jerk", n_arm), _group(extra_limits, "hand_jerk", 2 * N_HAND)]
            ),
        )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_urdf(cls, urdf: str, extra_limits: Mapping[str, Any] | None = None) -> RobotModel:
        """Model of ``urdf``; limits beyond URDF default to the description's ``urdf/*.yaml``."""
        return cls(urdf, extra_limits if extra_limits is not None else default_extra_limits())

    @classmethod
    def from_file(cls, path: str | Path, extra_limits: Mapping[str, Any] | None = None) -> RobotModel:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read URDF {path}: {exc}") from exc
        return cls.from_urdf(text, extra_limits)

    @classmethod
    def from_description(cls, overlay: str | Path | Mapping[str, Any] | None = None) -> RobotModel:
        """The generated description, with optional overrides of ``urdf/robot.yaml``."""

        return cls(build_urdf(overlay), default_extra_limits(load_description_config(overlay)))

    @classmethod
    def default(cls) -> RobotModel:
        """The generated description with its default parameters (built once per process)."""
        return _default_model()

    # ------------------------------------------------------------------ layout
    @property
    def joint_names(self) -> tuple[str, ...]:
        return CANONICAL_JOINT_NAMES

    @property
    def frame_names(self) -> tuple[str, ...]:
        """Every link name of the description (valid arguments of :meth:`frame_pose`)."""
        return tuple(self._frames)

    def joint_index(self, name: str) -> int:
        """Canonical index of a joint; :class:`JointNotFoundError` lists the known joints."""
        try:
            return self._joint_index[name]
        except KeyError:
            raise JointNotFoundError(name, CANONICAL_JOINT_NAMES) from None

    def indices(self, names: Iterable[str]) -> np.ndarray:
        """Canonical indices of ``names`` (e.g. the ``name`` field of a ``JointState``)."""
        return np.array([self.joint_index(n) for n in names], dtype=int)

    def neutral(self) -> np.ndarray:
        """A safe reference posture: every joint at 0 clipped into its limits [rad]."""
        return self.limits.clip_position(np.zeros(N_JOINTS))

    # ------------------------------------------------------------------ kinematics
    def to_pinocchio(self, q: np.ndarray) -> np.ndarray:
        """Canonical 54-vector -> Pinocchio configuration vector."""
        q = np.asarray(q, dtype=float)
        if q.shape != (N_JOINTS,):
            raise ValueError(f"expected a ({N_JOINTS},) joint vector, got shape {q.shape}")
        out = np.empty(self.model.nq)
        out[self._q_index] = q
        return out

    def frame_id(self, frame: str) -> int:
        try:
            return self._frames[frame]
        except KeyError:
            raise FrameNotFoundError(frame, self._frames) from None

    def forward_kinematics(self, q: np.ndarray, frames: Sequence[str], base: str | None = None) -> np.ndarray:
        """Poses of ``frames`` at configuration ``q`` (canonical order).

        Args:
            q: (54,) joint positions [rad].
            frames: link names.
            base: express the poses in this link's frame (default: ``base_link``).
        Returns:
            (len(frames), 4, 4) homogeneous transforms.
        """
        ids = [self.frame_id(f) for f in frames]
        base_id = self.frame_id(base) if base is not None else None
        pin.framesForwardKinematics(self.model, self._data, self.to_pinocchio(q))
        out = np.empty((len(ids), 4, 4))
        base_inv = self._data.oMf[base_id].inverse() if base_id is not None else None
        for k, fid in enumerate(ids):
            pose = self._data.oMf[fid] if base_inv is None else base_inv * self._data.oMf[fid]
            out[k] = pose.homogeneous
        return out

    def frame_pose(self, q: np.ndarray, frame: str, base: str | None = None) -> np.ndarray:
        """Pose (4x4) of one frame; see :meth:`forward_kinematics`."""
        return self.forward_kinematics(q, [frame], base)[0]


def _group(extra: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    if key not in extra:
        raise ConfigurationError(f"robot limits need {key!r}")
    v = np.atleast_1d(np.asarray(extra[key], dtype=float))
    if v.size == 1:
        v = np.full(n, float(v[0]))
    elif v.size == n // 2:  # one value per joint of one side, same for both sides
        v = np.concatenate([v, v])
    if v.shape != (n,) or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ConfigurationError(f"robot limit {key!r} must be positive, 1, {n // 2} or {n} values; got {extra[key]!r}")
    return v


def default_extra_limits(config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Acceleration and jerk limits of the description data (``urdf/*.yaml``)."""

    cfg = config if config is not None else load_description_config()
    arm_acc = np.radians([row[7] for row in load_arm_table()["joints"]])
    lim = cfg["limits"]
    return {
        "arm_acceleration": arm_acc,
        "arm_jerk": lim["arm_jerk"],
        "hand_acceleration": lim["hand_acceleration"],
        "hand_jerk": lim["hand_jerk"],
    }


@lru_cache(maxsize=1)
def _default_model() -> RobotModel:
    return RobotModel.from_description()
