"""The synthetic head camera draws the physical twin: its tabletop, targets and objects where their poses say."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace as NS

import numpy as np
import pytest

from rynn_teleop.core.camera import DEFAULT_DEPTH_SCALE
from rynn_teleop.core.robot_render import object_primitive
from rynn_teleop.sim.scene import load_scene, yaw_quaternion
from rynn_teleop.sources.camera.synthetic import SyntheticScene, twin_view

W, H = 320, 240


def scene_text(name: str, seed: int) -> str:
    """/twin/scene as the twin node publishes it (sim.monitor.scene_description of a fresh world)."""
    from rynn_teleop.sim.monitor import scene_description
    from rynn_teleop.sim.physics import PhysicsWorld

    return json.dumps(scene_description(PhysicsWorld(name, seed)))


def poses_message(poses: list[tuple[np.ndarray, np.ndarray]]) -> NS:
    """A PoseArray-like message: (position, quaternion x y z w) per object."""
    return NS(poses=[NS(position=NS(x=p[0], y=p[1], z=p[2]), orientation=NS(x=q[0], y=q[1], z=q[2], w=q[3]))
                     for p, q in poses])


def layout_poses(name: str, seed: int, moved: dict | None = None) -> NS:
    scene = load_scene(name)
    layout = scene.layout(seed)
    out = []
    for obj in scene.objects:
        pose = layout.objects[obj.name]
        out.append((moved or {}).get(obj.name, (pose.position, pose.quaternion)))
    return poses_message(out)


def camera(**kwargs) -> SyntheticScene:
    cam = SyntheticScene(W, H, 30.0, draw_robot=True, twin_scene_topic="/twin/scene", twin_in_background=False,
                         **kwargs)
    cam.start(0.0)
    return cam


def pixel(cam: SyntheticScene, point_base) -> tuple[int, int, float]:
    """(u, v) [px] and optical depth [m] of a point in base_link, through the camera's own model."""
    proj = cam.painter.view.project(np.asarray(point_base, float)[None])
    u, v = proj.uv[0]
    return int(round(u)), int(round(v)), float(proj.depth[0])


@pytest.fixture(scope="module")
def pick_place_text() -> str:
    return scene_text("pick_place", 3)


def test_the_camera_draws_an_object_where_its_pose_says(pick_place_text):
    cam = camera()
    cam.feed("/twin/scene", NS(data=pick_place_text))
    here = np.array([0.62, 0.02, 0.681 + 0.035])  # the red cube's centre, resting on the table in view
    cam.feed("/twin/objects", layout_poses("pick_place", 3, {"red_cube": (here, yaw_quaternion(0.2))}))
    frame = cam.read(0.0)[0]
    assert cam.twin is not None and cam.twin.scene == "pick_place" and cam.objects == ()
    u, v, z = pixel(cam, here)
    r, g, b = (int(c) for c in frame.color[v, u])
    assert r > 2 * g and r > 2 * b, f"the cube's centre pixel is not red: {r, g, b}"
    depth = frame.depth[v, u] * DEFAULT_DEPTH_SCALE  # [m] the face of the cube the centre's ray enters
    assert z - 0.07 < depth < z, (depth, z)
    # moved: red where it now is, not where it was (there: the table, at the table's depth)
    there = np.array([0.75, -0.12, 0.681 + 0.035])
    cam.feed("/twin/objects", layout_poses("pick_place", 3, {"red_cube": (there, yaw_quaternion(0.0))}))
    frame = cam.read(1 / 30)[-1]
    u2, v2, _ = pixel(cam, there)
    r, g, b = (int(c) for c in frame.color[v2, u2])
    assert r > 2 * g and r > 2 * b
    r, g, b = (int(c) for c in frame.color[v, u])
    assert not (r > 2 * g and r > 2 * b)
    u0, v0, z0 = pixel(cam, here - (0.0, 0.0, 0.035))  # the table below the old centre
    assert frame.depth[v0, u0] * DEFAULT_DEPTH_SCALE == pytest.approx(z0, abs=0.01)


