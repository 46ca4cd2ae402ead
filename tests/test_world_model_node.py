"""world_model node on real rclpy: commands in -> frames out, stamps equal to command stamps."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from ros_helpers import wait_for
from sensor_msgs.msg import CameraInfo, Image, JointState

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.robot_model import RobotModel, arm_joint_names, hand_joint_names
from rynn_teleop.errors import ConfigurationError, ParameterError
from rynn_teleop.nodes.conversions import image_array
from rynn_teleop.runner import Composition

SMALL = {"profile": "160x120x30", "reanchor_topic": ""}


class Operator:
    """Publishes arm and hand commands like arm_ik / hand_retarget, remembering each stamp's joint vector."""

    def __init__(self, comp: Composition) -> None:
        self.node = Node("fake_operator", context=comp.context)
        self.robot = RobotModel.default()
        self.arms = self.node.create_publisher(JointState, "/arms/command", 10)
        self.hands = self.node.create_publisher(JointState, "/hands/command", 10)
        self.lock = threading.Lock()
        self.images: list[Image] = []
        self.infos: list[CameraInfo] = []
        self.conditions: list[Image] = []
        ns = "/head_camera/generated"
        self.node.create_subscription(Image, f"{ns}/color/image_raw", self._keep(self.images), qos_profile_sensor_data)
        self.node.create_subscription(CameraInfo, f"{ns}/color/camera_info", self._keep(self.infos),
                                      qos_profile_sensor_data)
        self.node.create_subscription(Image, f"{ns}/condition/image_raw", self._keep(self.conditions),
                                      qos_profile_sensor_data)
        self.q = self.robot.neutral()
        self.q[self.robot.indices(arm_joint_names("left") + arm_joint_names("right"))] = DEFAULT_HOME
        self.q[self.robot.joint_index("left_arm_joint1")] -= 0.3  # shoulders raised: hands in the camera's view
        self.q[self.robot.joint_index("right_arm_joint1")] += 0.3
        self.sent: dict[tuple[int, int], np.ndarray] = {}  # stamp -> the full joint vector after that message
        self.log: list[tuple[tuple[int, int], str, np.ndarray, np.ndarray]] = []  # (stamp, group, indices, values)
        comp.add_node(self.node)

    def _keep(self, store):
        def cb(msg):
            with self.lock:
                store.append(msg)
        return cb

    def send(self, group: str, t: float, lag_s: float = 0.0) -> None:
        """One command of ``group`` ("arms", "left", "right") with the configuration at time ``t`` [s],
        stamped ``lag_s`` [s] in the past."""
        names = (arm_joint_names("left") + arm_joint_names("right")) if group == "arms" else hand_joint_names(group)
        idx = self.robot.indices(names)
        lim = self.robot.limits
        mid = 0.5 * (lim.lower[idx] + lim.upper[idx])
        span = 0.5 * (lim.upper[idx] - lim.lower[idx])
        if group == "arms":
            wrist = [idx[6], idx[13]]  # arms stay at home, the wrists swing a little
            self.q[wrist] = mid[[6, 13]] + 0.3 * span[[6, 13]] * np.sin(3.0 * t)
        else:
            self.q[idx] = mid + 0.6 * span * np.sin(2.0 * t + np.arange(len(idx)))
        msg = JointState(name=list(names), position=[float(v) for v in self.q[idx]])
        msg.header.stamp = (self.node.get_clock().now() - Duration(seconds=lag_s)).to_msg()
        with self.lock:
            self.sent[(msg.header.stamp.sec, msg.header.stamp.nanosec)] = self.q.copy()
            self.log.append(((msg.header.stamp.sec, msg.header.stamp.nanosec), group, idx, self.q[idx].copy()))
        (self.arms if group == "arms" else self.hands).publish(msg)

    def stream(self, seconds: float, groups=("arms", "left", "right"), hz: float = 100.0,
               hand_lag_s: float = 0.0) -> int:
        """Commands of ``groups`` at ``hz`` for ``seconds``; returns how many were sent."""
        end = time.monotonic() + seconds
        t0 = time.monotonic()
        n = 0
        while time.monotonic() < end:
            for g in groups:
                self.send(g, time.monotonic() - t0, 0.0 if g == "arms" else hand_lag_s)
                n += 1
            time.sleep(1.0 / hz)
        return n


