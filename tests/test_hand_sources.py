"""Hand sources: the synthetic glove pair, the Manus raw-skeleton converter and the rosbag2 replay."""

from __future__ import annotations

import enum
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from scipy.spatial.transform import Rotation

from rynn_teleop.core.hand_skeleton import BONES, CHAINS, FINGERS, N_POINTS, TIPS, check
from rynn_teleop.core.layout import SIDES
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.sources.hands import (
    HAND_BACKENDS,
    KEY_POSES,
    HandSample,
    HandSource,
    ManusSkeletonError,
    ReplayHands,
    SyntheticGlove,
    make_hand_source,
    manus_to_mediapipe,
)
from rynn_teleop.sources.hands import synthetic as synth
from rynn_teleop.sources.hands.manus import SDK_CHAIN_TYPES, chain_label

MIRROR = np.array([1.0, -1.0, 1.0])
THUMB_TIP, INDEX_TIP = 4, 8


def tip_distances(points: np.ndarray) -> np.ndarray:
    """(5,) wrist -> tip distance [m] per finger (thumb ... pinky)."""
    return np.linalg.norm(points[list(TIPS)] - points[0], axis=1)


def bone_lengths_of(points: np.ndarray) -> np.ndarray:
    return np.array([np.linalg.norm(points[b] - points[a]) for a, b in BONES])


def read_all(src: HandSource, times) -> list[HandSample]:
    out: list[HandSample] = []
    for now in times:
        out += src.read(float(now))
    return out


# --------------------------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_whatever_the_read_timing():
    a, b = SyntheticGlove(seed=3), SyntheticGlove(seed=3)
    a.start(10.0)
    b.start(10.0)
    got_a = a.read(12.0)
    got_b = read_all(b, [9.0, 10.0, 10.013, 10.5, 10.5, 11.37, 12.0])
    assert len(got_a) == len(got_b) == 2 * (2 * 90 + 1)
    for x, y in zip(got_a, got_b):
        assert x.side == y.side and x.stamp == y.stamp
        np.testing.assert_array_equal(x.points, y.points)
    c = SyntheticGlove(seed=4)
    c.start(10.0)
    assert not np.array_equal(c.read(12.0)[5].points, got_a[5].points)
    a.start(10.0)  # a restart restarts the timeline and the noise
    np.testing.assert_array_equal(a.read(10.0)[0].points, got_a[0].points)


def test_synthetic_samples_on_a_fixed_grid_left_then_right():
    src = SyntheticGlove(rate_hz=50.0)
    src.start(100.0)
    assert src.read(99.0) == []
    got = src.read(101.0) + src.read(101.0)
    assert [s.side for s in got[:4]] == ["left", "right", "left", "right"]
    for side in SIDES:
        stamps = [s.stamp for s in got if s.side == side]
        assert len(stamps) == 51
        assert stamps[0] == 100.0
        np.testing.assert_allclose(np.diff(stamps), 0.02, atol=1e-9)
    assert [s.stamp for s in got] == sorted(s.stamp for s in got)
    assert all(isinstance(s, HandSample) and s.points.shape == (N_POINTS, 3) for s in got)


def test_synthetic_one_side_gets_the_same_noise_as_in_a_pair():
    pair, right = SyntheticGlove(seed=7), SyntheticGlove(sides=("right",), seed=7)
    pair.start(0.0)
    right.start(0.0)
    from_pair = [s for s in pair.read(0.5) if s.side == "right"]
    alone = right.read(0.5)
    assert {s.side for s in alone} == {"right"} and len(alone) == len(from_pair)
    for x, y in zip(from_pair, alone):
        np.testing.assert_array_equal(x.points, y.points)


