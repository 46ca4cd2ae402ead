"""head_camera and camera_switch on real rclpy."""

from __future__ import annotations

import threading
import time

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import Parameter as ParameterMsg
from rcl_interfaces.msg import ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from ros_helpers import wait_for
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import String
from std_srvs.srv import Trigger

from rynn_teleop.errors import HardwareUnavailableError
from rynn_teleop.nodes.camera_switch import LATCHED, CameraSwitchNode
from rynn_teleop.nodes.conversions import image_array
from rynn_teleop.nodes.head_camera import HeadCameraNode
from rynn_teleop.nodes.parameters import to_ros_parameters
from rynn_teleop.runner import Composition, node_parameters


class Probe:
    def __init__(self, comp: Composition, ns: str = "/head_camera") -> None:
        self.node = Node("probe", context=comp.context)
        self.lock = threading.Lock()
        self.images: list[Image] = []
        self.infos: list[CameraInfo] = []
        self.depth: list[Image] = []
        self.active: list[str] = []
        self.node.create_subscription(Image, f"{ns}/color/image_raw", self._keep(self.images), qos_profile_sensor_data)
        self.node.create_subscription(CameraInfo, f"{ns}/color/camera_info", self._keep(self.infos),
                                      qos_profile_sensor_data)
        self.node.create_subscription(Image, f"{ns}/aligned_depth_to_color/image_raw", self._keep(self.depth),
                                      qos_profile_sensor_data)
        comp.add_node(self.node)

    def _keep(self, store):
        def cb(msg):
            with self.lock:
                store.append(msg)
        return cb

    def call(self, srv_type, name: str, request):
        client = self.node.create_client(srv_type, name)
        assert client.wait_for_service(timeout_sec=10.0)
        future = client.call_async(request)
        assert wait_for(future.done, 10.0)
        return future.result()


def add(comp: Composition, cls, overrides: dict) -> Node:
    values = node_parameters(cls.SCHEMA.node_name, cls.SCHEMA, overrides=overrides)
    node = cls(context=comp.context, parameter_overrides=to_ros_parameters(cls.SCHEMA, values))
    comp.add_node(node)
    return node


def test_synthetic_camera_publishes_consistent_images_and_camera_info(ros_domain_id):
    comp = Composition(["head_camera"], domain_id=ros_domain_id)
    try:
        probe = Probe(comp, "/head_camera/physical")
        assert wait_for(lambda: len(probe.images) > 10 and len(probe.infos) > 10 and probe.depth, 15.0)
        with probe.lock:
            img, info, depth = probe.images[-1], probe.infos[-1], probe.depth[-1]
        assert (img.encoding, img.width, img.height, img.step) == ("rgb8", 640, 480, 640 * 3)
        assert len(img.data) == img.step * img.height
        assert img.header.frame_id == "camera_color_optical_frame"
        assert (info.width, info.height) == (img.width, img.height)
        assert info.k[0] > 0 and info.k[2] == pytest.approx(320.0) and info.p[0] == info.k[0]
        assert (depth.encoding, depth.step) == ("16UC1", 640 * 2)
        assert depth.header.frame_id == "camera_color_optical_frame"  # registered to colour, like realsense-ros
        assert image_array(depth).max() > 0
        frames = np.array([image_array(m) for m in probe.images[-5:]])
        assert frames.std() > 10  # a drawn scene, not a blank image
        with probe.lock:
            stamps = [m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec for m in probe.images]
        ticks = np.diff(stamps) * 30.0
        np.testing.assert_allclose(ticks, np.round(ticks), atol=1e-3)  # capture stamps on the 30 Hz grid
    finally:
        comp.shutdown()


def test_replay_of_an_image_folder(ros_domain_id, tmp_path):
    for k in range(3):
        img = np.zeros((120, 160, 3), np.uint8)
        img[..., 2] = 200  # red in OpenCV's BGR
        img[:, : 40 * (k + 1), 1] = 255
        cv2.imwrite(str(tmp_path / f"frame{k}.png"), img)
    comp = Composition(["head_camera"], overrides={"head_camera": {"backend": "replay", "replay.path": str(tmp_path),
                                                                   "replay.rate_hz": 20.0}},
                       domain_id=ros_domain_id)
    try:
        probe = Probe(comp, "/head_camera/physical")
        assert wait_for(lambda: len(probe.images) >= 6, 10.0)
        with probe.lock:
            arrays = [image_array(m) for m in probe.images[:6]]
        assert all(a.shape == (120, 160, 3) for a in arrays)
        assert all(a[..., 0].mean() > 150 for a in arrays)  # red came back as R
        assert len({int((a[..., 1] > 128).sum()) for a in arrays}) == 3  # the three frames, looping
    finally:
        comp.shutdown()


def test_replay_without_a_path_and_bad_profiles_name_their_key(ros_domain_id):
    from rynn_teleop.errors import ParameterError

    with pytest.raises(ParameterError, match="replay.path"):
        Composition(["head_camera"], overrides={"head_camera": {"backend": "replay"}}, domain_id=ros_domain_id)
    with pytest.raises(ParameterError, match="synthetic.profile"):
        Composition(["head_camera"], overrides={"head_camera": {"synthetic.profile": "640x480"}},
                    domain_id=ros_domain_id)


