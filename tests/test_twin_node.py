"""The twin in the stack on real rclpy: the twin node with the drivers on its physics, the recorder taking the
twin's outcome, and an episode replayed on a fresh twin (``rynn-teleop episodes replay``)."""

from __future__ import annotations

import json
import threading
import time

import mujoco
import numpy as np
import pytest
import yaml
from geometry_msgs.msg import PoseArray
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from ros_helpers import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger
from twin_episodes import scripted_episode
from visualization_msgs.msg import MarkerArray

from rynn_teleop import cli
from rynn_teleop.core.layout import SIDES
from rynn_teleop.core.robot_model import RobotModel, arm_joint_names, hand_joint_names
from rynn_teleop.core.status import TwinStatus
from rynn_teleop.recording.replay import load_commands
from rynn_teleop.replay import replay_episode
from rynn_teleop.runner import Composition
from rynn_teleop.sim import shared

ARM = list(n for s in SIDES for n in arm_joint_names(s))
HANDS = list(n for s in SIDES for n in hand_joint_names(s))
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """The scripted operator's pick-and-place commands (layout 0) as a recorded episode, and the outcome the plan
    had in pure physics."""
    return scripted_episode(tmp_path_factory.mktemp("scripted"), "pick_place", 0)


class Probe:
    def __init__(self, comp: Composition) -> None:
        self.node = Node("twin_probe", context=comp.context)
        self.lock = threading.Lock()
        self.objects: list[PoseArray] = []
        self.scene: list[dict] = []
        self.outcome: list[dict] = []
        self.markers: list[MarkerArray] = []
        self.joints: dict[str, float] = {}
        n = self.node
        n.create_subscription(PoseArray, "/twin/objects", self.objects.append, 10)
        n.create_subscription(String, "/twin/scene", lambda m: self.scene.append(json.loads(m.data)), LATCHED)
        n.create_subscription(String, "/twin/outcome", lambda m: self.outcome.append(json.loads(m.data)), LATCHED)
        n.create_subscription(MarkerArray, "/twin/markers", self.markers.append, 2)
        n.create_subscription(JointState, "/joint_states", self._on_joints, 100)
        self.arm_cmd = n.create_publisher(JointState, "/arms/command", 10)
        self.hand_cmd = n.create_publisher(JointState, "/hands/command", 10)
        self.estop = n.create_publisher(Bool, "/estop", 10)
        comp.add_node(n)

    def _on_joints(self, msg: JointState) -> None:
        with self.lock:
            self.joints.update(zip(msg.name, msg.position))

    def q(self, names) -> np.ndarray:
        with self.lock:
            return np.array([self.joints.get(n, np.nan) for n in names])

    def call(self, name: str) -> Trigger.Response:
        client = self.node.create_client(Trigger, name)
        assert client.wait_for_service(timeout_sec=10.0)
        future = client.call_async(Trigger.Request())
        assert wait_for(future.done, 10.0)
        return future.result()


