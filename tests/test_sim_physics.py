"""The twin's physics: grasps move objects, the same inputs give the same trajectory, joints stay in range."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, GROUPS, RobotModel
from rynn_teleop.errors import ConfigurationError, JointNotFoundError
from rynn_teleop.sim.operator_plan import OperatorPlan, hand_posture, plan_task
from rynn_teleop.sim.physics import PhysicsWorld
from rynn_teleop.sim.rollout import ScriptedDriver, home_posture, run_plan

PENETRATION_BOUND = 0.005  # [m] deepest contact overlap allowed (measured: under 1 mm)
LIMIT_TOLERANCE = 0.01  # [rad] MuJoCo's joint limits are stiff soft constraints (measured: under 5 mrad)


def _until(plan: OperatorPlan, phase: str) -> OperatorPlan:
    """The plan cut at the end of ``phase``."""
    end = plan.phase_time(phase)
    return OperatorPlan(plan.task, [w for w in plan.waypoints if w.time <= end], plan.hands)


def _pick_plan(world: PhysicsWorld, driver: ScriptedDriver) -> OperatorPlan:
    states = world.object_states()
    return plan_task(world.scene, {k: s.position for k, s in states.items()},
                     {k: s.quaternion for k, s in states.items()}, world.layout.targets, driver.wrists())


@pytest.fixture(scope="module")
def world() -> PhysicsWorld:
    return PhysicsWorld("pick_place", 0, initial=home_posture())


def test_a_grasp_lifts_the_cube_holds_it_two_seconds_and_opening_drops_it(world) -> None:
    world.reset(3, home_posture())
    rest = world.object_state("red_cube").position.copy()
    driver = ScriptedDriver(RobotModel.default(), home_posture())
    plan = _pick_plan(world, driver)
    run_plan(world, _until(plan, "lift"), driver, settle=0.0)  # approach, grasp, lift
    lifted = world.object_state("red_cube").position
    assert lifted[2] - rest[2] > 0.1
    assert world.object_contacts("red_cube") == (("right",), False, ())
    start = world.time
    heights = []
    while world.time < start + 2.0 - 1e-9:  # hold still for 2 s of simulated time
        world.advance_to(world.time + 0.1)
        heights.append(world.object_state("red_cube").position[2])
        assert world.object_contacts("red_cube").hands == ("right",)
    assert np.ptp(heights) < 0.005 and min(heights) - rest[2] > 0.1
    # open the fingers where it is: it falls to the table
    world.set_targets(hand_posture(0.0, "right"), CANONICAL_JOINT_NAMES[GROUPS.right_hand])
    world.advance_to(world.time + 1.5)
    dropped = world.object_state("red_cube")
    assert dropped.position[2] == pytest.approx(rest[2], abs=0.005)  # resting on a face again
    assert world.object_contacts("red_cube").hands == () and world.object_contacts("red_cube").table
    assert np.linalg.norm(dropped.linear_velocity) < 0.01


def _grasp_trajectory(seed: int) -> list[np.ndarray]:
    world = PhysicsWorld("pick_place", seed, initial=home_posture())
    driver = ScriptedDriver(RobotModel.default(), home_posture())
    states = []
    run_plan(world, _until(_pick_plan(world, driver), "lift"), driver, settle=0.0,
             on_period=lambda w, t: states.append(w.state()) if round(t * 100) % 25 == 0 else None)
    return states


def test_the_same_seed_and_inputs_give_the_same_trajectory() -> None:
    a, b = _grasp_trajectory(5), _grasp_trajectory(5)
    assert len(a) == len(b) > 10
    for x, y in zip(a, b):
        assert np.array_equal(x, y)  # bit for bit, contacts included
    c = _grasp_trajectory(6)
    assert not np.array_equal(a[0], c[0])  # another seed, another layout


def test_joints_stay_in_range_when_driven_to_their_limits() -> None:
    """Every joint sent to random limits at its velocity limit (as the drivers' safety layer sends commands),
    arms stretched out sideways (hands in the air, fingers free to hit each other): positions stay within
    LIMIT_TOLERANCE of the ranges. (The scripted episodes check the same with objects and the table:
    test_sim_tasks.py.)"""
    robot = RobotModel.default()
    world = PhysicsWorld(None, initial=robot.neutral())
    lower, upper = world.index.lower, world.index.upper
    vmax = robot.limits.velocity
    rng = np.random.default_rng(0)
    command = robot.neutral()
    far = robot.neutral()
    worst = 0.0
    for _ in range(8):
        goal = np.where(rng.random(54) < 0.5, lower, upper)
        goal[:14] = far[:14] + rng.uniform(-0.3, 0.3, 14)  # arms: around the stretched-out posture
        for _ in range(40):  # 10 ms periods
            command += np.clip(goal - command, -vmax * 0.01, vmax * 0.01)
            world.set_targets(command)
            world.step(5)
            q = world.joint_state().position
            worst = max(worst, float(np.max(np.maximum(lower - q, q - upper))))
            assert world.max_penetration() < PENETRATION_BOUND
    assert worst < LIMIT_TOLERANCE


def test_targets_are_set_by_name_and_clipped_into_range(world) -> None:
    world.reset(0, home_posture())
    names = ["right_finger2_joint1", "left_arm_joint4"]
    applied = world.set_targets([10.0, -10.0], names)
    np.testing.assert_allclose(applied, [world.index.upper[world.indices(names)[0]],
                                         world.index.lower[world.indices(names)[1]]])
    np.testing.assert_allclose(world.targets(names), applied)
    with pytest.raises(JointNotFoundError, match="left_arm_joint9"):
        world.set_targets([0.0], ["left_arm_joint9"])
    with pytest.raises(ConfigurationError):
        world.set_targets([0.0, np.nan], names)
    with pytest.raises(ConfigurationError, match="no movable object"):
        world.object_state("table")


def test_time_advances_in_fixed_steps(world) -> None:
    world.reset(0, home_posture())
    assert world.time == 0.0 and world.timestep == pytest.approx(0.002)
    assert world.advance_to(0.1) == 50 and world.time == pytest.approx(0.1)
    assert world.advance_to(0.05) == 0 and world.time == pytest.approx(0.1)  # the past steps nothing
    assert world.advance_to(0.1009) == 0 and world.advance_to(0.1011) == 1  # to the nearest step
    sample = world.joint_state(["left_arm_joint1", "right_finger1_joint1"])
    assert sample.position.shape == sample.velocity.shape == sample.effort.shape == (2,)
    assert sample.time == pytest.approx(world.time)


def test_two_driver_threads_share_one_world(world) -> None:
    """An arm loop and a hand loop each set their joints and step to their own clock."""
    world.reset(0, home_posture())
    arm, hand = CANONICAL_JOINT_NAMES[:14], CANONICAL_JOINT_NAMES[14:]
    q0 = home_posture()
    errors: list[BaseException] = []

    def loop(names, period: float, n: int) -> None:
        try:
            for k in range(1, n + 1):
                with world.lock:  # read, decide, write: one state
                    world.set_targets(world.joint_state(names).position * 0 + q0[world.indices(names)], names)
                world.advance_to(k * period)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(arm, 0.005, 100)), threading.Thread(target=loop,
               args=(hand, 0.01, 40))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert world.time == pytest.approx(0.5)  # the latest time asked for


def test_a_reset_to_another_seed_moves_objects_platforms_and_targets() -> None:
    world = PhysicsWorld("bimanual_lift", 0, initial=home_posture())
    world.reset(9)
    layout = world.scene.layout(9)
    assert world.layout.seed == 9 and world.time == 0.0
    np.testing.assert_allclose(world.object_state("blue_bar").position, layout.objects["blue_bar"].position)
    np.testing.assert_allclose(world.data.body("platform").xpos, layout.objects["platform"].position)
    np.testing.assert_allclose(world.data.site("shelf").xpos[:2], layout.targets["shelf"].center[:2])
    np.testing.assert_allclose(world.joint_state().position, home_posture())
    state = world.state()
    world.step(100)
    world.set_state(state)
    assert world.time == 0.0 and np.array_equal(world.state(), state)
