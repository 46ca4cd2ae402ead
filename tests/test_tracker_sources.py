"""Tracker sources: the synthetic operator, the rosbag2 replay and the OpenVR source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from rynn_teleop.core.layout import ROLES
from rynn_teleop.core.transforms import invert, is_rigid, matrix_to_pose, pose_to_matrix, rotation_angle
from rynn_teleop.errors import ConfigurationError, HardwareUnavailableError
from rynn_teleop.sources.trackers import (
    OpenVRSource,
    ReplaySource,
    SyntheticOperator,
    TrackerSource,
    make_tracker_source,
)
from rynn_teleop.sources.trackers.synthetic import CHEST_MOUNT, FOREARM, UPPER_ARM

SERIALS = {role: f"LHR-{i:08X}" for i, role in enumerate(ROLES, start=0xA0)}
SIDES = ("left", "right")


def body_of(poses: dict[str, np.ndarray]) -> np.ndarray:
    """World pose of the operator's body frame, recovered from the chest tracker and its known mounting."""
    return poses["chest"] @ invert(CHEST_MOUNT)


def stamps_by_role(samples) -> dict[str, list[float]]:
    role_of = {s: r for r, s in SERIALS.items()}
    out: dict[str, list[float]] = {r: [] for r in ROLES}
    for s in samples:
        out[role_of[s.serial]].append(s.stamp)
    return out


# --------------------------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_whatever_the_read_timing():
    a, b = SyntheticOperator(SERIALS, seed=3), SyntheticOperator(SERIALS, seed=3)
    a.start(100.0)
    b.start(100.0)
    got_a = a.read(101.0)  # one late read
    got_b = []
    for now in np.arange(100.0, 101.0 + 1e-9, 0.0173):  # many irregular reads
        got_b += b.read(float(now))
    got_b += b.read(101.0)
    assert len(got_a) == len(got_b) == 5 * 121
    for x, y in zip(got_a, got_b):
        assert x.serial == y.serial
        assert x.stamp == y.stamp
        np.testing.assert_array_equal(x.matrix, y.matrix)
    assert a.read(101.0) == []  # nothing returned twice


def test_synthetic_seed_changes_the_noise_but_not_the_motion():
    a, b = SyntheticOperator(SERIALS, seed=1), SyntheticOperator(SERIALS, seed=2)
    a.start(0.0)
    b.start(0.0)
    sa, sb = a.read(0.5), b.read(0.5)
    diffs = [np.abs(x.matrix - y.matrix).max() for x, y in zip(sa, sb)]
    assert min(diffs) > 0.0  # every sample has different noise
    assert max(diffs) < 0.02  # ... of the configured size only
    np.testing.assert_array_equal(a.pose_at(0.3)["left_wrist"], b.pose_at(0.3)["left_wrist"])


def test_synthetic_noise_has_the_configured_size():
    op = SyntheticOperator(SERIALS, position_noise=0.002, rotation_noise=0.01, seed=4)
    op.start(0.0)
    role_of = {s: r for r, s in SERIALS.items()}
    pos_err, rot_err = [], []
    for s in op.read(3.0):
        truth = op.pose_at(s.stamp)[role_of[s.serial]]
        pos_err.append(s.matrix[:3, 3] - truth[:3, 3])
        rot_err.append(rotation_angle(truth[:3, :3], s.matrix[:3, :3]))
    assert np.std(pos_err) == pytest.approx(0.002, rel=0.1)
    # angle of a 3-D Gaussian rotation vector: mean sigma * sqrt(8 / pi)
    assert np.mean(rot_err) == pytest.approx(0.01 * np.sqrt(8 / np.pi), rel=0.1)


def test_synthetic_samples_on_its_grid_rate():
    op = SyntheticOperator(SERIALS, rate_hz=120.0)
    op.start(50.0)
    samples = []
    for now in np.arange(50.0, 52.0 + 1e-9, 0.01):
        samples += op.read(float(now))
    per_role = stamps_by_role(samples)
    for role in ROLES:
        assert abs(len(per_role[role]) - 240) <= 1
        np.testing.assert_allclose(np.diff(per_role[role]), 1 / 120.0, atol=1e-9)
    stamps = [s.stamp for s in samples]
    assert stamps == sorted(stamps)  # oldest first
    assert op.serials_seen() == set(SERIALS.values())


