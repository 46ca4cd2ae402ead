"""The task-aware synthetic operator: the twin's plan through the tracker and glove inputs a person would use.

Its wrist trackers go through the calibration arm_ik computes from the held posture (and the clutch, IK), and
its glove through the retargeter: what comes out must be the plan's wrists and the validated grasp posture.
"""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from rynn_teleop.core.arm_session import ArmSession, SessionSettings
from rynn_teleop.core.arm_teleop import DEFAULT_HOME, ArmTeleop
from rynn_teleop.core.hand_retarget import HandPipeline, HandRetargeter
from rynn_teleop.core.layout import ROLES, SIDES
from rynn_teleop.core.robot_model import GROUPS, RobotModel
from rynn_teleop.core.trackers import TrackerSet, group_frames
from rynn_teleop.core.transforms import make_transform
from rynn_teleop.sim.operator_io import IK_BASE_FRAME, TwinEpisodes, home_wrists, parse_twin_scene
from rynn_teleop.sim.operator_plan import hand_posture
from rynn_teleop.sources.hands.synthetic import SyntheticGlove, hand_points, task_angles
from rynn_teleop.sources.trackers.synthetic import SyntheticOperator

SERIALS = {role: f"LHR-{i}" for i, role in enumerate(ROLES)}
T0 = 1000.0  # [s] the node clock at which the twin set its layout
DELAY = 2.0  # [s] task_delay_s


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def scene_message(scene: str, seed: int, stamp: float | None = T0) -> NS:
    doc = {"scene": scene, "seed": seed, "task": "place"}
    if stamp is not None:
        doc["stamp"] = stamp
    return NS(data=json.dumps(doc))


def angle(R: np.ndarray) -> float:
    return float(np.arccos(np.clip((np.trace(R) - 1.0) / 2.0, -1.0, 1.0)))


@pytest.mark.parametrize("scene, seed, until", [("pick_place", 5, 14.5), ("bimanual_lift", 1, 6.5)])
def test_arm_ik_targets_are_the_plans_wrists(robot, scene, seed, until):
    """Tracker samples -> arm_ik's session (auto-calibration on the held posture, auto-engage, clutch, IK): the
    wrist of every IK solution is the plan's wrist at that sample's time."""
    operator = SyntheticOperator(SERIALS, rate_hz=120.0, task="twin", task_delay_s=DELAY, position_noise=0.0,
                                 rotation_noise=0.0, robot=robot)
    arms = np.r_[GROUPS.left_arm, GROUPS.right_arm]
    teleop = ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[arms])
    session = ArmSession(teleop, SessionSettings(start_from="home", auto_calibrate=True, auto_engage=True))
    trackers = TrackerSet(SERIALS, 0.1)
    T_base_ik = robot.frame_pose(robot.neutral(), IK_BASE_FRAME)
    operator.start(T0)
    operator.feed("/twin/scene", scene_message(scene, seed))
    worst_p = worst_r = 0.0
    checked = 0
    for k in range(1, int((DELAY + until) * 120)):
        now = T0 + k / 120.0
        for frame in group_frames(operator.read(now)):
            session.add_frame(frame.stamp, trackers.update_frame(frame))
        session.step(now)
        sample = operator.twin.sample(now)
        if sample is None or k % 6:
            continue
        assert session.engaged  # calibrated and engaged on the held posture before the plan starts
        for side in SIDES:
            wrist = T_base_ik @ teleop.ik[side].forward(teleop.sides[side].q_goal)
            worst_p = max(worst_p, float(np.linalg.norm(wrist[:3, 3] - sample.wrists[side][:3, 3])))
            worst_r = max(worst_r, angle(wrist[:3, :3].T @ sample.wrists[side][:3, :3]))
            checked += 1
    assert operator.twin.episodes == 1 and checked > 100
    assert worst_p < 1e-3 and worst_r < 5e-3, (worst_p, worst_r)  # IK tolerance: 0.3 mm, 2 mrad


