"""Tasks of the twin: the scripted operator's plans, whole episodes in pure physics, and the success predicate."""

from __future__ import annotations

import numpy as np
import pytest
from test_sim_physics import LIMIT_TOLERANCE, PENETRATION_BOUND

from rynn_teleop.core.layout import SIDES
from rynn_teleop.core.robot_model import GROUPS, RobotModel
from rynn_teleop.sim.operator_plan import (
    GRASP_POSTURE,
    OPEN_POSTURE,
    PHASES,
    OperatorPlan,
    grasp_offset,
    grasp_wrist,
    hand_posture,
    plan_task,
)
from rynn_teleop.sim.physics import PhysicsWorld
from rynn_teleop.sim.rollout import ScriptedDriver, home_posture, run_plan, run_scripted_episode
from rynn_teleop.sim.tasks import PlaceTask, bottom_height, task_for


def _plan(world: PhysicsWorld, driver: ScriptedDriver) -> OperatorPlan:
    states = world.object_states()
    return plan_task(world.scene, {k: s.position for k, s in states.items()},
                     {k: s.quaternion for k, s in states.items()}, world.layout.targets, driver.wrists())


@pytest.mark.parametrize("scene, seed", [("pick_place", 11), ("bimanual_lift", 12)])
def test_the_scripted_operator_does_the_task_and_the_twin_says_so(scene: str, seed: int) -> None:
    """One whole episode per task: success, released; joints in range and contacts shallow throughout. Before
    the release the predicate says why it is not yet a success."""
    world = PhysicsWorld(scene, seed, initial=home_posture())
    driver = ScriptedDriver(RobotModel.default(), home_posture())
    plan = _plan(world, driver)
    before_release = []

    def check(w: PhysicsWorld, t: float) -> None:
        if not before_release and t >= plan.phase_time("place"):
            before_release.append(task_for(w.scene).evaluate(w))

    result = run_plan(world, plan, driver, on_period=check)
    assert result.outcome.success, result.outcome.reason
    assert result.outcome.label == "success" and "released" in result.outcome.reason
    assert result.max_limit_excess < LIMIT_TOLERANCE
    assert result.max_penetration < PENETRATION_BOUND
    assert result.ik_misses == 0
    assert not before_release[0].success and "still touches" in before_release[0].reason


def test_the_predicate_names_what_is_missing() -> None:
    world = PhysicsWorld("pick_place", 2, initial=home_posture())
    task = PlaceTask(world.scene)
    outcome = task.evaluate(world)  # at the start: elsewhere
    assert not outcome.success and "outside goal" in outcome.reason and outcome.label == "failure"
    region = world.layout.targets["goal"]
    body = world.index.objects["red_cube"]
    adr = world.model.jnt_qposadr[world.model.body_jntadr[body]]
    dof = world.model.jnt_dofadr[world.model.body_jntadr[body]]
    with world.lock:  # put the cube over the goal, 5 cm up, falling
        world.data.qpos[adr:adr + 3] = region.center + (0.0, 0.0, 0.08)
    world.step(1)
    assert "not resting" in task.evaluate(world).reason
    world.advance_to(world.time + 1.0)  # landed and settled
    outcome = task.evaluate(world)
    assert outcome.success and outcome.reason == "red_cube rests in goal, released"
    with world.lock:  # sliding through the goal
        world.data.qvel[dof:dof + 3] = (0.05, 0.0, 0.0)
        world.step(1)
    assert "still moving" in task.evaluate(world).reason


def test_the_lowest_point_of_each_shape() -> None:
    scene = PhysicsWorld("pick_place", 0).scene
    cube, cylinder, ball = (scene.object(n) for n in ("red_cube", "green_cylinder", "yellow_ball"))
    upright = np.array([0.0, 0.0, 0.0, 1.0])
    assert bottom_height(cube, np.array([0, 0, 1.0]), upright) == pytest.approx(1.0 - 0.035)
    tipped = np.array([0.0, np.sin(np.pi / 8), 0.0, np.cos(np.pi / 8)])  # 45 deg about y: an edge down
    assert bottom_height(cube, np.array([0, 0, 1.0]), tipped) == pytest.approx(1.0 - 0.035 * np.sqrt(2))
    on_side = np.array([np.sin(np.pi / 4), 0.0, 0.0, np.cos(np.pi / 4)])
    assert bottom_height(cylinder, np.array([0, 0, 1.0]), on_side) == pytest.approx(1.0 - 0.035)
    assert bottom_height(cylinder, np.array([0, 0, 1.0]), upright) == pytest.approx(1.0 - 0.06)
    assert bottom_height(ball, np.array([0, 0, 1.0]), on_side) == pytest.approx(1.0 - 0.035)


