"""XR headset input without ROS (issue 30): the 25 -> 21 hand-joint mapping and the frame conversions against
hand-computed poses and IWER's own hand poses, the frame parser's refusals, the clock mapping, the body model
(chest from the head, elbows estimated), the ``xr`` tracker and hand backends, and the arm IK driven by a headset
with and without the estimated elbows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation

from rynn_teleop import bringup
from rynn_teleop.core.arm_ik import ArmIK
from rynn_teleop.core.arm_session import ArmSession, SessionSettings
from rynn_teleop.core.arm_teleop import DEFAULT_HOME, ArmTeleop
from rynn_teleop.core.hand_skeleton import NAMES, check
from rynn_teleop.core.layout import ROLES, SIDES
from rynn_teleop.core.robot_model import GROUPS, RobotModel
from rynn_teleop.core.trackers import TrackerSet, group_frames
from rynn_teleop.core.transforms import make_transform
from rynn_teleop.core.xr import (
    MEDIAPIPE_FROM_WEBXR,
    WEBXR_JOINTS,
    XR_JOINT_TO_WRIST,
    XR_TO_WORLD,
    BodyModel,
    FrameClock,
    XRFrameError,
    chest_pose,
    estimate_elbow,
    frame_world_poses,
    hand_keypoints,
    parse_frame,
    pose_matrix,
    to_world,
    upper_body,
)
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.sources.hands import HAND_BACKENDS, HandContext, HandMessageError
from rynn_teleop.sources.trackers import TRACKER_BACKENDS, TrackerContext

IWER_HANDS = json.loads((Path(__file__).parent / "vendor" / "iwer" / "hand_poses.json").read_text())
SERIALS = {r: f"XR-{i}" for i, r in enumerate(ROLES)}


def _quat(R: np.ndarray) -> np.ndarray:
    return Rotation.from_matrix(R).as_quat()  # x, y, z, w


def _pose7(T: np.ndarray) -> list[float]:
    return [*T[:3, 3], *_quat(T[:3, :3])]


# ---------------------------------------------------------------------- the joint layout and the mapping
def test_the_25_webxr_joints_map_onto_the_21_mediapipe_keypoints_by_name():
    assert len(WEBXR_JOINTS) == 25 and len(set(WEBXR_JOINTS)) == 25
    assert (WEBXR_JOINTS[0], WEBXR_JOINTS[9], WEBXR_JOINTS[24]) == ("wrist", "index-finger-tip", "pinky-finger-tip")
    # a WebXR joint sits at the base of its bone: metacarpal = CMC (thumb), proximal = MCP, intermediate = PIP ...
    expected = {"wrist": "wrist", "thumb_cmc": "thumb-metacarpal", "thumb_mcp": "thumb-phalanx-proximal",
                "thumb_ip": "thumb-phalanx-distal", "thumb_tip": "thumb-tip"}
    for finger in ("index", "middle", "ring", "pinky"):
        expected |= {f"{finger}_mcp": f"{finger}-finger-phalanx-proximal",
                     f"{finger}_pip": f"{finger}-finger-phalanx-intermediate",
                     f"{finger}_dip": f"{finger}-finger-phalanx-distal", f"{finger}_tip": f"{finger}-finger-tip"}
    assert [WEBXR_JOINTS[i] for i in MEDIAPIPE_FROM_WEBXR] == [expected[n] for n in NAMES]
    assert {WEBXR_JOINTS[i] for i in set(range(25)) - set(MEDIAPIPE_FROM_WEBXR)} == {
        f"{f}-finger-metacarpal" for f in ("index", "middle", "ring", "pinky")}  # at the carpus: no MediaPipe point


def test_the_frame_rotations_are_proper_and_point_where_the_module_says():
    for R in (XR_TO_WORLD, XR_JOINT_TO_WRIST):
        np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
        assert np.linalg.det(R) == pytest.approx(1.0)
    np.testing.assert_allclose(XR_TO_WORLD @ [0, 0, -1], [1, 0, 0])  # WebXR forward -> x
    np.testing.assert_allclose(XR_TO_WORLD @ [-1, 0, 0], [0, 1, 0])  # WebXR left -> y
    np.testing.assert_allclose(XR_TO_WORLD @ [0, 1, 0], [0, 0, 1])  # WebXR up -> z
    np.testing.assert_allclose(XR_JOINT_TO_WRIST @ [0, 0, -1], [0, 0, 1])  # along the bone -> towards the fingers
    np.testing.assert_allclose(XR_JOINT_TO_WRIST @ [0, -1, 0], [1, 0, 0])  # out of the palm -> +x


def test_hand_keypoints_of_a_hand_computed_pose():
    # a right hand, WebXR reference space: wrist at (0.3, 1.2, -0.4), its joint frame turned 90 deg about up (y):
    # the bone direction (-z) points to -x (the operator's left), the palm (-y) down
    R = Rotation.from_euler("y", 90, degrees=True).as_matrix()
    wrist = np.array([0.3, 1.2, -0.4])
    local = np.zeros((25, 3))  # joint positions in the wrist joint's axes (x, y, z)
    local[9] = [0.0, -0.01, -0.18]  # index tip: 18 cm along the bone, 1 cm palmar
    local[11] = [0.0, 0.0, -0.095]  # middle MCP
    local[4] = [-0.06, -0.03, -0.10]  # thumb tip: on the joint's -x side (a right hand's thumb)
    positions = wrist + local @ R.T
    points = hand_keypoints(positions, _quat(R))
    # by hand: glove x = -y_joint (palmar), y = -x_joint, z = -z_joint (towards the fingers)
    np.testing.assert_allclose(points[0], [0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(points[NAMES.index("index_tip")], [0.01, 0.0, 0.18], atol=1e-12)
    np.testing.assert_allclose(points[NAMES.index("middle_mcp")], [0.0, 0.0, 0.095], atol=1e-12)
    np.testing.assert_allclose(points[NAMES.index("thumb_tip")], [0.03, 0.06, 0.10], atol=1e-12)  # thumb at +y


@pytest.mark.parametrize("pose", sorted(IWER_HANDS))
def test_iwer_hands_become_skeletons_of_their_own_side_and_mirror_each_other(pose):
    points = {}
    for side in SIDES:
        joints = np.array(IWER_HANDS[pose][side])
        points[side] = hand_keypoints(joints[:, :3], joints[0, 3:])
        assert check(points[side], side) is None, (pose, side)
        other = "left" if side == "right" else "right"
        assert check(points[side], other).reason == "wrong_side"
        tips = points[side][[8, 12, 16, 20]]
        assert (tips[:, 2] > 0.05).all()  # the fingers point along +z of the wrist frame
    np.testing.assert_allclose(points["left"], points["right"] * [1, -1, 1], atol=2e-4)  # IWER mirrors its hands


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda q: np.linalg.norm(q) > 0.1),
       st.lists(st.floats(-2, 2), min_size=3, max_size=3))
def test_keypoints_do_not_depend_on_where_the_hand_is_nor_on_the_world_frame(q, t):
    joints = np.array(IWER_HANDS["pinch"]["right"])
    reference = hand_keypoints(joints[:, :3], joints[0, 3:])
    R = Rotation.from_quat(np.array(q) / np.linalg.norm(q)).as_matrix()
    moved_p = joints[:, :3] @ R.T + t
    moved_q = (Rotation.from_matrix(R) * Rotation.from_quat(joints[:, 3:])).as_quat()
    np.testing.assert_allclose(hand_keypoints(moved_p, moved_q[0]), reference, atol=1e-9)
    world = to_world(np.column_stack([moved_p, moved_q]))  # the console's conversion changes nothing either
    np.testing.assert_allclose(hand_keypoints(world.positions, world.quaternions[0]), reference, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda q: np.linalg.norm(q) > 0.1),
       st.lists(st.floats(-3, 3), min_size=3, max_size=3))
def test_to_world_turns_the_reference_space_and_keeps_each_pose_s_own_axes(q, p):
    q = np.array(q) / np.linalg.norm(q)
    world = to_world(np.array([[*p, *q]]))
    T_world = pose_matrix(world.positions[0], world.quaternions[0])
    T_xr = pose_matrix(np.array(p), q)
    np.testing.assert_allclose(T_world, make_transform(rotation=XR_TO_WORLD) @ T_xr, atol=1e-9)


def test_a_level_head_s_frame_in_the_world():
    head = to_world(np.array([[0.1, 1.6, -0.2, 0, 0, 0, 1]]))  # standing, looking along WebXR -z
    T = pose_matrix(head.positions[0], head.quaternions[0])
    np.testing.assert_allclose(T[:3, 3], [0.2, -0.1, 1.6])
    np.testing.assert_allclose(T[:3, :3] @ [0, 0, -1], [1, 0, 0], atol=1e-12)  # looking forward (x)


# ---------------------------------------------------------------------- parsing
def _frame(**changes) -> dict:
    hand = [[0.0, 1.0, -0.3, 0.0, 0.0, 0.0, 1.0] for _ in range(25)]
    doc = {"type": "xr_frame", "seq": 3, "t_ms": 1.7e12, "head": [0, 1.6, 0, 0, 0, 0, 1], "left": hand, "right": None}
    doc.update(changes)
    return doc


def test_a_frame_is_parsed_and_its_quaternions_normalised():
    frame = parse_frame(_frame(head=[0, 1.6, 0, 0, 0, 0, 1.004]))
    assert frame.seq == 3 and frame.t_ms == 1.7e12 and frame.hands["right"] is None
    assert frame.hands["left"].shape == (25, 7) and frame.head[6] == pytest.approx(1.0)
    poses = frame_world_poses(frame)
    np.testing.assert_allclose(poses.positions[0], [0, 0, 1.6])
    np.testing.assert_allclose(poses.positions[1], [0.3, 0, 1.0])  # the left wrist
    assert np.isnan(poses.positions[2]).all() and np.isnan(poses.quaternions[2]).all()  # right: untracked


@pytest.mark.parametrize("changes, reason", [
    ({"type": "frame"}, "malformed"),
    ({"extra": 1}, "malformed"),
    ({"seq": -1}, "malformed"),
    ({"seq": True}, "malformed"),
    ({"t_ms": "now"}, "malformed"),
    ({"t_ms": math.nan}, "not_finite"),
    ({"head": [0, 1.6, 0, 0, 0, 1]}, "malformed"),  # 6 numbers
    ({"head": [0, 1.6, "0", 0, 0, 0, 1]}, "malformed"),
    ({"head": [0, 1.6, True, 0, 0, 0, 1]}, "malformed"),
    ({"head": [0, 1.6, None, 0, 0, 0, 1]}, "not_finite"),  # a browser's JSON of NaN
    ({"head": [0, 1.6, math.nan, 0, 0, 0, 1]}, "not_finite"),  # Python's json reads NaN literals
    ({"head": [0, 1.6, math.inf, 0, 0, 0, 1]}, "not_finite"),
    ({"head": [0, 1.6, 0, 0, 0, 0, 0]}, "not_unit"),
    ({"head": [0, 1.6, 0, 0, 0, 0.5, 0.5]}, "not_unit"),
    ({"head": [0, 99.0, 0, 0, 0, 0, 1]}, "out_of_range"),
    ({"left": [[0, 1, 0, 0, 0, 0, 1]] * 24}, "malformed"),
    ({"left": "hand"}, "malformed"),
    ({"right": [[0, 1, 0, 0, 0, 0, 1]] * 24 + [[0, 1, math.nan, 0, 0, 0, 1]]}, "not_finite"),
])
def test_a_bad_frame_is_refused_whole_with_its_reason(changes, reason):
    with pytest.raises(XRFrameError) as info:
        parse_frame(_frame(**changes))
    assert info.value.reason == reason, str(info.value)


# ---------------------------------------------------------------------- clock
def test_the_clock_keeps_the_headset_s_frame_spacing_through_network_jitter():
    clock = FrameClock(window_s=5.0)
    offset = 1000.0  # [s] this clock minus the browser's
    rng = np.random.default_rng(1)
    stamps, received = [], []
    for k in range(300):
        t_ms = 1.7e12 + k * 1000.0 / 72.0
        delay = 0.002 + (rng.exponential(0.004) if k else 0.0)  # [s] the first frame came fastest
        received.append(t_ms * 1e-3 + offset + delay)
        stamps.append(clock.stamp(t_ms, received[-1]))
    stamps, received = np.array(stamps), np.array(received)
    np.testing.assert_allclose(np.diff(stamps), 1.0 / 72.0, atol=1e-6)  # the spacing is the headset's
    assert (stamps <= received).all() and stamps[0] == pytest.approx(received[0])
    assert clock.offset == pytest.approx(offset + 0.002)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 50.0), st.floats(0.0, 0.2)), min_size=2, max_size=60))
def test_stamps_never_lie_after_receipt_and_never_go_backwards(steps):
    clock = FrameClock(window_s=1.0)
    t_ms, last, received = 1.0e12, -math.inf, -math.inf
    for dt_ms, delay in steps:
        t_ms += dt_ms
        received = max(received + 1e-4, t_ms * 1e-3 + 5.0 + delay)  # one connection: received in order
        stamp = clock.stamp(t_ms, received)
        assert stamp <= received and stamp > last
        last = stamp


def test_the_clock_follows_a_drift_once_the_window_passed():
    clock = FrameClock(window_s=1.0)
    for k in range(50):  # 0.5 s at 100 Hz, offset 3 s
        clock.stamp(1e12 + 10.0 * k, 1e9 + 3.0 + 0.01 * k)
    assert clock.offset == pytest.approx(1e9 + 3.0 - 1e9)
    for k in range(50, 300):  # then the browser's clock steps 0.1 s behind
        clock.stamp(1e12 + 10.0 * k - 100.0, 1e9 + 3.0 + 0.01 * k)
    assert clock.offset == pytest.approx(3.1)


# ---------------------------------------------------------------------- body model
def _head(yaw: float = 0.0, pitch: float = 0.0, at=(0.0, 0.0, 1.65)) -> np.ndarray:
    """A head pose in the XR world (its axes WebXR's: x right, y up, z back), turned by yaw and pitch [rad]."""
    T = np.eye(4)
    T[:3, :3] = XR_TO_WORLD @ Rotation.from_euler("YX", [yaw, pitch]).as_matrix()
    T[:3, 3] = at
    return T


def test_the_chest_of_a_level_head_by_hand():
    T = chest_pose(_head())
    # neck pivot: head + C @ (0, -0.10, 0.09) = head + (-0.09, 0, -0.10); shoulders 0.10 below it
    np.testing.assert_allclose(T[:3, 3], [-0.09, 0.0, 1.45], atol=1e-12)
    np.testing.assert_allclose(T[:3, :3], np.eye(3), atol=1e-12)
    T = chest_pose(_head(yaw=math.radians(30)), BodyModel(heading="head"))
    np.testing.assert_allclose(T[:3, :3], Rotation.from_euler("z", 30, degrees=True).as_matrix(), atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.floats(-1.2, 1.2), st.floats(-0.8, 0.6))
def test_turning_or_nodding_the_head_about_the_neck_moves_no_chest(yaw, pitch):
    model = BodyModel()
    level = _head()
    pivot = level @ np.array([*model.head_to_neck, 1.0])
    turned = _head(yaw, pitch)
    turned[:3, 3] += pivot[:3] - (turned @ np.array([*model.head_to_neck, 1.0]))[:3]  # rotated about the pivot
    np.testing.assert_allclose(chest_pose(turned, model), chest_pose(level, model), atol=1e-9)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-0.6, 0.6), min_size=3, max_size=3))
