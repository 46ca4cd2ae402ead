"""twin node: the physical twin of the robot and its task scene (MuJoCo), for the digital mode.

Creates the process's physics world (``rynn_teleop.sim``: the robot from its description, the ``scene`` of
``config/sim/`` with the objects laid out by ``seed``, the robot at home) and steps it against the node clock
on a :class:`~.base.ControlLoop` of its own at ``physics_rate_hz`` (>= 500 Hz: every tick steps the world to the
tick's time in 2 ms physics steps). The arm and hand drivers' ``sim`` backends (``hardware.twin``) in the same
process set and read their joints of that world, so the twin and the drivers run in one process
(``rynn-teleop run twin arm_driver hand_driver``; the launch file does so in the digital mode).

Publishes what the rest of the stack needs to see and judge the scene (``sim.monitor``): the objects' poses
(``/twin/objects``, PoseArray in ``base_link``, in the scene file's object order, stamped with the simulated
instant on the node clock; TF frames ``twin/<object>`` where tf2_msgs is installed), markers of the objects,
targets and table for RViz and Foxglove, the scene (``/twin/scene``, latched JSON: everything a renderer needs)
and the task's outcome (``/twin/outcome``, latched JSON: success true/false/null, reason, task, t), which the
recorder writes into an episode's ``episode.yaml`` when no operator labelled it.

``~/reset``: the next layout (seed + 1) with the robot back at its home posture (the drivers restart their
safety layer from the new measurement; commands are followed again, ramped, once fresh). Setting the ``seed``
parameter resets to that layout (``ros2 param set /twin seed 7``: how a replay gets an episode's layout back).
"""

from __future__ import annotations

import json

from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import Pose, PoseArray, TransformStamped
from rclpy.parameter import Parameter
from std_msgs.msg import String
from std_srvs.srv import Trigger
from visualization_msgs.msg import Marker, MarkerArray

from ..core import node_io
from ..core.node_io import NodeIO, QoS, Service, Topic, when
from ..core.params import Param, ParamSchema
from ..core.status import TwinStatus
from ..errors import ConfigurationError
from ..sim.shared import DEFAULT_WORLD, create_world, detach
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single

try:  # not on PyPI (a ROS install has it): without it the objects are PoseArray and markers only
    from tf2_msgs.msg import TFMessage
except ImportError:  # pragma: no cover - depends on the install
    TFMessage = None

FRAME_ID = "base_link"  # the twin's world frame
TF_PREFIX = "twin/"  # TF child frame of an object: twin/<object name>
_MARKER = {"box": Marker.CUBE, "cylinder": Marker.CYLINDER, "sphere": Marker.SPHERE}
TARGET_THICKNESS = 0.002  # [m] a target region's marker (a flat box on its support)