def test_a_plan_runs_through_its_phases_with_continuous_inputs() -> None:
    world = PhysicsWorld("pick_place", 4, initial=home_posture())
    driver = ScriptedDriver(RobotModel.default(), home_posture())
    states = world.object_states()
    start = driver.wrists()
    plan = _plan(world, driver)
    assert plan.hands == ("right",)  # the cube lies right of the middle
    order = [PHASES.index(w.phase) for w in plan.waypoints]
    assert order == sorted(order) and {w.phase for w in plan.waypoints} == set(PHASES)
    previous = plan.sample(0.0)
    for t in np.arange(0.0, plan.duration + 0.5, 0.01):
        sample = plan.sample(float(t))
        for side in SIDES:
            step = np.linalg.norm(sample.wrists[side][:3, 3] - previous.wrists[side][:3, 3])
            assert step < 0.006  # [m] per 10 ms: at most 0.6 m/s
            assert 0.0 <= sample.closure[side] <= 1.0
            R = sample.wrists[side][:3, :3]
            np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-9)
        previous = sample
    for side in SIDES:  # it ends where it started; the other hand never moves
        np.testing.assert_allclose(plan.sample(plan.duration).wrists[side], start[side], atol=1e-12)
    assert all(np.array_equal(w.wrists["left"], start["left"]) for w in plan.waypoints)
    grasp = next(w for w in plan.waypoints if w.phase == "grasp")
    cube = states["red_cube"].position
    offset = grasp_offset(world.scene.object("red_cube"))
    np.testing.assert_allclose(offset, [0.04, 0.01, 0.09])  # the 7 cm cube's: top 5 mm in, far face at 12.5 cm
    np.testing.assert_allclose(grasp.wrists["right"][:3, :3] @ offset + grasp.wrists["right"][:3, 3], cube,
                               atol=1e-12)


def test_hand_postures_lie_within_both_hands_ranges() -> None:
    robot = RobotModel.default()
    np.testing.assert_allclose(hand_posture(0.0), OPEN_POSTURE, atol=1e-15)
    np.testing.assert_allclose(hand_posture(1.0), GRASP_POSTURE, atol=1e-15)
    np.testing.assert_allclose(hand_posture(2.0), GRASP_POSTURE, atol=1e-15)  # closure is clipped into [0, 1]
    for side in SIDES:
        limits = robot.limits[GROUPS.hand(side)]
        for c in np.linspace(0.0, 1.0, 11):
            assert limits.within(hand_posture(c, side))


def test_grasp_wrists_mirror_for_the_left_hand() -> None:
    point = np.array([0.5, 0.1, 0.7])
    bar = PhysicsWorld("bimanual_lift", 0).scene.object("blue_bar")
    offsets = {side: grasp_offset(bar, side) for side in SIDES}
    np.testing.assert_allclose(offsets["left"], offsets["right"] * (1, -1, 1))
    right, left = (grasp_wrist(point, 0.3, offsets[side]) for side in ("right", "left"))
    np.testing.assert_allclose(right[:3, :3], left[:3, :3])
    for T, side in ((right, "right"), (left, "left")):
        np.testing.assert_allclose(T[:3, :3] @ offsets[side] + T[:3, 3], point, atol=1e-12)
    np.testing.assert_allclose(right[:3, 0], [0.0, 0.0, -1.0], atol=1e-12)  # palm down


def test_run_scripted_episode_reuses_a_world() -> None:
    world = PhysicsWorld("pick_place", 0, initial=home_posture())
    result = run_scripted_episode("pick_place", 13, world=world)
    assert result.outcome.success and world.seed == 13
    assert result.sim_time == pytest.approx(result.plan.duration + 0.5, abs=0.011)