def test_an_estimated_elbow_joins_the_two_bones_and_hangs_lowest(offset):
    shoulder = np.array([0.0, 0.19, 1.45])
    wrist = shoulder + np.array(offset)
    a, b = 0.30, 0.27
    down_out = np.array([0.0, 0.15, -1.0]) / math.hypot(0.15, 1.0)
    elbow = estimate_elbow(shoulder, wrist, down_out, a, b)
    d = np.linalg.norm(wrist - shoulder)
    assert np.linalg.norm(elbow - shoulder) == pytest.approx(a, abs=1e-6)
    if abs(a - b) + 1e-3 < d < a + b - 1e-3:  # reachable: the forearm fits too
        assert np.linalg.norm(wrist - elbow) == pytest.approx(b, abs=1e-6)
        # no point of the circle of possible elbows lies further along down_out
        u = (wrist - shoulder) / d
        along = (a * a - b * b + d * d) / (2 * d)
        e1 = np.cross(u, [1.0, 0.0, 0.0] if abs(u[0]) < 0.9 else [0.0, 1.0, 0.0])
        e1 /= np.linalg.norm(e1)
        e2 = np.cross(u, e1)
        radius = math.sqrt(a * a - along * along)
        circle = [shoulder + along * u + radius * (math.cos(s) * e1 + math.sin(s) * e2)
                  for s in np.linspace(0.0, 2.0 * math.pi, 90)]
        assert max(p @ down_out for p in circle) <= elbow @ down_out + 1e-9