def test_synthetic_left_hand_is_the_mirror_image_of_the_right():
    glove = SyntheticGlove(phase_shift_s=0.0)
    for t in np.linspace(0.0, 6.0, 37):
        np.testing.assert_allclose(glove.points_at("left", t), glove.points_at("right", t) * MIRROR, atol=1e-15)
    lagging = SyntheticGlove(phase_shift_s=0.5)
    for t in (0.7, 2.2, 4.9):
        np.testing.assert_allclose(lagging.points_at("right", t + 0.5), lagging.points_at("left", t) * MIRROR)
    # before its script starts the right hand holds OPEN
    np.testing.assert_allclose(lagging.points_at("right", 0.2), lagging.pose_blend("open", "open", 0.0, "right"))


def test_synthetic_wrist_frame_convention():
    """Right hand: fingers along +z, thumb side +y, flexion towards +x (the palm side)."""
    glove = SyntheticGlove()
    open_ = glove.pose_blend("open", "fist", 0.0, "right")
    fist = glove.pose_blend("open", "fist", 1.0, "right")
    np.testing.assert_array_equal(open_[0], 0.0)
    assert open_[9, 2] > 0.08 and abs(open_[9, 1]) < 0.01 and abs(open_[9, 0]) < 1e-9  # middle MCP on +z
    assert open_[5, 1] > open_[9, 1] > open_[13, 1] > open_[17, 1]  # index ... pinky from +y to -y
    assert open_[THUMB_TIP, 1] > open_[5, 1]  # the thumb is on the +y side
    assert all(fist[tip, 0] > 0.015 for tip in TIPS[1:])  # curled fingertips are on the palm side


def test_synthetic_bone_lengths_are_constant_and_the_models():
    glove = SyntheticGlove()
    model = glove.bone_lengths()
    assert model.shape == (20,)
    for t in np.linspace(0.0, 6.5, 40):
        for side in SIDES:
            np.testing.assert_allclose(bone_lengths_of(glove.points_at(side, t)), model, atol=1e-12)
    by_bone = dict(zip(BONES, model))
    assert by_bone[(0, 5)] == pytest.approx(synth.METACARPAL["index"])  # wrist -> index MCP
    assert [by_bone[b] for b in ((5, 6), (6, 7), (7, 8))] == pytest.approx(synth.PHALANGES["index"])
    assert [by_bone[b] for b in ((1, 2), (2, 3), (3, 4))] == pytest.approx(synth.PHALANGES["thumb"])
    np.testing.assert_allclose(SyntheticGlove(scale=1.2).bone_lengths(), 1.2 * model)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-0.5, 1.8), min_size=20, max_size=20), st.sampled_from(SIDES), st.floats(0.7, 1.3))
def test_bone_lengths_do_not_depend_on_the_joint_angles(angles, side, scale):
    p = synth.hand_points(np.reshape(angles, (5, 4)), side, scale)
    np.testing.assert_allclose(bone_lengths_of(p), synth.bone_lengths(scale), atol=1e-12)


def test_joint_angles_by_name():
    q = synth.as_angle_array({"index_pip": 0.5, "thumb_cmc_abd": 0.2})
    assert q[1, 2] == 0.5 and q[0, 1] == 0.2 and np.count_nonzero(q) == 2
    assert synth.JOINT_NAMES[3] == ("ring_mcp_flex", "ring_mcp_abd", "ring_pip", "ring_dip")
    with pytest.raises(ValueError, match="knuckle"):
        synth.as_angle_array({"knuckle": 1.0})
    with pytest.raises(ValueError, match="shape"):
        synth.hand_points(np.zeros(20))


def test_fist_brings_every_fingertip_close_to_the_wrist():
    glove = SyntheticGlove()
    for side in SIDES:
        open_d = tip_distances(glove.pose_blend("open", "open", 0.0, side))
        fist_d = tip_distances(glove.pose_blend("fist", "fist", 0.0, side))
        assert np.all(open_d - fist_d > 0.04)
        assert np.all(fist_d[1:] < 0.45 * open_d[1:])  # fingers 2-5 end near the palm


def test_closing_into_a_fist_is_monotone():
    glove = SyntheticGlove()
    d = np.array([tip_distances(glove.pose_blend("open", "fist", s, "left")) for s in np.linspace(0.0, 1.0, 101)])
    assert np.all(np.diff(d, axis=0) < 0.0), "a fingertip moved away from the wrist while closing"


