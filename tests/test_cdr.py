"""Reading fields straight from serialized (CDR) messages: the same values rclpy's deserializer gives."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from rosbags.typesys import Stores, get_typestore
from sensor_msgs.msg import JointState

from rynn_teleop.recording.cdr import joint_state


def _message(frame_id: str, names: list[str], position: list[float], **extra) -> JointState:
    msg = JointState(name=names, position=position, **extra)
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1_700_000_123, 456_789
    return msg


@pytest.mark.parametrize("frame_id", ["", "a", "ab", "abc", "base_link"])  # every padding after frame_id
def test_a_joint_state_read_from_its_bytes_matches_rclpy(frame_id):
    for names in ([], ["j"], ["ab", "abc", "abcd", "abcde"], [f"left_arm_joint{i}" for i in range(1, 8)]):
        for extra in ({}, {"velocity": [0.5] * len(names), "effort": [-1.0] * len(names)}):
            position = [0.1 * k - 0.25 for k in range(len(names))]
            raw = serialize_message(_message(frame_id, names, position, **extra))
            stamp_ns, got_names, got_position = joint_state(raw)
            expected = deserialize_message(raw, JointState)
            assert stamp_ns == 1_700_000_123_000_456_789
            assert got_names == tuple(expected.name) == tuple(names)
            np.testing.assert_array_equal(got_position, np.asarray(expected.position))
            assert got_position.dtype == float and got_position.flags.writeable


def test_names_without_positions_and_a_big_endian_message():
    _, names, position = joint_state(serialize_message(_message("x", ["a", "b"], [])))
    assert names == ("a", "b") and position.shape == (0,)
    store = get_typestore(Stores.ROS2_KILTED)
    msg = store.types["sensor_msgs/msg/JointState"](
        header=store.types["std_msgs/msg/Header"](stamp=store.types["builtin_interfaces/msg/Time"](sec=3, nanosec=4),
                                                   frame_id="base"),
        name=["one", "three"], position=np.array([1.5, -2.5]), velocity=np.array([]), effort=np.array([]))
    raw = store.serialize_cdr(msg, "sensor_msgs/msg/JointState", little_endian=False)
    stamp_ns, names, position = joint_state(raw)
    assert (stamp_ns, names, position.tolist()) == (3_000_000_004, ("one", "three"), [1.5, -2.5])


def test_the_names_are_decoded_once_per_distinct_list():
    cache: dict = {}
    arm = serialize_message(_message("", ["a1", "a2"], [1.0, 2.0]))
    hand = serialize_message(_message("", ["h1"], [3.0]))
    first = joint_state(arm, cache)[1]
    assert joint_state(arm, cache)[1] is first and len(cache) == 1
    assert joint_state(hand, cache)[1] == ("h1",) and len(cache) == 2


def test_bytes_shorter_than_they_announce_are_refused():
    raw = serialize_message(_message("base", ["a", "b", "c"], [1.0, 2.0, 3.0]))
    last_position_ends = raw.index(struct.pack("<d", 3.0)) + 8
    for cut in (2, 15, 20, 30, last_position_ends - 1):
        with pytest.raises(ValueError):
            joint_state(raw[:cut])


@pytest.mark.parametrize("frame_id", ["", "a", "ab", "abc", "world", "left_operator_wrist"])
def test_a_pose_array_written_as_bytes_is_what_rclpy_reads(frame_id):
    from geometry_msgs.msg import PoseArray

    from rynn_teleop.recording.cdr import pose_array, pose_array_cdr

    rng = np.random.default_rng(3)
    for n in (0, 1, 5, 21):
        positions = rng.normal(size=(n, 3))
        quaternions = rng.normal(size=(n, 4))
        for q in (quaternions, None):
            raw = pose_array_cdr(1_700_000_000_123_456_789, frame_id, positions, q)
            msg = deserialize_message(raw, PoseArray)
            assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (1_700_000_000, 123_456_789,
                                                                                               frame_id)
            got = np.array([[p.position.x, p.position.y, p.position.z] for p in msg.poses]).reshape(n, 3)
            quat = np.array([[p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w]
                             for p in msg.poses]).reshape(n, 4)
            np.testing.assert_array_equal(got, positions)
            np.testing.assert_array_equal(quat, quaternions if q is not None else np.tile([0.0, 0, 0, 1], (n, 1)))
            stamp_ns, pos2, quat2 = pose_array(raw)  # and the project's own reader agrees
            assert stamp_ns == 1_700_000_000_123_456_789
            np.testing.assert_array_equal(pos2, got)
            np.testing.assert_array_equal(quat2, quat)