def test_home_posture_elbows_hang_below_the_shoulders():
    head = _head()
    chest = chest_pose(head)
    wrists = {s: chest[:3, 3] + [0.27, sign * 0.19, -0.30] for s, sign in (("left", 1), ("right", -1))}
    body = upper_body(head, wrists)
    for side, sign in (("left", 1), ("right", -1)):
        elbow = body.elbows[side]
        np.testing.assert_allclose(body.shoulders[side], chest[:3, 3] + [0, sign * 0.19, 0])
        assert elbow[2] < body.shoulders[side][2] - 0.28  # the upper arm hangs down
        assert sign * (elbow[1] - body.shoulders[side][1]) > 0  # a little outwards
        np.testing.assert_allclose(body.upper_arms[side][:3, 3], 0.5 * (body.shoulders[side] + elbow))


# ---------------------------------------------------------------------- the tracker backend
def _message(stamp: float, rows) -> SimpleNamespace:
    """A PoseArray as read by attribute."""
    sec = int(stamp)
    poses = [SimpleNamespace(position=SimpleNamespace(x=r[0], y=r[1], z=r[2]),
                             orientation=SimpleNamespace(x=r[3], y=r[4], z=r[5], w=r[6])) for r in rows]
    nanosec = int(round((stamp - sec) * 1e9))
    return SimpleNamespace(header=SimpleNamespace(stamp=SimpleNamespace(sec=sec, nanosec=nanosec)), poses=poses)