def test_pinch_brings_thumb_and_index_tips_together():
    glove = SyntheticGlove(scale=0.9)
    for side in SIDES:
        p = glove.pose_blend("open", "pinch", 1.0, side)
        assert np.linalg.norm(p[THUMB_TIP] - p[INDEX_TIP]) < 0.005
        # the other fingers are relaxed, neither straight nor in a fist
        d = tip_distances(p)[2:]
        assert np.all(d < tip_distances(glove.pose_blend("open", "open", 0.0, side))[2:] - 0.01)
        assert np.all(d > tip_distances(glove.pose_blend("fist", "fist", 0.0, side))[2:] + 0.01)
    # in the script: the held pinch of segment 3 (the fourth second of a 6 s cycle)
    g = glove.gesture_at(3.1)
    assert (g.pose, g.blend) == ("pinch", 0.0)
    p = glove.points_at("left", 3.1)
    assert np.linalg.norm(p[THUMB_TIP] - p[INDEX_TIP]) < 0.005


def test_grasp_wraps_a_cylinder_of_about_6_cm():
    p = SyntheticGlove().pose_blend("grasp", "grasp", 0.0, "right")
    q = KEY_POSES["grasp"]
    assert np.all((np.degrees(q[1:, 0]) >= 50) & (np.degrees(q[1:, 0]) <= 60))
    for chain in CHAINS[1:4]:  # index, middle, ring: a circle through MCP, PIP, DIP, tip in the x-z plane
        xz = p[list(chain[1:])][:, [0, 2]]
        A = np.column_stack([2 * xz, np.ones(4)])
        cx, cz, c = np.linalg.lstsq(A, (xz**2).sum(axis=1), rcond=None)[0]
        radius = math.sqrt(c + cx * cx + cz * cz)
        assert 0.035 < radius < 0.05  # skeleton radius = cylinder radius 0.03 + about 1 cm of finger
    assert p[THUMB_TIP, 0] > 0.05  # the thumb is opposed, in front of the palm


def test_gesture_script_runs_open_fist_open_pinch_open_grasp():
    glove = SyntheticGlove(cycle_s=6.0, phase_shift_s=0.5)
    held = [glove.gesture_at(k + 0.1).pose for k in range(7)]
    assert held == ["open", "fist", "open", "pinch", "open", "grasp", "open"]
    right, left = glove.gesture_at(1.1, "right"), glove.gesture_at(0.6, "left")
    assert right[:2] == left[:2] == ("open", "fist") and right.blend == pytest.approx(left.blend)
    blends = [glove.gesture_at(t).blend for t in np.linspace(0.0, 0.999, 50)]
    assert blends[0] == 0.0 and all(0.0 <= b <= 1.0 for b in blends)
    assert np.all(np.diff(blends) >= 0.0) and blends[-1] > 0.999
    np.testing.assert_allclose(glove.joint_angles_at("left", 1.1), KEY_POSES["fist"])


def test_every_sample_of_a_cycle_is_a_valid_smooth_skeleton():
    src = SyntheticGlove(rate_hz=90.0, noise=0.001)
    src.start(0.0)
    got = src.read(6.6)
    assert len(got) == 2 * (594 + 1)
    assert all(check(s.points) is None for s in got)
    for side in SIDES:
        clean = np.stack([src.points_at(side, s.stamp) for s in got if s.side == side])
        assert np.abs(np.diff(clean, axis=0)).max() < 0.01  # < 1 cm per 11 ms: no jumps, even across segments