def test_the_twins_table_targets_and_fixed_objects_are_the_static_layer():
    text = scene_text("bimanual_lift", 2)
    doc = json.loads(text)
    cam = camera()
    cam.feed("/twin/scene", NS(data=text))
    frame = cam.read(0.0)[0]
    shelf = doc["targets"][0]
    u, v, z = pixel(cam, shelf["center"])  # on the platform's top, inside the green shelf region
    assert frame.depth[v, u] * DEFAULT_DEPTH_SCALE == pytest.approx(z, abs=0.005)
    r, g, b = (int(c) for c in frame.color[v, u])
    assert g > r + 20 and g > b + 20, f"the shelf is not green: {(r, g, b)}"
    # the bar (a moving object) at its layout pose until /twin/objects says otherwise: blue at its centre
    bar = load_scene("bimanual_lift").layout(2).objects["blue_bar"].position
    u, v, z = pixel(cam, bar + (0.0, 0.08, 0.0))
    r, g, b = (int(c) for c in frame.color[v, u])
    assert b > r + 40 and b > g + 40
    assert z - 0.07 < frame.depth[v, u] * DEFAULT_DEPTH_SCALE < z


def test_without_a_twin_scene_the_procedural_tabletop_is_unchanged():
    plain = SyntheticScene(160, 120, 30.0, seed=4, draw_robot=True)
    following = SyntheticScene(160, 120, 30.0, seed=4, draw_robot=True, twin_scene_topic="/twin/scene")
    for cam in (plain, following):
        cam.start(0.0)
    a, b = plain.read(0.5)[-1], following.read(0.5)[-1]
    assert np.array_equal(a.color, b.color) and np.array_equal(a.depth, b.depth)
    assert set(following.message_inputs()) == {"/twin/scene", "/twin/objects"} and not plain.message_inputs()


def test_a_new_scene_is_built_in_the_background_and_frames_keep_coming(pick_place_text):
    cam = SyntheticScene(160, 120, 30.0, draw_robot=False, twin_scene_topic="/twin/scene")
    cam.start(0.0)
    cam.read(0.0)
    gate = threading.Event()
    real = cam.scene.__class__.prepare

    def slow_prepare(scene):
        if scene.twin is not None:
            gate.wait(10.0)
        return real(scene)

    cam.scene.__class__.prepare = slow_prepare
    try:
        cam.feed("/twin/scene", NS(data=pick_place_text))
        frames = cam.read(0.2)  # the twin layer is being built: the old tabletop is shown meanwhile
        assert frames and cam.twin is None
        gate.set()
        cam._twin_build.join(10.0)
        cam.read(0.3)
        assert cam.twin is not None and cam.twin.seed == 3
    finally:
        cam.scene.__class__.prepare = real
        gate.set()


def test_a_bad_scene_message_is_counted_and_changes_nothing():
    cam = camera()
    cam.feed("/twin/scene", NS(data="{not json"))
    cam.read(0.0)
    assert cam.twin is None and cam.twin_errors == 1
    with pytest.raises(ValueError, match="usable"):
        twin_view(json.dumps({"scene": "x"}))


def test_object_primitives_follow_the_scene_files_size_convention():
    box = object_primitive("b", "box", (0.1, 0.2, 0.3), (1, 0, 0, 1))
    cyl = object_primitive("c", "cylinder", (0.035, 0.12), (0, 1, 0, 1))
    ball = object_primitive("s", "sphere", (0.035,), (1, 1, 0, 1))
    np.testing.assert_allclose(box.size, (0.1, 0.2, 0.3))
    np.testing.assert_allclose(cyl.size, (0.07, 0.07, 0.12))
    np.testing.assert_allclose(ball.size, (0.07, 0.07, 0.07))
    with pytest.raises(ValueError, match="cylinder"):
        object_primitive("c", "cylinder", (0.1,), (0, 0, 0, 1))


