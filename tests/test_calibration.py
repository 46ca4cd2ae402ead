"""Operator-to-robot calibration (core.calibration), its use by the controller, and the stillness check
that gates an automatic capture."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from scipy.spatial.transform import Rotation

from rynn_teleop.core.arm_teleop import DEFAULT_HOME, ArmTeleop
from rynn_teleop.core.calibration import Calibration, StillnessDetector, calibrate
from rynn_teleop.core.layout import ROLES
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.core.trackers import ChestRelativeArms, TrackerSet, group_frames
from rynn_teleop.core.transforms import fit_similarity, make_transform, pose_error
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.sources.trackers import SyntheticOperator

SIDES = ("left", "right")


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


@pytest.fixture(scope="module")
def controller(robot) -> ArmTeleop:
    return ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[np.r_[0:14]])


@pytest.fixture(scope="module")
def home(controller):
    return controller.robot_home_points()


def operator_view(hands, elbows, R, t, s, wrist_mount):
    """The robot's home points as an operator would present them in a chest frame
    related to the torso by x_torso = s R x_chest + t, wrist trackers mounted with ``wrist_mount``."""
    wrists = {}
    op_elbows = {}
    for side in SIDES:
        p = R.T @ (hands[side][:3, 3] - t) / s
        wrists[side] = make_transform(p, R.T @ hands[side][:3, :3] @ wrist_mount[side])
        op_elbows[side] = R.T @ (elbows[side] - t) / s
    return wrists, op_elbows


def test_recovers_a_known_alignment_scale_and_wrist_offsets(home):
    hands, elbows = home
    R = Rotation.from_euler("xyz", [25, -70, 140], degrees=True).as_matrix()
    t = np.array([0.3, -0.1, 0.2])
    s = 1.3
    mount = {side: Rotation.random(random_state=i).as_matrix() for i, side in enumerate(SIDES)}
    wrists, op_elbows = operator_view(hands, elbows, R, t, s, mount)
    cal = calibrate(wrists, op_elbows, hands, elbows)
    np.testing.assert_allclose(cal.rotation, R, atol=1e-9)
    np.testing.assert_allclose(cal.translation, t, atol=1e-9)
    assert cal.scale == pytest.approx(s)
    assert cal.fit_residual < 1e-9
    for side in SIDES:
        np.testing.assert_allclose(cal.wrist_rotation[side], mount[side].T, atol=1e-9)
        err = pose_error(cal.map_wrist(side, wrists[side]), hands[side])
        assert err.position < 1e-9 and err.orientation < 1e-7
        # an operator motion of d in the chest frame moves the robot by s R d
        moved = wrists[side].copy()
        moved[:3, 3] += [0.01, 0.02, -0.03]
        np.testing.assert_allclose(
            cal.map_wrist(side, moved)[:3, 3] - hands[side][:3, 3], s * R @ [0.01, 0.02, -0.03], atol=1e-9
        )


def test_imperfect_posture_maps_home_exactly_through_the_offsets(home):
    hands, elbows = home
    R = Rotation.from_euler("z", 90, degrees=True).as_matrix()
    wrists, op_elbows = operator_view(hands, elbows, R, np.zeros(3), 0.8, {s: np.eye(3) for s in SIDES})
    wrists["left"][:3, 3] += [0.02, -0.01, 0.015]  # the operator's left wrist is a little off
    cal = calibrate(wrists, op_elbows, hands, elbows)
    assert 0.005 < cal.fit_residual < 0.05
    for side in SIDES:
        assert pose_error(cal.map_wrist(side, wrists[side]), hands[side]).position < 1e-9
        np.testing.assert_allclose(cal.map_elbow(side, op_elbows[side]), elbows[side], atol=1e-9)


def test_wrong_posture_and_degenerate_points_are_refused(home):
    hands, elbows = home
    wrists, op_elbows = operator_view(hands, elbows, np.eye(3), np.zeros(3), 1.0, {s: np.eye(3) for s in SIDES})
    twisted = dict(wrists)
    twisted["left"] = make_transform(wrists["right"][:3, 3], wrists["left"][:3, :3])  # both wrists on one side
    twisted["right"] = make_transform(wrists["left"][:3, 3] + [0.0, 0.0, 0.4], wrists["right"][:3, :3])
    with pytest.raises(ConfigurationError, match="calibration posture"):
        calibrate(twisted, op_elbows, hands, elbows)
    line = {s: make_transform([0.1 * k, 0.0, 0.0]) for k, s in enumerate(SIDES)}
    line_elbows = {s: np.array([0.2 + 0.1 * k, 0.0, 0.0]) for k, s in enumerate(SIDES)}
    with pytest.raises(ConfigurationError, match="degenerate"):
        calibrate(line, line_elbows, hands, elbows)
    nan = dict(wrists)
    nan["right"] = wrists["right"].copy()
    nan["right"][1, 1] = np.nan
    with pytest.raises(ConfigurationError, match="right operator wrist"):
        calibrate(nan, op_elbows, hands, elbows)
    with pytest.raises(ConfigurationError, match="left operator upper-arm"):
        calibrate(wrists, {"right": op_elbows["right"]}, hands, elbows)


def test_yaml_round_trip(home, tmp_path):
    hands, elbows = home
    R = Rotation.from_euler("xyz", [10, 20, 30], degrees=True).as_matrix()
    wrists, op_elbows = operator_view(hands, elbows, R, np.array([0.1, 0.2, 0.3]), 1.1,
                                      {s: Rotation.from_euler("y", 30, degrees=True).as_matrix() for s in SIDES})
    wrists["right"][:3, 3] += 0.01
    cal = calibrate(wrists, op_elbows, hands, elbows)
    path = cal.save(tmp_path / "sub" / "calibration.yaml")
    loaded = Calibration.load(path)
    assert not loaded.is_default
    assert loaded.to_dict() == cal.to_dict()
    probe = make_transform([0.05, -0.2, 0.1], Rotation.from_euler("x", 40, degrees=True).as_matrix())
    for side in SIDES:
        np.testing.assert_array_equal(loaded.map_wrist(side, probe), cal.map_wrist(side, probe))
        np.testing.assert_array_equal(loaded.map_elbow(side, probe[:3, 3]), cal.map_elbow(side, probe[:3, 3]))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.update(format_version=99), "format_version"),
        (lambda d: d["alignment"].update(rotation=[[2, 0, 0], [0, 1, 0], [0, 0, 1]]), "alignment.rotation"),
        (lambda d: d["alignment"].update(scale=50.0), "alignment.scale"),
        (lambda d: d["wrist_offsets"]["left"].update(position=[0, 0]), "wrist_offsets.left.position"),
        (lambda d: d.pop("elbow_offsets"), "elbow_offsets"),
    ],
)
def test_invalid_calibration_files_name_the_problem(tmp_path, edit, match):
    data = Calibration(is_default=False).to_dict()
    edit(data)
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigurationError, match=match):
        Calibration.load(path)


def test_missing_or_unwritable_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigurationError, match="calibration file not found: .*nope.yaml"):
        Calibration.load(tmp_path / "nope.yaml")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError, match="cannot write"):
        Calibration().save(blocker / "cal.yaml")


def test_synthetic_operator_calibrates_onto_the_robot_home(robot, home):
    """The synthetic operator's home posture, through TrackerSet and the controller."""
    serials = {r: f"LHR-{i:08X}" for i, r in enumerate(ROLES)}
    source = SyntheticOperator(serials, seed=3)
    trackers = TrackerSet(serials, timeout=0.1)
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[np.r_[0:14]])
    source.start(0.0)
    for sample in source.read(1.0):
        trackers.update(sample)
    with pytest.raises(ConfigurationError, match="no fresh left wrist"):
        ctl.calibrate(1.0)
    for side in SIDES:
        rel = trackers.relative(side, 1.0)
        ctl.set_operator(side, rel.wrist, rel.elbow[:3, 3], rel.stamp)
    cal = ctl.calibrate(1.0)
    assert not ctl.clutch.engaged
    assert cal.fit_residual < 0.03  # the operator's posture resembles the robot's home
    assert 1.0 < cal.scale < 1.6  # robot arms (0.29 + 0.44 m) are longer than the operator's (0.30 + 0.27 m)
    hands, _ = home
    for side in SIDES:
        rel = trackers.relative(side, 1.0)
        err = pose_error(cal.map_wrist(side, rel.wrist), hands[side])
        assert err.position < 1e-9 and err.orientation < 1e-7
    with pytest.raises(ConfigurationError, match="no fresh"):
        ctl.calibrate(5.0)  # samples are 4 s old