def _xr_source(**settings_):
    from rynn_teleop.nodes.tracker import TrackerNode

    schema = TrackerNode.SCHEMA  # the node's parameters, defaults and all, as the node builds its backend
    values = schema.validate({**schema.defaults(), "backend": "xr", **{f"xr.{k}": v for k, v in settings_.items()}},
                             allow_partial=False)
    return TrackerNode.SCHEMA.create(values, TrackerContext(SERIALS, 120.0, "/operator/trackers"))


def test_the_xr_backends_are_registered_and_chosen_by_the_launch_arguments():
    assert "xr" in TRACKER_BACKENDS and "xr" in HAND_BACKENDS
    assert "xr" in bringup.argument("tracker_backend").choices
    assert "xr" in bringup.argument("hand_retarget_backend").choices
    overrides = bringup.mode_overrides("digital", tracker_backend="xr", hand_retarget_backend="xr")
    assert overrides["tracker"]["backend"] == "xr" and overrides["hand_retarget"]["backend"] == "xr"
    assert overrides["arm_ik"] == {"auto_calibrate": False, "auto_engage": False}  # the operator calibrates


def test_the_tracker_backend_turns_a_frame_into_the_five_roles():
    source = _xr_source()
    assert source.impersonates_serials and not source.follows_rate_hz
    assert source.topics() == {"/xr/poses": "poses"} and source.message_type == "geometry_msgs/msg/PoseArray"
    source.start(0.0)
    assert source.serials_seen() == set(SERIALS.values())  # discovery passes before the headset connects
    head = _head()
    chest = chest_pose(head)
    left = make_transform(chest[:3, 3] + [0.27, 0.19, -0.30])
    right = make_transform(chest[:3, 3] + [0.27, -0.19, -0.30])
    source.feed("/xr/poses", _message(12.5, [_pose7(head), _pose7(left), _pose7(right)]))
    samples = source.read(12.6)
    assert [s.serial for s in samples] == [SERIALS[r] for r in ROLES] and {s.stamp for s in samples} == {12.5}
    by_role = {r: s.matrix for r, s in zip(ROLES, samples)}
    np.testing.assert_allclose(by_role["chest"], chest, atol=1e-9)
    np.testing.assert_allclose(by_role["left_wrist"], left, atol=1e-9)
    body = upper_body(head, {"left": left[:3, 3], "right": right[:3, 3]})
    np.testing.assert_allclose(by_role["right_elbow"], body.upper_arms["right"], atol=1e-9)
    assert source.read(12.7) == []


