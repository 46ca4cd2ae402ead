"""core.trackers: frames and the lag bound, TrackerSet (serials, discovery, freshness, chest-relative arm
poses) and ChestRelativeArms (the consumer side of the PoseArray frames)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rynn_teleop.core.layout import ROLES, SIDES
from rynn_teleop.core.trackers import (
    ChestRelativeArms,
    RelativePoses,
    TrackerFrame,
    TrackerSample,
    TrackerSet,
    drop_late_frames,
    frame_matrices,
    frame_poses,
    group_frames,
    rigid_mask,
)
from rynn_teleop.core.transforms import is_rigid, make_transform, pose_to_matrix, quat_from_rotation
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.sources.trackers import SyntheticOperator

SERIALS = {
    "chest": "LHR-0000C0C0",
    "left_elbow": "LHR-000011E0",
    "right_elbow": "LHR-000022E0",
    "left_wrist": "LHR-000011A0",
    "right_wrist": "LHR-000022A0",
}


def rot_z(deg: float) -> np.ndarray:
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def sample(role: str, stamp: float, T: np.ndarray | None = None) -> TrackerSample:
    return TrackerSample(SERIALS[role], stamp, np.eye(4) if T is None else T)


def feed_all(ts: TrackerSet, stamp: float) -> None:
    for role in ROLES:
        assert ts.update(sample(role, stamp)) == role


# ----------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "serials, expected",
    [
        ({r: s for r, s in SERIALS.items() if r not in ("chest", "right_wrist")}, "chest, right_wrist"),
        ({**SERIALS, "left_elbow": "  "}, "left_elbow"),
        ({**SERIALS, "left_elbow": None}, "left_elbow"),
    ],
)
def test_roles_without_a_serial_are_named(serials, expected):
    with pytest.raises(ConfigurationError, match="no serial") as err:
        TrackerSet(serials, timeout=0.1)
    assert expected in str(err.value)


def test_duplicate_serial_names_both_roles():
    with pytest.raises(ConfigurationError) as err:
        TrackerSet({**SERIALS, "right_wrist": SERIALS["left_wrist"]}, timeout=0.1)
    msg = str(err.value)
    assert SERIALS["left_wrist"] in msg and "left_wrist" in msg and "right_wrist" in msg


def test_unknown_role_is_rejected():
    with pytest.raises(ConfigurationError, match="head"):
        TrackerSet({**SERIALS, "head": "LHR-12345678"}, timeout=0.1)


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan")])
def test_timeout_must_be_positive(timeout):
    with pytest.raises(ConfigurationError, match="timeout"):
        TrackerSet(SERIALS, timeout=timeout)


# ----------------------------------------------------------------------------------------- discovery


def test_discovery_passes_when_every_serial_was_seen():
    TrackerSet(SERIALS, 0.1).check_discovered(set(SERIALS.values()) | {"LHR-FFFFFFFF"})


def test_discovery_error_names_missing_and_lists_seen_serials():
    seen = {SERIALS["chest"], SERIALS["left_wrist"], "LHR-DEADBEEF", "LHR-0BADF00D"}
    with pytest.raises(ConfigurationError) as err:
        TrackerSet(SERIALS, 0.1).check_discovered(seen)
    msg = str(err.value)
    for role in ("left_elbow", "right_elbow", "right_wrist"):
        assert role in msg and SERIALS[role] in msg
    assert f"left_wrist ({SERIALS['left_wrist']})" not in msg
    assert ", ".join(sorted(seen)) in msg  # sorted list of what was seen


def test_discovery_error_when_nothing_was_seen():
    with pytest.raises(ConfigurationError, match="no tracker was seen at all"):
        TrackerSet(SERIALS, 0.1).check_discovered(set())


# ----------------------------------------------------------------------------------------- updates


def test_update_stores_the_newest_pose_and_counts():
    ts = TrackerSet(SERIALS, 0.1)
    assert ts.pose("chest") is None and ts.stamp("chest") == -np.inf
    T = make_transform((0.1, 0.2, 1.3), rot_z(30))
    assert ts.update(sample("chest", 1.0, T)) == "chest"
    np.testing.assert_array_equal(ts.pose("chest"), T)
    assert ts.stamp("chest") == 1.0
    ts.pose("chest")[0, 3] = 99.0  # a copy: the stored pose does not change
    assert ts.pose("chest")[0, 3] == pytest.approx(0.1)
    assert ts.update(sample("chest", 1.0, T)) == "chest"  # same stamp: accepted
    assert ts.updates == {"chest": 2}
    assert ts.rejected == 0


def test_unknown_serial_is_counted_not_stored():
    ts = TrackerSet(SERIALS, 0.1)
    for _ in range(3):
        assert ts.update(TrackerSample("LHR-99999999", 1.0, np.eye(4))) is None
    assert ts.unknown_serials == {"LHR-99999999": 3}
    assert not ts.updates and ts.rejected == 0


@pytest.mark.parametrize(
    "matrix",
    [
        np.full((4, 4), np.nan),
        make_transform((0.0, np.inf, 0.0)),
        np.diag([1.0, 1.0, 1.1, 1.0]),  # scaled
        np.diag([1.0, 1.0, -1.0, 1.0]),  # mirrored
        np.eye(3),  # wrong shape
        np.vstack([make_transform((1, 2, 3))[:3], [0.0, 0.0, 0.5, 1.0]]),  # bad last row
    ],
)
def test_bad_matrices_are_rejected(matrix):
    ts = TrackerSet(SERIALS, 0.1)
    T = make_transform((1.0, 0.0, 0.0))
    ts.update(sample("left_wrist", 1.0, T))
    assert ts.update(sample("left_wrist", 2.0, matrix)) is None
    assert ts.rejected == 1
    np.testing.assert_array_equal(ts.pose("left_wrist"), T)
    assert ts.stamp("left_wrist") == 1.0


def test_float32_rotations_are_accepted():
    T = pose_to_matrix((0.3, 1.2, -0.4), (0.1, 0.7, -0.2, 0.6)).astype(np.float32)
    ts = TrackerSet(SERIALS, 0.1)
    assert ts.update(sample("chest", 0.0, T)) == "chest"


def test_out_of_order_and_nan_stamps_are_rejected():
    ts = TrackerSet(SERIALS, 0.1)
    ts.update(sample("chest", 5.0, make_transform((1.0, 0.0, 0.0))))
    assert ts.update(sample("chest", 4.99, make_transform((2.0, 0.0, 0.0)))) is None
    assert ts.update(sample("chest", float("nan"))) is None
    assert ts.rejected == 2
    assert ts.stamp("chest") == 5.0 and ts.pose("chest")[0, 3] == 1.0
    assert ts.update(sample("chest", 5.01)) == "chest"


# ----------------------------------------------------------------------------------------- staleness


def test_never_updated_roles_are_stale():
    ts = TrackerSet(SERIALS, 0.1)
    assert ts.stale(0.0) == set(ROLES)
    assert not ts.fresh("chest", 0.0)
    assert not ts.stale_events  # never fresh: no transition


def test_staleness_and_resumption():
    ts = TrackerSet(SERIALS, timeout=0.1)
    feed_all(ts, 1.0)
    assert ts.stale(1.05) == set()
    assert ts.stale(1.09) == set()
    ts.update(sample("chest", 1.15))
    assert ts.stale(1.2) == set(ROLES) - {"chest"}
    assert ts.stale(1.3) == set(ROLES)
    assert ts.stale(1.4) == set(ROLES)  # still stale: no new event
    assert ts.stale_events == {r: 1 for r in ROLES}
    assert ts.update(sample("left_wrist", 1.5)) == "left_wrist"
    assert ts.fresh("left_wrist", 1.52)
    assert ts.stale(1.52) == set(ROLES) - {"left_wrist"}
    assert ts.stale(1.7) == set(ROLES)
    assert ts.stale_events["left_wrist"] == 2
    assert ts.stale_events["chest"] == 1


def test_a_stream_of_samples_never_goes_stale():
    op = SyntheticOperator(SERIALS, rate_hz=100.0)
    ts = TrackerSet(SERIALS, timeout=0.05)
    op.start(0.0)
    for now in np.arange(0.0, 2.0, 1 / 120.0):  # a 120 Hz timer polling a 100 Hz source
        for s in op.read(float(now)):
            ts.update(s)
        assert not ts.stale(float(now))
    assert not ts.stale_events and ts.rejected == 0
    assert all(ts.updates[r] == 200 for r in ROLES)


# ----------------------------------------------------------------------------------------- relative poses


def test_relative_equals_the_hand_computed_product():
    ts = TrackerSet(SERIALS, 0.1)
    # chest 1.3 m up, turned 90 deg left; wrist 0.5 m along world x, same height, turned 90 deg too
    ts.update(sample("chest", 1.0, make_transform((0.0, 0.0, 1.3), rot_z(90))))
    ts.update(sample("left_wrist", 1.02, make_transform((0.5, 0.0, 1.3), rot_z(90))))
    ts.update(sample("left_elbow", 1.01, make_transform((0.0, 0.2, 1.0))))
    rel = ts.relative("left", 1.05)
    assert isinstance(rel, RelativePoses)
    # world +x is the chest's -y: the wrist is 0.5 m to the chest's right, not rotated relative to it
    np.testing.assert_allclose(rel.wrist, make_transform((0.0, -0.5, 0.0)), atol=1e-12)
    # elbow tracker: world (0, 0.2, -0.3) from the chest is chest (0.2, 0, -0.3), rotated -90 deg
    np.testing.assert_allclose(rel.elbow, make_transform((0.2, 0.0, -0.3), rot_z(-90)), atol=1e-12)
    assert rel.stamp == 1.02


def test_relative_is_none_when_chest_or_wrist_is_stale_and_elbow_optional():
    ts = TrackerSet(SERIALS, 0.1)
    assert ts.relative("right", 0.0) is None
    feed_all(ts, 1.0)
    assert ts.relative("right", 1.05).elbow is not None
    ts.update(sample("chest", 1.2))
    ts.update(sample("right_wrist", 1.2))
    rel = ts.relative("right", 1.25)
    assert rel is not None and rel.elbow is None  # elbow stale
    assert ts.relative("left", 1.25) is None  # left wrist stale
    ts.update(sample("left_wrist", 1.4))
    assert ts.relative("left", 1.45) is None  # chest stale now
    with pytest.raises(ValueError):
        ts.relative("middle", 1.0)


def test_relative_from_the_synthetic_operator_is_sway_free():
    """Wrist-in-chest does not depend on the body's sway: the arm is scripted in body axes."""
    op = SyntheticOperator(SERIALS, hold_s=5.0)
    ts = TrackerSet(SERIALS, timeout=0.1)
    rels = []
    for t in (0.0, 1.3, 2.9):
        for role, T in op.pose_at(t).items():
            ts.update(TrackerSample(SERIALS[role], t, T))
        rels.append(ts.relative("left", t).wrist)
    assert np.abs(op.pose_at(0.0)["chest"][:3, 3] - op.pose_at(1.3)["chest"][:3, 3]).max() > 1e-3
    for rel in rels[1:]:
        np.testing.assert_allclose(rel, rels[0], atol=1e-12)


