"""Hand retargeting (core.hand_retarget) and the skeleton layout (core.hand_skeleton)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation

from rynn_teleop.core import hand_skeleton as hs
from rynn_teleop.core.hand_retarget import HandPipeline, HandRetargeter
from rynn_teleop.core.motion import ExponentialSmoother
from rynn_teleop.core.robot_model import GROUPS, RobotModel
from rynn_teleop.errors import ConfigurationError

SIDES = ("left", "right")


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


@pytest.fixture(scope="module")
def retargeters(robot) -> dict[str, HandRetargeter]:
    return {s: HandRetargeter(robot, s) for s in SIDES}


def tip_error(rt: HandRetargeter, q: np.ndarray, reference: np.ndarray) -> float:
    """Largest fingertip distance [m] between the robot at q and reference keypoints (palm frame)."""
    tips = list(hs.TIPS)
    return float(np.linalg.norm(rt.keypoints(q)[tips] - reference[tips], axis=1).max())


@pytest.mark.parametrize("side", SIDES)
def test_keypoints_and_jacobians_match_the_robot_model(robot, retargeters, side):
    rt = retargeters[side]
    rng = np.random.default_rng(0)
    for _ in range(3):
        q = rng.uniform(rt.lower, rt.upper)
        full = robot.neutral()
        full[getattr(GROUPS, f"{side}_hand")] = q
        ref = robot.forward_kinematics(full, hs.robot_keypoint_frames(side), base=f"{side}_palm_link")[:, :3, 3]
        np.testing.assert_allclose(rt.keypoints(q), ref, atol=1e-12)
        J = rt.point_jacobians(q)
        eps = 1e-6
        for j in range(20):
            dq = np.zeros(20)
            dq[j] = eps
            numeric = (rt.keypoints(q + dq) - rt.keypoints(q - dq)) / (2 * eps)
            np.testing.assert_allclose(J[:, :, j], numeric, atol=1e-8)


@pytest.mark.parametrize("side", SIDES)
def test_recovers_random_robot_configurations_within_2mm(retargeters, side):
    """Keypoints from the robot's own FK (seen from an arbitrary frame) come back to <= 2 mm at the tips."""
    rt = retargeters[side]
    rng = np.random.default_rng(11 if side == "left" else 12)
    worst = 0.0
    for k in range(150):
        q_true = rng.uniform(rt.lower, rt.upper)
        points = rt.keypoints(q_true)
        seen = points @ Rotation.random(random_state=k).as_matrix().T + rng.normal(size=3)
        result = rt.retarget(seen)  # cold start
        assert np.all(result.q >= rt.lower) and np.all(result.q <= rt.upper)
        worst = max(worst, tip_error(rt, result.q, points))
    assert worst <= 2e-3


def test_left_and_right_are_mirrored(retargeters):
    """A mirrored human hand makes the other robot hand take the mirrored posture.

    (The vendor's abduction joints do not mirror their sign, so the angles differ
    in sign there; the postures must still be mirror images.)"""
    rng = np.random.default_rng(5)
    right, left = retargeters["right"], retargeters["left"]
    mirror = np.array([1.0, -1.0, 1.0])
    for _ in range(10):
        q = rng.uniform(right.lower, right.upper)
        points_right = right.keypoints(q)
        q_right = right.retarget(points_right).q
        q_left = left.retarget(points_right * mirror).q
        np.testing.assert_allclose(left.keypoints(q_left), right.keypoints(q_right) * mirror, atol=1.5e-3)


def test_a_warm_started_stream_follows_within_1mm_in_few_iterations(retargeters):
    rt = retargeters["left"]
    rng = np.random.default_rng(3)
    qa, qb = rng.uniform(rt.lower, rt.upper, size=(2, 20))
    q = None
    iterations = []
    for s in np.linspace(0.0, 1.0, 60):  # a smooth 60-frame motion between two postures
        points = rt.keypoints(qa + s * (qb - qa))
        result = rt.retarget(points, q)
        q = result.q
        iterations.append(result.iterations)
        assert tip_error(rt, q, points) <= 1e-3
    assert np.mean(iterations[1:]) <= 3


