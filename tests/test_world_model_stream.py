"""Which action each generated frame shows and which stamp it carries (world_model.stream)."""

from __future__ import annotations

import numpy as np
import pytest

from rynn_teleop.world_model.generator import Generator
from rynn_teleop.world_model.stream import ActionStream, FrameQueue

NAMES = ("a1", "a2", "h1", "h2")
GROUPS = {"arm": ("a1", "a2"), "hand": ("h1", "h2")}


def stream() -> ActionStream:
    return ActionStream(NAMES, GROUPS, np.zeros(4))


def test_no_action_until_every_joint_was_commanded():
    s = stream()
    assert s.update(["a1", "a2"], [1.0, 2.0], 100)
    assert not s.complete and s.missing_groups() == ["hand"] and s.take() is None
    assert s.update(["h1", "h2"], [3.0, 4.0], 90)
    q, stamp = s.take()
    np.testing.assert_array_equal(q, [1, 2, 3, 4])
    assert stamp == 100  # the newest stamp the action uses
    assert s.take() is None  # nothing new: no second frame


def test_an_older_group_message_never_repeats_a_stamp_and_out_of_order_is_rejected():
    s = stream()
    s.update(["a1", "a2"], [1.0, 1.0], 1_000)
    s.update(["h1", "h2"], [0.0, 0.0], 500)
    stamps = [s.take()[1]]
    s.update(["h1", "h2"], [0.5, 0.5], 600)  # hands lag the arms (older capture time): not a new frame yet
    assert s.take() is None
    s.update(["a1", "a2"], [2.0, 2.0], 1_010)
    q, stamp = s.take()
    stamps.append(stamp)
    np.testing.assert_array_equal(q, [2.0, 2.0, 0.5, 0.5])  # the hand update is shown with the next arm command
    assert stamps == [1_000, 1_010]
    assert not s.update(["a1", "a2"], [9.0, 9.0], 1_005)  # older than the arm's last: rejected
    assert s.out_of_order == 1 and s.position[0] == 2.0


def test_commands_overwritten_before_a_frame_are_counted_dropped():
    s = stream()
    s.update(["h1", "h2"], [0.0, 0.0], 1)
    s.update(["a1", "a2"], [0.0, 0.0], 2)
    s.take()
    for k in range(3, 8):  # five arm commands between two frames: four never shown
        s.update(["a1", "a2"], [k, k], k)
    s.update(["h1", "h2"], [1.0, 1.0], 8)  # one hand command: shown
    s.take()
    assert s.dropped == 4


def test_skip_pending_forgets_without_counting():
    s = stream()
    for k in range(1, 4):
        s.update(["a1", "a2", "h1", "h2"], [k] * 4, k)
    s.skip_pending()
    assert s.take() is None and s.dropped == 2  # the two overwritten while arriving; skipping adds none
    s.update(["a1"], [5.0], 10)
    assert s.take()[1] == 10


def test_malformed_or_unknown_messages_change_nothing():
    s = stream()
    assert not s.update(["a1", "a2"], [1.0, float("nan")], 1)
    assert not s.update(["a1", "a2"], [1.0], 2)
    assert not s.update(["zz"], [1.0], 3)
    assert s.rejected == 3 and s.latest_stamp == -1
    np.testing.assert_array_equal(s.position, 0.0)


class BlockGenerator(Generator):
    """Returns nothing until ``block`` actions are in, then one frame per action (the action's first value)."""

    def __init__(self, block: int, fail_on: float | None = None) -> None:
        super().__init__()
        self.block, self.fail_on = block, fail_on
        self._buffer: list[float] = []

    def reset(self, reference):
        self._buffer = []

    def step(self, action, condition=None):
        if self.fail_on is not None and action[0] == self.fail_on:
            raise RuntimeError("boom")
        self._buffer.append(float(action[0]))
        if len(self._buffer) < self.block:
            return []
        out = [np.full((2, 2, 3), v) for v in self._buffer]
        self._buffer = []
        return out

    @property
    def pending(self) -> int:
        return len(self._buffer)


def drain(queue: FrameQueue) -> list[tuple[float, int]]:
    out = []
    while (item := queue.pop()) is not None:
        out.append((float(item[0][0, 0, 0]), item[1]))
    return out


@pytest.mark.parametrize("block", [1, 4])
def test_each_frame_carries_the_stamp_of_its_own_action(block):
    q = FrameQueue(BlockGenerator(block))
    q.reset(np.zeros((2, 2, 3), np.uint8))
    released = []
    for k in range(12):
        q.push(np.array([k, 0, 0, 0.0]), 1000 + k, None)
        item = q.pop()  # at most one per tick
        if item is not None:
            released.append((float(item[0][0, 0, 0]), item[1]))
    released += drain(q)
    assert released == [(k, 1000 + k) for k in range(12)]


def test_a_half_full_block_is_completed_by_padding_and_padding_is_never_shown():
    q = FrameQueue(BlockGenerator(4))
    q.reset(np.zeros((2, 2, 3), np.uint8))
    for k in range(6):  # one block and a half
        q.push(np.array([k, 0, 0, 0.0]), 100 + k, None)
    assert q.waiting == 6
    for _ in range(3):
        q.pad()
    assert drain(q) == [(k, 100 + k) for k in range(6)]  # the last real action is shown, padding is not
    assert q.waiting == 0
    q.pad()  # nothing pending: no step
    assert q.generator.pending == 0


def test_a_failed_step_leaves_no_stamp_behind():
    q = FrameQueue(BlockGenerator(1, fail_on=2.0))
    q.reset(np.zeros((2, 2, 3), np.uint8))
    for k in range(5):
        try:
            q.push(np.array([k, 0, 0, 0.0]), 100 + k, None)
        except RuntimeError:
            pass
    assert drain(q) == [(0, 100), (1, 101), (3, 103), (4, 104)]
    assert q.resyncs == 0


def test_reset_forgets_pending_actions():
    q = FrameQueue(BlockGenerator(4))
    q.reset(np.zeros((2, 2, 3), np.uint8))
    q.push(np.array([1, 0, 0, 0.0]), 1, None)
    q.reset(np.zeros((2, 2, 3), np.uint8))
    for k in range(4):
        q.push(np.array([10 + k, 0, 0, 0.0]), 10 + k, None)
    assert drain(q) == [(10 + k, 10 + k) for k in range(4)]


def test_first_name_after_header_reads_a_joint_states_first_name_from_its_cdr():
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import JointState

    from rynn_teleop.recording.cdr import first_name_after_header, header_stamp_ns

    for frame_id in ("", "a", "ab", "abc", "base_link"):  # every padding after frame_id
        msg = JointState(name=["left_finger1_joint1", "x"], position=[0.0, 1.0])
        msg.header.frame_id = frame_id
        msg.header.stamp.sec, msg.header.stamp.nanosec = 12, 345
        raw = serialize_message(msg)
        assert first_name_after_header(raw) == b"left_finger1_joint1"
        assert header_stamp_ns(raw) == 12_000_000_345
    assert first_name_after_header(serialize_message(JointState())) == b""
    assert first_name_after_header(b"\x00\x01") == b""


def test_superseded_commands_count_as_dropped():
    names = ["a", "b"]
    stream = ActionStream(names, {"g": names}, np.zeros(2))
    stream.note_superseded(3)
    assert stream.dropped == 3
