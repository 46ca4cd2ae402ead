"""hand_retarget node on real rclpy (composed in one process)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from geometry_msgs.msg import Pose, PoseArray
from rclpy.node import Node
from ros_helpers import wait_for
from sensor_msgs.msg import JointState

from rynn_teleop.core.robot_model import RobotModel, hand_joint_names
from rynn_teleop.errors import HardwareUnavailableError
from rynn_teleop.runner import Composition
from rynn_teleop.sources.hands import SyntheticGlove


class Probe:
    def __init__(self, comp: Composition) -> None:
        self.node = Node("probe", context=comp.context)
        self.lock = threading.Lock()
        self.commands: list[tuple[float, JointState]] = []
        self.skeletons: dict[str, list[PoseArray]] = {"left": [], "right": []}
        self.node.create_subscription(JointState, "/hands/command", self._on_command, 200)
        for side in ("left", "right"):
            self.node.create_subscription(PoseArray, f"/operator/hand/{side}/skeleton",
                                          lambda m, s=side: self._on_skeleton(s, m), 200)
        comp.add_node(self.node)

    def _on_command(self, msg: JointState) -> None:
        with self.lock:
            self.commands.append((time.monotonic(), msg))

    def _on_skeleton(self, side: str, msg: PoseArray) -> None:
        with self.lock:
            self.skeletons[side].append(msg)


def test_synthetic_glove_drives_both_hands_on_the_input_grid(ros_domain_id):
    comp = Composition(["hand_retarget"], overrides={"hand_retarget": {"backend": "synthetic", "rate_hz": 90.0}},
                       domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        assert wait_for(lambda: len(probe.commands) > 50, 20.0)
        node = comp.node("hand_retarget")
        with probe.lock:
            start = len(probe.commands)
        skipped_before = dict(node.skipped)
        t0 = time.monotonic()
        time.sleep(3.0)
        with probe.lock:
            window = [m for t, m in probe.commands[start:] if t >= t0]
            skeletons = {s: list(v) for s, v in probe.skeletons.items()}
        by_side = {s: [m for m in window if m.name[0].startswith(s)] for s in ("left", "right")}
        lim = RobotModel.default().limits
        for side, msgs in by_side.items():
            assert msgs, f"no {side} command"  # (the rate under load is bench/stack.py's to measure)
            assert all(list(m.name) == list(hand_joint_names(side)) for m in msgs)
            q = np.array([m.position for m in msgs])
            idx = RobotModel.default().indices(hand_joint_names(side))
            assert np.all(np.isfinite(q))
            assert np.all(q >= lim.lower[idx] - 1e-9) and np.all(q <= lim.upper[idx] + 1e-9)
            assert np.ptp(q, axis=0).max() > 0.3  # the gestures move the fingers
            stamps = [m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec for m in msgs]
            ticks = np.diff(stamps) * 90.0  # capture stamps on the glove's 90 Hz grid
            np.testing.assert_allclose(ticks, np.round(ticks), atol=1e-3)
            assert len(skeletons[side][-1].poses) == 21
        assert [loop.name for loop in node.loops] == ["poll"]  # one loop polls the glove for both hands
        values = node.diagnostic_values()
        assert float(values["solve_time_p99_ms"]) > 0.0  # reported (its size is bench/hand_retarget.py's)
        assert values["left.held.nan"] == 0
        # frames skipped for being late are counted (how many depends on the machine's load)
        assert sum(node.skipped.values()) >= sum(skipped_before.values())
    finally:
        comp.shutdown()
    assert not comp.errors


def test_skeleton_topic_input_and_bad_frames_are_held(ros_domain_id):
    comp = Composition(["hand_retarget"], overrides={"hand_retarget": {"backend": "skeleton", "sides": ["right"],
                                                                      "ema_alpha": 1.0}},
                       domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        pub = probe.node.create_publisher(PoseArray, "/hand_tracking/right/skeleton", 10)
        glove = SyntheticGlove(sides=("right",))
        fist = glove.pose_blend("open", "fist", 1.0, "right")

        sent_stamps = []

        def send(points) -> None:
            msg = PoseArray()
            msg.header.stamp = probe.node.get_clock().now().to_msg()
            msg.header.stamp.nanosec = (msg.header.stamp.nanosec // 1000) * 1000 + 789  # odd ns: exactness
            sent_stamps.append((msg.header.stamp.sec, msg.header.stamp.nanosec))
            for x, y, z in np.asarray(points).tolist():
                pose = Pose()
                pose.position.x, pose.position.y, pose.position.z = x, y, z
                msg.poses.append(pose)
            pub.publish(msg)

        # before the first good frame nothing is commanded (a mirrored = left hand is not a right hand)
        assert wait_for(lambda: (send(fist * [1.0, -1.0, 1.0]),
                                 comp.node("hand_retarget").pipelines["right"].held["wrong_side"] > 2)[1], 10.0)
        assert not probe.commands
        assert wait_for(lambda: (send(fist), len(probe.commands) > 3)[1], 10.0)
        with probe.lock:
            got = [(m.header.stamp.sec, m.header.stamp.nanosec) for _, m in probe.commands]
        assert set(got) <= set(sent_stamps)  # the capture stamp comes back unchanged, to the nanosecond
        time.sleep(0.5)  # every good frame answered
        with probe.lock:
            n = len(probe.commands)
        bad = fist.copy()
        bad[8, 0] = np.nan
        for points in (bad, fist[:15]):
            send(points)
        assert wait_for(lambda: len(probe.commands) >= n + 2, 5.0)
        with probe.lock:
            good = np.array(probe.commands[n - 1][1].position)
            held = [np.array(m.position) for _, m in probe.commands[n:n + 2]]
        for q in held:
            np.testing.assert_array_equal(q, good)  # the last good command, repeated
        node = comp.node("hand_retarget")
        assert node.pipelines["right"].held["nan"] == 1 and node.pipelines["right"].held["count"] == 1
        # a fist closes the robot's fingers: flexion joints well above their open values
        flex = good[[4, 8, 12, 16]]  # joint1 (MCP flexion) of fingers 2-5
        assert np.all(flex > 0.8)
        assert not node.loops  # message-driven: nothing to poll
    finally:
        comp.shutdown()
    assert not comp.errors


def test_manus_source_without_the_vendor_package_is_a_clear_error(ros_domain_id):
    with pytest.raises(HardwareUnavailableError, match="manus_ros2_msgs"):
        Composition(["hand_retarget"], overrides={"hand_retarget": {"backend": "manus"}}, domain_id=ros_domain_id)


def test_a_recorded_session_replays_through_the_node(ros_domain_id, tmp_path):
    """Record the node's own skeleton output (raw CDR, MCAP) and drive a second run from it."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    recorded: list[tuple[str, int, bytes]] = []
    lock = threading.Lock()
    comp = Composition(["hand_retarget"], overrides={"hand_retarget": {"backend": "synthetic", "sides": ["left"]}},
                       domain_id=ros_domain_id)
    try:
        node = Node("recorder", context=comp.context)
        topic = "/operator/hand/left/skeleton"

        def keep(raw) -> None:
            with lock:
                recorded.append((topic, time.time_ns(), bytes(raw)))

        node.create_subscription(PoseArray, topic, keep, 200, raw=True)
        comp.add_node(node)
        assert wait_for(lambda: len(recorded) >= 120, 20.0)
    finally:
        comp.shutdown()
    bag = tmp_path / "session"
    with Writer(bag, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection(topic, "geometry_msgs/msg/PoseArray", typestore=get_typestore(Stores.ROS2_JAZZY))
        with lock:
            for _, t_ns, raw in recorded:
                writer.write(conn, t_ns, raw)

    comp = Composition(["hand_retarget"], overrides={"hand_retarget": {
        "backend": "replay", "replay.path": str(bag), "sides": ["left"]}}, domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        assert wait_for(lambda: len(probe.commands) >= 60, 15.0)
        with probe.lock:
            msgs = [m for _, m in probe.commands]
        assert all(list(m.name) == list(hand_joint_names("left")) for m in msgs)
        assert np.ptp(np.array([m.position for m in msgs]), axis=0).max() > 0.05  # the recorded gestures move
    finally:
        comp.shutdown()
    assert not comp.errors