quats = st.lists(st.floats(-1.0, 1.0), min_size=4, max_size=4).filter(lambda q: np.linalg.norm(q) > 0.1)
positions = st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=3)


@settings(max_examples=50, deadline=None)
@given(pc=positions, qc=quats, pw=positions, qw=quats)
def test_relative_pose_recomposes_to_the_world_pose(pc, qc, pw, qw):
    chest, wrist = pose_to_matrix(pc, qc), pose_to_matrix(pw, qw)
    ts = TrackerSet(SERIALS, 0.1)
    ts.update(sample("chest", 0.0, chest))
    ts.update(sample("right_wrist", 0.0, wrist))
    rel = ts.relative("right", 0.0)
    np.testing.assert_allclose(chest @ rel.wrist, wrist, atol=1e-9)
    np.testing.assert_allclose(rel.wrist, np.linalg.inv(chest) @ wrist, atol=1e-9)


# ----------------------------------------------------------------------------------------- frames and lag


def frame_samples(stamp: float, roles=ROLES) -> list[TrackerSample]:
    return [sample(r, stamp, make_transform((0.1 * i, 0.0, 1.0))) for i, r in enumerate(roles)]


def test_group_frames_splits_on_stamp_changes_in_order():
    samples = frame_samples(1.0) + frame_samples(1.01, ROLES[:2]) + frame_samples(1.02)
    frames = group_frames(samples)
    assert [f.stamp for f in frames] == [1.0, 1.01, 1.02]
    assert [len(f.samples) for f in frames] == [5, 2, 5]
    assert [s for f in frames for s in f.samples] == samples
    assert group_frames([]) == []


