"""Inverse kinematics of one 7-DoF Marvin arm on Pinocchio (ROS-free).

Damped least squares in the tip frame (``LOCAL``): the wrist error ``e = log6(T(q)^-1 T_target)`` (6-D twist,
[m] and [rad]) gives ``dq = V diag(s / (s^2 + lambda^2)) U^T e`` from the SVD ``J = U S V^T`` of the tip
Jacobian, ``lambda`` growing from 0 as the smallest singular value falls below ``singular_threshold``. Along
the one redundant DoF (the elbow swivel, the last right singular vector) each iteration pushes joints out of
the zone near their limits or, when none is there, swings the elbow towards the elbow hint, at most
``max_null_step``. A step is scaled to at most ``max_step`` and the result clipped into the position limits
shrunk by ``limit_margin``.

Contract: the returned ``q`` is always within the shrunk limits; when ``max_iterations`` are spent before the
wrist error is within tolerance, the best configuration seen is returned with ``converged=False`` (an
unreachable target gives the nearest reachable pose). Why hand-written rather than on pink: README, "Arm teleoperation".
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pinocchio as pin
from scipy.linalg.lapack import dgesvd

from ..errors import ConfigurationError
from .layout import SIDES
from .robot_model import GROUPS, RobotModel


class IKSettings(NamedTuple):
    """Tuning of :class:`ArmIK` (units beside each field)."""

    position_tolerance: float = 3e-4  # [m] wrist position error accepted as converged
    orientation_tolerance: float = 2e-3  # [rad] wrist orientation error accepted as converged
    max_iterations: int = 20  # [-] per solve
    # [-] stop early (when within 10x tolerance) once an iteration keeps more than this share of the error
    stall_ratio: float = 0.95
    max_step: float = 0.3  # [rad] largest joint change per iteration (infinity norm)
    damping: float = 0.02  # [-] damping lambda at a singular configuration
    singular_threshold: float = 0.05  # [-] smallest singular value below which damping starts
    elbow_gain: float = 0.3  # [-] fraction of the tangential elbow error corrected per iteration
    limit_zone: float = 0.2  # [rad] distance from a position limit where avoidance starts
    limit_gain: float = 0.5  # [-] fraction of the zone violation corrected per iteration
    limit_margin: float = 0.01  # [rad] solutions stay this far inside the position limits
    max_null_step: float = 0.01  # [rad] largest null-space (swivel / limit avoidance) step per iteration


class IKResult(NamedTuple):
    """Outcome of one :meth:`ArmIK.solve`."""

    q: np.ndarray  # (7,) joint positions [rad]
    position_error: float  # [m]
    orientation_error: float  # [rad]
    iterations: int  # [-]
    converged: bool  # wrist error within tolerance


class ArmIK:
    """IK for one arm of the robot: wrist pose task plus elbow hint.

    The model is Pinocchio's reduced model of the arm's 7 joints (every other
    joint locked), so each iteration touches only the chain. Poses are given
    and returned in ``base_frame`` (default ``torso_link``).
    """

    def __init__(
        self,
        robot: RobotModel,
        side: str,
        *,
        tip_frame: str | None = None,
        elbow_frame: str | None = None,
        base_frame: str = "torso_link",
        settings: IKSettings | None = None,
    ) -> None:
        """
        Args:
            robot: the whole robot's model (its arm limits are used).
            side: ``"left"`` or ``"right"``.
            tip_frame: the controlled frame (default ``{side}_palm_link``, the wrist).
            elbow_frame: the frame steered towards the elbow hint (default ``{side}_arm_link4``).
            base_frame: frame of targets, hints and results (must not move with the arm).
            settings: tuning, see :class:`IKSettings` (default: its defaults).
        """
        settings = IKSettings() if settings is None else settings
        if side not in SIDES:
            raise ConfigurationError(f"side must be 'left' or 'right', got {side!r}")
        self.side = side
        self.settings = settings
        self.tip_frame = tip_frame or f"{side}_palm_link"
        self.elbow_frame = elbow_frame or f"{side}_arm_link4"
        self.base_frame = base_frame
        arm = GROUPS.arm(side)
        self.joint_names = robot.joint_names[arm]
        for frame in (self.tip_frame, self.elbow_frame, base_frame):
            robot.frame_id(frame)  # FrameNotFoundError listing the frames
        full = robot.model
        keep = {full.getJointId(n) for n in self.joint_names}
        lock = [j for j in range(1, full.njoints) if j not in keep]
        q_ref = robot.to_pinocchio(robot.neutral())
        self.model = pin.buildReducedModel(full, lock, q_ref)
        self.data = self.model.createData()
        if [self.model.names[j] for j in range(1, self.model.njoints)] != list(self.joint_names):
            raise ConfigurationError(f"unexpected joint order in the reduced {side} arm model")
        self._tip = self.model.getFrameId(self.tip_frame)
        self._elbow = self.model.getFrameId(self.elbow_frame)
        base_id = self.model.getFrameId(base_frame)
        pin.framesForwardKinematics(self.model, self.data, pin.neutral(self.model))
        self._world_base = pin.SE3(self.data.oMf[base_id])
        self._base_world = self._world_base.inverse()
        if self._depends_on_arm(base_id):
            raise ConfigurationError(f"base frame {base_frame!r} moves with the {side} arm")
        limits = robot.limits[arm]
        self.lower = limits.lower + settings.limit_margin
        self.upper = limits.upper - settings.limit_margin
        self._zone_lo = limits.lower + settings.limit_zone
        self._zone_hi = limits.upper - settings.limit_zone
        self._zone_lo_list, self._zone_hi_list = self._zone_lo.tolist(), self._zone_hi.tolist()

    def _depends_on_arm(self, frame_id: int) -> bool:
        return self.model.frames[frame_id].parentJoint != 0

    # ------------------------------------------------------------------ kinematics
    def forward(self, q: np.ndarray) -> np.ndarray:
        """(4, 4) pose of the tip frame in the base frame at arm joints ``q`` (7,) [rad]."""
        pin.forwardKinematics(self.model, self.data, np.asarray(q, dtype=float))
        return (self._base_world * pin.updateFramePlacement(self.model, self.data, self._tip)).homogeneous

    def elbow_position(self, q: np.ndarray) -> np.ndarray:
        """(3,) position [m] of the elbow frame in the base frame."""
        pin.forwardKinematics(self.model, self.data, np.asarray(q, dtype=float))
        return self._base_world.act(pin.updateFramePlacement(self.model, self.data, self._elbow).translation)

    # ------------------------------------------------------------------ solve
    def solve(self, target: np.ndarray, q_init: np.ndarray, elbow_hint: np.ndarray | None = None) -> IKResult:
        """Joint positions putting the tip at ``target``.

        Args:
            target: (4, 4) desired tip pose in the base frame (finite, rigid).
            q_init: (7,) warm start [rad] (e.g. the previous solution).
            elbow_hint: (3,) point in the base frame the elbow should swing
                towards (only the swivel is affected), or None.
        Returns:
            :class:`IKResult`; ``q`` always lies within the (shrunk) limits.
        """
        s = self.settings
        model, data, tip = self.model, self.data, self._tip
        goal = self._world_base * pin.SE3(np.asarray(target, dtype=float))
        p_goal = goal.translation
        hint = None if elbow_hint is None else self._world_base.act(np.asarray(elbow_hint, dtype=float))
        q = np.minimum(np.maximum(np.asarray(q_init, dtype=float), self.lower), self.upper)
        ptol, rtol = s.position_tolerance, s.orientation_tolerance
        best_score, best = math.inf, (q, math.inf, math.inf)
        iterations = 0
        prev_score = math.inf
        while True:
            pin.forwardKinematics(model, data, q)
            current = pin.updateFramePlacement(model, data, tip)
            err = pin.log6(current.actInv(goal)).vector
            dp = p_goal - current.translation  # log6's linear part is not the distance
            pos_err = math.sqrt(dp @ dp)
            rot_err = math.sqrt(err[3] * err[3] + err[4] * err[4] + err[5] * err[5])
            # excess over tolerance, 1 rad counting as 10 cm: 0 when converged; ties go to the newer q
            score = (pos_err - ptol if pos_err > ptol else 0.0) + 0.1 * (rot_err - rtol if rot_err > rtol else 0.0)
            # slow convergence near a singularity: stop once close and no longer improving
            stalled = 0.0 < score < 10 * ptol and iterations >= 2 and score > s.stall_ratio * prev_score
            prev_score = score
            if score <= best_score:
                best_score, best = score, (q, pos_err, rot_err)
            # With an elbow hint, one null-space step is taken even when converged,
            # so the swivel keeps following the hint across calls.
            if (score == 0.0 and (hint is None or iterations > 0)) or stalled or iterations >= s.max_iterations:
                break
            pin.computeJointJacobians(model, data)  # uses the forward kinematics above
            J = pin.getFrameJacobian(model, data, tip, pin.LOCAL)
            U, sv, Vt, info = dgesvd(J)  # LAPACK directly: less overhead than np.linalg.svd
            if info != 0:
                break
            smin = sv[5]
            if smin < s.singular_threshold:
                lam2 = (1.0 - (smin / s.singular_threshold) ** 2) * s.damping**2
                dq = Vt[:6].T @ ((sv / (sv * sv + lam2)) * (U.T @ err))
            else:
                dq = Vt[:6].T @ ((U.T @ err) / sv)
            alpha = self._null_alpha(q, Vt[6], hint)
            if alpha:
                dq += alpha * Vt[6]
            peak = np.abs(dq).max()
            if peak > s.max_step:
                dq *= s.max_step / peak
            q = np.minimum(np.maximum(q + dq, self.lower), self.upper)
            iterations += 1
        q_best, pos_best, rot_best = best
        return IKResult(q_best, pos_best, rot_best, iterations, best_score == 0.0)

    def _null_alpha(self, q: np.ndarray, n: np.ndarray, hint: np.ndarray | None) -> float:
        """Signed step [rad] along the unit null-space direction ``n`` (7,).

        Joint-limit avoidance has priority: while a joint is inside the zone
        near a limit, the step is the least-squares move of the zone
        violation back towards zero. Otherwise the elbow hint: the step that
        moves the elbow a share ``elbow_gain`` of its error along the swivel
        tangent. Capped at ``max_null_step`` so the second-order drift it
        causes in the wrist stays far below the tolerance. Uses the Jacobians
        computed for ``q`` by the caller.
        """
        s = self.settings
        if any(v < lo or v > hi for v, lo, hi in zip(q.tolist(), self._zone_lo_list, self._zone_hi_list)):
            g = np.minimum(q - self._zone_lo, 0.0) + np.maximum(q - self._zone_hi, 0.0)  # [rad] zone violation
            alpha = -s.limit_gain * float(n @ g)
        elif hint is not None:
            p_elbow = pin.updateFramePlacement(self.model, self.data, self._elbow).translation
            Je = pin.getFrameJacobian(self.model, self.data, self._elbow, pin.LOCAL_WORLD_ALIGNED)[:3]
            t = Je @ n  # elbow velocity per unit motion along n [m/rad]
            tt = float(t @ t)
            if tt < 1e-12:
                return 0.0
            alpha = s.elbow_gain * float(t @ (hint - p_elbow)) / tt
        else:
            return 0.0
        return max(-s.max_null_step, min(s.max_null_step, alpha))