class TwinNode(TeleopNode):
    PRIORITY = "control"  # the physics the drivers measure
    SCHEMA = ParamSchema(
        "twin",
        [
            DESCRIPTION_OVERLAY,
            Param("scene", str, "pick_place", "task scene: a file name in config/sim/ (without .yaml) or a path"),
            Param("seed", int, 0, "layout of the objects (their initial poses); setting it resets to that layout",
                  min=0, max=2**31 - 1, dynamic=True),
            Param("world", str, DEFAULT_WORLD, "name of the process's physics world (the drivers' sim backend "
                  "setting `world`)"),
            Param("physics_rate_hz", float, 500.0, "the world is stepped to the node clock this often (2 ms "
                  "physics steps)", "Hz", min=500.0, max=2000.0),
            Param("objects_rate_hz", float, 60.0, "/twin/objects (and TF) rate", "Hz", min=1.0, max=500.0),
            Param("markers_rate_hz", float, 10.0, "/twin/markers rate (RViz, Foxglove)", "Hz", min=0.5, max=60.0),
            Param("outcome_rate_hz", float, 10.0, "the task is judged this often; /twin/outcome is published when "
                  "the outcome or its reason changes", "Hz", min=1.0, max=100.0),
        ],
    )
    IO = NodeIO(
        publishers=(
            Topic("/twin/objects", "geometry_msgs/msg/PoseArray", QoS(10),
                  "every object's pose in base_link, in the scene file's object order (/twin/scene names them), "
                  "stamped with the simulated instant on the node clock, at objects_rate_hz"),
            Topic("/twin/scene", "std_msgs/msg/String", node_io.LATCHED,
                  "JSON: scene, seed, task, table, objects (name, shape, size [m], color RGBA, mass, fixed) and "
                  "targets (name, center, size, yaw, support, color) as laid out, stamp (node clock [s] when this "
                  "layout was set: the synthetic operator starts its plan from it), resets (0: the start-up layout); "
                  "again at every reset"),
            Topic("/twin/outcome", "std_msgs/msg/String", node_io.LATCHED,
                  "JSON: success (true: the task's predicate holds now; false: it cannot any more; null: "
                  "undecided), reason, task, t [s of simulated time]; when it changes, at most outcome_rate_hz"),
            Topic("/twin/markers", "visualization_msgs/msg/MarkerArray", QoS(2),
                  "the objects, target regions and table as markers in base_link (namespace twin), at "
                  "markers_rate_hz"),
            Topic("/tf", "tf2_msgs/msg/TFMessage", QoS(100),
                  "frames twin/<object> (children of base_link) at objects_rate_hz, where tf2_msgs is installed",
                  when=(when("tf2_msgs", True),)),
        ),
        services=(
            Service("~/reset", "std_srvs/srv/Trigger", "the next layout (seed + 1), the robot back at its home "
                    "posture (the drivers restart from the new measurement)"),
        ),
        facts={"tf2_msgs": "the tf2_msgs message package is installed (then the objects are TF frames too)"},
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        from ..sim.model import TwinSettings
        from ..sim.monitor import TaskMonitor
        from ..sim.physics import PhysicsWorld
        from ..sim.rollout import home_posture
        from ..sim.scene import load_scene

        p = self.params
        scene = load_scene(p["scene"])  # a SceneError names the file and key
        overlay = p["description_overlay"] or None
        home = home_posture(robot_from_overlay(p["description_overlay"]))
        self.shared = create_world(
            p["world"], lambda: PhysicsWorld(scene, p["seed"], settings=TwinSettings(overlay=overlay), initial=home),
            owner=f"the twin node {self.get_fully_qualified_name()}", home=home)
        try:
            self._set_up(p, TaskMonitor)
        except BaseException:
            detach(self.shared.name, self.shared.owner)  # the process may start another twin (a test, a retry)
            raise
        self.get_logger().info(f"twin: scene {scene.name} (seed {p['seed']}): {self.monitor.task.name}; physics at "
                               f"{p['physics_rate_hz']:.0f} Hz in world {p['world']!r}"
                               + ("" if TFMessage is not None else "; tf2_msgs not installed: no TF frames"))

    def _set_up(self, p, monitor_cls) -> None:
        self.world = self.shared.world
        self.monitor = monitor_cls(self.world)
        self.outcome = self.monitor.update()
        self._seed_param = p["seed"]
        self.resets = 0
        self.io_facts["tf2_msgs"] = TFMessage is not None
        self._objects_pub = self.io_publisher("/twin/objects")
        self._scene_pub = self.io_publisher("/twin/scene")
        self._outcome_pub = self.io_publisher("/twin/outcome")
        self._markers_pub = self.io_publisher("/twin/markers")
        self._tf_pub = self.io_publisher("/tf") if TFMessage is not None else None
        self.io_service("~/reset", self._srv_reset)
        self._objects_msg = PoseArray()
        self._objects_msg.header.frame_id = FRAME_ID
        self._published_outcome: tuple | None = None
        self._layout_stamp_s = self.now_s()  # [s] node clock when the current layout was set (start, ~/reset)
        self._physics_meter = self.meter("physics", nominal_hz=p["physics_rate_hz"])
        self._objects_meter = self.meter("objects", nominal_hz=p["objects_rate_hz"])
        self._publish_scene()
        self._publish_outcome(force=True)
        self.create_loop(p["physics_rate_hz"], self._step, "physics")
        self.create_loop(p["objects_rate_hz"], self._publish_objects, "objects")
        self.create_loop(p["outcome_rate_hz"], self._judge, "outcome")
        self.create_timer(1.0 / p["markers_rate_hz"], self._publish_markers)

    # ------------------------------------------------------------------ loops
    def _step(self) -> None:
        now = self.now_s()
        self.shared.advance(now)
        self._physics_meter.tick(now)

    def _publish_objects(self) -> None:
        from ..sim.monitor import object_poses

        with self.world.lock:
            poses = object_poses(self.world)
            stamp_s = self.shared.clock_time(self.world.time)
        msg = self._objects_msg
        _set_stamp(msg.header.stamp, stamp_s)
        msg.poses = [_pose(p) for p in poses]
        self._objects_pub.publish(msg)
        if self._tf_pub is not None:
            transforms = []
            for spec, pose in zip(self.world.scene.objects, msg.poses):
                t = TransformStamped(child_frame_id=TF_PREFIX + spec.name)
                t.header = msg.header
                t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (
                    pose.position.x, pose.position.y, pose.position.z)
                t.transform.rotation = pose.orientation
                transforms.append(t)
            self._tf_pub.publish(TFMessage(transforms=transforms))
        self._objects_meter.tick(self.now_s())

    def _judge(self) -> None:
        seed = self.get_parameter("seed").value
        if seed != self._seed_param:  # set from outside: that layout
            self._seed_param = seed
            self.reset(seed)
            return
        self.outcome = self.monitor.update()
        self._publish_outcome()

    def _publish_markers(self) -> None:
        from ..sim.monitor import object_poses

        world = self.world
        with world.lock:
            poses = object_poses(world)
            stamp_s = self.shared.clock_time(world.time)
        markers = []
        scene, layout = world.scene, world.layout
        for i, (spec, pose) in enumerate(zip(scene.objects, poses)):
            m = _marker("twin/objects", i, _MARKER[spec.shape], spec.colour, stamp_s)
            m.pose = _pose(pose)
            if spec.shape == "box":
                m.scale.x, m.scale.y, m.scale.z = (float(v) for v in spec.size)
            elif spec.shape == "cylinder":
                m.scale.x = m.scale.y = 2.0 * spec.size[0]
                m.scale.z = float(spec.size[1])
            else:
                m.scale.x = m.scale.y = m.scale.z = 2.0 * spec.size[0]
            markers.append(m)
        for i, spec in enumerate(scene.targets):
            region = layout.targets[spec.name]
            m = _marker("twin/targets", i, Marker.CUBE, spec.colour, stamp_s)
            m.pose.position.x, m.pose.position.y = float(region.center[0]), float(region.center[1])
            m.pose.position.z = float(region.center[2]) + TARGET_THICKNESS / 2
            _yaw(m.pose, region.yaw)
            m.scale.x, m.scale.y, m.scale.z = float(spec.size[0]), float(spec.size[1]), TARGET_THICKNESS
            markers.append(m)
        table = scene.table
        m = _marker("twin/table", 0, Marker.CUBE, table.colour, stamp_s)
        m.pose.position.x, m.pose.position.y, m.pose.position.z = (float(table.center[0]), float(table.center[1]),
                                                                   table.height / 2)
        m.pose.orientation.w = 1.0
        m.scale.x, m.scale.y, m.scale.z = float(table.size[0]), float(table.size[1]), float(table.height)
        markers.append(m)
        self._markers_pub.publish(MarkerArray(markers=markers))

    # ------------------------------------------------------------------ scene and outcome
    def _publish_scene(self) -> None:
        from ..sim.monitor import scene_description

        doc = scene_description(self.world) | {"stamp": self._layout_stamp_s, "resets": self.resets}
        self._scene_pub.publish(String(data=json.dumps(doc)))

    def _publish_outcome(self, force: bool = False) -> None:
        key = (self.outcome.success, self.outcome.reason)
        if force or key != self._published_outcome:
            self._published_outcome = key
            self._outcome_pub.publish(String(data=json.dumps(self.outcome.to_dict())))

    def reset(self, seed: int) -> None:
        """Lay the objects out by ``seed``, put the robot back at home, restart simulated time now."""
        self._layout_stamp_s = self.now_s()
        self.shared.reset(self._layout_stamp_s, seed)
        self.monitor.reset()
        self.outcome = self.monitor.update()
        self.resets += 1
        self._publish_scene()
        self._publish_outcome(force=True)
        self.get_logger().info(f"twin reset: layout {seed}, robot at home")

    def _srv_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        seed = int(self.world.seed) + 1
        try:
            self.reset(seed)
            self._seed_param = seed
            self.set_parameters([Parameter("seed", Parameter.Type.INTEGER, seed)])
        except ConfigurationError as exc:
            response.success, response.message = False, str(exc)
            return response
        response.success = True
        response.message = (f"layout {seed} of scene {self.world.scene.name}, the robot at home; the drivers follow "
                            "fresh commands again, ramped")
        return response

    # ------------------------------------------------------------------ diagnostics
    def twin_status(self) -> TwinStatus:
        return TwinStatus(scene=self.world.scene.name, seed=int(self.world.seed), task=self.monitor.task.name,
                          outcome=self.outcome.label, reason=self.outcome.reason, sim_time_s=self.world.time,
                          slipped_s=self.shared.slipped_s)

    def diagnostic_values(self):
        return self.twin_status().values({"world": self.shared.name, "world_users": ",".join(sorted(self.shared.users)),
                                          "resets": self.resets, "tf": TFMessage is not None})

    def diagnostic_level(self):
        outcome, world = self.outcome, self.world
        return DiagnosticStatus.OK, f"{world.scene.name} seed {world.seed}: {outcome.label} ({outcome.reason})"

    def destroy_node(self) -> None:
        self.stop_loops()
        shared = getattr(self, "shared", None)
        if shared is not None:
            detach(shared.name, shared.owner)
        super().destroy_node()


def _set_stamp(stamp, seconds: float) -> None:
    stamp.sec, stamp.nanosec = divmod(int(round(seconds * 1e9)), 1_000_000_000)


def _pose(pose) -> Pose:
    out = Pose()
    out.position.x, out.position.y, out.position.z = (float(v) for v in pose.position)
    q = pose.quaternion
    out.orientation.x, out.orientation.y, out.orientation.z, out.orientation.w = (float(v) for v in q)
    return out


def _yaw(pose: Pose, yaw: float) -> None:
    import math

    pose.orientation.z, pose.orientation.w = math.sin(yaw / 2), math.cos(yaw / 2)


def _marker(ns: str, i: int, kind: int, colour, stamp_s: float) -> Marker:
    m = Marker(ns=ns, id=i, type=kind, action=Marker.ADD)
    m.header.frame_id = FRAME_ID
    _set_stamp(m.header.stamp, stamp_s)
    m.color.r, m.color.g, m.color.b, m.color.a = (float(c) for c in colour)
    return m


def main(args=None) -> int:
    return run_single(TwinNode, args)
