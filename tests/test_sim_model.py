"""The twin's MuJoCo model: generated from the robot description, its drives, contacts and the exported MJCF."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from rynn_teleop.core.layout import SIDES
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, GROUPS, RobotModel
from rynn_teleop.core.urdf_builder import build_urdf
from rynn_teleop.sim.model import (
    ARM_DRIVE,
    FINGER_DRIVE,
    HEAD_CAMERA,
    build_model,
    excluded_pairs,
    export_mjcf,
    index_model,
)
from rynn_teleop.sim.operator_plan import hand_posture
from rynn_teleop.sim.rollout import home_posture
from rynn_teleop.sim.scene import load_scene


@pytest.fixture(scope="module")
def twin() -> mujoco.MjModel:
    return build_model(load_scene("pick_place"))


def test_joints_and_limits_are_the_descriptions(twin) -> None:
    robot = RobotModel.default()
    hinges = [twin.joint(j).name for j in range(twin.njnt) if twin.jnt_type[j] == mujoco.mjtJoint.mjJNT_HINGE]
    assert sorted(hinges) == sorted(CANONICAL_JOINT_NAMES)
    idx = index_model(twin)
    np.testing.assert_allclose(idx.lower, robot.limits.lower, atol=1e-12)
    np.testing.assert_allclose(idx.upper, robot.limits.upper, atol=1e-12)
    efforts = robot.model.effortLimit[[robot.model.joints[robot.model.getJointId(n)].idx_v
                                       for n in CANONICAL_JOINT_NAMES]]
    np.testing.assert_allclose(twin.actuator_forcerange[idx.actuator, 1], efforts)
    np.testing.assert_allclose(twin.jnt_actfrcrange[[twin.joint(n).id for n in CANONICAL_JOINT_NAMES], 1], efforts)
    np.testing.assert_allclose(twin.actuator_ctrlrange[idx.actuator], np.stack([idx.lower, idx.upper], 1))
    # one position servo per joint: kp = effort / full_effort_error of its group
    error = np.where(["_finger" in n for n in CANONICAL_JOINT_NAMES], FINGER_DRIVE.full_effort_error,
                     ARM_DRIVE.full_effort_error)
    np.testing.assert_allclose(twin.actuator_gainprm[idx.actuator, 0], efforts / error)
    np.testing.assert_allclose(twin.actuator_biasprm[idx.actuator, 1], -efforts / error)
    assert np.all(twin.actuator_biasprm[idx.actuator, 2] < 0)  # damped (dampratio 1)


def test_every_description_frame_is_a_body_at_the_descriptions_pose(twin) -> None:
    robot = RobotModel.default()
    data = mujoco.MjData(twin)
    q = home_posture(robot)
    data.qpos[index_model(twin).qpos] = q
    mujoco.mj_kinematics(twin, data)
    for frame in ("right_palm_link", "left_finger2_tip_link", "camera_color_optical_frame", "torso_link"):
        T = robot.frame_pose(q, frame)
        np.testing.assert_allclose(data.body(frame).xpos, T[:3, 3], atol=1e-9)
        np.testing.assert_allclose(data.body(frame).xmat.reshape(3, 3), T[:3, :3], atol=1e-9)
    assert twin.camera(HEAD_CAMERA).bodyid == twin.body("camera_color_optical_frame").id


def _robot_contacts(model: mujoco.MjModel, q: np.ndarray) -> list[tuple[str, str]]:
    data = mujoco.MjData(model)
    data.qpos[index_model(model).qpos] = q
    mujoco.mj_forward(model, data)
    robot = set(index_model(model).robot_geoms.tolist())
    return [(model.body(model.geom_bodyid[c.geom[0]]).name, model.body(model.geom_bodyid[c.geom[1]]).name)
            for c in data.contact[:data.ncon] if c.geom[0] in robot and c.geom[1] in robot]


@pytest.mark.parametrize("closure", [0.0, 0.5, 1.0])
def test_the_robot_does_not_touch_itself_in_its_working_postures(closure: float) -> None:
    """At home, hands open to closed: no self-contact but, closed on nothing, the thumb on the index finger
    (a real touch, which the exclusions keep)."""
    model = build_model(None)
    q = home_posture()
    for side in SIDES:
        q[GROUPS.hand(side)] = hand_posture(closure, side)
    contacts = _robot_contacts(model, q)
    if closure < 1.0:
        assert contacts == []
    for a, b in contacts:
        assert {a.split("_link")[0].split("_", 1)[1], b.split("_link")[0].split("_", 1)[1]} == {"finger1", "finger2"}


def test_the_exclusions_keep_hand_object_hand_hand_and_arm_arm_contacts() -> None:
    pairs = excluded_pairs(RobotModel.default().frame_names)
    assert pairs and len(pairs) == len(set(pairs))
    sides = {tuple(sorted(p.split("_")[0] for p in pair)) for pair in pairs}
    assert ("left", "right") not in sides  # nothing of one side is excluded against the other side
    for side in SIDES:  # fingertips can press the palm (a fist); the thumb's tip can press the other fingers
        assert (f"{side}_palm_link", f"{side}_finger2_link4") not in pairs
        assert (f"{side}_finger1_link4", f"{side}_finger2_link4") not in pairs
    model = build_model(load_scene("pick_place"))
    for obj in ("red_cube", "table"):  # objects and the table collide with everything
        geom = model.geom(obj)
        assert geom.contype[0] and geom.conaffinity[0]
    hands = index_model(model).hand_geoms
    assert all(model.geom_contype[hands[s]].all() and model.geom_conaffinity[hands[s]].all() for s in SIDES)


def test_the_exclusions_are_needed_only_where_the_primitives_overlap() -> None:
    """Without the exclusions, the home posture has robot self-contacts (so they are not vacuous)."""
    spec = mujoco.MjSpec.from_string(build_urdf())
    spec.compiler.fusestatic = False
    model = spec.compile()
    q = home_posture()
    data = mujoco.MjData(model)
    for name, value in zip(CANONICAL_JOINT_NAMES, q):
        data.joint(name).qpos = value
    mujoco.mj_forward(model, data)
    assert data.ncon > 0


def test_the_exported_mjcf_opens_without_assets(tmp_path, twin) -> None:
    path = export_mjcf(tmp_path / "sub" / "twin.xml", load_scene("pick_place"))
    text = path.read_text()
    assert "mesh" not in text and "file=" not in text
    loaded = mujoco.MjModel.from_xml_path(str(path))
    assert (loaded.nq, loaded.nv, loaded.nu, loaded.ngeom, loaded.nbody) == (twin.nq, twin.nv, twin.nu, twin.ngeom,
                                                                          twin.nbody)
    # MuJoCo's XML writer keeps 6 significant digits
    np.testing.assert_allclose(loaded.actuator_gainprm, twin.actuator_gainprm, rtol=1e-5)
    np.testing.assert_allclose(loaded.jnt_range, twin.jnt_range, atol=1e-5)
    assert loaded.nexclude == twin.nexclude > 0


def test_the_robot_alone_and_every_scene_compile() -> None:
    alone = build_model(None)
    assert alone.nu == 54 and alone.nq == 54
    for scene, movable in (("pick_place", 3), ("bimanual_lift", 1)):
        model = build_model(load_scene(scene))
        assert model.nq == 54 + 7 * movable and len(index_model(model).objects) == movable


def test_objects_take_the_scenes_mass_friction_and_layout() -> None:
    scene = load_scene("pick_place")
    layout = scene.layout(7)
    model = build_model(scene, layout)
    for obj in scene.objects:
        body = model.body(obj.name)
        assert body.mass[0] == pytest.approx(obj.mass)
        assert model.geom(obj.name).friction[0] == obj.friction
        np.testing.assert_allclose(body.pos, layout.objects[obj.name].position)