def test_lost_tracking_leaves_the_roles_out_and_the_arm_session_holds():
    source = _xr_source()
    source.start(0.0)
    nan = np.full((4, 4), np.nan)
    head = _head()
    wrist = make_transform(chest_pose(head)[:3, 3] + [0.27, 0.19, -0.30])
    source.feed_frame(1.0, head, wrist, nan)  # the right hand is not tracked
    assert [s.serial for s in source.read(1.0)] == [SERIALS[r] for r in ("chest", "left_elbow", "left_wrist")]
    source.feed_frame(1.01, nan, wrist, wrist)  # no head: wrists only (no chest, no elbows)
    assert [s.serial for s in source.read(1.01)] == [SERIALS["left_wrist"], SERIALS["right_wrist"]]
    source.feed("/xr/poses", _message(1.02, [[0, 0, 0, 0, 0, 0, 1]] * 2))  # two poses: not a frame
    assert source.malformed == 1 and source.read(1.02) == []
    source.close()
    with pytest.raises(RuntimeError):
        source.read(2.0)


def test_a_bad_body_model_fails_at_construction():
    with pytest.raises(ConfigurationError, match="heading"):
        TRACKER_BACKENDS.make("xr", serials=SERIALS, model=BodyModel(heading="sideways"))
    with pytest.raises(ConfigurationError, match="serial"):
        TRACKER_BACKENDS.make("xr", serials={**SERIALS, "chest": ""})


