"""policies.controller: the rules of running a policy on the robot, on an injected clock (no ROS), and the
``constant`` stand-in backend (policies.constant)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, N_JOINTS, JointLimits, RobotModel
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.policies import POLICY_BACKENDS, PolicyContext
from rynn_teleop.policies.controller import ARMS, HANDS, ControllerSettings, PolicyController

DT = 0.005  # [s] the arm rate, 200 Hz
FRAME = 1 / 30  # [s] the policy's frame period


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def arm_motion(robot: RobotModel) -> JointLimits:
    lim = robot.limits[ARMS]
    return JointLimits(lim.lower, lim.upper, lim.velocity * 0.5, lim.acceleration * 0.5, lim.jerk * 0.5)


def home(robot: RobotModel) -> np.ndarray:
    from rynn_teleop.sim.rollout import home_posture

    return home_posture(robot)


class Rig:
    """A controller fed like the node feeds it: joint states and frames stamped at the injected clock ``t``."""

    def __init__(self, robot: RobotModel, **kw) -> None:
        self.robot = robot
        self.ctl = PolicyController(robot.limits, arm_motion(robot), ["physical"], ControllerSettings(**kw))
        self.t = 100.0
        self.q = home(robot)

    def observe(self) -> None:
        self.ctl.measure(CANONICAL_JOINT_NAMES, self.q, self.t)
        self.ctl.frame("physical", self.t)

    def arms(self, seconds: float, *, observe: bool = True) -> list:
        """Step the arm loop for ``seconds`` [s] (the measured arms follow the command); the commands (None: none)."""
        out = []
        for _ in range(round(seconds / DT)):
            self.t += DT
            if observe:
                self.observe()
            cmd = self.ctl.arm_step(self.t)
            out.append(cmd)
            if cmd is not None:
                self.q[ARMS] = cmd.position
        return out

    def start(self) -> None:
        self.observe()
        ok, message = self.ctl.start(self.t)
        assert ok, message


def check_stream(positions: np.ndarray, limits: JointLimits, dt: float = DT) -> None:
    """Positions (T, n) within the position limits; finite differences within velocity, acceleration, jerk."""
    assert np.all(positions >= limits.lower - 1e-9) and np.all(positions <= limits.upper + 1e-9)
    tol = 1.0 + 1e-6
    v = np.diff(positions, axis=0) / dt
    a = np.diff(v, axis=0) / dt
    j = np.diff(a, axis=0) / dt
    assert np.all(np.abs(v) <= limits.velocity * tol + 1e-9), f"velocity {np.abs(v).max(0)}"
    assert np.all(np.abs(a) <= limits.acceleration * tol + 1e-6), f"acceleration {np.abs(a).max(0)}"
    assert np.all(np.abs(j) <= limits.jerk * tol + 1e-3), f"jerk {np.abs(j).max(0)}"


# ---------------------------------------------------------------------------------------------- start
def test_start_needs_a_fresh_observation(robot):
    rig = Rig(robot, stale_timeout=0.2)
    ok, message = rig.ctl.start(rig.t)
    assert not ok and "no physical camera frame" in message and rig.ctl.state == "idle"
    rig.ctl.frame("physical", rig.t)
    ok, message = rig.ctl.start(rig.t)
    assert not ok and "never measured" in message and "54 joints stale" in message
    rig.ctl.measure(CANONICAL_JOINT_NAMES[:14], rig.q[:14], rig.t)  # the arm driver only
    ok, message = rig.ctl.start(rig.t)
    assert not ok and CANONICAL_JOINT_NAMES[14] in message
    rig.observe()
    rig.t += 0.3  # both older than stale_timeout
    ok, message = rig.ctl.start(rig.t)
    assert not ok and "0.30 s old" in message
    rig.observe()
    assert rig.ctl.start(rig.t) == (True, "started (run 1)")
    assert rig.ctl.state == "running" and rig.ctl.start(rig.t) == (True, "already running")
    assert [e.kind for e in rig.ctl.take_events()] == ["started"]


def test_start_is_refused_with_an_arm_far_outside_its_limits(robot):
    rig = Rig(robot)
    rig.q[0] = robot.limits.upper[0] + 0.05
    rig.observe()
    ok, message = rig.ctl.start(rig.t)
    assert not ok and "left_arm_joint1" in message and "outside its limits" in message
    rig.q[0] = robot.limits.upper[0] + 0.005  # within start_tolerance: clipped, said
    rig.start()
    assert any("clipped into the limits" in e.text for e in rig.ctl.take_events())


def test_a_constant_action_is_followed_and_the_hands_are_commanded(robot):
    rig = Rig(robot)
    rig.start()
    assert rig.ctl.hand_step() is None  # no action yet: the hands are not commanded
    first = rig.arms(0.1)
    assert all(c is not None for c in first)  # the arms hold where they were measured
    np.testing.assert_allclose(first[-1].position, home(robot)[ARMS], atol=1e-12)
    target = home(robot)
    target[ARMS] += 0.2
    target[HANDS] = robot.limits.lower[HANDS] + 0.5 * (robot.limits.upper[HANDS] - robot.limits.lower[HANDS])
    decision = rig.ctl.policy_tick(rig.t)
    assert decision.act
    for _ in range(60):  # 2 s of frames, the same action each
        assert rig.ctl.take_action(decision.generation, target, rig.t)
        rig.arms(FRAME)
        decision = rig.ctl.policy_tick(rig.t)
    np.testing.assert_allclose(rig.q[ARMS], target[ARMS], atol=1e-6)
    np.testing.assert_allclose(rig.ctl.hand_step(), target[HANDS], atol=1e-9)
    assert rig.ctl.status().steps == 60 and rig.ctl.status().hand_commands_limited > 0  # the first, velocity-limited


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 40), st.floats(-3.0, 3.0)), min_size=3, max_size=8), st.data())
def test_a_jumping_target_never_takes_the_arms_past_their_limits(robot, jumps, data):
    """Whatever the actions (jumps anywhere, beyond the limits, a stale gap, a stop), the 200 Hz arm commands stay
    within the position, velocity, acceleration and jerk limits."""
    rig = Rig(robot, stale_timeout=0.1)
    rig.start()
    positions = [rig.q[ARMS].copy()]
    lim = arm_motion(robot)
    for frames, offset in jumps:
        action = home(robot)
        action[ARMS] += offset * data.draw(st.lists(st.floats(-1, 1), min_size=14, max_size=14).map(np.array))
        stale = data.draw(st.booleans())
        for _ in range(frames):
            decision = rig.ctl.policy_tick(rig.t)
            if decision.act:
                rig.ctl.take_action(decision.generation, action, rig.t)
            positions += [c.position for c in rig.arms(FRAME, observe=not stale) if c is not None]
    rig.ctl.stop(rig.t)
    positions += [c.position for c in rig.arms(3.0) if c is not None]
    check_stream(np.array(positions), lim)
    assert rig.ctl.commanding is False  # at rest after the stop: nothing more is sent


# ---------------------------------------------------------------------------------------------- hold, stop, e-stop
def test_a_stale_observation_holds_and_fresh_again_resumes(robot):
    rig = Rig(robot, stale_timeout=0.1)
    rig.start()
    target = home(robot)
    target[ARMS] += np.where(np.arange(14) % 2, -1.0, 1.0)
    goal = np.clip(target[ARMS], robot.limits.lower[ARMS] + 0.02, robot.limits.upper[ARMS] - 0.02)
    decision = rig.ctl.policy_tick(rig.t)
    rig.ctl.take_action(decision.generation, target, rig.t)
    rig.arms(0.2)
    rig.ctl.take_events()
    # the camera stops: at the next tick the policy holds; the arms brake to a stop short of the target
    rig.arms(0.11, observe=False)
    moving = rig.q[ARMS].copy()
    rig.ctl.measure(CANONICAL_JOINT_NAMES, rig.q, rig.t)
    decision = rig.ctl.policy_tick(rig.t)
    assert not decision.act and rig.ctl.state == "holding" and "physical camera frame" in rig.ctl.reason
    assert [e.text for e in rig.ctl.take_events()][0].startswith("holding:")
    assert not rig.ctl.take_action(decision.generation, target, rig.t)  # an action computed meanwhile: discarded
    commands = [c for c in rig.arms(2.0, observe=False)]
    assert all(c is not None for c in commands)  # held by commands
    assert np.all(np.abs(commands[-1].velocity) < 1e-9)
    held = commands[-1].position
    far = np.abs(home(robot)[ARMS] - goal) > 0.8  # joints whose target was far: stopped short of it
    assert far.sum() >= 4 and np.all(np.abs(held - goal)[far] > 0.01) and np.any(np.abs(held - moving) > 0.0)
    # fresh again: acting resumes from where the arms are
    rig.observe()
    assert rig.ctl.policy_tick(rig.t).act and rig.ctl.state == "running"
    status = rig.ctl.status()
    assert status.holds == 1 and status.discarded == 1


def test_stop_brakes_the_arms_keeps_the_hands_then_commands_nothing(robot):
    rig = Rig(robot)
    rig.start()
    target = home(robot)
    target[ARMS] += np.where(np.arange(14) % 2, -1.0, 1.0)
    target[HANDS] += 0.01
    goal = np.clip(target[ARMS], robot.limits.lower[ARMS] + 0.02, robot.limits.upper[ARMS] - 0.02)
    decision = rig.ctl.policy_tick(rig.t)
    rig.ctl.take_action(decision.generation, target, rig.t)
    rig.arms(0.15)
    hands = rig.ctl.hand_step().copy()
    ok, message = rig.ctl.stop(rig.t)
    assert ok and "brake" in message and rig.ctl.state == "idle"
    assert [e.kind for e in rig.ctl.take_events() if e.kind != "note"] == ["started", "ended"]
    braking = []
    while (command := rig.ctl.arm_step(rig.t + DT)) is not None:
        rig.t += DT
        braking.append(command.position)
        if rig.ctl.commanding:
            np.testing.assert_array_equal(rig.ctl.hand_step(), hands)  # the hands keep their command meanwhile
    assert 5 < len(braking) < 400
    far = np.abs(home(robot)[ARMS] - goal) > 0.8
    assert far.sum() >= 4 and np.all(np.abs(braking[-1] - goal)[far] > 0.01)  # stopped short of the target
    assert rig.ctl.hand_step() is None and rig.ctl.arm_step(rig.t + DT) is None
    assert not rig.ctl.take_action(decision.generation, target, rig.t)  # a late action of the stopped run
    assert rig.ctl.stop(rig.t) == (True, "not running")


def test_the_estop_commands_nothing_at_once_refuses_starts_until_the_drivers_release_it(robot):
    rig = Rig(robot, estop_grace=0.5)
    rig.ctl.driver_report("arm_driver", False, rig.t)
    rig.start()
    decision = rig.ctl.policy_tick(rig.t)
    target = home(robot)
    target[ARMS] += 0.5
    rig.ctl.take_action(decision.generation, target, rig.t)
    rig.arms(0.2)
    rig.ctl.estop(rig.t, "/estop topic")
    assert rig.ctl.state == "estopped" and rig.ctl.arm_step(rig.t + DT) is None and rig.ctl.hand_step() is None
    assert rig.ctl.take_events()[-1].kind == "ended"
    ok, message = rig.ctl.start(rig.t)
    assert not ok and "e-stop latched (/estop topic)" in message
    # a report sent before the driver latched does not release it; the latched report, then a released one, does
    rig.ctl.driver_report("arm_driver", False, rig.t + 0.1)
    assert not rig.ctl.policy_tick(rig.t + 0.2).act and rig.ctl.state == "estopped"
    rig.ctl.driver_report("arm_driver", True, rig.t + 1.0)
    rig.ctl.policy_tick(rig.t + 1.0)
    assert rig.ctl.state == "estopped"
    rig.ctl.driver_report("arm_driver", False, rig.t + 3.0)
    rig.ctl.policy_tick(rig.t + 3.0)
    assert rig.ctl.state == "idle" and "released" in rig.ctl.reason
    rig.t += 3.0
    rig.start()  # started again by the operator


def test_a_driver_reporting_its_estop_latched_estops_the_policy(robot):
    rig = Rig(robot)
    rig.start()
    rig.ctl.driver_report("hand_driver", True, rig.t)
    assert rig.ctl.state == "estopped" and rig.ctl.reason == "e-stop latched in hand_driver"
    assert rig.ctl.arm_step(rig.t) is None


def test_a_run_stops_by_itself_after_max_episode(robot):
    rig = Rig(robot, max_episode=1.0)
    rig.start()
    for _ in range(25):
        rig.arms(FRAME)
        assert rig.ctl.policy_tick(rig.t).act
    rig.arms(0.2)
    assert not rig.ctl.policy_tick(rig.t).act and rig.ctl.state == "idle"
    assert "max_episode_s (1 s) reached" in rig.ctl.reason
    assert rig.ctl.take_events()[-1].kind == "ended"


def test_a_failing_policy_ends_the_run_and_a_fatal_failure_refuses_starts(robot):
    rig = Rig(robot)
    rig.start()
    decision = rig.ctl.policy_tick(rig.t)
    assert not rig.ctl.take_action(decision.generation, np.full(N_JOINTS, np.nan), rig.t)
    assert rig.ctl.state == "error" and "54 finite joint positions" in rig.ctl.last_error
    rig.arms(2.0)
    assert rig.ctl.arm_step(rig.t + DT) is None  # braked to rest, then nothing
    rig.start()  # not fatal: the operator may start again
    rig.ctl.fail(rig.t, "the LeRobot worker died", fatal=True)
    ok, message = rig.ctl.start(rig.t)
    assert not ok and "the LeRobot worker died" in message and "restart the policy node" in message
    assert rig.ctl.status().errors == 2


def test_the_hand_command_stays_within_the_limits_and_the_velocity_limit(robot):
    rig = Rig(robot)
    rig.start()
    decision = rig.ctl.policy_tick(rig.t)
    wild = home(robot)
    wild[HANDS] = robot.limits.upper[HANDS] + 1.0
    start_hands = rig.q[HANDS].copy()
    rig.t += FRAME
    rig.observe()
    rig.ctl.take_action(decision.generation, wild, rig.t)
    sent = rig.ctl.hand_step()
    lim = robot.limits[HANDS]
    assert np.all(sent <= lim.upper + 1e-12) and np.all(sent >= lim.lower - 1e-12)
    assert np.all(np.abs(sent - start_hands) <= lim.velocity * FRAME + 1e-9)


def test_a_bad_configuration_is_refused(robot):
    with pytest.raises(ConfigurationError, match="without a camera"):
        PolicyController(robot.limits, arm_motion(robot), [])
    with pytest.raises(ConfigurationError, match="stale_timeout"):
        PolicyController(robot.limits, arm_motion(robot), ["physical"], ControllerSettings(stale_timeout=0.0))


# ---------------------------------------------------------------------------------------------- constant backend
def build(robot: RobotModel, **settings):
    cls = POLICY_BACKENDS.backend("constant")
    values = {p.name: p.default for p in cls.SETTINGS} | settings
    return POLICY_BACKENDS.create("constant", {f"constant.{k}": v for k, v in values.items()},
                                  PolicyContext(robot, 0.0))


def test_the_constant_backend_gives_its_action_and_its_spec(robot):
    runner = build(robot, fps=15.0, camera="generated", image_height=48, image_width=64)
    assert runner.spec.fps == 15.0 and dict(runner.spec.images) == {"generated": (48, 64)}
    assert runner.spec.action_names == runner.spec.state_names == CANONICAL_JOINT_NAMES
    image = np.zeros((48, 64, 3), np.uint8)
    np.testing.assert_array_equal(runner.act({"observation.images.generated": image}), home(robot))
    with pytest.raises(ValueError, match="observation.images.generated"):
        runner.act({"observation.images.physical": image})
    given_action = build(robot, action=[0.1] * N_JOINTS)
    assert np.all(given_action.act({"observation.images.physical": image}) == 0.1)


@pytest.mark.parametrize(("settings", "message"), [
    ({"action": [0.0] * 50}, "the action has 50 values, joint_names 54"),
    ({"joint_names": list(CANONICAL_JOINT_NAMES[:53]), "action": [0.0] * 53},
     "the policy's action has 53 dimensions, the robot has 54 joints"),
    ({"joint_names": list(reversed(CANONICAL_JOINT_NAMES)), "action": [0.0] * 54},
     "joint order differs from the robot's"),
])
def test_the_constant_backend_refuses_a_policy_for_another_robot(robot, settings, message):
    with pytest.raises(ConfigurationError, match=message):
        build(robot, **settings)