def test_pinch_weighting_closes_the_robot_pinch(retargeters):
    """Human thumb and index tips touching (other fingers unchanged): the robot's meet too."""
    rt = retargeters["right"]
    q = np.zeros(20)
    q[[0, 1, 2, 3]] = [1.0, 0.5, 0.6, 0.4]  # thumb across the palm
    q[[4, 6, 7]] = [0.7, 0.6, 0.5]  # index curled
    points = rt.keypoints(q)
    # move the human index tip onto the thumb tip (a pinch the robot cannot make exactly)
    points[hs.TIPS[1]] = points[hs.TIPS[0]] + [0.0, 0.0, 0.002]
    pinched = rt.retarget(points, q).q
    tips = rt.keypoints(pinched)
    gap = np.linalg.norm(tips[hs.TIPS[0]] - tips[hs.TIPS[1]])
    open_gap = np.linalg.norm(rt.keypoints(q)[hs.TIPS[0]] - rt.keypoints(q)[hs.TIPS[1]])
    assert gap < 0.01 and gap < 0.5 * open_gap
    # without the pinch priority the same input leaves the tips further apart
    plain = HandRetargeter.__new__(HandRetargeter)
    plain.__dict__.update(rt.__dict__)
    plain.settings = rt.settings._replace(pinch_weight=rt.settings.tip_weight)
    plain._weights = rt._weights
    tips_plain = plain.keypoints(plain.retarget(points, q).q)
    assert gap < np.linalg.norm(tips_plain[hs.TIPS[0]] - tips_plain[hs.TIPS[1]])


def test_skeleton_checks_name_what_is_wrong():
    from rynn_teleop.sources.hands import SyntheticGlove

    good = SyntheticGlove().pose_blend("open", "grasp", 0.5, "right")
    assert hs.check(good) is None and hs.check(good, "right") is None
    assert hs.check(good[:20]).reason == "count"
    bad = good.copy()
    bad[7, 1] = np.nan
    assert hs.check(bad).reason == "nan"
    line = good.copy()
    for i in (hs.INDEX_MCP, hs.PINKY_MCP):  # knuckles on the wrist -> middle knuckle line
        line[i] = line[hs.MIDDLE_MCP] * (0.8 if i == hs.INDEX_MCP else 0.6)
    assert hs.check(line).reason == "degenerate_palm"
    assert hs.check(good * 1000.0).reason == "implausible_size"  # millimetres given as metres
    assert hs.check(good * 1e200).reason == "implausible_size"
    collapsed = good.copy()
    collapsed[6:9] = collapsed[5]  # an undetected finger reported at its knuckle
    assert hs.check(collapsed).reason == "collapsed"
    mirrored = good * [1.0, -1.0, 1.0]
    assert hs.check(mirrored, "right").reason == "wrong_side"
    assert hs.check(mirrored, "left") is None
    T = hs.palm_frame(good)
    np.testing.assert_allclose(T[:3, :3].T @ T[:3, :3], np.eye(3), atol=1e-12)
    assert np.linalg.det(T[:3, :3]) == pytest.approx(1.0)


def test_pipeline_holds_the_last_good_command_on_bad_input(retargeters):
    rt = retargeters["left"]
    pipe = HandPipeline(rt, ema_alpha=1.0)
    good = rt.keypoints(np.full(20, 0.4))
    assert pipe.step(np.full((21, 3), np.nan)).q is None  # nothing to hold before the first good frame
    first = pipe.step(good)
    assert not first.held
    np.testing.assert_allclose(first.q, rt.retarget(good).q, atol=1e-3)  # seeded with the first solution
    for bad, reason in ((np.full((21, 3), np.nan), "nan"), (np.zeros((5, 3)), "count"),
                        (np.zeros((21, 3)), "implausible_size"), (good[:, :2], "count"),
                        (good * [1.0, -1.0, 1.0], "wrong_side")):
        out = pipe.step(bad)
        assert out.held and out.reason == reason
        np.testing.assert_array_equal(out.q, first.q)
    assert pipe.held["nan"] == 2 and pipe.held["count"] == 2
    assert pipe.held["implausible_size"] == 1 and pipe.held["wrong_side"] == 1
    assert pipe.frames == 1


def test_pipeline_limits_the_change_per_frame_to_the_joint_velocities(robot, retargeters):
    rt = retargeters["left"]
    velocity = robot.limits.velocity[robot.indices(rt.joint_names)]
    pipe = HandPipeline(rt, ema_alpha=1.0, velocity=velocity)
    open_hand, fist = rt.keypoints(np.zeros(20)), rt.keypoints(np.clip(np.full(20, 1.4), rt.lower, rt.upper))
    previous = pipe.step(open_hand, 0.0).q
    dt = 1.0 / 90.0
    for k in range(1, 40):  # the human hand jumps to a fist; the command follows at joint speed
        q = pipe.step(fist, k * dt).q
        assert np.all(np.abs(q - previous) <= velocity * dt + 1e-9)
        previous = q
    assert pipe.limited > 0
    np.testing.assert_allclose(previous, rt.retarget(fist).q, atol=0.02)  # and gets there