def test_an_episode_is_aimed_from_where_arm_ik_has_the_arms(robot):
    """arm_ik's clutch holds an offset (re-anchored while the arm lagged): the operator, fed arm_ik's commands,
    starts the episode from where the wrists are and takes the offset out of its aim, so arm_ik's targets reach
    the plan's grasp anyway."""
    operator = SyntheticOperator(SERIALS, rate_hz=120.0, task="twin", task_delay_s=DELAY, position_noise=0.0,
                                 rotation_noise=0.0, robot=robot)
    arms = np.r_[GROUPS.left_arm, GROUPS.right_arm]
    teleop = ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[arms])
    session = ArmSession(teleop, SessionSettings(start_from="measured", auto_calibrate=True, auto_engage=True))
    displaced = np.array(DEFAULT_HOME) + np.tile([0.0, 0.1, 0.0, 0.15, 0.0, -0.1, 0.05], 2)  # [rad]
    names = [robot.joint_names[i] for i in arms]
    trackers = TrackerSet(SERIALS, 0.1)
    T_base_ik = robot.frame_pose(robot.neutral(), IK_BASE_FRAME)
    operator.start(T0)
    operator.feed("/twin/scene", scene_message("pick_place", 5))
    plan = None
    grasp_error = []
    for k in range(1, int((DELAY + 6.0) * 120)):
        now = T0 + k / 120.0
        session.add_joint_states(names, displaced, now)  # the arms stand off the held posture's wrists
        for frame in group_frames(operator.read(now)):
            session.add_frame(frame.stamp, trackers.update_frame(frame))
        command = session.step(now)
        if command is not None:
            operator.feed("/arms/command", NS(name=names, position=command.state.position.tolist()))
        if operator.episode is not None:
            plan = operator.episode.task.plan
            t = now - operator.episode.task.start
            if plan.phase_time("grasp") + 0.3 <= t <= plan.phase_time("lift") - 0.05:  # holding the grasp pose
                side = plan.hands[0]
                wrist = T_base_ik @ teleop.ik[side].forward(teleop.sides[side].q_goal)
                grasp_error.append(float(np.linalg.norm(wrist[:3, 3] - plan.sample(t).wrists[side][:3, 3])))
    assert session.engaged and plan is not None
    offsets = operator.episode.offsets
    assert max(float(np.linalg.norm(p)) for p, _ in offsets.values()) > 0.02  # a real offset was taken out
    assert grasp_error and max(grasp_error) < 1e-3, max(grasp_error or [0.0])


def test_the_tracker_mapping_inverts_the_calibration(robot):
    operator = SyntheticOperator(SERIALS, task="twin", robot=robot)
    mapping = operator.mapping
    rng = np.random.default_rng(0)
    for _ in range(20):
        side = SIDES[int(rng.integers(2))]
        T = make_transform(rng.uniform([0.3, -0.5, 0.7], [0.8, 0.5, 1.2]),
                           Rotation.random(random_state=rng).as_matrix())
        np.testing.assert_allclose(mapping.robot_wrist(side, mapping.chest_wrist(side, T)), T, atol=1e-12)
    # the held posture maps onto the robot's wrists at home, where plans start
    start = home_wrists(robot, np.array(DEFAULT_HOME))
    for side in SIDES:
        np.testing.assert_allclose(mapping.start_wrists[side], start[side], atol=1e-9)


@pytest.mark.parametrize("side", SIDES)
def test_the_glove_closure_retargets_to_the_validated_grasp(robot, side):
    """The task hand poses through the stack's retargeting pipeline (warm-started frame after frame, as the node
    runs it) give the posture the twin validated: open at 0, GRASP_POSTURE at 1, the blend in between."""
    for closure, tolerance in ((0.0, 0.01), (1.0, 0.01), (0.5, 0.06), (0.8, 0.06)):
        pipe = HandPipeline(HandRetargeter(robot, side), 0.5)
        points = hand_points(task_angles(closure), side)
        for k in range(60):
            q = pipe.step(points, k / 90.0).q
        np.testing.assert_allclose(q, hand_posture(closure), atol=tolerance, err_msg=f"closure {closure}")
    # with the glove's keypoint noise (1 mm on 2-4 cm phalanges), the held grasp stays within 0.08 rad
    glove = SyntheticGlove(sides=(side,), noise=0.001, task="twin")
    rng = np.random.default_rng(1)
    pipe = HandPipeline(HandRetargeter(robot, side), 0.5)
    grasp = glove.points_for(task_angles(1.0), side)
    for k in range(60):
        q = pipe.step(grasp + np.r_[np.zeros((1, 3)), 0.001 * rng.standard_normal((20, 3))], k / 90.0).q
    np.testing.assert_allclose(q, hand_posture(1.0), atol=0.08)