def test_synthetic_matrices_are_rigid():
    op = SyntheticOperator(SERIALS, seed=7)
    op.start(0.0)
    samples = op.read(12.0)  # hold + a whole cycle
    assert all(is_rigid(s.matrix, 1e-9) for s in samples)


def test_synthetic_home_pose_geometry_in_body_axes():
    op = SyntheticOperator(SERIALS)
    home = op.home_pose()
    T_world_body = body_of(home)
    np.testing.assert_allclose(home["chest"][:3, 3], (0.0, 0.0, 1.35), atol=0.02)
    for side in SIDES:
        shoulder = op.shoulder_in_body(side)
        wrist = invert(T_world_body) @ home[f"{side}_wrist"]
        np.testing.assert_allclose(wrist[:3, 3] - shoulder, (0.27, 0.0, -0.30), atol=0.01)
        # wrist frame at home: x forward along the forearm, z up (body axes)
        np.testing.assert_allclose(wrist[:3, :3], np.eye(3), atol=1e-9)
        # the upper-arm tracker: mid upper arm, x along the (hanging) arm, 4 cm outside
        elbow = invert(T_world_body) @ home[f"{side}_elbow"]
        outward = 1.0 if side == "left" else -1.0
        assert elbow[2, 0] < -0.95  # arm hangs down
        assert elbow[1, 2] * outward > 0.95  # tracker face points outward
        assert (elbow[1, 3] - shoulder[1]) * outward > 0.03
        assert elbow[2, 3] - shoulder[2] == pytest.approx(-0.15, abs=0.01)


def test_synthetic_chest_tracker_is_not_aligned_with_the_world():
    home = SyntheticOperator(SERIALS).home_pose()
    R = home["chest"][:3, :3]
    assert rotation_angle(R, np.eye(3)) > np.radians(30)
    assert np.abs(R).max(axis=0).max() < 0.99  # no tracker axis is a world axis ...
    assert np.abs(R).max(axis=1).max() < 0.99  # ... nor any world axis a tracker axis


def test_synthetic_wrists_stay_within_reach_and_elbows_solve_the_arm():
    op = SyntheticOperator(SERIALS, hold_s=0.5, cycle_s=8.0)
    for t in np.arange(0.0, 0.5 + 8.0 + 0.5, 0.01):
        poses = op.pose_at(float(t))
        T_body_world = invert(body_of(poses))
        for side in SIDES:
            shoulder = op.shoulder_in_body(side)
            wrist = (T_body_world @ poses[f"{side}_wrist"])[:3, 3]
            assert 0.15 <= np.linalg.norm(wrist - shoulder) <= 0.55
            elbow_tracker = T_body_world @ poses[f"{side}_elbow"]
            # the elbow is half an upper arm further along the tracker's x axis, 4 cm inward
            elbow = elbow_tracker[:3, 3] + 0.5 * UPPER_ARM * elbow_tracker[:3, 0] - 0.04 * elbow_tracker[:3, 2]
            assert np.linalg.norm(elbow - shoulder) == pytest.approx(UPPER_ARM, abs=1e-6)
            assert np.linalg.norm(wrist - elbow) == pytest.approx(FOREARM, abs=1e-6)
            assert elbow[2] < shoulder[2] - 0.1  # the elbow hangs below the shoulder


def test_synthetic_task_moves_and_rotates_the_wrists_within_limits():
    op = SyntheticOperator(SERIALS, hold_s=1.0, cycle_s=8.0)
    home = op.home_pose()
    angles, travel = [], []
    for t in np.arange(1.0, 9.0, 0.02):
        poses = op.pose_at(float(t))
        rel = invert(body_of(poses)) @ poses["left_wrist"]
        rel_home = invert(body_of(home)) @ home["left_wrist"]
        angles.append(rotation_angle(rel_home[:3, :3], rel[:3, :3]))
        travel.append(np.linalg.norm(rel[:3, 3] - rel_home[:3, 3]))
    assert np.radians(25) < max(angles) <= np.radians(45)
    assert max(travel) > 0.15
    np.testing.assert_allclose(op.pose_at(0.7)["left_wrist"][:3, :3], home["left_wrist"][:3, :3], atol=0.05)