def test_synthetic_noise_has_the_configured_std():
    src = SyntheticGlove(noise=0.002, seed=11)
    src.start(0.0)
    got = src.read(3.0)
    err = np.stack([s.points - src.points_at(s.side, s.stamp) for s in got])
    np.testing.assert_array_equal(err[:, 0], 0.0)  # the wrist is the origin of its own frame
    assert abs(err[:, 1:].std() - 0.002) < 0.0001
    assert abs(err[:, 1:].mean()) < 0.0001
    quiet = SyntheticGlove(noise=0.0)
    quiet.start(0.0)
    for s in quiet.read(0.5):
        np.testing.assert_array_equal(s.points, quiet.points_at(s.side, s.stamp))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sides": ()},
        {"sides": ("left", "middle")},
        {"sides": ("left", "left")},
        {"rate_hz": 0.0},
        {"noise": -0.001},
        {"cycle_s": 0.0},
        {"phase_shift_s": -1.0},
        {"scale": 0.0},
    ],
)
def test_synthetic_rejects_bad_arguments(kwargs):
    with pytest.raises(ConfigurationError):
        SyntheticGlove(**kwargs)


def test_synthetic_life_cycle():
    with SyntheticGlove(sides="left") as src:
        assert src.sides == ("left",)
        with pytest.raises(RuntimeError):
            src.read(0.0)  # entering does not start
        src.start(0.0)
        assert len(src.read(0.1)) == 10
    with pytest.raises(RuntimeError):
        src.read(1.0)
    src.close()


# --------------------------------------------------------------------------------------------- manus


class Chain(enum.IntEnum):  # the SDK's ChainType values, as a binding might expose them
    ChainType_FingerThumb = 5
    ChainType_FingerIndex = 6
    ChainType_FingerMiddle = 7
    ChainType_FingerRing = 8
    ChainType_FingerPinky = 9
    ChainType_Hand = 13


def _pose(p: np.ndarray, q: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(
        position=SimpleNamespace(x=float(p[0]), y=float(p[1]), z=float(p[2])),
        orientation=SimpleNamespace(x=float(q[0]), y=float(q[1]), z=float(q[2]), w=float(q[3])),
    )


def stand_in_glove(
    points: np.ndarray,
    side: str = "Right",
    *,
    seed: int = 0,
    R_glove_wrist: np.ndarray | None = None,
    origin=(0.3, -0.1, 1.2),
    metacarpals: bool = True,
    chain_name=lambda finger: finger.capitalize(),
) -> SimpleNamespace:
    """A ManusGlove-like message whose raw skeleton holds ``points`` (wrist frame) in a glove frame.

    Node positions: origin + R_glove_wrist @ point; each non-thumb finger gets an
    extra carpometacarpal node between the wrist and its MCP (if ``metacarpals``);
    node ids are random and the node order is shuffled.
    """
    rng = np.random.default_rng(seed)
    R = np.eye(3) if R_glove_wrist is None else R_glove_wrist

    def to_glove(p):
        return np.asarray(origin) + R @ p

    ids = iter(rng.choice(1000, size=40, replace=False).tolist())
    quats = Rotation.random(40, random_state=seed).as_quat()
    nodes = []

    def add(p, parent, chain, joint):
        node_id = next(ids)
        nodes.append(
            SimpleNamespace(
                node_id=node_id,
                parent_node_id=parent,
                joint_type=joint,
                chain_type=chain,
                pose=_pose(to_glove(p), quats[len(nodes)]),
            )
        )
        return node_id

    wrist = add(points[0], -1, chain_name("hand"), "Invalid")
    for f, finger in enumerate(FINGERS):
        parent = wrist
        joints = ["MCP", "PIP", "DIP", "TIP"]
        if finger != "thumb" and metacarpals:
            along = 0.25 + 0.1 * rng.random()
            cmc = points[0] + along * (points[1 + 4 * f] - points[0]) + 0.003 * rng.standard_normal(3)
            parent = add(cmc, parent, chain_name(finger), "MCP")
            joints = ["PIP", "IP", "DIP", "TIP"]
        for k in range(4):
            parent = add(points[1 + 4 * f + k], parent, chain_name(finger), joints[k])
    order = rng.permutation(len(nodes))
    nodes = [nodes[i] for i in order]
    return SimpleNamespace(glove_id=7, side=side, raw_node_count=len(nodes), raw_nodes=nodes, ergonomics=[])


def known_points(t: float = 1.4, side: str = "right") -> np.ndarray:
    return SyntheticGlove().points_at(side, t)


def test_manus_recovers_the_21_points():
    points = known_points()
    glove = stand_in_glove(points)
    assert glove.raw_node_count == 25
    side, got = manus_to_mediapipe(glove)
    assert side == "right"
    np.testing.assert_allclose(got, points, atol=1e-12)
    assert check(got) is None


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 6.0), st.booleans())
def test_manus_recovers_the_points_through_a_glove_rotation(seed, t, reflect):
    points = known_points(t, "left")
    R = Rotation.random(random_state=seed).as_matrix()
    if reflect:  # a left-handed SDK frame
        R = R @ np.diag([1.0, 1.0, -1.0])
    glove = stand_in_glove(points, "Left", seed=seed, R_glove_wrist=R)
    side, got = manus_to_mediapipe(glove, glove_to_wrist=R.T)
    assert side == "left"
    np.testing.assert_allclose(got, points, atol=1e-12)
    _, raw = manus_to_mediapipe(glove)  # without the rotation: the same points in the glove axes
    np.testing.assert_allclose(raw, points @ R.T, atol=1e-12)