def test_a_failing_read_is_reported_and_the_camera_keeps_running(ros_domain_id):
    comp = Composition(["head_camera"], domain_id=ros_domain_id)
    try:
        probe = Probe(comp, "/head_camera/physical")
        camera = comp.node("head_camera")
        assert wait_for(lambda: len(probe.images) > 3, 10.0)
        real_read = camera.source.read
        camera.source.read = lambda now: (_ for _ in ()).throw(OSError("USB gone"))
        assert wait_for(lambda: camera.read_errors > 3, 5.0)
        assert wait_for(lambda: camera.diagnostic_level()[0] == DiagnosticStatus.ERROR, 10.0)
        camera.source.read = real_read
        n = len(probe.images)
        assert wait_for(lambda: len(probe.images) > n + 3, 5.0)  # streaming again
    finally:
        comp.shutdown()
    assert not comp.errors


def test_realsense_without_a_device_is_a_clear_error(ros_domain_id):
    t0 = time.monotonic()
    with pytest.raises(HardwareUnavailableError, match="RealSense|pyrealsense2"):
        Composition(["head_camera"], overrides={"head_camera": {"backend": "realsense"}}, domain_id=ros_domain_id)
    assert time.monotonic() - t0 < 10.0  # fails fast, no hang


def test_switch_toggles_by_service_and_parameter_with_no_stale_frame(ros_domain_id):
    comp = Composition(["head_camera", "camera_switch"], overrides={"camera_switch": {"silent_timeout_s": 0.3}},
                       domain_id=ros_domain_id)
    try:
        # a stand-in for the world model: the same camera node on the generated topics, another frame id
        add(comp, HeadCameraNode, {"namespace": "/head_camera/generated",
                                                 "color_frame_id": "generated_frame", "synthetic.seed": 1})
        probe = Probe(comp)
        switch: CameraSwitchNode = comp.node("camera_switch")
        active: list[str] = []
        probe.node.create_subscription(String, "/head_camera/active_source", lambda m: active.append(m.data), LATCHED)
        assert wait_for(lambda: active == ["physical"] and len(probe.images) > 5, 15.0)

        def frames_after(t: float, frame_id: str) -> list[Image]:
            with probe.lock:
                return [m for m in probe.images if m.header.frame_id == frame_id
                        and m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec > t]

        # by service (the answer says whether it changed the feed)
        answer = probe.call(Trigger, "/camera_switch/use_generated", Trigger.Request())
        assert answer.success and answer.message == "active source: generated"
        t_switch = switch.last_switch_time
        assert probe.call(Trigger, "/camera_switch/use_generated", Trigger.Request()).message == \
            "active source: generated (unchanged)"
        assert switch.get_parameter("active_source").value == "generated"
        forwarded_physical = switch.forwarded["physical"]  # nothing of the old source is forwarded after this
        assert wait_for(lambda: len(frames_after(t_switch, "generated_frame")) > 5, 10.0)
        assert not frames_after(t_switch, "camera_color_optical_frame")  # nothing from the old source after
        assert switch.forwarded["physical"] == forwarded_physical
        assert wait_for(lambda: active[-1] == "generated", 5.0)
        # by parameter (what `ros2 param set /camera_switch active_source physical` does)
        request = SetParameters.Request(parameters=[ParameterMsg(
            name="active_source", value=ParameterValue(type=ParameterType.PARAMETER_STRING, string_value="physical"))])
        assert probe.call(SetParameters, "/camera_switch/set_parameters", request).results[0].successful
        assert switch.active == "physical"
        t_switch = switch.last_switch_time
        assert wait_for(lambda: len(frames_after(t_switch, "camera_color_optical_frame")) > 5, 10.0)
        assert not frames_after(t_switch, "generated_frame")
        assert wait_for(lambda: active[-1] == "physical", 5.0)
        bad = SetParameters.Request(parameters=[ParameterMsg(
            name="active_source", value=ParameterValue(type=ParameterType.PARAMETER_STRING, string_value="both"))])
        assert not probe.call(SetParameters, "/camera_switch/set_parameters", bad).results[0].successful
        assert probe.call(Trigger, "/camera_switch/toggle", Trigger.Request()).message == "active source: generated"
        # a late subscriber still learns the active source (latched)
        late: list[str] = []
        probe.node.create_subscription(String, "/head_camera/active_source", lambda m: late.append(m.data), LATCHED)
        assert wait_for(lambda: late == ["generated"], 5.0)
    finally:
        comp.shutdown()
    assert not comp.errors


def test_a_silent_source_is_reported_and_optionally_replaced(ros_domain_id):
    comp = Composition(["head_camera", "camera_switch"],
                       overrides={"camera_switch": {"silent_timeout_s": 0.3, "active_source": "generated"}},
                       domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        switch: CameraSwitchNode = comp.node("camera_switch")
        assert wait_for(lambda: switch.diagnostic_level()[0] == DiagnosticStatus.WARN, 5.0)
        assert "generated" in switch.diagnostic_level()[1] and not probe.images  # nothing generated: nothing out
    finally:
        comp.shutdown()
    comp = Composition(["head_camera", "camera_switch"],
                       overrides={"camera_switch": {"silent_timeout_s": 0.3, "active_source": "generated",
                                                    "fallback": True}},
                       domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        switch = comp.node("camera_switch")
        assert wait_for(lambda: switch.active == "physical", 5.0)  # fell back to the live source
        assert wait_for(lambda: len(probe.images) > 3, 5.0)
        level, message = switch.diagnostic_level()
        assert level == DiagnosticStatus.WARN and "fallback active" in message
        assert switch.get_parameter("active_source").value == "generated"  # the operator's choice is kept
        # the chosen source comes back: the output returns to it
        add(comp, HeadCameraNode, {"namespace": "/head_camera/generated", "color_frame_id": "generated_frame"})
        assert wait_for(lambda: switch.active == "generated", 5.0)
        assert wait_for(lambda: switch.diagnostic_level()[0] == DiagnosticStatus.OK, 5.0)
    finally:
        comp.shutdown()