def test_late_frames_are_dropped_and_the_newest_kept():
    frames = [TrackerFrame(t, ()) for t in np.arange(0.0, 0.30, 1 / 120)]
    kept, dropped = drop_late_frames(frames, now=0.30, max_lag=0.05)
    assert all(0.30 - f.stamp <= 0.05 for f in kept)
    assert len(kept) + dropped == len(frames) and dropped == sum(0.30 - f.stamp > 0.05 for f in frames)
    assert kept == [f for f in frames if 0.30 - f.stamp <= 0.05]  # in order
    # a stalled source: every frame is old, the newest one is still published
    kept, dropped = drop_late_frames(frames, now=10.0, max_lag=0.05)
    assert kept == [frames[-1]] and dropped == len(frames) - 1
    assert drop_late_frames([], 1.0, 0.05) == ([], 0)


@settings(max_examples=100, deadline=None)
@given(
    stamps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40, unique=True),
    late=st.floats(0.0, 2.0),
    max_lag=st.floats(0.005, 1.0),
)
def test_lag_bound_property(stamps, late, max_lag):
    stamps = sorted(stamps)
    now = stamps[-1] + late
    kept, dropped = drop_late_frames([TrackerFrame(t, ()) for t in stamps], now, max_lag)
    assert kept[-1].stamp == stamps[-1]  # the newest frame is never dropped
    assert all(now - f.stamp <= max_lag for f in kept[:-1])  # the others lag at most max_lag
    assert len(kept) + dropped == len(stamps)
    assert [f.stamp for f in kept] == sorted(f.stamp for f in kept)