# ---------------------------------------------------------------------- the hand backend
def test_the_hand_backend_maps_each_side_s_topic_and_refuses_what_is_not_a_hand():
    from rynn_teleop.nodes.hand_retarget import HandRetargetNode

    schema = HandRetargetNode.SCHEMA
    values = schema.validate({**schema.defaults(), "backend": "xr"}, allow_partial=False)
    hands = HandRetargetNode.SCHEMA.create(values, HandContext(("left", "right"), 90.0, "/operator/hand"))
    assert hands.topics() == {"/xr/hands/left": "left", "/xr/hands/right": "right"}
    joints = np.array(IWER_HANDS["relaxed"]["right"])
    world = to_world(joints)
    rows = np.column_stack([world.positions, world.quaternions])
    side, points = hands.convert("/xr/hands/right", "right", _message(3.0, rows))
    assert side == "right" and check(points, "right") is None
    np.testing.assert_allclose(points, hand_keypoints(joints[:, :3], joints[0, 3:]), atol=1e-9)
    with pytest.raises(HandMessageError, match="25"):
        hands.convert("/xr/hands/right", "right", _message(3.0, rows[:24]))
    bad = rows.copy()
    bad[0, :3] = np.nan
    with pytest.raises(HandMessageError, match="wrist"):
        hands.convert("/xr/hands/right", "right", _message(3.0, bad))
    bad = rows.copy()
    bad[9, 0] = np.nan  # a finger joint: the node's check rejects the skeleton (a hold)
    assert check(hands.convert("/xr/hands/right", "right", _message(3.0, bad))[1], "right").reason == "nan"
    with pytest.raises(ConfigurationError, match="side"):
        HAND_BACKENDS.make("xr", input_topic="/xr/hands")


# ---------------------------------------------------------------------- calibration and IK with a headset
@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


class Headset:
    """A headset operator in the XR world, fed through the xr tracker backend as the tracker node publishes."""

    def __init__(self, **model) -> None:
        self.source = _xr_source(**model)
        self.source.start(0.0)
        self.trackers = TrackerSet(SERIALS, 0.1)
        self.head = _head()
        chest = chest_pose(self.head)
        # the robot's home posture: upper arms down, forearms forward (wrist = shoulder + (0.27, 0, -0.30))
        self.wrist = {s: make_transform(chest[:3, 3] + [0.27, sign * 0.19, -0.30], _wrist_rotation(s))
                      for s, sign in (("left", 1), ("right", -1))}

    def feed(self, session: ArmSession, now: float, lost: tuple[str, ...] = ()) -> None:
        nan = np.full((4, 4), np.nan)
        self.source.feed_frame(now, self.head, *(nan if s in lost else self.wrist[s] for s in SIDES))
        for frame in group_frames(self.source.read(now)):
            session.add_frame(frame.stamp, self.trackers.update_frame(frame))