def test_the_twin_publishes_its_scene_and_the_drivers_follow_on_its_physics(ros_domain_id):
    comp = Composition(["twin", "arm_driver", "hand_driver"], overrides={"twin": {"seed": 2}}, domain_id=ros_domain_id)
    stop = threading.Event()
    try:
        probe = Probe(comp)
        twin, arm = comp.node("twin"), comp.node("arm_driver")
        assert arm.backend.name == "sim" and arm.backend.shared is twin.shared  # one world for the process
        assert comp.node("hand_driver").backend.shared is twin.shared
        assert wait_for(lambda: probe.objects and probe.scene and probe.outcome and probe.markers, 10.0)
        scene = probe.scene[-1]
        assert (scene["scene"], scene["seed"], scene["task"]) == ("pick_place", 2, "place red_cube in goal")
        assert scene["resets"] == 0 and abs(scene["stamp"] - twin.now_s()) < 10.0  # the start-up layout, its time
        names = [o["name"] for o in scene["objects"]]
        poses = probe.objects[-1]
        assert poses.header.frame_id == "base_link" and len(poses.poses) == len(names) == 3
        assert abs(poses.header.stamp.sec + poses.header.stamp.nanosec * 1e-9 - twin.now_s()) < 1.0
        cube = poses.poses[names.index("red_cube")].position
        np.testing.assert_allclose([cube.x, cube.y, cube.z], twin.world.layout.objects["red_cube"].position, atol=2e-3)
        assert probe.outcome[-1]["success"] is None and "outside goal" in probe.outcome[-1]["reason"]
        assert {m.ns for m in probe.markers[-1].markers} == {"twin/objects", "twin/targets", "twin/table"}
        status = TwinStatus.decode({k: str(v) for k, v in twin.diagnostic_values().items()})
        assert (status.scene, status.seed, status.outcome) == ("pick_place", 2, "undecided")
        # the drivers' measurements are the physics; commands go through the safety layer
        robot = RobotModel.default()
        home = twin.shared.home[:14]
        assert wait_for(lambda: np.abs(probe.q(ARM) - home).max() < 1e-3, 5.0)
        # shoulder and elbow raise both hands (clear of the table), a wrist roll
        goal = home + np.array([-0.15, 0, 0, -0.15, 0, 0, 0.1, 0.15, 0, 0, -0.15, 0, 0, -0.1])
        hand_goal = np.clip(np.full(40, 0.4), robot.limits.lower[14:], robot.limits.upper[14:])

        def stream(arm_goal):
            while not stop.is_set():
                probe.arm_cmd.publish(JointState(name=ARM, position=arm_goal.tolist()))
                probe.hand_cmd.publish(JointState(name=HANDS, position=hand_goal.tolist()))
                time.sleep(0.01)

        streamer = threading.Thread(target=stream, args=(goal,), daemon=True)
        streamer.start()
        limits = robot.limits
        inside = []

        def reached() -> bool:
            q = probe.q(ARM + HANDS)
            inside.append(bool(np.all(q >= limits.lower - 5e-3) and np.all(q <= limits.upper + 5e-3)))
            return np.abs(q[:14] - goal).max() < 0.01 and np.abs(q[14:] - hand_goal).max() < 0.05

        assert wait_for(reached, 15.0), f"arms {np.abs(probe.q(ARM) - goal).max():.3f} rad from the command"
        assert all(inside)  # no joint left its limits on the way
        # the e-stop: held where it is, later commands ignored
        probe.estop.publish(Bool(data=True))
        assert wait_for(lambda: arm.safety.estopped, 5.0)
        stop.set()
        streamer.join()
        time.sleep(0.3)
        held = probe.q(ARM)
        stop.clear()
        streamer = threading.Thread(target=stream, args=(home,), daemon=True)
        streamer.start()
        time.sleep(0.5)
        stop.set()
        streamer.join()
        np.testing.assert_allclose(probe.q(ARM), held, atol=2e-3)
        # ~/reset: the next layout, the robot back at home, the drivers start again from there
        assert probe.call("/arm_driver/reset").success and probe.call("/hand_driver/reset").success
        from rynn_teleop.nodes.operator import ACTIONS

        assert [step.service for step in ACTIONS["twin reset"].steps] == ["/twin/reset"]  # console, call twin reset
        response = probe.call("/twin/reset")
        assert response.success and "layout 3" in response.message
        assert wait_for(lambda: probe.scene[-1]["seed"] == 3, 5.0)
        assert twin.get_parameter("seed").value == 3
        assert probe.scene[-1]["resets"] == 1 and probe.scene[-1]["stamp"] > scene["stamp"]  # the operator's clock
        time.sleep(0.3)
        np.testing.assert_allclose(probe.q(ARM), home, atol=2e-3)  # at home, and stays there
        assert arm.safety.mode in ("waiting", "watchdog")
    finally:
        stop.set()
        comp.shutdown()
    assert not comp.errors
    assert shared.find_world("twin") is None  # the process's world went with its users