@pytest.mark.parametrize(
    "name",
    [
        lambda f: f.capitalize(),  # what the vendor publisher sends
        lambda f: f.upper(),
        lambda f: "Hand" if f == "hand" else f"ChainType_Finger{f.capitalize()}",
        lambda f: Chain[f"ChainType_{'Hand' if f == 'hand' else 'Finger' + f.capitalize()}"],  # enum member
        lambda f: {v: k for k, v in SDK_CHAIN_TYPES.items()}[f],  # plain SDK integers
    ],
)
def test_manus_chain_type_spellings(name):
    points = known_points(2.0)
    _, got = manus_to_mediapipe(stand_in_glove(points, chain_name=name))
    np.testing.assert_allclose(got, points, atol=1e-12)


def test_manus_chain_label():
    assert chain_label("Thumb") == "thumb" and chain_label(13) == "hand" and chain_label("FingerPinky") == "pinky"
    assert chain_label("Arm") is None and chain_label(1) is None and chain_label(None) is None


@pytest.mark.parametrize("raw, side", [("Left", "left"), ("Right", "right"), ("RIGHT", "right"), ("Side_Left", "left")])
def test_manus_side_parsing(raw, side):
    assert manus_to_mediapipe(stand_in_glove(known_points(), raw)).side == side


def test_manus_fingers_without_metacarpal_nodes_are_accepted():
    points = known_points(0.3)
    glove = stand_in_glove(points, metacarpals=False)
    assert len(glove.raw_nodes) == 21
    np.testing.assert_allclose(manus_to_mediapipe(glove).points, points, atol=1e-12)


def _node(glove, chain: str, k: int):
    """The k-th node (from the wrist) of a chain of a stand-in glove."""
    by_id = {n.node_id: n for n in glove.raw_nodes}
    members = [n for n in glove.raw_nodes if chain_label(n.chain_type) == chain]
    depth = {}
    for n in members:
        d, cur = 0, n
        while chain_label(cur.chain_type) == chain:
            cur, d = by_id[cur.parent_node_id], d + 1
        depth[d - 1] = n
    return depth[k]


def _drop_chain(g, chain):
    g.raw_nodes = [n for n in g.raw_nodes if chain_label(n.chain_type) != chain]
    g.raw_node_count = len(g.raw_nodes)


def _set(g, chain, k, **fields):
    for name, value in fields.items():
        setattr(_node(g, chain, k), name, value(g) if callable(value) else value)


def _second_hand_node(g):
    n = _node(g, "index", 0)
    n.chain_type = "Hand"


def _duplicate_id(g):
    _node(g, "ring", 4).node_id = _node(g, "ring", 3).node_id


def _branch(g):  # the middle tip hangs off the middle MCP as well: two children
    _set(g, "middle", 4, parent_node_id=_node(g, "middle", 1).node_id)


def _cycle(g):  # the first pinky node hangs off the pinky tip: pinky is cut off from the wrist
    _set(g, "pinky", 0, parent_node_id=_node(g, "pinky", 4).node_id)


