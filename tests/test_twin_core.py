"""The twin in the stack, ROS-free: the process's shared world, the live outcome, the drivers' sim backend on it,
replay's command extraction and the demo's strict summary."""

from __future__ import annotations

import json
import math

import mujoco
import numpy as np
import pytest
from twin_episodes import scripted_episode

from rynn_teleop.core.layout import SIDES
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, RobotModel, arm_joint_names, hand_joint_names
from rynn_teleop.demo import strict_json, write_json
from rynn_teleop.hardware.base import ARM_BACKENDS, HAND_BACKENDS, DriverContext
from rynn_teleop.hardware.twin import TwinArms, TwinHands
from rynn_teleop.recording.replay import (
    JointNamesMismatchError,
    ReplayOptions,
    approach,
    check_joint_names,
    load_commands,
)
from rynn_teleop.sim import shared
from rynn_teleop.sim.monitor import FELL_BELOW_M, TaskMonitor, object_poses, scene_description
from rynn_teleop.sim.physics import PhysicsWorld
from rynn_teleop.sim.rollout import home_posture
from rynn_teleop.sim.tasks import bottom_height

ARM = tuple(n for s in SIDES for n in arm_joint_names(s))
HANDS = tuple(n for s in SIDES for n in hand_joint_names(s))


@pytest.fixture(scope="module")
def world() -> PhysicsWorld:
    return PhysicsWorld("pick_place", 3, initial=home_posture())


def _place(world: PhysicsWorld, name: str, xyz) -> None:
    """Put object ``name`` at ``xyz`` [m], upright, at rest."""
    with world.lock:
        body = world.index.objects[name]
        adr = world.model.jnt_qposadr[world.model.body_jntadr[body]]
        dof = world.model.jnt_dofadr[world.model.body_jntadr[body]]
        world.data.qpos[adr:adr + 7] = (*xyz, 1.0, 0.0, 0.0, 0.0)
        world.data.qvel[dof:dof + 6] = 0.0
        mujoco.mj_forward(world.model, world.data)


# ---------------------------------------------------------------------- the live outcome
def test_the_outcome_is_undecided_until_the_cube_rests_in_the_goal_and_failed_once_it_fell(world):
    world.reset(3)
    monitor = TaskMonitor(world)
    first = monitor.update()
    assert first.success is None and "outside goal" in first.reason and first.task == "place red_cube in goal"
    assert first.to_dict() == {"success": None, "reason": first.reason, "task": first.task, "t": 0.0}
    goal = world.layout.targets["goal"].center
    cube = world.scene.object("red_cube")
    _place(world, "red_cube", (goal[0], goal[1], goal[2] + cube.size[2] / 2 + 0.002))
    world.step(250)  # 0.5 s: lands and settles
    done = monitor.update()
    assert done.success is True and done.label == "success" and "rests in goal" in done.reason
    _place(world, "red_cube", (0.65, 0.0, world.scene.table.height - FELL_BELOW_M - 0.1))  # under the table top
    assert bottom_height(cube, world.object_state("red_cube").position, np.array([0, 0, 0, 1.0])) < \
        world.scene.table.height - FELL_BELOW_M
    fell = monitor.update()
    assert fell.success is False and "fell off the table" in fell.reason
    _place(world, "red_cube", (goal[0], goal[1], goal[2] + cube.size[2] / 2 + 0.002))
    assert monitor.update().success is False  # a failure stays decided until the world is reset
    world.reset(3)
    monitor.reset()
    assert monitor.update().success is None


