"""The policy node on real rclpy: the ``constant`` policy drives the physical twin through the drivers' safety
layer (twin, drivers, the head camera drawing the twin, recorder and policy in one process), stops, e-stops; a
policy for another robot refuses the start; ``rynn-teleop run --policy`` chooses the node set."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import yaml
from rclpy.node import Node
from ros_helpers import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from std_srvs.srv import Trigger

from rynn_teleop import bringup, cli
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES
from rynn_teleop.core.status import PolicyStatus
from rynn_teleop.errors import ConfigurationError, ParameterError, RynnTeleopError
from rynn_teleop.runner import Composition

ARMS = list(CANONICAL_JOINT_NAMES[:14])
# [rad] the constant action's arms, from home (mirrored for the right arm): a pose in free space the twin's servos
# reach (others press a hand against the table or the other arm)
_LEFT = np.array([0.1, -0.1, 0.1, -0.1, -0.1, 0.1, 0.0])
OFFSET = np.concatenate([_LEFT, _LEFT * np.array([-1, 1, -1, 1, -1, 1, -1])])
POLICY = {"backend": "constant", "constant.fps": 15.0, "constant.image_height": 48, "constant.image_width": 64,
          "stale_timeout_s": 1.0}


class Probe:
    def __init__(self, comp: Composition) -> None:
        self.node = Node("policy_probe", context=comp.context)
        self.lock = threading.Lock()
        self.joints: dict[str, float] = {}
        self.arm_commands = 0
        self.hand_commands: dict[str, JointState] = {}  # first joint name -> the newest hand command
        n = self.node
        n.create_subscription(JointState, "/joint_states", self._on_joints, 100)
        n.create_subscription(JointState, "/arms/command", self._on_command, 100)
        n.create_subscription(JointState, "/hands/command", self._on_hands, 100)
        self.estop = n.create_publisher(Bool, "/estop", 10)
        comp.add_node(n)

    def _on_joints(self, msg: JointState) -> None:
        with self.lock:
            self.joints.update(zip(msg.name, msg.position))

    def _on_command(self, msg: JointState) -> None:
        with self.lock:
            self.arm_commands += 1

    def _on_hands(self, msg: JointState) -> None:
        with self.lock:
            self.hand_commands[msg.name[0]] = msg

    def q(self, names) -> np.ndarray:
        with self.lock:
            return np.array([self.joints.get(n, np.nan) for n in names])

    def call(self, name: str) -> Trigger.Response:
        client = self.node.create_client(Trigger, name)
        assert client.wait_for_service(timeout_sec=10.0), name
        future = client.call_async(Trigger.Request())
        assert wait_for(future.done, 30.0), name
        return future.result()


def test_the_constant_policy_drives_the_twin_stops_and_estops(ros_domain_id, tmp_path):
    from rynn_teleop.sim.rollout import home_posture

    home = home_posture()
    action = home.copy()
    action[:14] += OFFSET
    comp = Composition(
        ["twin", "arm_driver", "hand_driver", "head_camera", "recorder", "policy"], domain_id=ros_domain_id,
        overrides={"head_camera": {"synthetic.profile": "160x120x30", "synthetic.depth": False},
                   "recorder": {"output_dir": str(tmp_path), "topics": ["/joint_states", "/arms/command"],
                                "expected_rates_hz": [0.0, 0.0]},
                   "policy": {**POLICY, "constant.action": action.tolist()}})
    try:
        probe = Probe(comp)
        policy, arm = comp.node("policy"), comp.node("arm_driver")
        assert wait_for(lambda: policy.ctl.stale_reason(policy.now_s()) == "", 30.0), \
            policy.ctl.stale_reason(policy.now_s())
        assert wait_for(lambda: not np.isnan(probe.q(ARMS)).any(), 10.0)
        np.testing.assert_allclose(probe.q(ARMS), home[:14], atol=5e-3)
        assert probe.arm_commands == 0  # idle: nothing commanded

        # started: the measured arms go to the constant action's, through the drivers; a recorded episode
        started = probe.call("/policy/start")
        assert started.success, started.message
        assert wait_for(lambda: np.abs(probe.q(ARMS) - action[:14]).max() < 0.01, 20.0), probe.q(ARMS) - action[:14]
        # a stale observation on a loaded machine holds the policy for a moment (as intended); it runs again
        assert wait_for(lambda: policy.ctl.state == "running", 10.0), policy.ctl.reason
        assert policy.ctl.steps > 0 and arm.safety.mode in ("track", "ramp")
        assert wait_for(lambda: policy._episode == "recording", 10.0)
        with probe.lock:  # the hands: one message per hand (as hand_retarget sends them), the action's positions
            hands = dict(probe.hand_commands)
        assert sorted(hands) == ["left_finger1_joint1", "right_finger1_joint1"]
        for msg in hands.values():
            index = [CANONICAL_JOINT_NAMES.index(n) for n in msg.name]
            assert len(index) == 20 and np.allclose(msg.position, action[index], atol=1e-9)
        seen: list[PolicyStatus] = []

        def running_status() -> bool:  # the status read once per poll, kept for the checks below
            seen[:] = [PolicyStatus.decode({k: str(v) for k, v in policy.diagnostic_values().items()})]
            return seen[0].state == "running"

        assert wait_for(running_status, 10.0), seen
        status = seen[0]
        assert (status.state, status.backend, status.fps, status.run, status.recording) == (
            "running", "constant", 15.0, 1, True)
        assert policy.meter("act").rate(policy.now_s()) > 0
        # stopped: the arms stay where they are; the episode ends with the twin's judgement
        stopped = probe.call("/policy/stop")
        assert stopped.success and "brake" in stopped.message
        assert wait_for(lambda: not policy.ctl.commanding, 5.0)
        assert wait_for(lambda: policy._episode == "", 30.0)
        episode = yaml.safe_load((tmp_path / "episode_0001" / "episode.yaml").read_text())
        assert episode["outcome"] == "failure" and "red_cube" in episode["outcome_reason"]  # the twin's judgement
        time.sleep(0.3)
        np.testing.assert_allclose(probe.q(ARMS), action[:14], atol=0.01)

        # e-stop while running: the policy commands nothing more, the drivers hold, a start is refused
        assert probe.call("/policy/start").success
        probe.estop.publish(Bool(data=True))
        assert wait_for(lambda: policy.ctl.state == "estopped" and arm.safety.estopped, 5.0)
        time.sleep(0.3)
        with probe.lock:
            sent = probe.arm_commands
        held = probe.q(ARMS)
        time.sleep(0.5)
        assert probe.arm_commands == sent  # nothing more commanded
        np.testing.assert_allclose(probe.q(ARMS), held, atol=2e-3)  # the drivers hold
        refused = probe.call("/policy/start")
        assert not refused.success and "e-stop latched" in refused.message
        # released in the drivers: the policy is idle again (it reads their status) and may be started again
        assert probe.call("/arm_driver/reset").success and probe.call("/hand_driver/reset").success
        assert wait_for(lambda: policy.ctl.state == "idle", 10.0), policy.ctl.reason
        assert probe.call("/policy/start").success
        assert probe.call("/policy/stop").success
    finally:
        comp.shutdown()
    assert not comp.errors


def test_a_policy_for_another_robot_refuses_the_start_with_the_reason(ros_domain_id):
    with pytest.raises(ParameterError, match="no policy given: set path"):  # the default backend, lerobot
        Composition(["policy"], domain_id=ros_domain_id)
    with pytest.raises(ConfigurationError, match="the action has 50 values, joint_names 54"):
        Composition(["policy"], domain_id=ros_domain_id,
                    overrides={"policy": {**POLICY, "constant.action": [0.0] * 50}})
    swapped = list(CANONICAL_JOINT_NAMES)
    swapped[14], swapped[15] = swapped[15], swapped[14]
    with pytest.raises(ConfigurationError, match="joint order differs from the robot's at 2 place"):
        Composition(["policy"], domain_id=ros_domain_id,
                    overrides={"policy": {**POLICY, "constant.joint_names": swapped,
                                          "constant.action": [0.0] * 54}})


def test_rynn_teleop_run_refuses_a_policy_it_cannot_load_with_exit_code_2(ros_env, tmp_path):
    out = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "run", "policy", "--policy", str(tmp_path),
                          "--duration", "5"], env=ros_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "is not a LeRobot policy folder" in out.stderr and str(tmp_path) in out.stderr


def _plan(*argv: str):
    return cli._run_plan(cli.build_parser().parse_args(["run", *argv]))


def test_run_with_a_policy_replaces_the_operator_input(tmp_path):
    nodes, overrides = _plan("--mode", "digital", "--policy", str(tmp_path), "--record")
    assert nodes == list(bringup.mode_nodes(record=True, policy=True))
    assert "policy" in nodes and not {"tracker", "arm_ik", "hand_retarget"} & set(nodes)
    assert {"twin", "arm_driver", "hand_driver", "head_camera", "recorder"} <= set(nodes)
    assert overrides["policy"] == {"path": str(tmp_path)}
    from rynn_teleop.recording import OPERATOR_INPUT_TOPICS

    assert overrides["recorder"] == {"exclude_topics": list(OPERATOR_INPUT_TOPICS)}  # nobody publishes them then
    nodes, overrides = _plan("--mode", "real", "--policy", str(tmp_path), "--policy-backend", "replay")
    assert overrides["policy"] == {"backend": "replay", "path": str(tmp_path)} and "twin" not in nodes
    assert "recorder" not in overrides  # not recording
    nodes, overrides = _plan("policy", "arm_driver", "--policy", str(tmp_path))  # named nodes
    assert nodes == ["policy", "arm_driver"] and overrides == {"policy": {"path": str(tmp_path)}}
    with pytest.raises(RynnTeleopError, match="the policy node is not started"):
        _plan("arm_driver", "--policy", str(tmp_path))
    nodes, overrides = _plan("--mode", "digital", "--record")
    assert "policy" not in nodes and "tracker" in nodes and "recorder" not in overrides