def test_the_glove_closes_on_the_plans_clock():
    glove = SyntheticGlove(rate_hz=90.0, noise=0.0, task="twin", task_delay_s=DELAY)
    glove.start(T0)
    glove.feed("/twin/scene", scene_message("pick_place", 2))
    assert glove.read(T0 + 0.5)  # the message is planned at a read
    plan = glove.twin.task.plan
    hand = plan.hands[0]
    other = "left" if hand == "right" else "right"
    closed = plan.phase_time("lift") - 0.2  # [s] into the plan: the grasp's closing is over
    for t, want in ((-0.5, 0.0), (0.5, 0.0), (closed, 1.0), (plan.duration + 0.5, 0.0)):
        t_source = DELAY + t  # the glove's own time since its start
        assert glove.closure_at(hand, t_source) == pytest.approx(want), t
        assert glove.closure_at(other, t_source) == 0.0
    np.testing.assert_allclose(glove.points_at(hand, DELAY + closed), hand_points(task_angles(1.0), hand))


def test_episodes_start_at_the_stamp_plus_the_delay_and_late_ones_are_skipped():
    start = home_wrists(RobotModel.default(), np.array(DEFAULT_HOME))
    episodes = TwinEpisodes(DELAY, start, "test")
    episodes.feed(json.dumps({"scene": "pick_place", "seed": 0, "stamp": T0}))
    episodes.update(T0 + 0.1)
    assert episodes.task.start == T0 + DELAY and episodes.sample(T0 + 1.0) is None
    assert episodes.sample(T0 + DELAY + 1.0).phase == "approach"
    later = episodes.task.end + 5.0  # [s] the first episode is over
    assert episodes.follow(json.dumps({"scene": "pick_place", "seed": 1}), later).start == later + DELAY  # no stamp
    later = episodes.task.end + 5.0
    assert episodes.follow(json.dumps({"scene": "pick_place", "seed": 1, "stamp": later - 8.0}), later) is None
    assert episodes.task is None and episodes.errors == 1  # started 6 s ago: the operator holds still
    assert episodes.follow(json.dumps({"scene": "no_such_scene", "seed": 1}), T0) is None and episodes.errors == 2
    for bad in ("{", "[]", json.dumps({"scene": "", "seed": 1}), json.dumps({"scene": "a", "seed": -1}),
                json.dumps({"scene": "a", "seed": 1, "stamp": "now"})):
        with pytest.raises(ValueError):
            parse_twin_scene(bad)


def test_the_twins_start_up_layout_is_not_played_each_reset_is():
    """The sources start at different times (and the tracker first holds the calibration posture): both hold
    still on the twin's start-up layout (resets 0) and play the layout of every reset, so they agree."""
    start = home_wrists(RobotModel.default(), np.array(DEFAULT_HOME))
    episodes = TwinEpisodes(DELAY, start, "test")
    assert episodes.follow(json.dumps({"scene": "pick_place", "seed": 0, "stamp": T0, "resets": 0}), T0) is None
    assert episodes.task is None and episodes.startup_layouts == 1 and episodes.errors == 0
    assert episodes.sample(T0 + DELAY + 1.0) is None  # holds still
    reset = episodes.follow(json.dumps({"scene": "pick_place", "seed": 1, "stamp": T0 + 3.0, "resets": 1}), T0 + 3.0)
    assert reset is not None and reset.start == T0 + 3.0 + DELAY and reset.twin.resets == 1
    assert episodes.sample(T0 + 3.0 + DELAY + 1.0).phase == "approach"
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="resets"):
            parse_twin_scene(json.dumps({"scene": "a", "seed": 1, "resets": bad}))