def _wrist_rotation(side: str) -> np.ndarray:
    """A WebXR wrist joint with the palm facing inwards, fingers forward (its -z forward, -y to the body's middle)."""
    sign = 1.0 if side == "left" else -1.0
    return np.column_stack([[0, 0, sign], [0, sign, 0], [-1, 0, 0]]).astype(float)  # columns x, y, z


def _run(session: ArmSession, headset: Headset, t0: float, t1: float, lost=()) -> float:
    now = t0
    while now < t1:
        headset.feed(session, now, lost)
        session.step(now)
        now += 0.005
    return now


def test_a_headset_operator_calibrates_and_the_arms_reach_the_wrists_with_and_without_the_elbow_estimate(robot):
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]])
    session = ArmSession(ctl, SessionSettings(start_from="home"))
    headset = Headset()
    now = _run(session, headset, 0.0, 0.2)
    message = session.calibrate(now)  # the estimated upper arms stand in for the trackers
    assert ctl.calibration.fit_residual < 0.06, message  # accepted up to 0.10 m
    assert session.set_clutch(True)[0]
    headset.wrist["right"][:3, 3] += [0.08, -0.05, 0.10]  # reach forward, out and up
    now = _run(session, headset, now, now + 3.0)
    st_ = ctl.sides["right"]
    assert st_.last_ik.position_error < 0.002 and not st_.unreachable
    q_right = ctl.follower.state.position[7:]
    np.testing.assert_allclose(q_right, st_.q_goal, atol=2e-3)  # the command arrived at the IK solution
    # the same target without an elbow hint (no upper-arm estimate): reached too, from the same start
    ik = ArmIK(robot, "right")
    target = ik.forward(st_.q_goal)
    hint = ctl.clutch.apply_point("right", ctl.calibration.map_elbow("right", ctl.operator("right").elbow))
    start = np.array(DEFAULT_HOME[7:])
    start[2] += 0.6  # an elbow swung up and out: the swivel the IK starts from
    with_hint = without = ik.solve(target, start, None)
    swivel_start = ik.elbow_position(without.q)
    for _ in range(60):  # the frames of half a second, each solve warm-started from the last (as arm_ik does)
        with_hint = ik.solve(target, with_hint.q, hint)
        without = ik.solve(target, without.q, None)
        for result in (with_hint, without):
            assert result.position_error < 1e-3 and result.orientation_error < 5e-3
    # the hint swings the elbow towards the estimate; without it the swivel stays where the warm start put it
    d_with = np.linalg.norm(ik.elbow_position(with_hint.q) - hint)
    d_without = np.linalg.norm(ik.elbow_position(without.q) - hint)
    assert d_with < 0.5 * d_without, (d_with, d_without)
    np.testing.assert_allclose(ik.elbow_position(without.q), swivel_start, atol=0.01)


def test_a_lost_wrist_holds_its_arm_and_tracking_that_resumes_does_not_jump(robot):
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]])
    session = ArmSession(ctl, SessionSettings(start_from="home"))
    headset = Headset()
    now = _run(session, headset, 0.0, 0.2)
    session.calibrate(now)
    session.set_clutch(True)
    now = _run(session, headset, now, now + 0.5)
    held = ctl.follower.state.position.copy()
    hand = ctl.commanded_hand_pose("left")
    headset.wrist["left"][:3, 3] += [0.0, 0.0, 0.15]  # moved while the headset does not see it
    now = _run(session, headset, now, now + 1.0, lost=("left",))
    assert ctl.sides["left"].stale
    np.testing.assert_allclose(ctl.follower.state.position[:7], held[:7], atol=1e-6)  # held
    now = _run(session, headset, now, now + 1.0)  # seen again, 15 cm higher: re-anchored there
    assert not ctl.sides["left"].stale and ctl.sides["left"].active
    after = ctl.commanded_hand_pose("left")  # no jump: the hand stays (only the elbow's swivel may settle)
    assert np.linalg.norm(after[:3, 3] - hand[:3, 3]) < 0.002
    assert np.arccos(np.clip((np.trace(hand[:3, :3].T @ after[:3, :3]) - 1) / 2, -1, 1)) < 0.01