def test_the_recorder_writes_the_twins_outcome_unless_the_operator_gave_one(ros_domain_id, tmp_path):
    comp = Composition(["twin", "recorder"], overrides={
        "twin": {"seed": 1}, "recorder": {"output_dir": str(tmp_path), "topics": ["/twin/objects"],
                                          "expected_rates_hz": [60.0]}}, domain_id=ros_domain_id)
    try:
        twin, recorder = comp.node("twin"), comp.node("recorder")
        assert wait_for(lambda: {"/twin/objects", "/twin/scene", "/twin/outcome"} <= set(recorder._types)
                        and {"/twin/scene", "/twin/outcome"} <= set(recorder._latched), 10.0)
        path = recorder.start_episode()
        time.sleep(0.5)
        recorder.stop_episode()
        doc = yaml.safe_load((path / "episode.yaml").read_text())
        assert doc["outcome"] == "failure" and doc["outcome_reason"].startswith("not achieved when the episode stopped")
        assert "red_cube is outside goal" in doc["outcome_reason"]
        assert doc["extra"]["twin"] == {"scene": "pick_place", "seed": 1, "task": "place red_cube in goal"}
        # the twin's scene and outcome are recorded, never reported missing (a gap of a loaded machine may be)
        assert not [p for p in doc["problems"] if "gap" not in p], doc["problems"]
        # the cube put down in the goal: the twin judges success, the recorder writes it
        world = twin.world
        goal = world.layout.targets["goal"].center
        with world.lock:
            body = world.index.objects["red_cube"]
            adr = world.model.jnt_qposadr[world.model.body_jntadr[body]]
            world.data.qpos[adr:adr + 7] = (goal[0], goal[1], goal[2] + 0.037, 1.0, 0.0, 0.0, 0.0)
            mujoco.mj_forward(world.model, world.data)
        assert wait_for(lambda: twin.outcome.success is True, 5.0)
        path = recorder.start_episode()
        time.sleep(0.5)
        recorder.stop_episode()
        doc = yaml.safe_load((path / "episode.yaml").read_text())
        assert (doc["outcome"], doc["outcome_reason"]) == ("success", "red_cube rests in goal, released")
        # an operator's label wins
        from rclpy.parameter import Parameter

        path = recorder.start_episode()
        recorder.set_parameters([Parameter("outcome", Parameter.Type.STRING, "failure")])
        recorder.stop_episode()
        doc = yaml.safe_load((path / "episode.yaml").read_text())
        assert (doc["outcome"], doc["outcome_reason"]) == ("failure", "")
    finally:
        comp.shutdown()
    assert not comp.errors


def test_replay_refuses_an_episode_of_another_robot_before_starting_anything(tmp_path, capsys):
    other = [n.replace("right_", "r_") for n in ARM]
    path, _ = scripted_episode(tmp_path, names=other)
    assert cli.main(["episodes", "replay", str(path), "--twin"]) == 1
    err = capsys.readouterr().err
    assert "joints this robot does not have" in err and "r_" in err and "not replayed" in err


def test_a_scripted_episode_replayed_on_a_fresh_twin_reports_the_tasks_outcome(ros_domain_id, scripted):
    """The scripted operator's commands, recorded, then replayed through the drivers' safety layer on a fresh
    twin of the episode's scene and layout: the twin judges the task (a success, as in pure physics)."""
    path, label = scripted
    lines: list[str] = []
    result, twin = replay_episode(path, twin=True, domain_id=ros_domain_id, log=lines.append)
    assert (twin.scene, twin.seed, twin.source) == ("pick_place", 0, "episode")
    assert result.completed and result.arrived and result.stopped_by == ""
    assert result.commands_sent == len(load_commands(path).commands)
    assert result.outcome is not None and set(result.outcome) == {"success", "reason", "task", "t"}
    assert result.outcome["success"] is True, result.outcome  # what pure physics gave the plan: same outcome
    assert label == "success"
    assert any(line.startswith("approach:") for line in lines)


def test_an_estop_ends_a_replay_at_once(ros_domain_id, scripted):
    path, _ = scripted
    stop = threading.Event()
    replaying = threading.Event()
    results = []

    def estop_later():
        assert replaying.wait(60.0)  # the approach is done, commands go out
        time.sleep(0.5)
        comp_pub.publish(Bool(data=True))

    # the e-stop comes from another process's node on the same domain, like an operator's pedal
    with Composition([], domain_id=ros_domain_id) as other:
        node = Node("pedal", context=other.context)
        comp_pub = node.create_publisher(Bool, "/estop", 10)
        other.add_node(node)
        threading.Thread(target=estop_later, daemon=True).start()
        results.append(replay_episode(path, twin=True, domain_id=ros_domain_id, stop=stop,
                                      log=lambda line: line.startswith("replaying") and replaying.set()))
    result, _ = results[0]
    assert not result.completed and "e-stop" in result.stopped_by
    assert 0 < result.commands_sent < len(load_commands(path).commands)


@pytest.fixture(autouse=True)
def _no_world_left_behind():
    yield
    assert shared.find_world("twin") is None