def test_similarity_fit_is_exact_for_exact_data():
    rng = np.random.default_rng(0)
    pts = rng.normal(size=(6, 3))
    R = Rotation.random(random_state=1).as_matrix()
    sim = fit_similarity(pts, 2.5 * pts @ R.T + [1, 2, 3])
    np.testing.assert_allclose(sim.rotation, R, atol=1e-12)
    assert sim.scale == pytest.approx(2.5)
    np.testing.assert_allclose(sim.translation, [1, 2, 3], atol=1e-12)
    reflected = pts * [1, 1, -1]  # a mirror image is not a rotation: best proper rotation, det +1
    assert np.linalg.det(fit_similarity(pts, reflected).rotation) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ stillness
KEYS = [f"{side}_{part}" for side in SIDES for part in ("wrist", "elbow")]


def stillness_over(op: SyntheticOperator, t0: float, t1: float, **kwargs) -> list[tuple[float, bool]]:
    """(frame stamp, still) for every frame of ``op`` in [t0, t1] [s], the detector fed the chest-relative
    wrist and elbow poses the arm_ik node computes."""
    det = StillnessDetector(KEYS, **{"window": 0.5, "position_tolerance": 0.01, "rotation_tolerance": 0.05,
                                     "max_gap": 0.1, **kwargs})
    serials = op.serials
    ts, arms = TrackerSet(serials, 0.1), ChestRelativeArms(0.1)
    op.start(0.0)
    out = []
    for frame in group_frames(op.read(t1)):
        for side, rel in arms.update(frame.stamp, ts.update_frame(frame)):
            det.add(f"{side}_wrist", rel.stamp, rel.wrist)
            det.add(f"{side}_elbow", rel.stamp, rel.elbow)
        if frame.stamp >= t0:
            out.append((frame.stamp, det.still(frame.stamp)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_still_operator_is_still_once_the_window_is_covered(seed):
    serials = {r: f"S{i}" for i, r in enumerate(ROLES)}
    got = stillness_over(SyntheticOperator(serials, hold_s=4.0, seed=seed), 0.0, 3.9)  # tracker noise included
    first = next(t for t, still in got if still)
    assert 0.5 - 1e-9 <= first <= 0.5 + 1 / 120 + 1e-9  # not before a whole window of poses
    assert all(still for t, still in got if t >= first)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_moving_operator_is_never_still(seed):
    serials = {r: f"S{i}" for i, r in enumerate(ROLES)}
    # the pick-and-place between its passes through home (at 0 and 8 s)
    got = stillness_over(SyntheticOperator(serials, hold_s=0.0, seed=seed), 1.0, 7.5)
    assert len(got) > 700 and not any(still for _, still in got)


def test_stillness_needs_every_key_fresh_and_within_the_tolerances():
    det = StillnessDetector(["a", "b"], window=0.5, position_tolerance=0.01, rotation_tolerance=0.05, max_gap=0.1)
    for k in range(61):
        t = k / 120
        det.add("a", t, make_transform((0.0, 0.0, 0.0)))
        det.add("b", t, make_transform((0.004 * (-1) ** k, 0.0, 0.0)))  # +-4 mm: within 1 cm of the mean
    assert det.still(0.5)
    assert not det.still(0.5 + 0.11)  # the newest poses are too old
    det.add("a", 0.51, make_transform((0.02, 0.0, 0.0)))  # 2 cm away
    assert not det.still(0.51)
    det.clear()
    assert not det.still(0.51)
    R = Rotation.from_rotvec([0.0, 0.0, 0.08]).as_matrix()  # 4.6 deg
    for k in range(61):
        det.add("a", k / 120, make_transform(rotation=R if k == 30 else np.eye(3)))
        det.add("b", k / 120, make_transform())
    assert not det.still(0.5)
    with pytest.raises(ConfigurationError, match="window"):
        StillnessDetector(["a"], window=0.0, position_tolerance=0.01, rotation_tolerance=0.05, max_gap=0.1)
    with pytest.raises(ConfigurationError, match="no pose"):
        StillnessDetector([], window=0.5, position_tolerance=0.01, rotation_tolerance=0.05, max_gap=0.1)


@pytest.mark.parametrize("text, match", [
    ("version: 1\nwrist_offsets: [1, 2\n", r"calibration file .*cal\.yaml, line 3, column 1: invalid YAML"),
    ("- 1\n- 2\n", r"calibration file .*cal\.yaml: expected a mapping at the top level, got list"),
    ("", r"expected a mapping at the top level, got NoneType"),
])
def test_an_unreadable_calibration_file_names_the_file_and_the_place(tmp_path, text, match):
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=match):
        Calibration.load(path)