def test_scene_description_and_poses_follow_the_scene_files_order(world):
    world.reset(3)
    doc = json.loads(json.dumps(scene_description(world)))  # plain JSON
    assert (doc["scene"], doc["seed"], doc["task"], doc["frame_id"]) == ("pick_place", 3, "place red_cube in goal",
                                                                        "base_link")
    assert [o["name"] for o in doc["objects"]] == [o.name for o in world.scene.objects]
    assert doc["objects"][0] == {"name": "red_cube", "shape": "box", "size": [0.07, 0.07, 0.07],
                                 "color": list(world.scene.objects[0].colour), "mass": 0.1, "fixed": False}
    (goal,) = doc["targets"]
    assert goal["name"] == "goal" and goal["support"] == "table" and goal["size"] == [0.14, 0.14]
    np.testing.assert_allclose(goal["center"], world.layout.targets["goal"].center)
    poses = object_poses(world)
    assert len(poses) == len(world.scene.objects)
    for obj, pose in zip(world.scene.objects, poses):
        np.testing.assert_allclose(pose.position, world.layout.objects[obj.name].position, atol=1e-9)


# ---------------------------------------------------------------------- the shared world
def test_one_world_per_name_the_twin_refuses_a_second_and_it_goes_with_its_last_user(world):
    name = "test-registry"
    made = shared.create_world(name, lambda: world, owner="twin A")
    try:
        with pytest.raises(shared.TwinWorldExistsError, match="created by twin A"):
            shared.create_world(name, lambda: world, owner="twin B")
        assert shared.attach(name, "arm backend") is made and made.users == {"twin A", "arm backend"}
        shared.detach(name, "twin A")
        assert shared.find_world(name) is made  # the backend still uses it
    finally:
        shared.detach(name, "arm backend")
        shared.detach(name, "twin A")
    assert shared.find_world(name) is None
    with pytest.raises(shared.TwinWorldError, match="start the twin node in the same process"):
        shared.attach(name, "hand backend")


def test_the_shared_clock_steps_to_now_and_slips_after_a_stall(world):
    world.reset(3)
    sw = shared.SharedWorld("clock", world, "test")
    assert sw.advance(100.0) == 0 and sw.epoch == pytest.approx(100.0)  # the first call sets the epoch
    assert sw.advance(100.05) == 25 and world.time == pytest.approx(0.05)
    assert sw.advance(100.04) == 0  # a time already passed steps nothing
    assert sw.advance(110.0) == round(shared.MAX_CATCH_UP_S / world.timestep)  # a 10 s stall: 0.1 s stepped
    assert sw.slipped_s == pytest.approx(9.95 - shared.MAX_CATCH_UP_S, abs=1e-6)
    assert sw.clock_time(world.time) == pytest.approx(110.0, abs=world.timestep)
    sw.reset(200.0, seed=4)
    assert sw.generation == 1 and world.time == 0.0 and world.seed == 4 and sw.epoch == 200.0
    np.testing.assert_allclose(world.joint_state().position, sw.home, atol=1e-12)


# ---------------------------------------------------------------------- the drivers' sim backend
def _context(names, sides=SIDES) -> DriverContext:
    robot = RobotModel.default()
    return DriverContext(names, robot.limits[robot.indices(names)], sides, 200.0)


def test_the_sim_backends_are_the_physics_and_the_kinematic_one_keeps_its_name():
    assert ARM_BACKENDS.backend("sim") is TwinArms and HAND_BACKENDS.backend("sim") is TwinHands
    assert ARM_BACKENDS.backend("kinematic").__module__ == "rynn_teleop.hardware.sim"
    assert [p.name for p in TwinArms.SETTINGS] == ["world"]


