"""Run an operator plan on the twin directly: IK to the wrist targets, closure to finger targets (ROS-free).

This is the pure-physics check of :mod:`.operator_plan`: every control period the plan is sampled, each arm's
joint targets come from the project's IK (:class:`~rynn_teleop.core.arm_ik.ArmIK`, warm-started from its last
solution) and each hand's from :func:`~.operator_plan.hand_posture`; the world then steps to that time. After
the plan and a settling time the scene's task (:mod:`.tasks`) says whether it worked. The stack's own path
(trackers, calibration, Ruckig, glove retargeting, the drivers' safety layer) is not in this loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..core.arm_ik import ArmIK
from ..core.layout import SIDES
from ..core.robot_model import GROUPS, RobotModel
from ..core.yamlfile import read_yaml
from ..errors import ConfigurationError
from ..paths import config_file
from .operator_plan import OperatorPlan, PlanTiming, hand_posture, plan_task
from .physics import PhysicsWorld
from .scene import Scene, load_scene
from .tasks import Outcome, task_for

CONTROL_PERIOD = 0.01  # [s] IK and target updates (100 Hz)
SETTLE_TIME = 0.5  # [s] stepped after the plan before the task is judged


class RolloutResult(NamedTuple):
    """What one scripted episode in the twin gave."""

    outcome: Outcome
    plan: OperatorPlan
    sim_time: float  # [s] simulated
    max_penetration: float  # [m] deepest contact overlap seen at any control period
    max_limit_excess: float  # [rad] furthest any joint was outside its range at any control period (0: never)
    ik_misses: int  # control periods where an arm's IK did not converge


def home_posture(robot: RobotModel | None = None) -> np.ndarray:
    """(54,) [rad] the arms at the arm_ik node's ``home_position`` (``config/arm_ik.yaml``), the hands at
    :func:`~.operator_plan.hand_posture` (0)."""
    robot = robot or RobotModel.default()
    doc = read_yaml(config_file("arm_ik.yaml"), "parameter file", mapping=True)
    try:
        home = np.asarray(doc["arm_ik"]["ros__parameters"]["home_position"], dtype=float)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"config/arm_ik.yaml: no usable arm_ik.ros__parameters.home_position "
                                 f"({exc})") from None
    q = robot.neutral()
    q[:14] = home
    for side in SIDES:
        q[GROUPS.hand(side)] = hand_posture(0.0, side)
    return robot.limits.clip_position(q)


class ScriptedDriver:
    """Turns plan samples into the 54 joint targets (IK per arm, closure per hand)."""

    def __init__(self, robot: RobotModel, initial: np.ndarray) -> None:
        self.robot = robot
        self.ik = {side: ArmIK(robot, side, base_frame="base_link") for side in SIDES}
        self.q = np.asarray(initial, dtype=float).copy()
        self.misses = 0

    def wrists(self) -> dict[str, np.ndarray]:
        """side -> (4, 4) wrist poses of the current targets in base_link."""
        return {side: self.ik[side].forward(self.q[GROUPS.arm(side)]) for side in SIDES}

    def targets(self, wrists: dict[str, np.ndarray], closure: dict[str, float]) -> np.ndarray:
        """(54,) joint targets [rad] for wrist poses and closures."""
        for side in SIDES:
            arm = GROUPS.arm(side)
            result = self.ik[side].solve(wrists[side], self.q[arm])
            self.misses += not result.converged
            self.q[arm] = result.q
            self.q[GROUPS.hand(side)] = hand_posture(closure[side], side)
        return self.q.copy()


def run_plan(world: PhysicsWorld, plan: OperatorPlan, driver: ScriptedDriver, *,
             control_period: float = CONTROL_PERIOD, settle: float = SETTLE_TIME,
             on_period: Callable[[PhysicsWorld, float], None] | None = None) -> RolloutResult:
    """Drive ``world`` through ``plan`` (see the module doc), then judge the scene's task.

    Args:
        on_period: called after each control period with the world and the plan time [s] (recording, checks).
    """
    if world.scene is None:
        raise ConfigurationError("the rollout needs a world with a scene")
    task = task_for(world.scene)
    t0 = world.time
    lower, upper = world.index.lower, world.index.upper
    pen = excess = 0.0
    n = int(np.ceil((plan.duration + settle) / control_period))
    for k in range(1, n + 1):
        t = k * control_period
        sample = plan.sample(t)
        world.set_targets(driver.targets(sample.wrists, sample.closure))
        world.advance_to(t0 + t)
        with world.lock:
            q = world.joint_state().position
            pen = max(pen, world.max_penetration())
        excess = max(excess, float(np.max(np.maximum(lower - q, q - upper))))
        if on_period is not None:
            on_period(world, t)
    return RolloutResult(task.evaluate(world), plan, world.time - t0, pen, max(excess, 0.0), driver.misses)


def run_scripted_episode(scene: Scene | str, seed: int, *, timing: PlanTiming | None = None,
                         world: PhysicsWorld | None = None,
                         on_period: Callable[[PhysicsWorld, float], None] | None = None) -> RolloutResult:
    """A fresh twin of ``scene`` at ``seed`` (or ``world``, reset to ``seed``), the arms at home, the task's plan
    from the objects' poses, run to the end and judged."""
    scene = load_scene(scene) if isinstance(scene, str) else scene
    robot = RobotModel.default()
    q0 = home_posture(robot)
    if world is None:
        world = PhysicsWorld(scene, seed, initial=q0)
    else:
        world.reset(seed, q0)
    driver = ScriptedDriver(robot, q0)
    states = world.object_states()
    plan = plan_task(scene, {k: s.position for k, s in states.items()},
                     {k: s.quaternion for k, s in states.items()}, world.layout.targets, driver.wrists(), timing)
    return run_plan(world, plan, driver, on_period=on_period)