def _short_chain(g):  # a thumb of three nodes
    tip = _node(g, "thumb", 3)
    g.raw_nodes.remove(tip)
    g.raw_node_count -= 1


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda g: setattr(g, "side", "Both"), "Left"),
        (lambda g: setattr(g, "raw_node_count", 24), "raw_node_count"),
        (lambda g: _drop_chain(g, "ring"), "no ring chain"),
        (lambda g: _drop_chain(g, "hand"), "exactly one"),
        (_second_hand_node, "exactly one"),
        (lambda g: _set(g, "index", 2, chain_type="Arm"), "chain type"),
        (lambda g: _set(g, "thumb", 2, parent_node_id=9999), "not in the glove"),
        (_duplicate_id, "twice"),
        (_branch, "branches"),
        (_cycle, "not reachable"),
        (_short_chain, "at least 4"),
        (lambda g: (g.raw_nodes.clear(), setattr(g, "raw_node_count", 0)), "no raw nodes"),
    ],
)
def test_manus_malformed_gloves_raise_a_clear_error(break_it, message):
    glove = stand_in_glove(known_points())
    break_it(glove)
    with pytest.raises(ManusSkeletonError, match=message):
        manus_to_mediapipe(glove)
    assert issubclass(ManusSkeletonError, ValueError)


def test_manus_bad_glove_to_wrist():
    glove = stand_in_glove(known_points())
    with pytest.raises(ConfigurationError, match="3x3"):
        manus_to_mediapipe(glove, np.eye(4))
    with pytest.raises(ConfigurationError, match="rotation"):
        manus_to_mediapipe(glove, 2.0 * np.eye(3))


# --------------------------------------------------------------------------------------------- replay

TYPESTORE = get_typestore(Stores.ROS2_JAZZY)
FIRST_NS = 1_700_000_000_250_000_000