def test_synthetic_velocity_is_continuous():
    op = SyntheticOperator(SERIALS, hold_s=0.5, cycle_s=8.0)
    dt = 2e-3
    poses = [op.pose_at(float(t)) for t in np.arange(0.0, 0.5 + 8.0 + 1.0, dt)]  # hold, a cycle, the next
    for role in ROLES:
        p = np.array([P[role][:3, 3] for P in poses])
        v = np.diff(p, axis=0) / dt
        dv = np.linalg.norm(np.diff(v, axis=0), axis=1)
        assert np.linalg.norm(v, axis=1).max() < 2.0  # [m/s] human-like
        # [m/s per step]: accelerations below 2 m/s^2; a corner between two straight
        # (non-minimum-jerk) segments of this script would jump by > 0.1 m/s
        assert dv.max() < 2.0 * dt, role


def test_synthetic_the_arms_move():
    op = SyntheticOperator(SERIALS, hold_s=0.0, cycle_s=8.0)
    start = op.pose_at(0.0)
    mid = op.pose_at(3.5)
    for side in SIDES:
        assert np.linalg.norm(mid[f"{side}_wrist"][:3, 3] - start[f"{side}_wrist"][:3, 3]) > 0.1


def test_synthetic_dropouts_withhold_exactly_the_interval():
    op = SyntheticOperator(SERIALS, rate_hz=100.0, dropouts=[("left_wrist", 0.5, 0.8)])
    op.start(10.0)
    per_role = stamps_by_role(op.read(11.0))
    rel = np.round(np.array(per_role["left_wrist"]) - 10.0, 9)
    expected = [k / 100.0 for k in range(101) if not 50 <= k < 80]
    np.testing.assert_allclose(rel, expected, atol=1e-9)
    assert len(per_role["right_wrist"]) == 101
    # the other trackers' samples (noise included) do not depend on the dropouts
    ref = SyntheticOperator(SERIALS, rate_hz=100.0)
    ref.start(10.0)
    ref_samples = [s for s in ref.read(11.0) if s.serial != SERIALS["left_wrist"]]
    op.start(10.0)
    op_samples = [s for s in op.read(11.0) if s.serial != SERIALS["left_wrist"]]
    assert len(op_samples) == len(ref_samples) == 4 * 101
    for x, y in zip(ref_samples, op_samples):
        assert (x.serial, x.stamp) == (y.serial, y.stamp)
        np.testing.assert_array_equal(x.matrix, y.matrix)


@pytest.mark.parametrize(
    "serials, words",
    [
        ({r: s for r, s in SERIALS.items() if r != "left_elbow"}, ["left_elbow"]),
        ({**SERIALS, "right_wrist": ""}, ["right_wrist"]),
        ({**SERIALS, "head": "LHR-00000000"}, ["head"]),
        ({**SERIALS, "right_wrist": SERIALS["left_wrist"]}, ["share"]),
    ],
)
def test_synthetic_rejects_bad_serial_maps(serials, words):
    with pytest.raises(ConfigurationError) as err:
        SyntheticOperator(serials)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"rate_hz": 0.0}, {"cycle_s": -1.0}, {"dropouts": [("left_wrist", 2.0, 1.0)]}, {"dropouts": [("x", 0, 1)]}],
)
def test_synthetic_rejects_bad_numbers(kwargs):
    with pytest.raises(ConfigurationError):
        SyntheticOperator(SERIALS, **kwargs)


def test_synthetic_read_before_start_and_context_manager():
    op = SyntheticOperator(SERIALS)
    with pytest.raises(RuntimeError):
        op.read(0.0)
    with op as entered:
        assert entered is op
        with pytest.raises(RuntimeError):  # __enter__ does not start
            op.read(0.0)
        op.start(0.0)
        assert len(op.read(0.0)) == 5
    with pytest.raises(RuntimeError):  # closed on exit
        op.read(1.0)
    op.close()  # idempotent


@settings(max_examples=40, deadline=None)
@given(t=st.floats(min_value=0.0, max_value=60.0, allow_nan=False))
def test_synthetic_pose_at_is_rigid_and_reachable_at_any_time(t):
    op = SyntheticOperator(SERIALS, hold_s=1.0, cycle_s=5.0)
    poses = op.pose_at(t)
    assert all(is_rigid(T, 1e-9) for T in poses.values())
    T_body_world = invert(body_of(poses))
    for side in SIDES:
        d = np.linalg.norm((T_body_world @ poses[f"{side}_wrist"])[:3, 3] - op.shoulder_in_body(side))
        assert 0.15 <= d <= 0.55