def test_commands_in_frames_out_one_per_tick_with_command_stamps(ros_domain_id):
    comp = Composition(["world_model"], overrides={"world_model": {**SMALL, "publish_condition": True}},
                       domain_id=ros_domain_id)
    try:
        op = Operator(comp)
        wm = comp.node("world_model")
        used: dict[tuple[int, int], np.ndarray] = {}  # frame stamp -> the action the world model took for it
        take = wm.actions.take

        def recording_take():
            taken = take()
            if taken is not None:
                used[divmod(taken[1], 1_000_000_000)] = np.array(taken[0])
            return taken

        wm.actions.take = recording_take
        op.stream(0.5, groups=("arms", "left"))  # the right hand never commanded: no frame yet
        time.sleep(0.2)
        assert not op.images
        level, message = wm.diagnostic_level()
        assert level == DiagnosticStatus.WARN and "right_hand" in message and "left_hand" not in message

        t_start = time.monotonic()
        sent_count = op.stream(3.0)
        span = time.monotonic() - t_start
        assert wait_for(lambda: len(op.infos) >= len(op.images) > 0, 2.0)
        with op.lock:
            images, infos, sent = list(op.images), list(op.infos), dict(op.sent)
        assert len(images) <= 30.0 * span + 2  # at most one frame per 30 Hz tick (the rate is the bench's)
        img = images[-1]
        assert (img.encoding, img.width, img.height, img.step) == ("rgb8", 160, 120, 480)
        assert img.header.frame_id == "camera_color_optical_frame"
        info_stamps = {(m.header.stamp.sec, m.header.stamp.nanosec) for m in infos}
        for m in images:
            key = (m.header.stamp.sec, m.header.stamp.nanosec)
            assert key in sent, "a frame stamp that is not a command stamp"
            assert key in info_stamps
        stamps = [m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec for m in images]
        assert all(np.diff(stamps) > 0)  # one frame per new command, in order
        diag = wm.diagnostic_values()
        # about 300 commands/s in, 30 frames/s out: most commands are overwritten before a frame shows them
        assert 0.5 * sent_count < diag["commands_dropped"] < sent_count
        assert diag["commands_out_of_order"] == 0
        with op.lock:
            conditions = list(op.conditions)
        assert conditions and all((c.header.stamp.sec, c.header.stamp.nanosec) in sent for c in conditions)
        assert image_array(conditions[-1]).max() > 0  # the skeleton is drawn

        # each frame's action holds the command its stamp names, and of every other group a command sent before
        # it (the newest the world model had: the two topics may arrive in either order)
        with op.lock:
            log = list(op.log)
        order = {key: i for i, (key, *_) in enumerate(log)}
        for key, q in dict(used).items():
            i = order[key]
            _, group, idx, values = log[i]
            np.testing.assert_array_equal(q[idx], values)
            for g in ("arms", "left", "right"):
                earlier = [(ix, v) for _, gg, ix, v in log[: i + 1] if gg == g]
                assert earlier and any(np.array_equal(q[ix], v) for ix, v in earlier[::-1]), f"{g} at {key}"
        # and each frame is the render of exactly that action
        from rynn_teleop.world_model.render import RenderGenerator

        reference = wm.generator.reference.copy()
        check = RenderGenerator(wm.robot, wm.intrinsics)
        check.reset(reference)
        for m in images[-3:]:
            q = used[(m.header.stamp.sec, m.header.stamp.nanosec)]
            np.testing.assert_array_equal(image_array(m), check.step(q)[0])

        n = len(op.images)  # commands stop: frames stop (hold, no new frames)
        time.sleep(0.5)
        assert len(op.images) - n <= 1
        assert wm.diagnostic_values()["idle_ticks"] > 5
    finally:
        comp.shutdown()


