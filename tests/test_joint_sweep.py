"""The joint test pattern never leaves a joint's limits (position to jerk)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rynn_teleop.core.joint_state import JointStateBuffer
from rynn_teleop.core.joint_sweep import JointSweep
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, RobotModel

ROBOT = RobotModel.default()


@settings(max_examples=25, deadline=None)
@given(period=st.floats(0.5, 30.0), fraction=st.floats(0.01, 1.0), margin=st.floats(0.05, 1.0))
def test_sweep_respects_every_limit(period, fraction, margin):
    lim = ROBOT.limits
    sweep = JointSweep(lim, period, fraction, margin, center=ROBOT.neutral())
    dt = period / 2000
    t = np.arange(0, period, dt)
    q = np.stack([sweep.sample(ti).position for ti in t])
    assert np.all(q >= lim.lower - 1e-12) and np.all(q <= lim.upper + 1e-12)
    v = np.gradient(q, dt, axis=0)
    a = np.gradient(v, dt, axis=0)
    j = np.gradient(a, dt, axis=0)
    tol = 1.02  # finite-difference error
    assert np.all(np.abs(v) <= margin * lim.velocity * tol)
    assert np.all(np.abs(a[2:-2]) <= margin * lim.acceleration * tol)
    assert np.all(np.abs(j[4:-4]) <= margin * lim.jerk * tol)
    # analytic velocity and acceleration agree with the positions
    s = sweep.sample(0.3 * period)
    ahead, behind = sweep.sample(0.3 * period + 1e-6), sweep.sample(0.3 * period - 1e-6)
    np.testing.assert_allclose(s.velocity, (ahead.position - behind.position) / 2e-6, atol=1e-5)


def test_sweep_actually_moves_every_joint():
    sweep = JointSweep(ROBOT.limits, 8.0, 0.5, center=ROBOT.neutral())
    q = np.stack([sweep.sample(t).position for t in np.linspace(0, 8, 200)])
    assert np.all(q.max(axis=0) - q.min(axis=0) > 1e-3)


def test_joint_state_buffer_merges_partial_messages():
    buf = JointStateBuffer(np.zeros(54))
    assert buf.update(["left_arm_joint3", "right_finger2_joint1", "mystery_joint"], [0.5, 0.25, 9.0], stamp=1.0)
    assert buf.position[2] == 0.5 and buf.position[CANONICAL_JOINT_NAMES.index("right_finger2_joint1")] == 0.25
    assert buf.unknown_names == {"mystery_joint"}
    assert buf.update(["left_arm_joint1"], [0.1], stamp=2.0)
    assert buf.position[2] == 0.5  # untouched by the second message
    fresh = buf.fresh(now=2.5, timeout=1.0)
    assert fresh[0] and not fresh[2]
    assert not buf.update(["left_arm_joint3"], [float("nan")], stamp=3.0)
    assert not buf.update(["left_arm_joint3", "left_arm_joint4"], [0.1], stamp=3.0)
    assert buf.position[2] == 0.5 and buf.rejected == 2 and buf.latest_stamp == 2.0