def test_ema_smooths_with_the_configured_factor():
    ema = ExponentialSmoother(0.25, np.zeros(3))
    out = [ema.update(np.ones(3))[0] for _ in range(4)]
    np.testing.assert_allclose(out, [0.25, 0.4375, 0.578125, 0.68359375])
    with pytest.raises(ConfigurationError):
        ExponentialSmoother(0.0, np.zeros(3))


POINTS = st.lists(st.floats(-0.3, 0.3, allow_nan=False), min_size=63, max_size=63)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(
        st.one_of(
            st.tuples(st.just("random"), POINTS),
            st.tuples(st.just("robot"), st.lists(st.floats(0.0, 1.0), min_size=20, max_size=20)),
            st.tuples(st.just("scaled"), st.floats(-12.0, 12.0)),  # hands from 1e-12 to 1e12 times too big
            st.tuples(st.just("mirrored"), st.lists(st.floats(0.0, 1.0), min_size=20, max_size=20)),
            st.tuples(st.just("nan"), st.integers(0, 62)),
            st.tuples(st.just("short"), st.integers(0, 20)),
        ),
        min_size=1, max_size=12,
    ),
    alpha=st.floats(0.05, 1.0),
)
def test_commands_stay_finite_and_within_limits_for_any_input(robot, retargeters, frames, alpha):
    rt = retargeters["right"]
    velocity = robot.limits.velocity[robot.indices(rt.joint_names)]
    pipe = HandPipeline(rt, ema_alpha=alpha, velocity=velocity)
    last = None
    last_good = None  # stamp of the last good frame
    dt = 1.0 / 90.0
    for k, (kind, arg) in enumerate(frames):
        if kind == "random":
            points = np.array(arg).reshape(21, 3)
        elif kind in ("robot", "mirrored"):
            points = rt.keypoints(rt.lower + np.array(arg) * (rt.upper - rt.lower))
            if kind == "mirrored":
                points = points * [1.0, -1.0, 1.0]
        elif kind == "scaled":
            points = rt.keypoints(np.zeros(20)) * 10.0**arg
        elif kind == "nan":
            points = rt.keypoints(np.zeros(20)).ravel()
            points[arg] = np.nan
            points = points.reshape(21, 3)
        else:
            points = np.zeros((arg, 3))
        out = pipe.step(points, k * dt)
        if out.q is None:
            assert last is None  # nothing is commanded before the first good frame
            continue
        assert np.all(np.isfinite(out.q))
        assert np.all(out.q >= rt.lower - 1e-12) and np.all(out.q <= rt.upper + 1e-12)
        if out.held:
            np.testing.assert_array_equal(out.q, last)
        else:
            if last_good is not None:  # never faster than the joints, over the time since the last good frame
                assert np.all(np.abs(out.q - last) <= velocity * min(k * dt - last_good, pipe.max_dt) + 1e-9)
            last_good = k * dt
        last = out.q.copy()


def test_bad_side_is_refused(robot):
    with pytest.raises(ConfigurationError):
        HandRetargeter(robot, "middle")


@pytest.mark.parametrize("side", SIDES)
def test_closing_a_human_fist_closes_every_robot_finger_monotonically(retargeters, side):
    from rynn_teleop.sources.hands import SyntheticGlove

    rt, glove = retargeters[side], SyntheticGlove()
    q = None
    flexion, reach = [], []
    for s in np.linspace(0.0, 1.0, 40):  # a human hand (its own proportions) closing into a fist
        q = rt.retarget(glove.pose_blend("open", "fist", s, side), q).q
        flexion.append([q[4 * f] + q[4 * f + 2] + q[4 * f + 3] for f in range(5)])  # MCP + PIP + DIP
        reach.append(np.linalg.norm(rt.keypoints(q)[list(hs.TIPS)], axis=1))  # tip to wrist [m]
    flexion, reach = np.array(flexion), np.array(reach)
    assert np.all(np.diff(reach, axis=0) <= 2e-4)  # every tip comes closer to the wrist, step by step (0.2 mm)
    assert np.all(np.diff(flexion[:, 1:], axis=0) >= 0.0)  # fingers 2-5 flex at every step
    assert np.all(flexion[-1] - flexion[0] > 1.5)  # and end well closed (thumb included)


@pytest.mark.parametrize("side", SIDES)
def test_a_human_pinch_brings_the_robot_thumb_and_index_tips_together(retargeters, side):
    from rynn_teleop.sources.hands import SyntheticGlove

    rt, glove = retargeters[side], SyntheticGlove()

    def gap(pose: str) -> float:
        k = rt.keypoints(rt.retarget(glove.pose_blend("open", pose, 1.0, side)).q)
        return float(np.linalg.norm(k[hs.TIPS[0]] - k[hs.TIPS[1]]))

    assert gap("pinch") < 0.005
    assert gap("open") > 0.05