def test_reference_from_a_topic_waits_for_its_first_frame(ros_domain_id):
    comp = Composition(["world_model"], overrides={"world_model": {**SMALL, "reference.source": "topic",
                                                                   "reference.topic": "/ref/image_raw"}},
                       domain_id=ros_domain_id)
    try:
        op = Operator(comp)
        wm = comp.node("world_model")
        op.stream(0.4)
        assert not op.images
        assert wm.diagnostic_level()[0] == DiagnosticStatus.WARN and "reference" in wm.diagnostic_level()[1]
        pub = op.node.create_publisher(Image, "/ref/image_raw", qos_profile_sensor_data)
        assert wait_for(lambda: pub.get_subscription_count() > 0, 5.0)
        from rynn_teleop.nodes.conversions import image_message

        ref = np.zeros((240, 320, 3), np.uint8)
        ref[..., 1] = 200  # green scene
        for _ in range(5):
            pub.publish(image_message(ref, "rgb8", op.node.get_clock().now().to_msg(), "camera_color_optical_frame"))
            time.sleep(0.05)
        op.stream(1.0)
        assert wait_for(lambda: len(op.images) > 3, 3.0)
        frame = image_array(op.images[-1])
        assert frame.shape == (120, 160, 3)
        assert (frame[0, 0] == [0, 200, 0]).all()  # the reference (resized) shows where the robot is not
    finally:
        comp.shutdown()


def test_reference_from_the_twin_is_its_layout_drawn_without_the_robot(ros_domain_id):
    """reference.source twin: no frame before the twin's scene; then the stream starts from the layout's
    robot-free view (reference_frame of that scene), not the procedural tabletop."""
    import json

    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    from rynn_teleop.sim.monitor import scene_description
    from rynn_teleop.sim.physics import PhysicsWorld
    from rynn_teleop.sources.camera.synthetic import reference_frame

    comp = Composition(["world_model"], overrides={"world_model": {**SMALL, "reference.source": "twin"}},
                       domain_id=ros_domain_id)
    try:
        op = Operator(comp)
        wm = comp.node("world_model")
        op.stream(0.4)
        assert not op.images
        level, text = wm.diagnostic_level()
        assert level == DiagnosticStatus.WARN and "/twin/scene" in text
        scene = json.dumps(scene_description(PhysicsWorld("pick_place", 3)))
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        pub = op.node.create_publisher(String, "/twin/scene", latched)
        pub.publish(String(data=scene))  # latched: delivered whenever the subscription matches
        assert wait_for(lambda: wm._reference is not None, 10.0)
        expected = reference_frame(160, 120, wm.robot, twin_scene=scene)
        np.testing.assert_array_equal(wm._reference, expected)
        assert not np.array_equal(expected, reference_frame(160, 120, wm.robot))  # the layout is drawn
        op.stream(1.0)
        assert wait_for(lambda: len(op.images) > 3, 3.0)
        np.testing.assert_array_equal(image_array(op.images[-1])[0, 0], expected[0, 0])  # no robot in the corner
    finally:
        comp.shutdown()


def test_bad_reference_and_style_refuse_to_start(ros_domain_id, tmp_path):
    with pytest.raises(ParameterError, match="reference.path"):
        Composition(["world_model"], overrides={"world_model": {"reference.source": "file",
                                                                "reference.path": str(tmp_path / "none.png")}},
                    domain_id=ros_domain_id)
    with pytest.raises(ParameterError, match="condition.far_m"):
        Composition(["world_model"], overrides={"world_model": {"condition.near_m": 2.0, "condition.far_m": 1.0}},
                    domain_id=ros_domain_id)


def test_hand_commands_older_than_arm_commands_never_share_a_frame_stamp(ros_domain_id):
    comp = Composition(["world_model"], overrides={"world_model": SMALL}, domain_id=ros_domain_id)
    try:
        op = Operator(comp)
        op.stream(2.0, hand_lag_s=0.05)  # hand commands carry older capture stamps than arm commands
        assert wait_for(lambda: len(op.images) > 20, 3.0)
        with op.lock:
            stamps = [(m.header.stamp.sec, m.header.stamp.nanosec) for m in op.images]
            sent = dict(op.sent)
        assert len(set(stamps)) == len(stamps)
        assert all(k in sent for k in stamps)
        assert comp.node("world_model").diagnostic_values()["commands_out_of_order"] == 0
    finally:
        comp.shutdown()


def test_bad_profile_and_device_name_their_key(ros_domain_id):
    with pytest.raises(ParameterError, match="profile"):
        Composition(["world_model"], overrides={"world_model": {"profile": "20000x20000x30"}},
                    domain_id=ros_domain_id)
    with pytest.raises(ParameterError, match="diffusion.device"):
        Composition(["world_model"], overrides={"world_model": {"diffusion.device": "gpu0"}},
                    domain_id=ros_domain_id)