def test_backends_without_a_twin_share_one_world_follow_hold_and_see_a_reset():
    arms = ARM_BACKENDS.create("sim", {"sim.world": "test-backend"}, _context(ARM))
    hands = HAND_BACKENDS.create("sim", {"sim.world": "test-backend"}, _context(HANDS))
    try:
        arms.connect()
        hands.connect()
        sw = shared.find_world("test-backend")
        assert arms.shared is sw and hands.shared is sw and sw.world.scene is None  # the robot alone
        home = home_posture()
        np.testing.assert_allclose(arms.read(10.0).position, home[:14], atol=1e-9)
        arms.write(home[:14] + 0.1)  # not enabled: ignored
        assert arms.writes == 0
        arms.enable()
        hands.enable()
        goal = home[:14] + 0.1
        for k in range(1, 301):  # 1.5 s at 200 Hz
            arms.write(goal)
            reading = arms.read(10.0 + k * 0.005)
        assert np.abs(reading.position - goal).max() < 0.01 and reading.effort is not None
        limits = RobotModel.default().limits[RobotModel.default().indices(ARM)]
        assert np.all(reading.position >= limits.lower - 1e-3) and np.all(reading.position <= limits.upper + 1e-3)
        assert hands.read(11.5).position.shape == (40,)  # the same world: stepped by either
        arms.stop()  # the e-stop: holds where it is, writes ignored
        held = arms.read(11.5).position
        arms.write(home[:14] - 0.2)
        assert np.abs(arms.read(12.5).position - held).max() < 2e-3
        assert not arms.discontinuity()
        sw.reset(13.0)
        assert np.abs(arms.read(13.0).position - home[:14]).max() < 1e-9
        assert arms.discontinuity() and not arms.discontinuity()  # once
        assert hands.read(13.0) is not None and hands.discontinuity()
    finally:
        arms.close()
        hands.close()
    assert shared.find_world("test-backend") is None


# ---------------------------------------------------------------------- replay's commands
def test_replay_reads_the_commands_and_refuses_another_robots_joints(tmp_path):
    path, label = scripted_episode(tmp_path / "a")
    track = load_commands(path)
    assert label == "success" and track.twin == {"scene": "pick_place", "seed": 0}
    assert set(track.joint_names) == set(CANONICAL_JOINT_NAMES)
    assert {c.topic for c in track.commands} == {"/arms/command", "/hands/command"}
    assert all(b.time >= a.time for a, b in zip(track.commands, track.commands[1:]))
    check_joint_names(track, CANONICAL_JOINT_NAMES)
    other = [n.replace("left_", "l_") for n in CANONICAL_JOINT_NAMES[:14]]
    path, _ = scripted_episode(tmp_path / "b", names=other)
    with pytest.raises(JointNamesMismatchError, match="joints this robot does not have") as err:
        check_joint_names(load_commands(path), CANONICAL_JOINT_NAMES)
    assert set(err.value.unknown) == {n for n in other if n.startswith("l_")}
    assert err.value.exit_code == 1


def test_the_approach_is_slow_and_ends_at_the_first_command():
    options = ReplayOptions(approach_speed=0.25, min_approach_s=2.0)
    plan = approach({"a": 0.0, "b": 1.0, "x": 5.0}, {"a": 1.0, "b": 1.0}, options)
    assert plan.names == ("a", "b") and plan.duration == pytest.approx(15 / 8 * 1.0 / 0.25)
    t = np.linspace(0.0, plan.duration, 400)
    q = np.array([plan.sample(x) for x in t])
    np.testing.assert_allclose(q[0], [0.0, 1.0]) and np.testing.assert_allclose(q[-1], [1.0, 1.0])
    assert np.max(np.abs(np.diff(q[:, 0])) / np.diff(t)) <= 0.25 + 1e-3
    assert approach({"a": 0.0}, {"a": 0.01}, options).duration == 2.0  # at least min_approach_s


# ---------------------------------------------------------------------- the demo's summary
def test_summary_json_holds_null_never_nan(tmp_path):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    summary = {"meters": [{"rate_hz": 30.0, "latency_p50_ms": math.nan, "latency_p99_ms": math.inf}],
               "outcome": {"outcome": "success", "reason": "r"}, "nested": (1.5, -math.inf)}
    write_json(tmp_path / "summary.json", summary)
    doc = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert doc["meters"][0] == {"rate_hz": 30.0, "latency_p50_ms": None, "latency_p99_ms": None}
    assert doc["nested"] == [1.5, None] and strict_json(float("nan")) is None