# --------------------------------------------------------------------------------------------- replay

TYPESTORE = get_typestore(Stores.ROS2_JAZZY)


def header(stamp_ns: int, frame_id: str):
    ts = TYPESTORE.types
    return ts["std_msgs/msg/Header"](
        stamp=ts["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id=frame_id
    )


def pose_msg(T: np.ndarray | None):
    """A rosbags geometry_msgs/Pose of ``T``; all-NaN for None (a role without a sample)."""
    ts = TYPESTORE.types
    if T is None:
        p, q = np.full(3, np.nan), np.full(4, np.nan)
    else:
        p, q = matrix_to_pose(T)
    return ts["geometry_msgs/msg/Pose"](
        position=ts["geometry_msgs/msg/Point"](x=p[0], y=p[1], z=p[2]),
        orientation=ts["geometry_msgs/msg/Quaternion"](x=q[0], y=q[1], z=q[2], w=q[3]),
    )


def write_bag(
    path: Path,
    *,
    roles=ROLES,
    n: int = 20,
    period_ns: int = 10_000_000,
    first_ns: int = 1_700_000_000_123_000_000,
    storage=StoragePlugin.MCAP,
    topic: str = "/operator/trackers",
    extra_topic: bool = True,
    per_role: bool = False,
) -> dict[str, list[tuple[float, np.ndarray]]]:
    """A bag of ``n`` frames from the synthetic operator, each with the poses of ``roles`` (the others
    absent, all-NaN), as the tracker node publishes them: one PoseArray per frame on ``topic``; or, with
    ``per_role``, the older layout (one PoseStamped topic per role, ``<topic>/<role>``, roles 1 us apart).
    Returns role -> [(stamp [s], T)]."""
    op = SyntheticOperator(SERIALS, hold_s=0.0)
    recorded: dict[str, list[tuple[float, np.ndarray]]] = {r: [] for r in roles}
    ts = TYPESTORE.types
    with Writer(path, version=9, storage_plugin=storage) as writer:
        if per_role:
            conns = {r: writer.add_connection(f"{topic}/{r}", "geometry_msgs/msg/PoseStamped", typestore=TYPESTORE)
                     for r in roles}
        else:
            frames = writer.add_connection(topic, "geometry_msgs/msg/PoseArray", typestore=TYPESTORE)
        if extra_topic:
            other = writer.add_connection("/rosout_like", "std_msgs/msg/String", typestore=TYPESTORE)
        for k in range(n):
            stamp_ns = first_ns + k * period_ns
            poses = op.pose_at(k * period_ns * 1e-9)
            if per_role:
                for j, role in enumerate(roles):
                    stamp = stamp_ns + j * 1000  # roles 1 us apart, like separate callbacks
                    msg = ts["geometry_msgs/msg/PoseStamped"](header=header(stamp, "vive_world"),
                                                               pose=pose_msg(poses[role]))
                    raw = TYPESTORE.serialize_cdr(msg, "geometry_msgs/msg/PoseStamped")
                    writer.write(conns[role], stamp + 2_000_000, raw)  # received 2 ms later
                    recorded[role].append((stamp * 1e-9, poses[role]))
            else:
                msg = ts["geometry_msgs/msg/PoseArray"](
                    header=header(stamp_ns, "vive_world"),
                    poses=[pose_msg(poses[r] if r in roles else None) for r in ROLES],
                )
                writer.write(frames, stamp_ns + 2_000_000, TYPESTORE.serialize_cdr(msg, "geometry_msgs/msg/PoseArray"))
                for role in roles:
                    recorded[role].append((stamp_ns * 1e-9, poses[role]))
            if extra_topic and k == 0:
                raw = TYPESTORE.serialize_cdr(TYPESTORE.types["std_msgs/msg/String"](data="hi"), "std_msgs/msg/String")
                writer.write(other, stamp_ns, raw)
    return recorded


@pytest.mark.parametrize("per_role", [False, True], ids=["frames", "per_role"])
@pytest.mark.parametrize("storage", [StoragePlugin.MCAP, StoragePlugin.SQLITE3])
def test_replay_maps_recorded_stamps_onto_the_playback_clock(tmp_path, storage, per_role):
    bag = tmp_path / "session"
    recorded = write_bag(bag, storage=storage, per_role=per_role)
    src = ReplaySource(bag, SERIALS)
    src.start(500.0)
    assert src.world_frame == "vive_world"
    first = recorded["chest"][0][0]
    assert src.read(499.9) == []
    got = src.read(500.0 + 0.095)  # the first 10 periods (stamps up to +0.090004)
    assert len(got) == 5 * 10
    role_of = {s: r for r, s in SERIALS.items()}
    by_role = {r: [s for s in got if s.serial == SERIALS[r]] for r in ROLES}
    for role in ROLES:
        for sample, (stamp, T) in zip(by_role[role], recorded[role]):
            assert sample.stamp == pytest.approx(500.0 + (stamp - first), abs=1e-6)
            np.testing.assert_allclose(sample.matrix, T, atol=1e-9)
    assert [s.stamp for s in got] == sorted(s.stamp for s in got)
    assert {role_of[s.serial] for s in got} == set(ROLES)
    if not per_role:  # the samples of one recorded frame keep one stamp, in ROLES order
        for k in range(10):
            frame = got[5 * k: 5 * k + 5]
            assert len({s.stamp for s in frame}) == 1
            assert [role_of[s.serial] for s in frame] == list(ROLES)
    rest = src.read(1000.0)
    assert len(rest) == 5 * 10
    assert src.finished
    assert src.read(2000.0) == []
    assert src.serials_seen() == set(SERIALS.values())
    src.close()
    src.close()


def test_replay_of_frames_skips_absent_roles_and_replays_a_subset(tmp_path):
    bag = tmp_path / "bag"
    recorded = write_bag(bag, roles=("chest", "left_wrist", "right_wrist"), n=4)  # elbows all-NaN
    src = ReplaySource(bag, {r: SERIALS[r] for r in ("chest", "left_wrist")})
    src.start(0.0)
    got = src.read(10.0)
    assert [s.serial for s in got] == [SERIALS["chest"], SERIALS["left_wrist"]] * 4
    assert src.skipped == 0  # absent is not invalid
    np.testing.assert_allclose(got[1].matrix, recorded["left_wrist"][0][1], atol=1e-9)


def test_replay_rate_scale_halves_the_intervals(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, roles=("chest", "left_wrist"), n=11)
    serials = {r: SERIALS[r] for r in ("chest", "left_wrist")}
    normal, fast = ReplaySource(bag, serials), ReplaySource(bag, serials, rate_scale=2.0)
    normal.start(0.0)
    fast.start(0.0)
    s_normal = [s.stamp for s in normal.read(10.0) if s.serial == SERIALS["chest"]]
    s_fast = [s.stamp for s in fast.read(10.0) if s.serial == SERIALS["chest"]]
    np.testing.assert_allclose(np.diff(s_normal), 0.010, atol=1e-6)
    np.testing.assert_allclose(np.diff(s_fast), 0.005, atol=1e-6)
    assert s_fast[-1] == pytest.approx(0.05, abs=1e-6)


def test_replay_loop_continues_the_timeline(tmp_path):
    bag = tmp_path / "bag"
    recorded = write_bag(bag, roles=("chest", "right_wrist"), n=5)
    src = ReplaySource(bag, {r: SERIALS[r] for r in ("chest", "right_wrist")}, loop=True)
    src.start(0.0)
    got = []
    for now in np.arange(0.0, 0.2, 0.013):
        got += src.read(float(now))
    chest = [s for s in got if s.serial == SERIALS["chest"]]
    stamps = [s.stamp for s in chest]
    assert len(chest) >= 15  # went round at least three times
    assert np.all(np.diff(stamps) > 0)  # never backwards, never repeated
    np.testing.assert_allclose(np.diff(stamps), 0.010, atol=1e-6)  # a loop restarts one period later
    for i, s in enumerate(chest):
        np.testing.assert_allclose(s.matrix, recorded["chest"][i % 5][1], atol=1e-9)
    assert not src.finished


@pytest.mark.parametrize("per_role", [False, True], ids=["frames", "per_role"])
def test_replay_missing_role_lists_the_recorded_roles(tmp_path, per_role):
    bag = tmp_path / "bag"
    write_bag(bag, roles=("chest", "left_wrist", "right_wrist"), n=2, per_role=per_role)
    src = ReplaySource(bag, SERIALS)
    with pytest.raises(ConfigurationError) as err:
        src.start(0.0)
    msg = str(err.value)
    assert "left_elbow" in msg and "right_elbow" in msg
    assert "recorded roles: chest, left_wrist, right_wrist" in msg


def test_replay_bag_without_tracker_topics_lists_its_topics(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, n=2, topic="/other/trackers")
    with pytest.raises(ConfigurationError) as err:
        ReplaySource(bag, SERIALS).start(0.0)
    assert "PoseArray topic /operator/trackers" in str(err.value)
    assert "/other/trackers" in str(err.value) and "/rosout_like" in str(err.value)
    src = ReplaySource(bag / "metadata.yaml", SERIALS, topic="/other/trackers/")  # a file inside is fine
    src.start(0.0)
    assert len(src.read(1.0)) == 10


def test_replay_skips_invalid_poses_and_frames_of_the_wrong_size(tmp_path):
    bag = tmp_path / "bag"
    ts = TYPESTORE.types
    home = SyntheticOperator(SERIALS).home_pose()
    with Writer(bag, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/operator/trackers", "geometry_msgs/msg/PoseArray", typestore=TYPESTORE)
        for k, poses in enumerate([
            [pose_msg(home[r]) for r in ROLES],
            [pose_msg(home[r]) for r in ROLES[:4]],  # four poses: not a frame
            [pose_msg(home[r]) for r in ROLES],
        ]):
            if k == 2:
                poses[0].orientation.x = poses[0].orientation.y = poses[0].orientation.z = 0.0
                poses[0].orientation.w = 0.0  # zero quaternion
            msg = ts["geometry_msgs/msg/PoseArray"](header=header(10**9 * (k + 1), "w"), poses=poses)
            writer.write(conn, 10**9 * (k + 1), TYPESTORE.serialize_cdr(msg, "geometry_msgs/msg/PoseArray"))
    src = ReplaySource(bag, SERIALS)
    src.start(0.0)
    got = src.read(100.0)
    assert len(got) == 5 + 4  # the first frame, and the last without its chest
    assert src.skipped == 4 + 1


def test_replay_missing_directory(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        ReplaySource(tmp_path / "nope", SERIALS).start(0.0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match="not a rosbag2 directory"):
        ReplaySource(tmp_path / "empty", SERIALS).start(0.0)


@pytest.mark.parametrize("kwargs", [{"rate_scale": 0.0}, {"serials": {}}, {"serials": {"head": "LHR-1"}}])
def test_replay_rejects_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ConfigurationError):
        ReplaySource(tmp_path, **{"serials": SERIALS, **kwargs})


def test_replay_read_before_start(tmp_path):
    with pytest.raises(RuntimeError):
        ReplaySource(tmp_path, SERIALS).read(0.0)


# --------------------------------------------------------------------------------------------- openvr


class FakePose:
    def __init__(self, T: np.ndarray | None = None, valid: bool = True, connected: bool = True):
        T = np.eye(4) if T is None else T
        self.mDeviceToAbsoluteTracking = [[float(T[r, c]) for c in range(4)] for r in range(3)]
        self.bPoseIsValid = valid
        self.bDeviceIsConnected = connected


class FakeOpenVR:
    """Stand-in for the ``openvr`` module and its IVRSystem."""

    VRApplication_Other = 0
    TrackingUniverseSeated, TrackingUniverseStanding, TrackingUniverseRawAndUncalibrated = 0, 1, 2
    TrackedDeviceClass_Invalid, TrackedDeviceClass_HMD, TrackedDeviceClass_Controller = 0, 1, 2
    TrackedDeviceClass_GenericTracker, TrackedDeviceClass_TrackingReference = 3, 4
    Prop_SerialNumber_String = 1002
    k_unMaxTrackedDeviceCount = 64

    class OpenVRError(Exception):
        pass

    def __init__(self, init_error: Exception | None = None):
        self.init_error = init_error
        self.classes: dict[int, int] = {}
        self.serials: dict[int, str] = {}
        self.poses = [FakePose(valid=False, connected=False) for _ in range(64)]
        self.calls: list = []
        self.serial_calls = 0

    # module-level functions
    def init(self, app_type):
        self.calls.append(("init", app_type))
        if self.init_error is not None:
            raise self.init_error
        return self

    def shutdown(self):
        self.calls.append(("shutdown",))

    # IVRSystem methods
    def getDeviceToAbsoluteTrackingPose(self, universe, predicted, count):
        self.calls.append(("poses", universe, predicted, count))
        return list(self.poses)

    def getTrackedDeviceClass(self, index):
        return self.classes.get(index, self.TrackedDeviceClass_Invalid)

    def getStringTrackedDeviceProperty(self, index, prop):
        assert prop == self.Prop_SerialNumber_String
        self.serial_calls += 1
        return self.serials[index]


def a_pose(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return pose_to_matrix(rng.uniform(-2, 2, 3), rng.normal(size=4))


def fake_with_devices() -> FakeOpenVR:
    ov = FakeOpenVR()
    ov.classes = {0: ov.TrackedDeviceClass_HMD, 1: ov.TrackedDeviceClass_TrackingReference, 3: 3, 4: 3, 7: 3, 9: 2}
    ov.serials = {0: "HMD-1", 1: "LHB-1", 3: "LHR-00000003", 4: "LHR-00000004", 7: "LHR-00000007", 9: "CTRL-9"}
    for i in ov.classes:
        ov.poses[i] = FakePose(a_pose(i))
    ov.poses[7] = FakePose(a_pose(7), valid=False)  # a tracker that lost tracking
    return ov


def test_openvr_reads_only_valid_generic_trackers():
    ov = fake_with_devices()
    src = OpenVRSource(openvr_module=ov, world_frame="vive")
    src.start(0.0)
    assert ov.calls[0] == ("init", ov.VRApplication_Other)
    got = src.read(12.5)
    assert ov.calls[-1] == ("poses", ov.TrackingUniverseStanding, 0, 64)
    assert sorted(s.serial for s in got) == ["LHR-00000003", "LHR-00000004"]
    for s in got:
        assert s.stamp == 12.5
        np.testing.assert_allclose(s.matrix, a_pose(int(s.serial[-1])), atol=1e-12)
        assert is_rigid(s.matrix)
    ov.poses[7] = FakePose(a_pose(7))  # tracking regained
    ov.poses[4] = FakePose(a_pose(4), connected=False)  # switched off
    ov.poses[3] = FakePose(a_pose(33))  # moved
    assert sorted(s.serial for s in src.read(13.0)) == ["LHR-00000003", "LHR-00000007"]
    assert src.serials_seen() == {"LHR-00000003", "LHR-00000004", "LHR-00000007"}
    assert src.world_frame == "vive"


def test_openvr_matrix_conversion_uses_row_column_indexing():
    ov = FakeOpenVR()
    ov.classes = {2: 3}
    ov.serials = {2: "LHR-2"}
    # a hand-written 3x4 row-major pose: rotation of 90 deg about y, translation (1, 2, 3)
    ov.poses[2] = SimpleNamespace(
        mDeviceToAbsoluteTracking=[[0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 2.0], [-1.0, 0.0, 0.0, 3.0]],
        bPoseIsValid=True,
        bDeviceIsConnected=True,
    )
    src = OpenVRSource(openvr_module=ov, universe="seated")
    src.start(0.0)
    (s,) = src.read(1.0)
    expected = np.array([[0, 0, 1, 1], [0, 1, 0, 2], [-1, 0, 0, 3], [0, 0, 0, 1]], dtype=float)
    np.testing.assert_array_equal(s.matrix, expected)
    assert ov.calls[-1][1] == ov.TrackingUniverseSeated


def test_openvr_reads_the_real_ctypes_pose_structures():
    openvr = pytest.importorskip("openvr")
    ov = FakeOpenVR()
    ov.classes = {5: 3}
    ov.serials = {5: "LHR-5"}
    poses = (openvr.TrackedDevicePose_t * openvr.k_unMaxTrackedDeviceCount)()
    T = a_pose(5)
    for r in range(3):
        for c in range(4):
            poses[5].mDeviceToAbsoluteTracking.m[r][c] = T[r, c]
    poses[5].bPoseIsValid = poses[5].bDeviceIsConnected = True
    poses[6].bPoseIsValid = poses[6].bDeviceIsConnected = True  # not a tracker
    ov.poses = poses
    src = OpenVRSource(openvr_module=ov)
    src.start(0.0)
    (s,) = src.read(0.0)
    np.testing.assert_allclose(s.matrix, T, atol=1e-6)  # float32 in the structure
    assert s.matrix.dtype == np.float64


def test_openvr_skips_unchanged_poses_and_caches_serials():
    ov = fake_with_devices()
    src = OpenVRSource(openvr_module=ov)
    src.start(0.0)
    assert len(src.read(0.01)) == 2
    calls = ov.serial_calls
    assert src.read(0.02) == []  # nothing moved
    ov.poses[3] = FakePose(a_pose(30))
    (moved,) = src.read(0.03)
    assert moved.serial == "LHR-00000003"
    assert ov.serial_calls == calls  # serials are looked up once per device


def test_openvr_serial_lookup_failure_skips_the_device_until_it_works():
    ov = fake_with_devices()
    del ov.serials[4]  # KeyError, as a property error would raise
    src = OpenVRSource(openvr_module=ov)
    src.start(0.0)
    assert [s.serial for s in src.read(0.0)] == ["LHR-00000003"]
    ov.serials[4] = "LHR-00000004"
    assert [s.serial for s in src.read(0.1)] == ["LHR-00000004"]  # 3 did not move


def test_openvr_close_shuts_down_once():
    ov = fake_with_devices()
    src = OpenVRSource(openvr_module=ov)
    src.close()  # not started: nothing to do
    with src:
        src.start(0.0)
    src.close()
    assert [c for c in ov.calls if c[0] == "shutdown"] == [("shutdown",)]
    with pytest.raises(RuntimeError):
        src.read(0.0)


def test_openvr_init_failure_is_hardware_unavailable():
    ov = FakeOpenVR(init_error=FakeOpenVR.OpenVRError("VRInitError_Init_NoServerForBackgroundApp"))
    src = OpenVRSource(openvr_module=ov)
    with pytest.raises(HardwareUnavailableError) as err:
        src.start(0.0)
    msg = str(err.value)
    assert "SteamVR" in msg and "OpenVR runtime" in msg
    assert "NoServerForBackgroundApp" in msg
    assert "backend:=synthetic" in msg and "replay" in msg
    src.close()
    assert ("shutdown",) not in ov.calls


def test_openvr_unknown_universe():
    with pytest.raises(ConfigurationError, match="standing"):
        OpenVRSource(universe="sitting")


def test_openvr_real_package_without_runtime_raises_hardware_unavailable(tmp_path):
    """The installed ``openvr`` package, with no SteamVR here: a typed error, quickly, in a child process."""
    code = (
        "import sys\n"
        "from rynn_teleop.errors import HardwareUnavailableError\n"
        "from rynn_teleop.sources.trackers import OpenVRSource\n"
        "try:\n"
        "    OpenVRSource().start(0.0)\n"
        "except HardwareUnavailableError as e:\n"
        "    print('UNAVAILABLE', e)\n"
        "    sys.exit(0)\n"
        "print('STARTED')\n"
    )
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path
    )
    if "STARTED" in proc.stdout:
        pytest.skip("an OpenVR runtime is running on this machine")
    assert proc.returncode == 0, proc.stderr
    assert "UNAVAILABLE" in proc.stdout and "backend:=synthetic" in proc.stdout


# --------------------------------------------------------------------------------------------- factory


def test_factory_builds_each_kind(tmp_path):
    assert isinstance(make_tracker_source("synthetic", serials=SERIALS, seed=2), SyntheticOperator)
    assert isinstance(make_tracker_source("replay", path=tmp_path, serials=SERIALS), ReplaySource)
    src = make_tracker_source("openvr", universe="raw")
    assert isinstance(src, OpenVRSource) and isinstance(src, TrackerSource)
    assert src.name == "openvr"


def test_factory_errors():
    with pytest.raises(ConfigurationError, match="synthetic"):
        make_tracker_source("libsurvive")
    with pytest.raises(ConfigurationError, match="rate_hz"):
        make_tracker_source("openvr", rate_hz=100.0)
    with pytest.raises(ConfigurationError, match="missing"):
        make_tracker_source("synthetic")
