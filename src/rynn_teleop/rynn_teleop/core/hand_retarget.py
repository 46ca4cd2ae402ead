"""Human 21-point hand skeleton -> 20 Wuji joint angles (ROS-free).

Vector retargeting in the spirit of DexPilot, solved by a bounded
Levenberg-Marquardt on the hand's own kinematics (Pinocchio FK and joint
Jacobians of the project's Wuji model, reduced to the hand's 20 joints):

* the human points are expressed in their own palm frame
  (:func:`~.hand_skeleton.palm_frame`) and placed into the robot's palm frame
  through the robot's palm frame built the same way (this also mirrors left
  and right correctly: both are built from the points);
* residuals (all 3-D vectors, metres): every finger segment (MCP->PIP,
  PIP->DIP, DIP->TIP; thumb CMC->MCP, MCP->IP, IP->TIP) with the robot's own
  segment length along the human segment's direction; wrist->tip per finger,
  the human vector scaled by the ratio of robot to human chain length;
  thumb tip -> each finger tip, scaled the same way, whose weight rises from
  ``tip_weight`` to ``pinch_weight`` as the human distance falls below
  ``pinch_threshold`` (DexPilot's pinch priority: a human pinch closes the
  robot's thumb and finger tips);
* a term ``previous_weight * |q - q_prev|^2`` keeps the solution near the
  previous one; the solve is warm-started from it; joint limits are bounds
  (projected steps).

Written by hand instead of using dex-retargeting's optimisers (NLopt SLSQP
over numerical cost callbacks): the hand is five independent 4-joint chains,
so one Gauss-Newton system of 20 unknowns per iteration, built from
Pinocchio's joint Jacobians in a few vectorised numpy operations, converges
in a handful of iterations; ``bench/hand_retarget.py`` compares both.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import pinocchio as pin
from scipy.linalg.lapack import dposv

from ..errors import ConfigurationError
from . import hand_skeleton as hs
from .motion import ExponentialSmoother
from .robot_model import GROUPS, N_HAND, RobotModel, hand_joint_names


class RetargetSettings(NamedTuple):
    """Tuning of :class:`HandRetargeter`."""

    max_iterations: int = 30  # [-] Gauss-Newton iterations per frame (a warm-started frame needs 1-3)
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
    cost: float  # [m^2] weighted squared residual (before the last step when it was below step_tolerance)
    iterations: int  # [-]


# Residual vectors as (from, to) MediaPipe indices.
_SEGMENTS = tuple((c[k], c[k + 1]) for c in hs.CHAINS for k in (1, 2, 3))
_WRIST_TIPS = tuple((hs.WRIST, t) for t in hs.TIPS)
_PINCHES = tuple((hs.TIPS[0], t) for t in hs.TIPS[1:])


class HandRetargeter:
    """Retargets one hand (``side``) of the robot."""

    def __init__(self, robot: RobotModel, side: str, settings: RetargetSettings = RetargetSettings()) -> None:
        if side not in ("left", "right"):
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
        self.neutral_points = self.keypoints(np.zeros(N_HAND))
        if hs.check(self.neutral_points) is not None:
            raise ConfigurationError(f"the {side} robot hand's own keypoints do not form a palm")
        self._robot_palm = hs.palm_frame(self.neutral_points)
        seg = self.neutral_points
        self._segment_length = np.array([np.linalg.norm(seg[b] - seg[a]) for a, b in _SEGMENTS])
        self._chain_length = np.array([
            sum(np.linalg.norm(seg[c[k + 1]] - seg[c[k]]) for k in range(4)) for c in hs.CHAINS
        ])
        pairs = _SEGMENTS + _WRIST_TIPS + _PINCHES
        self._a = np.array([a for a, _ in pairs])
        self._b = np.array([b for _, b in pairs])
        self._n_seg, self._n_tip = len(_SEGMENTS), len(_WRIST_TIPS)
        self._bone_child = np.array([c for _, c in hs.BONES])
        self._bone_parent = np.array([p for p, _ in hs.BONES])
        self._seg_bones = np.array([hs.BONES.index(pair) for pair in _SEGMENTS])  # segments are bones 2-4 of a chain
        self._weights = np.array([settings.segment_weight] * self._n_seg + [settings.tip_weight] * (len(pairs) - self._n_seg))
        # Residual Jacobian assembly: moving points are numbered finger * 3 + (0 PIP, 1 DIP, 2 TIP).
        n = len(pairs)
        self._n_res = n
        self._difference = np.zeros((n, 15))  # residual r = P[b] - P[a] over the moving points
        for rows, pts, sign in (self._endpoint_map(self._b) + (1.0,), self._endpoint_map(self._a) + (-1.0,)):
            self._difference[rows[:, 0], pts] += sign
        self._point_rows = np.arange(15)[:, None]
        self._point_cols = np.repeat(self._cols, 3, axis=0)  # (15, 4): moving point -> its finger's columns

    @staticmethod
    def _endpoint_map(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the residuals whose endpoint moves: residual rows (m, 1) and moving-point numbers (m,)."""
        rows, pts = [], []
        for r, i in enumerate(points):
            if i == hs.WRIST or (i - 1) % 4 == 0:  # wrist and MCP/CMC are fixed
                continue
            finger, kind = (i - 1) // 4, (i - 1) % 4 - 1
            rows.append(r)
            pts.append(finger * 3 + kind)
        return np.array(rows)[:, None], np.array(pts)

    # ------------------------------------------------------------------ kinematics
    def _moving(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions (21, 3) [m] and Jacobians (15, 3, 4) of the moving points at ``q`` (palm frame).

        Moving point ``finger * 3 + k`` (k: 0 PIP, 1 DIP, 2 TIP) depends on its finger's 4 joints.
        """
        data = self.data
        pin.computeJointJacobians(self.model, data, q)
        oMi = data.oMi
        H4 = np.array([oMi[j].homogeneous for j in self._j4])  # (5, 4, 4)
        P = self._fixed.copy()
        pts = P[1:].reshape(5, 4, 3)[:, 1:]  # view: PIP, DIP, TIP of each finger (5, 3, 3)
        pts[:, 0] = [oMi[j].translation for j in self._j3]
        pts[:, 1] = H4[:, :3, 3]
        pts[:, 2] = (H4[:, :3, :3] @ self._tip_xyz[:, :, None])[:, :, 0] + H4[:, :3, 3]
        # point Jacobian column of joint j for point p: v_j + w_j x p (joint Jacobians at the world origin)
        J = data.J
        Jc = J[:, self._cols]  # (6, 5 fingers, 4 joints)
        v, w = Jc[:3, :, None, :], Jc[3:, :, None, :]  # (3, 5, 1, 4)
        p = pts.transpose(2, 0, 1)[:, :, :, None]  # (3, 5, 3 points, 1)
        block = np.empty((3, 5, 3, 4))  # (xyz, finger, point, joint) = v + w x p, written out (np.cross is slow)
        block[0] = v[0] + w[1] * p[2] - w[2] * p[1]
        block[1] = v[1] + w[2] * p[0] - w[0] * p[2]
        block[2] = v[2] + w[0] * p[1] - w[1] * p[0]
        block[:, :, 0, 3] = 0.0  # the PIP does not depend on the DIP joint
        return P, block.transpose(1, 2, 3, 0).reshape(15, 4, 3)

    def keypoints(self, q: np.ndarray) -> np.ndarray:
        """The robot's 21 keypoints (21, 3) [m] in the palm frame at joint angles ``q`` (20,)."""
        return self._moving(np.asarray(q, dtype=float))[0]

    def point_jacobians(self, q: np.ndarray) -> np.ndarray:
        """(21, 3, 20) Jacobians of the 21 keypoints at ``q`` (for tests and tools)."""
        _, block = self._moving(np.asarray(q, dtype=float))
        out = np.zeros((hs.N_POINTS, 3, N_HAND))
        for m in range(15):
            finger, kind = divmod(m, 3)
            out[1 + 4 * finger + 1 + kind][:, self._cols[finger]] = block[m].T
        return out

    def _residual_jacobian(self, block: np.ndarray) -> np.ndarray:
        """(n, 3, 20) Jacobian of the residual vectors P[b] - P[a], from the moving points' blocks."""
        dense = np.zeros((15, N_HAND, 3))
        dense[self._point_rows, self._point_cols] = block  # each moving point's 4 joint columns
        # residual = (+1 at its end point, -1 at its start point) over the 15 moving points
        return (self._difference @ dense.reshape(15, -1)).reshape(-1, N_HAND, 3).transpose(0, 2, 1)

    # ------------------------------------------------------------------ targets
    def targets(self, human: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Target vectors (n, 3) [m] in the robot palm frame and their weights (n,).

        ``human``: (21, 3) keypoints in any frame; must pass :func:`hand_skeleton.check`.
        """
        s = self.settings
        T = hs.palm_frame(human)
        if T is None:
            raise ValueError("degenerate palm")
        # human bone vectors, rotated from their palm frame into the robot's palm frame
        bones = (human[self._bone_child] - human[self._bone_parent]) @ (T[:3, :3] @ self._robot_palm[:3, :3].T)
        length = np.maximum(np.sqrt((bones * bones).sum(axis=1)), 1e-9)  # (20,) [m], coincident points guarded
        scale = np.minimum(np.maximum(self._chain_length / length.reshape(5, 4).sum(axis=1), s.min_scale), s.max_scale)
        tip = bones.reshape(5, 4, 3).sum(axis=1)  # wrist -> tip per finger
        pinch = tip[1:] - tip[0]  # thumb tip -> finger tips
        n_seg, n_tip = self._n_seg, self._n_tip
        target = np.empty((self._n_res, 3))
        target[:n_seg] = bones[self._seg_bones] * (self._segment_length / length[self._seg_bones])[:, None]
        target[n_seg:n_seg + n_tip] = tip * scale[:, None]
        target[n_seg + n_tip:] = pinch * (0.5 * (scale[0] + scale[1:]))[:, None]
        weights = self._weights.copy()
        closeness = np.maximum(1.0 - np.sqrt((pinch * pinch).sum(axis=1)) / s.pinch_threshold, 0.0)
        weights[n_seg + n_tip:] += (s.pinch_weight - s.tip_weight) * closeness
        return target, weights

    # ------------------------------------------------------------------ solve
    def _bounded_step(self, A: np.ndarray, g: np.ndarray, q: np.ndarray) -> np.ndarray | None:
        """Gauss-Newton step of ``A dq = -g`` within the joint limits (active set).

        A joint at a bound whose gradient pushes outwards stays there; a joint
        the step would carry past a bound stops at the bound and the others
        are solved again given that (at most a few rounds).
        """
        lower, upper = self.lower, self.upper
        if not ((q <= lower).any() or (q >= upper).any()):
            _, delta, info = dposv(A, -g)  # the usual case: nothing at a bound
            if info != 0:
                return None
            if not ((q + delta < lower).any() or (q + delta > upper).any()):
                return delta
        fixed = ((q <= lower) & (g > 0)) | ((q >= upper) & (g < 0))
        delta = np.zeros(N_HAND)
        for _ in range(5):
            if fixed.all():
                return delta
            if fixed.any():
                free = ~fixed
                rhs = -(g[free] + A[np.ix_(free, fixed)] @ delta[fixed])
                _, d, info = dposv(A[np.ix_(free, free)], rhs)
                if info != 0:
                    return None
                delta[free] = d
            else:
                _, delta, info = dposv(A, -g)
                if info != 0:
                    return None
            trial = q + delta
            out = ~fixed & ((trial < lower) | (trial > upper))
            if not out.any():
                return delta
            delta[out] = np.minimum(np.maximum(trial[out], lower[out]), upper[out]) - q[out]
            fixed |= out
        return delta

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
        s = self.settings
        target, weights = self.targets(human)  # ValueError for a degenerate palm
        sw = np.sqrt(weights)[:, None]
        swJ = sw[:, :, None]
        a, b = self._a, self._b
        if q_init is None:
            # cold start: from mid-range (from 0, on the thumb's bounds, it can stall), no pull
            # towards it, and converged tightly, since the following frames start from it
            q_prev = 0.5 * (self.lower + self.upper)
            prior, cost_tolerance, step_tolerance = 0.0, 1e-9, 1e-6
        else:
            q_prev = np.minimum(np.maximum(q_init, self.lower), self.upper)
            prior, cost_tolerance, step_tolerance = s.previous_weight, s.cost_tolerance, s.step_tolerance
        q = q_prev.copy()
        eye = np.eye(N_HAND)

        def evaluate(q: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
            P, block = self._moving(q)
            r = ((P[b] - P[a] - target) * sw).reshape(-1)
            d = q - q_prev
            return float(r @ r) + prior * float(d @ d), r, block

        cost, r, block = evaluate(q)
        mu = s.damping
        iterations = 0
        stale = True  # the normal equations must be (re)built at q
        while iterations < s.max_iterations:
            if stale:
                Jr = (self._residual_jacobian(block) * swJ).reshape(-1, N_HAND)
                g = Jr.T @ r + prior * (q - q_prev)
                JtJ = Jr.T @ Jr + prior * eye
            dq = self._bounded_step(JtJ + mu * eye, g, q)
            if dq is None:
                break
            peak = np.abs(dq).max()
            if peak > s.max_step:
                dq *= s.max_step / peak
                peak = s.max_step
            q_new = np.minimum(np.maximum(q + dq, self.lower), self.upper)
            iterations += 1
            step = q_new - q
            predicted = -(2.0 * float(g @ step) + float(step @ JtJ @ step))  # decrease the linear model promises
            if peak < step_tolerance or (stale and predicted <= cost_tolerance * cost):
                # a small step in the region where the model is accurate: take it without another evaluation
                q = q_new
                break
            cost_new, r_new, block_new = evaluate(q_new)
            gain = (cost - cost_new) / predicted if predicted > 0 else -1.0
            if gain > 0:  # accept
                improvement = cost - cost_new
                q, cost, r, block = q_new, cost_new, r_new, block_new
                stale = True
                # Levenberg-Marquardt (Nielsen): trust the model more when it predicted well
                mu = max(mu * max(1.0 / 3.0, 1.0 - (2.0 * gain - 1.0) ** 3), s.damping)
                if improvement <= cost_tolerance * cost:
                    break  # no longer paying for itself
            else:  # reject and retry from the same point with more damping
                mu = max(mu * 4.0, 1e-6)
                stale = False
                if mu > 1.0:
                    break
        return RetargetResult(q, float(r @ r), iterations)


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
        problem = hs.check(points, self.side)
        if problem is not None:
            return self._hold(problem.reason)
        t0 = time.perf_counter()
        try:
            result = self.retargeter.retarget(np.asarray(points, dtype=float), self._solution)
        except ValueError:
            result = None
        elapsed = time.perf_counter() - t0
        r = self.retargeter
        if result is None or not np.all(np.isfinite(result.q)):
            return self._hold("solver", elapsed)
        self._solution = result.q
        q = np.minimum(np.maximum(result.q, r.lower), r.upper)
        if self.smoother is None:
            self.smoother = ExponentialSmoother(self._ema_alpha, q)
            command = q
        else:
            command = self.smoother.update(q)
            if self.velocity is not None and stamp is not None and self._stamp is not None:
                dt = min(max(stamp - self._stamp, 0.0), self.max_dt)
                limit = self.velocity * dt
                change = command - self._command
                if np.any(np.abs(change) > limit):
                    self.limited += 1
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