def test_diffusion_without_a_base_model_refuses_to_start(ros_domain_id):
    with pytest.raises(ConfigurationError, match="base_dir is required"):
        Composition(["world_model"], overrides={"world_model": {"backend": "diffusion"}}, domain_id=ros_domain_id)


def test_diffusion_backend_frames_arrive_block_wise_with_their_own_command_stamps(ros_domain_id, tmp_path):
    from rynn_teleop.world_model.diffusion.model import save_model, untrained_model
    from rynn_teleop.world_model.diffusion.presets import get_preset

    paths = {"base_dir": str(tmp_path / "base"), "weights_dir": str(tmp_path / "weights"),
             "prompt_file": str(tmp_path / "prompt.safetensors")}
    save_model(untrained_model(get_preset("tiny"), seed=0), **paths)  # tests the plumbing, not a trained model
    import torch

    threads = torch.get_num_threads()  # the node sets the process's torch threads: restored for later tests
    torch.set_num_threads(2)
    comp = Composition(["world_model"], overrides={"world_model": {
        **SMALL, "backend": "diffusion", **{f"diffusion.{k}": v for k, v in paths.items()}, "profile": "96x64x30"}},
        domain_id=ros_domain_id)
    try:
        op = Operator(comp)
        wm = comp.node("world_model")
        op.stream(2.0)
        assert wait_for(lambda: len(op.images) >= 12, 5.0)
        # commands stopped: the half-full block is padded and every action taken is shown
        assert wait_for(lambda: wm.frame_queue.waiting == 0, 5.0)
        with op.lock:
            images, sent = list(op.images), dict(op.sent)
        keys = [(m.header.stamp.sec, m.header.stamp.nanosec) for m in images]
        assert all(k in sent for k in keys) and len(set(keys)) == len(keys)
        assert (images[-1].width, images[-1].height, images[-1].encoding) == (96, 64, "rgb8")
        assert wm.reanchoring is False  # SMALL has no re-anchoring topic
        assert {"denoise", "decode"} <= set(wm.generator.timings())
        assert torch.get_num_threads() == 1  # diffusion.threads' default: one core for the model
    finally:
        comp.shutdown()
        torch.set_num_threads(threads)


class _RecordingLogger:
    """A node logger that also keeps what is logged at ERROR."""

    def __init__(self, logger, errors: list[str]) -> None:
        self._logger, self.errors = logger, errors

    def error(self, message, **kwargs):
        self.errors.append(message)
        return self._logger.error(message, **kwargs)

    def __getattr__(self, name):
        return getattr(self._logger, name)


def test_a_publish_racing_the_shutdown_logs_no_error(ros_domain_id):
    """Ctrl-C under ``ros2 launch``: rclpy's signal handler shuts the context down before the node's
    destroy_node() stops the generation thread, so a tick may publish on a dead context. That is no error."""
    comp = Composition(["world_model"], overrides={"world_model": SMALL}, domain_id=ros_domain_id)
    operator = Composition([], domain_id=ros_domain_id)  # its own context: it keeps publishing through the stop
    wm = comp.node("world_model")
    errors: list[str] = []
    logger = _RecordingLogger(wm.get_logger(), errors)
    wm.get_logger = lambda: logger
    pop, raced = wm.frame_queue.pop, threading.Event()

    def pop_then_shut_down():  # the first frame's tick: the context goes away between generating and publishing
        out = pop()
        if out is not None and not raced.is_set():
            comp.context.handle.shutdown()  # what rclpy's SIGINT handler does (no node is destroyed)
            raced.set()
        return out

    wm.frame_queue.pop = pop_then_shut_down
    try:
        op = Operator(operator)
        deadline = time.monotonic() + 20.0
        while not raced.is_set() and time.monotonic() < deadline:
            op.stream(0.1)
        assert raced.is_set(), "the world model generated no frame"
        op.stream(0.3)  # more ticks on the dead context
        assert wm.generation_errors == 0 and errors == []
        assert wm.diagnostic_values()["frames"] == 0  # the raced publish did not go out
    finally:
        comp.shutdown()
        operator.shutdown()