def test_the_head_camera_node_draws_what_the_twin_publishes(ros_domain_id, pick_place_text):
    from geometry_msgs.msg import Pose, PoseArray
    from rclpy.node import Node
    from rclpy.qos import qos_profile_sensor_data
    from ros_helpers import wait_for
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from rynn_teleop.core.node_io import LATCHED, QoS
    from rynn_teleop.nodes.conversions import image_array
    from rynn_teleop.nodes.io import qos_profile
    from rynn_teleop.runner import Composition

    comp = Composition(["head_camera"], domain_id=ros_domain_id,
                       overrides={"head_camera": {"synthetic.profile": "160x120x30"}})
    try:
        twin = Node("fake_twin", context=comp.context)
        images: list[Image] = []
        twin.create_subscription(Image, "/head_camera/physical/color/image_raw", images.append,
                                 qos_profile_sensor_data)
        scene_pub = twin.create_publisher(String, "/twin/scene", qos_profile(LATCHED))
        objects_pub = twin.create_publisher(PoseArray, "/twin/objects", qos_profile(QoS(10)))
        here = np.array([0.62, 0.02, 0.681 + 0.035])
        message = layout_poses("pick_place", 3, {"red_cube": (here, yaw_quaternion(0.0))})
        poses = PoseArray()
        for p in message.poses:
            pose = Pose()
            pose.position.x, pose.position.y, pose.position.z = p.position.x, p.position.y, p.position.z
            pose.orientation.x, pose.orientation.y = p.orientation.x, p.orientation.y
            pose.orientation.z, pose.orientation.w = p.orientation.z, p.orientation.w
            poses.poses.append(pose)
        twin.create_timer(0.05, lambda: objects_pub.publish(poses))
        comp.add_node(twin)
        scene_pub.publish(String(data=pick_place_text))
        node = comp.node("head_camera")
        assert wait_for(lambda: node.source.twin is not None and len(images) > 3, 30.0)
        images.clear()
        assert wait_for(lambda: len(images) > 2, 10.0)
        u, v, _ = pixel(node.source, here)
        r, g, b = (int(c) for c in image_array(images[-1])[v, u])
        assert r > 2 * g and r > 2 * b
    finally:
        comp.shutdown()


def test_the_robot_free_reference_shows_the_twins_layout(pick_place_text):
    from rynn_teleop.sources.camera.synthetic import reference_frame

    frame = reference_frame(W, H, twin_scene=pick_place_text)
    plain = reference_frame(W, H)
    cam = camera()
    goal = json.loads(pick_place_text)["targets"][0]["center"]
    u, v, _ = pixel(cam, goal)
    r, g, b = (int(c) for c in frame[v, u])
    assert b > r and b > int(plain[v, u, 2]) + 30  # the blue goal region on the table, no robot drawn


def test_fixed_objects_of_a_scene_not_on_this_machine_wait_for_the_twins_poses():
    from rynn_teleop.sources.camera.synthetic import FixedPosesUnknown

    doc = json.loads(scene_text("bimanual_lift", 0))
    doc["scene"] = "a_scene_file_this_machine_does_not_have"
    text = json.dumps(doc)
    with pytest.raises(FixedPosesUnknown):
        twin_view(text)
    message = layout_poses("bimanual_lift", 0)
    poses = np.array([np.eye(4)] * len(message.poses))
    for T, p in zip(poses, message.poses):
        T[:3, 3] = (p.position.x, p.position.y, p.position.z)
    view = twin_view(text, poses)
    np.testing.assert_allclose(view.tabletop.fixed[0].pose[:3, 3], poses[1][:3, 3])  # the platform
    assert view.movable == (0,) and np.array_equal(view.initial, poses[[0]])  # the bar, where the twin has it