def test_update_frame_gives_roles_order_and_nan_for_absent_or_rejected():
    ts = TrackerSet(SERIALS, 0.1)
    bad = np.diag([1.0, 1.0, 2.0, 1.0])
    samples = [sample("right_wrist", 1.0, make_transform((0.5, 0.0, 1.0))),
               sample("chest", 1.0, make_transform((0.0, 0.0, 1.3))),
               sample("left_elbow", 1.0, bad),
               TrackerSample("LHR-99999999", 1.0, np.eye(4))]
    out = ts.update_frame(TrackerFrame(1.0, tuple(samples)))
    assert out.shape == (len(ROLES), 4, 4)
    np.testing.assert_array_equal(out[ROLES.index("chest")], make_transform((0.0, 0.0, 1.3)))
    np.testing.assert_array_equal(out[ROLES.index("right_wrist")], make_transform((0.5, 0.0, 1.0)))
    for role in ("left_elbow", "right_elbow", "left_wrist"):
        assert np.all(np.isnan(out[ROLES.index(role)]))
    assert ts.rejected == 1 and ts.unknown_serials == {"LHR-99999999": 1}


# ----------------------------------------------------------------------------------------- consumer side


def test_chest_relative_arms_match_the_tracker_set_on_synthetic_frames():
    """The frames the tracker node publishes give arm_ik the same chest-relative poses as the tracker set."""
    op = SyntheticOperator(SERIALS, hold_s=0.5)
    op.start(0.0)
    ts, arms = TrackerSet(SERIALS, 0.1), ChestRelativeArms(0.1)
    n = 0
    for now in np.arange(0.05, 3.0, 0.05):
        for frame in group_frames(op.read(float(now))):
            matrices = ts.update_frame(frame)
            got = dict(arms.update(frame.stamp, matrices))
            for side in SIDES:
                want = ts.relative(side, frame.stamp)
                np.testing.assert_allclose(got[side].wrist, want.wrist, atol=1e-12)
                np.testing.assert_allclose(got[side].elbow, want.elbow, atol=1e-12)
                assert got[side].stamp == want.stamp == frame.stamp
                n += 1
    assert n > 500 and arms.malformed == 0 and arms.trackers.rejected == 0


