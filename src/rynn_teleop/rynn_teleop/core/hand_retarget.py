"""Human 21-point hand skeleton -> 20 Wuji joint angles (ROS-free).

Vector retargeting in the spirit of DexPilot, solved by a bounded Levenberg-Marquardt on the hand's own
kinematics (Pinocchio FK and joint Jacobians of the Wuji model reduced to the hand's 20 joints). The human
points are expressed in their own palm frame (:func:`~.hand_skeleton.palm_frame`) and placed in the robot's
palm frame built the same way (which also handles left and right). Residuals (3-D vectors [m]): every finger
segment, at the robot's segment length along the human segment's direction; wrist -> tip per finger and thumb
tip -> each finger tip, scaled by the ratio of robot to human chain length, the latter weighted from
``tip_weight`` up to ``pinch_weight`` as the human distance falls below ``pinch_threshold`` (a human pinch
closes the robot's tips). A term ``previous_weight * |q - q_prev|^2`` keeps the solution near the previous
one, which is also the warm start; joint limits are bounds (projected steps).

:class:`HandPipeline` runs one hand: checks, retargeting, EMA and velocity limit, holding on bad input.
Why hand-written rather than dex-retargeting: README, "Hand teleoperation".
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import pinocchio as pin
from scipy.linalg.lapack import dposv

from ..errors import ConfigurationError
from . import hand_skeleton as hs
from .layout import N_HAND, SIDES
from .motion import ExponentialSmoother
from .robot_model import GROUPS, RobotModel, hand_joint_names


class RetargetSettings(NamedTuple):
    """Tuning of :class:`HandRetargeter`."""

    max_iterations: int = 30  # [-] Gauss-Newton iterations per frame (a warm-started frame needs a few)
    step_tolerance: float = 0.02  # [rad] stop after a step no larger than this (what it leaves is ~its square)
    max_step: float = 1.0  # [rad] largest joint change per iteration
    cost_tolerance: float = 0.05  # [-] stop when an accepted step lowers the cost by less than this share
    segment_weight: float = 1.0  # [-] finger segment directions
    tip_weight: float = 1.0  # [-] wrist->tip and (outside pinches) thumb->tip vectors
    pinch_weight: float = 20.0  # [-] thumb->tip vectors at a full pinch
    pinch_threshold: float = 0.04  # [m] human thumb-tip to finger-tip distance where pinch weighting starts
    previous_weight: float = 3e-4  # [m^2/rad^2] pull towards the previous solution (1 rad ~ 17 mm)
    damping: float = 1e-7  # [m^2/rad^2] Levenberg-Marquardt damping added to the normal equations
    min_scale: float = 0.5  # [-] bounds of the robot/human chain length ratio
    max_scale: float = 2.0  # [-]


class RetargetResult(NamedTuple):
    """One retargeted frame."""

    q: np.ndarray  # (20,) joint angles [rad], canonical order of the side
    cost: float  # [m^2] weighted squared residual (before the final step when that step is below step_tolerance)
    iterations: int  # [-]


# Residual vectors as (from, to) MediaPipe indices.
_SEGMENTS = tuple((c[k], c[k + 1]) for c in hs.CHAINS for k in (1, 2, 3))
_WRIST_TIPS = tuple((hs.WRIST, t) for t in hs.TIPS)
_PINCHES = tuple((hs.TIPS[0], t) for t in hs.TIPS[1:])
_ROLL_1, _ROLL_2 = np.array([1, 2, 0]), np.array([2, 0, 1])  # xyz index i -> (i + 1) % 3, (i + 2) % 3
_EYE = np.eye(N_HAND)
_EYE.flags.writeable = False
# reductions without the ndarray-method wrappers (same results)
_any, _all, _max = np.logical_or.reduce, np.logical_and.reduce, np.maximum.reduce


class HandRetargeter:
    """Retargets one hand (``side``) of the robot."""

    def __init__(self, robot: RobotModel, side: str, settings: RetargetSettings | None = None) -> None:
        """
        Args:
            robot: the whole robot's model (its hand joints and limits are used).
            side: ``"left"`` or ``"right"``.
            settings: tuning (default: :class:`RetargetSettings`' defaults).

        Raises:
            ConfigurationError: an unknown side or a hand model without the expected layout.
        """
        settings = RetargetSettings() if settings is None else settings
        if side not in SIDES:
            raise ConfigurationError(f"side must be 'left' or 'right', got {side!r}")
        self.side = side
        self.settings = settings
        self.joint_names = hand_joint_names(side)
        full = robot.model
        keep = {full.getJointId(n) for n in self.joint_names}
        lock = [j for j in range(1, full.njoints) if j not in keep]
        model = pin.buildReducedModel(full, lock, robot.to_pinocchio(robot.neutral()))
        names = [model.names[j] for j in range(1, model.njoints)]
        if names != list(self.joint_names):
            raise ConfigurationError(f"unexpected joint order in the reduced {side} hand model: {names}")
        # Re-root the fingers on the palm: the palm frame becomes the model's world frame.
        data = model.createData()
        pin.framesForwardKinematics(model, data, pin.neutral(model))
        palm_inv = data.oMf[model.getFrameId(f"{side}_palm_link")].inverse()
        for j in range(1, model.njoints):
            if model.parents[j] == 0:
                model.jointPlacements[j] = palm_inv * model.jointPlacements[j]
        self.model, self.data = model, model.createData()
        limits = robot.limits[getattr(GROUPS, f"{side}_hand")]
        self.lower, self.upper = limits.lower.copy(), limits.upper.copy()
        # Keypoints: PIP and DIP are the origins of joints 3 and 4, TIP a fixed offset from joint 4;
        # wrist (palm origin) and MCP/CMC (origins of joint 1) do not move.
        frames = hs.robot_keypoint_frames(side)
        self._j3 = [model.getJointId(f"{side}_finger{f}_joint3") for f in range(1, 6)]
        self._j4 = [model.getJointId(f"{side}_finger{f}_joint4") for f in range(1, 6)]
        tip_frames = [model.frames[model.getFrameId(frames[t])] for t in hs.TIPS]
        self._tip_xyz = np.array([f.placement.translation for f in tip_frames])  # in the joint-4 frame
        if any(f.parentJoint != j for f, j in zip(tip_frames, self._j4)):
            raise ConfigurationError("tip frames must hang off joint 4 of their finger")
        pin.framesForwardKinematics(model, self.data, pin.neutral(model))
        self._fixed = np.array([self.data.oMf[model.getFrameId(frames[i])].translation for i in range(hs.N_POINTS)])
        self._fixed[hs.WRIST] = 0.0  # the palm origin (frames on the palm itself were not re-rooted)
        self._cols = np.array([[model.joints[model.getJointId(f"{side}_finger{f}_joint{k}")].idx_v
                                for k in range(1, 5)] for f in range(1, 6)])  # (5, 4) velocity columns
        self._moving_index = np.array([1 + 4 * f + k for f in range(5) for k in (1, 2, 3)])
        self._tip_offset = self._tip_xyz[:, :, None]  # (5, 3, 1)
        self._j34 = [j for pair in zip(self._j3, self._j4) for j in pair]  # joint 3, joint 4 of finger 1, ...
        self.neutral_points = self.keypoints(np.zeros(N_HAND))
        if hs.check(self.neutral_points) is not None:
            raise ConfigurationError(f"the {side} robot hand's own keypoints do not form a palm")
        self._robot_palm = hs.palm_frame(self.neutral_points)
        self._robot_palm_rt = self._robot_palm[:3, :3].T  # its rotation, transposed
        seg = self.neutral_points
        self._segment_length = np.array([np.linalg.norm(seg[b] - seg[a]) for a, b in _SEGMENTS])
        self._chain_length = np.array([
            sum(np.linalg.norm(seg[c[k + 1]] - seg[c[k]]) for k in range(4)) for c in hs.CHAINS
        ])
        pairs = _SEGMENTS + _WRIST_TIPS + _PINCHES
        self._a = np.array([a for a, _ in pairs])
        self._b = np.array([b for _, b in pairs])
        self._n_seg, self._n_tip = len(_SEGMENTS), len(_WRIST_TIPS)
        self._seg_bones = np.array([hs.BONES.index(pair) for pair in _SEGMENTS])  # segments are bones 2-4 of a chain
        self._segment_length53 = self._segment_length.reshape(5, 3)  # per finger
        if list(self._seg_bones) != [4 * f + k for f in range(5) for k in (1, 2, 3)]:
            raise ConfigurationError("finger segments must be bones 2-4 of each chain")
        # rows: (wrist -> tip) = tip of each finger (5), then (thumb tip -> tip) = tip - thumb tip (4)
        self._tip_pinch = np.vstack([np.eye(5), hs.difference_matrix([(0, f) for f in range(1, 5)], 5)])
        # their scales: each finger's (5), then the mean of the thumb's and the finger's (4); 0.5 x + 0.5 y is
        # 0.5 (x + y) bit for bit
        self._tip_pinch_scale = np.vstack([np.eye(5), 0.5 * np.abs(self._tip_pinch[5:])])
        self._weights = np.array(
            [settings.segment_weight] * self._n_seg + [settings.tip_weight] * (len(pairs) - self._n_seg)
        )
        n = len(pairs)
        self._n_res = n
        self._residual_difference = hs.difference_matrix(pairs, hs.N_POINTS)  # P -> P[b] - P[a], exactly
        # Residual Jacobian assembly: moving points are numbered finger * 3 + (0 PIP, 1 DIP, 2 TIP); the
        # residual P[b] - P[a] has the Jacobian (+1 at its end point, -1 at its start point) over them.
        self._difference = np.zeros((n, 15))
        for r, (start, end) in enumerate(zip(self._moving_number(self._a), self._moving_number(self._b))):
            for m, sign in ((end, 1.0), (start, -1.0)):
                if m is not None:
                    self._difference[r, m] = sign
        # Gathers (flat indices) for _point_jacobians, each entry (moving point m, xyz i, column c): from data.J
        # extended by a zero column (6, 21), the rows v_i, w_(i+1), w_(i+2) at c where point m depends on
        # joint c (its finger's joints, but for the PIP not the DIP joint), else the zero column; from the
        # keypoints (21, 3), the coordinates p_(i+2), p_(i+1) of point m.
        self._J_extended = np.zeros((6, N_HAND + 1))
        column = np.full((15, N_HAND), N_HAND)
        for m in range(15):
            finger, kind = divmod(m, 3)
            joints = self._cols[finger, :3] if kind == 0 else self._cols[finger]
            column[m, joints] = joints
        i = np.arange(3)
        rows = np.stack([i, 3 + (i + 1) % 3, 3 + (i + 2) % 3])  # (3 parts, 3 xyz)
        self._J_gather = rows[:, None, :, None] * (N_HAND + 1) + column[None, :, None, :]  # (3, 15, 3, 20)
        coords = np.stack([(i + 2) % 3, (i + 1) % 3])  # (2 parts, 3 xyz)
        self._p_gather = self._moving_index[None, :, None, None] * 3 + coords[:, None, :, None]  # (2, 15, 3, 1)

    @staticmethod
    def _moving_number(points: np.ndarray) -> list[int | None]:
        """Moving-point number (finger * 3 + 0 PIP, 1 DIP, 2 TIP) of each keypoint index, None for fixed points."""
        return [None if i == hs.WRIST or (i - 1) % 4 == 0 else (i - 1) // 4 * 3 + (i - 1) % 4 - 1 for i in points]

    # ------------------------------------------------------------------ kinematics
    def _positions(self, q: np.ndarray) -> np.ndarray:
        """Keypoints (21, 3) [m] at ``q`` (palm frame); leaves ``self.data`` at ``q`` for :meth:`_point_jacobians`."""
        data = self.data
        pin.computeJointJacobians(self.model, data, q)
        oMi = data.oMi
        H = np.array([oMi[j].homogeneous for j in self._j34]).reshape(5, 2, 4, 4)  # joints 3 and 4 per finger
        P = self._fixed.copy()
        pts = P[1:].reshape(5, 4, 3)[:, 1:]  # view: PIP, DIP, TIP of each finger (5, 3, 3)
        pts[:, :2] = H[:, :, :3, 3]  # PIP, DIP: origins of joints 3 and 4
        H4 = H[:, 1]
        np.add((H4[:, :3, :3] @ self._tip_offset)[:, :, 0], H4[:, :3, 3], out=pts[:, 2])  # TIP: R4 tip + t4
        return P

    def _point_jacobians(self, P: np.ndarray) -> np.ndarray:
        """(15, 3, 20) Jacobians of the moving points (number finger * 3 + 0 PIP, 1 DIP, 2 TIP) at the ``q`` of
        the last :meth:`_positions` call, whose keypoints are ``P``."""
        # point Jacobian column of joint j for point p: v_j + w_j x p (joint Jacobians at the world origin),
        # 0 for the joints it does not depend on; the cross product is written out over rolled rows
        # (np.cross is slow): (w x p)_i = w_(i+1) p_(i+2) - w_(i+2) p_(i+1)
        J = self._J_extended
        J[:, :N_HAND] = self.data.J
        parts = J.take(self._J_gather)  # v, w_(i+1), w_(i+2): (3, 15, 3, 20)
        cross = parts[1:] * P.take(self._p_gather)  # w_(i+1) p_(i+2), w_(i+2) p_(i+1)
        jacobian = parts[0] + cross[0]
        jacobian -= cross[1]
        return jacobian

    def keypoints(self, q: np.ndarray) -> np.ndarray:
        """The robot's 21 keypoints (21, 3) [m] in the palm frame at joint angles ``q`` (20,)."""
        return self._positions(np.asarray(q, dtype=float))

    def point_jacobians(self, q: np.ndarray) -> np.ndarray:
        """(21, 3, 20) Jacobians of the 21 keypoints at ``q`` (for tests and tools)."""
        P = self._positions(np.asarray(q, dtype=float))
        out = np.zeros((hs.N_POINTS, 3, N_HAND))
        out[self._moving_index] = self._point_jacobians(P)
        return out

    def _residual_jacobian(self, P: np.ndarray, sw: np.ndarray) -> np.ndarray:
        """(3n, 20) weighted Jacobian of the residual vectors ``sw * (P[b] - P[a])`` (rows residual-major, then
        xyz) at the ``q`` of the last :meth:`_positions` call (keypoints ``P``); ``sw``: (n, 1, 1)."""
        # the +-1 combination of the points' rows is exact: the same bits as subtracting them
        residual = self._difference @ self._point_jacobians(P).reshape(15, -1)
        return (residual.reshape(-1, 3, N_HAND) * sw).reshape(-1, N_HAND)

    # ------------------------------------------------------------------ targets
    def targets(self, human: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Target vectors (n, 3) [m] in the robot palm frame and their weights (n,).

        ``human``: (21, 3) keypoints in any frame; must pass :func:`hand_skeleton.check`.
        """
        human = np.asarray(human, dtype=float)
        R = hs._palm_axes(human)
        if R is None:
            raise ValueError("degenerate palm")
        return self._targets(R, hs.bone_vectors(human))

    def _targets(self, R: np.ndarray, bones: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`targets` of a skeleton with palm axes ``R`` (3, 3) and bone vectors ``bones`` (20, 3) [m]
        (:func:`hand_skeleton.check_details`)."""
        s = self.settings
        # rows 0-19: the human bone vectors, rotated from their palm frame into the robot's palm frame;
        # rows 20-28: wrist -> tip per finger (5), then thumb tip -> finger tips (4)
        vectors = np.empty((hs.N_BONES + 9, 3))
        rotated = vectors[:hs.N_BONES]
        bones4 = rotated.reshape(5, 4, 3)  # per finger
        tip_pinch = vectors[hs.N_BONES:]
        bones.dot(R.dot(self._robot_palm_rt), out=rotated)
        self._tip_pinch.dot(np.add.reduce(bones4, 1), out=tip_pinch)
        norms = np.add.reduce(vectors * vectors, 1)
        np.sqrt(norms, out=norms)  # lengths [m] of the rows of vectors
        length = norms[:hs.N_BONES]
        np.maximum(length, 1e-9, out=length)  # coincident points guarded
        length4 = length.reshape(5, 4)
        scale = self._chain_length / np.add.reduce(length4, 1)
        np.minimum(np.maximum(scale, s.min_scale, out=scale), s.max_scale, out=scale)
        n_seg = self._n_seg
        target = np.empty((self._n_res, 3))
        # segments: bones 2-4 of each chain, at the robot's segment lengths
        np.multiply(bones4[:, 1:], (self._segment_length53 / length4[:, 1:])[:, :, None],
                    out=target[:n_seg].reshape(5, 3, 3))
        # wrist -> tip and thumb tip -> tip, scaled by the finger's chain length ratio, and the mean of the
        # thumb's and the finger's
        np.multiply(tip_pinch, self._tip_pinch_scale.dot(scale)[:, None], out=target[n_seg:])
        closeness = norms[hs.N_BONES + 5:]  # from the thumb tip -> finger tip distances
        closeness /= s.pinch_threshold
        np.maximum(np.subtract(1.0, closeness, out=closeness), 0.0, out=closeness)
        weights = self._weights.copy()
        weights[n_seg + self._n_tip:] += (s.pinch_weight - s.tip_weight) * closeness
        return target, weights

    # ------------------------------------------------------------------ solve
    def _bounded_step(self, JtJ: np.ndarray, mu: float, g: np.ndarray, q: np.ndarray,
                      limits: tuple[list[float], list[float]]) -> tuple[np.ndarray, np.ndarray | None] | None:
        """Gauss-Newton step of ``A dq = -g``, ``A = JtJ + mu I`` (symmetric), within the joint limits (active set).

        A joint at a bound whose gradient pushes outwards stays there; a joint
        the step would carry past a bound stops at the bound and the others
        are solved again given that (at most a few rounds). ``limits``: the
        lower and upper limits [rad] as lists.

        Returns:
            the step, and ``q + step`` where that is known to be within the limits (else None); None if
            ``A`` is not positive definite.
        """
        if not _reaches(q.tolist(), *limits):
            delta = _spd_solve(JtJ + mu * _EYE, -g)  # the usual case: nothing at a bound
            if delta is None:
                return None
            trial = q + delta
            if not _leaves(trial.tolist(), *limits):
                return delta, trial
        # the active set is kept in Python lists: cheaper than numpy calls on 20 flags
        lower, upper = limits
        A = JtJ + mu * _EYE
        x = q.tolist()
        fixed = [(v <= lo and gi > 0) or (v >= hi and gi < 0) for v, lo, hi, gi in zip(x, lower, upper, g.tolist())]
        delta = np.zeros(N_HAND)
        for _ in range(5):
            if all(fixed):
                return delta, None
            if any(fixed):
                free = [i for i, f in enumerate(fixed) if not f]
                held = [i for i, f in enumerate(fixed) if f]
                A_free = A.take(free, axis=0)  # rows of the free joints; take keeps sub-matrices C-ordered
                d = _spd_solve(A_free.take(free, axis=1),
                               -(g.take(free) + A_free.take(held, axis=1).dot(delta.take(held))))
                if d is None:
                    return None
                delta[free] = d
            else:
                delta = _spd_solve(A.copy(), -g)
                if delta is None:
                    return None
            trial = (q + delta).tolist()
            out = [i for i, (f, t, lo, hi) in enumerate(zip(fixed, trial, lower, upper))
                   if not f and (t < lo or t > hi)]
            if not out:
                return delta, None
            for i in out:  # stop at the bound
                delta[i] = min(max(trial[i], lower[i]), upper[i]) - x[i]
                fixed[i] = True
        return delta, None

    def retarget(self, human: np.ndarray, q_init: np.ndarray | None = None) -> RetargetResult:
        """Joint angles (20,) whose keypoint vectors best match the human skeleton's.

        Gauss-Newton steps within the joint limits (:meth:`_bounded_step`), at
        most ``max_step`` per joint; a step that raises the cost is rejected and
        retried with more Levenberg-Marquardt damping. A step smaller than
        ``step_tolerance`` ends the solve without a further evaluation.

        Args:
            human: (21, 3) MediaPipe keypoints [m] (any frame; see :func:`hand_skeleton.check`).
            q_init: (20,) previous solution (warm start and regularisation target); default:
                the middle of each joint's range.
        Raises:
            ValueError if the skeleton fails :func:`hand_skeleton.check` (callers check first).
        """
        human = np.asarray(human, dtype=float)
        if human.shape != (hs.N_POINTS, 3) or not np.isfinite(human).all():
            raise ValueError(f"expected 21 finite 3-D points, got shape {human.shape}")
        R = hs._palm_axes(human)
        if R is None:
            raise ValueError("degenerate palm")
        return self._solve(R, hs.bone_vectors(human), q_init)

    def _solve(self, R: np.ndarray, bones: np.ndarray, q_init: np.ndarray | None) -> RetargetResult:
        """:meth:`retarget` of a skeleton with palm axes ``R`` (3, 3) and bone vectors ``bones`` (20, 3) [m]
        (:func:`hand_skeleton.check_details`)."""
        s = self.settings
        target, weights = self._targets(R, bones)
        sw = np.sqrt(weights)[:, None]
        swJ = sw[:, :, None]
        difference = self._residual_difference
        lower, upper = self.lower, self.upper
        if q_init is None:
            # cold start: from mid-range (from 0, on the thumb's bounds, it can stall), no pull
            # towards it, and converged tightly, since the following frames start from it
            q_prev = 0.5 * (lower + upper)
            prior, cost_tolerance, step_tolerance = 0.0, 1e-9, 1e-6
        else:
            q_prev = np.minimum(np.maximum(q_init, lower), upper)
            prior, cost_tolerance, step_tolerance = s.previous_weight, s.cost_tolerance, s.step_tolerance
        q = q_prev.copy()
        max_step, damping = s.max_step, s.damping
        prior_eye = prior * _EYE
        limits = lower.tolist(), upper.tolist()

        def evaluate(q: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray]:
            """Cost at ``q``, its residual part r.r, weighted residual r (3n,), keypoints (21, 3), ``q - q_prev``."""
            P = self._positions(q)
            r = difference.dot(P)  # P[b] - P[a]
            r -= target
            r *= sw
            r = r.reshape(-1)
            d = q - q_prev
            rr = float(r.dot(r))
            return rr + prior * float(d.dot(d)), rr, r, P, d

        cost, rr, r, P, d = evaluate(q)
        mu = damping
        iterations = 0
        stale = True  # the normal equations must be (re)built at q
        while iterations < s.max_iterations:
            if stale:
                # the last evaluation was at q (stale is only set after one), so self.data is at q
                Jr = self._residual_jacobian(P, swJ)
                JrT = Jr.T
                g = JrT.dot(r)
                g += prior * d
                JtJ = JrT.dot(Jr)
                JtJ += prior_eye
            bounded = self._bounded_step(JtJ, mu, g, q, limits)
            if bounded is None:
                break
            dq, q_new = bounded
            peak = _max(np.abs(dq))
            if peak > max_step:
                dq *= max_step / peak
                peak = max_step
                q_new = None
            if q_new is None:  # else q + dq is known to be within the limits already
                q_new = q + dq
                np.minimum(np.maximum(q_new, lower, out=q_new), upper, out=q_new)
            iterations += 1
            step = q_new - q
            # decrease the linear model promises
            predicted = -(2.0 * float(g.dot(step)) + float(step.dot(JtJ).dot(step)))
            if peak < step_tolerance or (stale and predicted <= cost_tolerance * cost):
                # a small step in the region where the model is accurate: take it without another evaluation
                q = q_new
                break
            cost_new, rr_new, r_new, P_new, d_new = evaluate(q_new)
            gain = (cost - cost_new) / predicted if predicted > 0 else -1.0
            if gain > 0:  # accept
                improvement = cost - cost_new
                q, cost, rr, r, P, d = q_new, cost_new, rr_new, r_new, P_new, d_new
                stale = True
                # Levenberg-Marquardt (Nielsen): trust the model more when it predicted well
                mu = max(mu * max(1.0 / 3.0, 1.0 - (2.0 * gain - 1.0) ** 3), damping)
                if improvement <= cost_tolerance * cost:
                    break  # no longer paying for itself
            else:  # reject and retry from the same point with more damping
                mu = max(mu * 4.0, 1e-6)
                stale = False
                if mu > 1.0:
                    break
        return RetargetResult(q, rr, iterations)


def _reaches(x: list[float], lower: list[float], upper: list[float]) -> bool:
    """Whether any ``x[i] <= lower[i]`` or ``x[i] >= upper[i]`` (Python floats: cheaper than numpy on 20)."""
    for v, lo, hi in zip(x, lower, upper):
        if v <= lo or v >= hi:
            return True
    return False


def _leaves(x: list[float], lower: list[float], upper: list[float]) -> bool:
    """Whether any ``x[i] < lower[i]`` or ``x[i] > upper[i]`` (Python floats)."""
    for v, lo, hi in zip(x, lower, upper):
        if v < lo or v > hi:
            return True
    return False


def _exceeds(change: list[float], velocity: list[float], dt: float) -> bool:
    """Whether any ``|change[i]| > velocity[i] * dt`` (Python floats)."""
    for c, v in zip(change, velocity):
        if abs(c) > v * dt:
            return True
    return False


def _spd_solve(A: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """x with ``A x = b`` (LAPACK dposv) for a C-ordered symmetric ``A``, None if it is not positive definite.

    ``A`` and ``b`` are overwritten. ``A.T`` is ``A`` for a symmetric matrix and is Fortran-ordered, as LAPACK
    wants it, so it is factored in place instead of through a copy.
    """
    _, x, info = dposv(A.T, b, overwrite_a=1, overwrite_b=1)
    return x if info == 0 else None


class HandCommand(NamedTuple):
    """Output of :meth:`HandPipeline.step`."""

    q: np.ndarray | None  # (20,) joint command [rad], finite and within the limits; None before the first good frame
    held: bool  # True: the input was rejected and the last good command repeated
    reason: str | None  # why it was held (a hand_skeleton.REASONS word or "solver"), else None
    solve_time: float  # [s] wall time of the retargeting (0 when rejected before solving)


class HandPipeline:
    """One hand: skeleton checks -> :class:`HandRetargeter` -> EMA -> velocity limit, holding on bad input.

    Bad input (see :func:`hand_skeleton.check`, including the mirror image of
    this side's hand, or a failed solve) repeats the last good command and
    counts the event in :attr:`held`. There is no command before the first
    good frame (``q`` is None): nothing to hold yet, and no posture is
    invented. The first good solution seeds the EMA; afterwards each command
    moves at most ``velocity * dt`` from the previous one (``dt`` from the
    frames' stamps), so a glitch that gets through the checks cannot make the
    hand jump faster than its joints can move.
    """

    def __init__(self, retargeter: HandRetargeter, ema_alpha: float = 0.5,
                 velocity: np.ndarray | None = None, max_dt: float = 0.1) -> None:
        """
        Args:
            retargeter: the hand's retargeter.
            ema_alpha: weight of the newest solution in the exponential moving average
                (1 = no smoothing; smaller = smoother and more lag), in (0, 1].
            velocity: (20,) joint velocity limits [rad/s] for the per-frame change; None = no limit.
            max_dt: [s] largest frame interval used for that limit (after a pause the hand catches up
                at this many seconds' worth of motion per frame).
        """
        self.retargeter = retargeter
        self.side = retargeter.side
        self._ema_alpha = ema_alpha
        ExponentialSmoother(ema_alpha, np.zeros(1))  # validates the factor now
        self.smoother: ExponentialSmoother | None = None
        self.velocity = None if velocity is None else np.asarray(velocity, dtype=float)
        self.max_dt = max_dt
        self._solution: np.ndarray | None = None  # last raw solution (warm start)
        self._command: np.ndarray | None = None
        self._stamp: float | None = None
        self.held: dict[str, int] = {reason: 0 for reason in (*hs.REASONS, "solver")}
        self.frames = 0  # good frames
        self.limited = 0  # frames whose change was cut to the velocity limit

    @property
    def command(self) -> np.ndarray | None:
        """The last command (None before the first good frame)."""
        return self._command

    def _hold(self, reason: str, solve_time: float = 0.0) -> HandCommand:
        self.held[reason] += 1
        return HandCommand(self._command, True, reason, solve_time)

    def step(self, points: np.ndarray, stamp: float | None = None) -> HandCommand:
        """Process one frame captured at ``stamp`` [s] (needed for the velocity limit)."""
        points = np.asarray(points, dtype=float)
        checked = hs.check_details(points, self.side)
        if checked.problem is not None:
            return self._hold(checked.problem.reason)
        t0 = time.perf_counter()
        try:
            result = self.retargeter._solve(checked.axes, checked.bones, self._solution)  # = retarget(points, ...)
        except ValueError:
            result = None
        elapsed = time.perf_counter() - t0
        r = self.retargeter
        if result is None or not _all(np.isfinite(result.q)):
            return self._hold("solver", elapsed)
        self._solution = q = result.q  # within the limits: every iterate is clipped to them
        if self.smoother is None:
            self.smoother = ExponentialSmoother(self._ema_alpha, q)
            command = q
        else:
            command = self.smoother.update(q)
            if self.velocity is not None and stamp is not None and self._stamp is not None:
                dt = min(max(stamp - self._stamp, 0.0), self.max_dt)
                change = command - self._command
                if _exceeds(change.tolist(), self.velocity.tolist(), dt):
                    self.limited += 1
                    limit = self.velocity * dt
                    command = self._command + np.minimum(np.maximum(change, -limit), limit)
                    self.smoother.value = command
        self._command = np.minimum(np.maximum(command, r.lower), r.upper)
        if stamp is not None:
            self._stamp = stamp
        self.frames += 1
        return HandCommand(self._command, False, None, elapsed)


def split_backlog(samples: list, max_backlog: float) -> tuple[list, dict[str, int]]:
    """The samples to process of one poll: those at most ``max_backlog`` [s] older than the newest sample of
    their hand, in input order, and the number dropped per side. Teleoperation wants the newest hand, not a
    backlog a late poll collected. ``samples``: objects with ``side`` and ``stamp`` [s]."""
    newest: dict[str, float] = {}
    for sample in samples:
        newest[sample.side] = max(newest.get(sample.side, sample.stamp), sample.stamp)
    kept, dropped = [], {}
    for sample in samples:
        if newest[sample.side] - sample.stamp > max_backlog:
            dropped[sample.side] = dropped.get(sample.side, 0) + 1
        else:
            kept.append(sample)
    return kept, dropped