def test_task_none_keeps_the_procedural_operator():
    plain = SyntheticOperator(SERIALS)
    assert plain.mapping is None and plain.message_inputs() == {}
    assert SyntheticGlove().message_inputs() == {}
    following = SyntheticOperator(SERIALS, task="twin", robot=RobotModel.default())
    assert set(following.message_inputs()) == {"/twin/scene", "/arms/command"}
    with pytest.raises(Exception, match="task"):
        SyntheticOperator(SERIALS, task="dance")


def test_tracker_and_hand_nodes_follow_the_twins_latched_scene(ros_domain_id):
    """Both nodes get /twin/scene (also when it was published before they subscribed) and plan the same
    episode on the same clock."""
    import time

    from rclpy.node import Node
    from ros_helpers import wait_for
    from std_msgs.msg import String

    from rynn_teleop.core.node_io import LATCHED
    from rynn_teleop.nodes.io import qos_profile
    from rynn_teleop.runner import Composition

    task = {"synthetic.task": "twin", "synthetic.task_delay_s": 30.0}
    comp = Composition(["tracker", "hand_retarget"], domain_id=ros_domain_id,
                       overrides={"tracker": task, "hand_retarget": task})
    try:
        twin = Node("fake_twin", context=comp.context)
        stamp = time.time()
        twin.create_publisher(String, "/twin/scene", qos_profile(LATCHED)).publish(
            String(data=json.dumps({"scene": "bimanual_lift", "seed": 4, "stamp": stamp})))
        comp.add_node(twin)
        sources = [comp.node("tracker").source, comp.node("hand_retarget").source]
        assert wait_for(lambda: all(s.twin.task is not None for s in sources), 20.0)
        assert [s.twin.task.start for s in sources] == [stamp + 30.0] * 2
        assert {s.twin.task.plan.task for s in sources} == {"bimanual blue_bar -> shelf"}
    finally:
        comp.shutdown()


def test_an_episode_being_played_is_not_cut_short():
    start = home_wrists(RobotModel.default(), np.array(DEFAULT_HOME))
    episodes = TwinEpisodes(DELAY, start, "test")
    first = episodes.follow(json.dumps({"scene": "pick_place", "seed": 0, "stamp": T0}), T0)
    mid = first.start + 1.5
    assert episodes.sample(mid).phase == "approach"
    second = episodes.follow(json.dumps({"scene": "pick_place", "seed": 1, "stamp": mid}), mid)  # a reset
    assert second.start == pytest.approx(first.end + 0.5) and episodes.task is first
    assert episodes.sample(mid + 0.1).phase == "approach"  # the first goes on
    assert episodes.sample(first.end + 0.6).phase == "start" and episodes.task is second


def test_an_episode_before_the_operator_held_its_posture_is_skipped(robot):
    """arm_ik calibrates on the held posture: an episode starting sooner than hold_s after the operator appears
    is skipped (it holds still), the next one is played."""
    operator = SyntheticOperator(SERIALS, task="twin", task_delay_s=DELAY, hold_s=2.0, robot=robot)
    operator.start(T0)
    operator.feed("/twin/scene", scene_message("pick_place", 0, stamp=T0 - 1.0))  # would start at T0 + 1
    operator.read(T0 + 0.5)
    held = operator.pose_at(0.0)["right_wrist"]
    np.testing.assert_allclose(operator.pose_at(3.0)["right_wrist"][:3, 3], held[:3, 3], atol=0.03)  # body sway
    assert operator.episode.plan is None
    later = operator.twin.task.end + 1.0
    operator.feed("/twin/scene", scene_message("pick_place", 1, stamp=later))
    operator.read(later)
    assert operator.twin.active(later + DELAY + 1.0).twin.seed == 1
    moved = operator.pose_at(later + DELAY + 2.0 - T0)["right_wrist"][:3, 3]
    assert np.linalg.norm(moved - held[:3, 3]) > 0.05 and operator.episode.plan is not None