def test_chest_relative_arms_freshness_is_judged_at_the_frame_stamp():
    arms = ChestRelativeArms(timeout=0.1)
    home = SyntheticOperator(SERIALS).home_pose()
    full = np.stack([home[r] for r in ROLES])
    assert {s for s, _ in arms.update(1.0, full)} == set(SIDES)
    no_left = full.copy()
    no_left[ROLES.index("left_wrist")] = np.nan
    got = dict(arms.update(1.05, no_left))
    assert set(got) == {"right"}  # the left wrist was not updated by this frame: no new left pose
    no_elbow = full.copy()
    no_elbow[ROLES.index("right_elbow")] = np.nan
    got = dict(arms.update(1.3, no_elbow))  # 0.3 s after the right elbow's last sample: stale there
    assert got["right"].elbow is None and got["left"].elbow is not None
    no_chest = full.copy()
    no_chest[ROLES.index("chest")] = np.nan
    assert arms.update(1.5, no_chest) == []  # the chest is stale at 1.5
    # a frame delivered late is judged at its own stamp, not at the time it is taken
    assert {s for s, _ in arms.update(1.55, full)} == set(SIDES)


def test_chest_relative_arms_refuses_malformed_frames():
    arms = ChestRelativeArms(timeout=0.1)
    assert arms.update(1.0, np.tile(np.eye(4), (4, 1, 1))) == []
    assert arms.update(float("nan"), np.tile(np.eye(4), (5, 1, 1))) == []
    assert arms.malformed == 2 and arms.frames == 0
    skew = np.tile(np.eye(4), (5, 1, 1))
    skew[ROLES.index("left_wrist"), 0, 0] = 2.0
    assert {s for s, _ in arms.update(1.0, skew)} == {"right"}
    assert arms.trackers.rejected == 1 and arms.frames == 1


# ----------------------------------------------------------------------------------------- frame conversions


@settings(max_examples=100, deadline=None)
@given(ps=st.lists(positions, min_size=1, max_size=6), qs=st.lists(quats, min_size=6, max_size=6))
def test_frame_poses_and_matrices_round_trip(ps, qs):
    T = np.stack([pose_to_matrix(p, q) for p, q in zip(ps, qs)])
    p, q = frame_poses(T)
    np.testing.assert_allclose(p, T[:, :3, 3], atol=1e-12)
    np.testing.assert_allclose(q, [quat_from_rotation(m[:3, :3]) for m in T], atol=1e-12)
    assert np.all(q[:, 3] >= 0)
    np.testing.assert_allclose(frame_matrices(p, q), T, atol=1e-12)
    np.testing.assert_allclose(frame_matrices(p, 3.0 * q), T, atol=1e-12)  # quaternions are normalised


def test_frame_conversions_keep_absent_roles_nan():
    T = np.tile(np.eye(4), (5, 1, 1))
    T[2] = np.nan
    p, q = frame_poses(T)
    assert np.all(np.isnan(p[2])) and np.all(np.isnan(q[2]))
    assert np.all(np.isfinite(np.delete(p, 2, axis=0))) and np.all(np.isfinite(np.delete(q, 2, axis=0)))
    q[3] = 0.0  # a zero quaternion is no pose either
    p[4, 0] = np.inf
    M = frame_matrices(p, q)
    assert [bool(np.all(np.isnan(m))) for m in M] == [False, False, True, True, True]


def test_rigid_mask_agrees_with_is_rigid():
    rng = np.random.default_rng(5)
    good = [pose_to_matrix(rng.normal(size=3), rng.normal(size=4)) for _ in range(5)]
    bad = [np.full((4, 4), np.nan), np.diag([1.0, 1.0, 1.1, 1.0]), np.diag([1.0, 1.0, -1.0, 1.0]),
           np.vstack([make_transform((1, 2, 3))[:3], [0.0, 0.0, 0.5, 1.0]]), make_transform((0.0, np.inf, 0.0))]
    M = np.stack(good + bad)
    assert rigid_mask(M).tolist() == [is_rigid(m, 1e-3) for m in M] == [True] * 5 + [False] * 5