def pose_array(points: np.ndarray, stamp_ns: int, frame_id: str):
    ts = TYPESTORE.types
    return ts["geometry_msgs/msg/PoseArray"](
        header=ts["std_msgs/msg/Header"](
            stamp=ts["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9),
            frame_id=frame_id,
        ),
        poses=[
            ts["geometry_msgs/msg/Pose"](
                position=ts["geometry_msgs/msg/Point"](x=float(p[0]), y=float(p[1]), z=float(p[2])),
                orientation=ts["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0),
            )
            for p in points
        ],
    )


def write_bag(
    path: Path,
    *,
    sides=SIDES,
    n: int = 20,
    period_ns: int = 11_000_000,
    storage=StoragePlugin.MCAP,
    prefix: str = "/operator/hand",
    zero_stamps: bool = False,
    short_at: int | None = None,
) -> dict[str, list[tuple[float, np.ndarray]]]:
    """A bag of ``n`` skeletons per side from the synthetic glove; returns side -> [(stamp [s], points)]."""
    glove = SyntheticGlove()
    recorded: dict[str, list[tuple[float, np.ndarray]]] = {s: [] for s in sides}
    with Writer(path, version=9, storage_plugin=storage) as writer:
        conns = {
            s: writer.add_connection(f"{prefix}/{s}/skeleton", "geometry_msgs/msg/PoseArray", typestore=TYPESTORE)
            for s in sides
        }
        other = writer.add_connection("/rosout_like", "std_msgs/msg/String", typestore=TYPESTORE)
        for k in range(n):
            for j, side in enumerate(sides):
                stamp = FIRST_NS + k * period_ns + j * 1000  # sides 1 us apart, like separate callbacks
                points = glove.points_at(side, k * period_ns * 1e-9)
                if short_at == k:
                    points = points[:20]
                msg = pose_array(points, 0 if zero_stamps else stamp, f"{side}_wrist")
                log_ns = stamp + (0 if zero_stamps else 3_000_000)  # received 3 ms later
                writer.write(conns[side], log_ns, TYPESTORE.serialize_cdr(msg, "geometry_msgs/msg/PoseArray"))
                recorded[side].append((stamp * 1e-9, points))
            if k == 0:
                raw = TYPESTORE.serialize_cdr(TYPESTORE.types["std_msgs/msg/String"](data="hi"), "std_msgs/msg/String")
                writer.write(other, FIRST_NS, raw)
    return recorded


@pytest.mark.parametrize("storage", [StoragePlugin.MCAP, StoragePlugin.SQLITE3])
def test_replay_maps_recorded_stamps_onto_the_playback_clock(tmp_path, storage):
    bag = tmp_path / "session"
    recorded = write_bag(bag, storage=storage)
    src = ReplayHands(bag)
    src.start(500.0)
    assert src.sides == SIDES
    assert src.frame_ids == {"left": "left_wrist", "right": "right_wrist"}
    first = recorded["left"][0][0]
    assert src.read(499.9) == []
    got = src.read(500.0 + 0.105)  # the first 10 periods (stamps up to +0.099001)
    assert len(got) == 2 * 10
    assert [s.side for s in got[:2]] == ["left", "right"]
    for side in SIDES:
        mine = [s for s in got if s.side == side]
        for sample, (stamp, points) in zip(mine, recorded[side]):
            assert sample.stamp == pytest.approx(500.0 + (stamp - first), abs=1e-6)
            np.testing.assert_allclose(sample.points, points, atol=1e-12)
    assert [s.stamp for s in got] == sorted(s.stamp for s in got)
    assert not src.finished
    assert len(src.read(1000.0)) == 2 * 10
    assert src.finished
    assert src.duration == pytest.approx(19 * 0.011 + 1e-6, abs=1e-9)
    assert src.read(2000.0) == []
    src.close()
    src.close()
    with pytest.raises(RuntimeError):
        src.read(3000.0)


def test_replay_rate_scale_shrinks_the_intervals(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, sides=("right",), n=11)
    normal, fast = ReplayHands(bag), ReplayHands(bag, rate_scale=2.0)
    normal.start(0.0)
    fast.start(0.0)
    s_normal = [s.stamp for s in normal.read(10.0)]
    s_fast = [s.stamp for s in fast.read(10.0)]
    np.testing.assert_allclose(np.diff(s_normal), 0.011, atol=1e-6)
    np.testing.assert_allclose(np.diff(s_fast), 0.0055, atol=1e-6)
    assert s_fast[-1] == pytest.approx(0.055, abs=1e-6)


def test_replay_loop_continues_the_timeline(tmp_path):
    bag = tmp_path / "bag"
    recorded = write_bag(bag, n=5)
    src = ReplayHands(bag, loop=True, sides=["left"])
    src.start(0.0)
    assert src.sides == ("left",)
    got = read_all(src, np.arange(0.0, 0.2, 0.013))
    assert {s.side for s in got} == {"left"}
    stamps = [s.stamp for s in got]
    assert len(got) >= 15  # went round at least three times
    np.testing.assert_allclose(np.diff(stamps), 0.011, atol=1e-6)  # a loop restarts one period later
    for i, s in enumerate(got):
        np.testing.assert_allclose(s.points, recorded["left"][i % 5][1], atol=1e-12)
    assert not src.finished


def test_replay_returns_skeletons_with_a_wrong_point_count(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, sides=("left",), n=4, short_at=2)
    src = ReplayHands(bag)
    src.start(0.0)
    shapes = [s.points.shape for s in src.read(1.0)]
    assert shapes == [(21, 3), (21, 3), (20, 3), (21, 3)]


def test_replay_zero_header_stamps_use_the_receive_time(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, sides=("right",), n=3, zero_stamps=True)
    src = ReplayHands(bag)
    src.start(5.0)
    np.testing.assert_allclose([s.stamp for s in src.read(6.0)], [5.0, 5.011, 5.022], atol=1e-6)


def test_replay_uses_the_recorded_hands_and_names_missing_ones(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, sides=("right",), n=2)
    src = ReplayHands(bag)
    src.start(0.0)
    assert src.sides == ("right",) and {s.side for s in src.read(1.0)} == {"right"}
    with pytest.raises(ConfigurationError, match="no recording of the left hand; recorded hands: right"):
        ReplayHands(bag, sides=("left", "right")).start(0.0)


def test_replay_bag_without_skeleton_topics_lists_its_topics(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, n=2, prefix="/other/prefix")
    with pytest.raises(ConfigurationError) as err:
        ReplayHands(bag).start(0.0)
    msg = str(err.value)
    assert "/operator/hand" in msg
    assert "/other/prefix/left/skeleton" in msg and "/rosout_like" in msg
    src = ReplayHands(bag / "metadata.yaml", topic_prefix="other/prefix/")  # a file inside is fine
    src.start(0.0)
    assert len(src.read(1.0)) == 4


def test_replay_missing_directory(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        ReplayHands(tmp_path / "nope").start(0.0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match="not a rosbag2 directory"):
        ReplayHands(tmp_path / "empty").start(0.0)


@pytest.mark.parametrize(
    "kwargs", [{"rate_scale": 0.0}, {"sides": ()}, {"sides": ("thumb",)}, {"sides": ("left", "left")}]
)
def test_replay_rejects_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ConfigurationError):
        ReplayHands(tmp_path, **kwargs)


def test_replay_read_before_start(tmp_path):
    with ReplayHands(tmp_path) as src, pytest.raises(RuntimeError):
        src.read(0.0)


# --------------------------------------------------------------------------------------------- factory


def test_factory_builds_each_kind(tmp_path):
    assert set(HAND_BACKENDS) == {"synthetic", "replay", "skeleton", "manus", "xr"}
    glove = make_hand_source("synthetic", seed=2, sides=("left",))
    assert isinstance(glove, SyntheticGlove) and glove.name == "synthetic" and glove.seed == 2
    replay = make_hand_source("replay", path=tmp_path, rate_scale=2.0)
    assert isinstance(replay, ReplayHands) and isinstance(replay, HandSource) and replay.name == "replay"


def test_factory_errors():
    with pytest.raises(ConfigurationError, match="known: manus, replay, skeleton, synthetic"):
        make_hand_source("leap")
    with pytest.raises(ConfigurationError, match="serials"):
        make_hand_source("synthetic", serials={})
    with pytest.raises(ConfigurationError, match="path"):
        make_hand_source("replay")
    with pytest.raises(ConfigurationError, match="rate_hz"):
        make_hand_source("synthetic", rate_hz=-1.0)


def test_hand_points_equal_the_chain_of_rotation_matrices():
    """hand_points' closed form (cumulative flexion about one axis) against the plain product of rotations."""
    import math

    from rynn_teleop.sources.hands import synthetic as syn

    def rx(a):
        c, s = math.cos(a), math.sin(a)
        return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])

    def ry(a):
        c, s = math.cos(a), math.sin(a)
        return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])

    rng = np.random.default_rng(3)
    for _ in range(50):
        q = rng.uniform(-1.5, 1.5, (5, 4))
        want = np.zeros((21, 3))
        for f, finger in enumerate(syn.FINGERS):
            flex1, abd, flex2, flex3 = q[f]
            base, R = (syn.THUMB_CMC, syn.THUMB_BASE) if finger == "thumb" else (syn.MCP_POSITIONS[finger],
                                                                                syn.FINGER_BASE)
            R = R @ rx(-abd) @ ry(flex1)
            k = 1 + 4 * f
            want[k] = base
            for j, flex in enumerate((None, flex2, flex3)):
                if flex is not None:
                    R = R @ ry(flex)
                want[k + j + 1] = want[k + j] + R[:, 2] * syn.PHALANGES[finger][j]
        np.testing.assert_allclose(syn.hand_points(q, "right", 1.2), 1.2 * want, atol=1e-12)
        mirrored = 1.2 * want * np.array([1.0, -1.0, 1.0])
        np.testing.assert_allclose(syn.hand_points(q, "left", 1.2), mirrored, atol=1e-12)
