"""The synthetic head camera: a procedurally drawn tabletop on a fixed frame grid (deterministic, ROS-free).

The scene (geometry, ray caster, units) is :mod:`.scene`; this module is the camera source that plays it:
frame k shows the scene at t = k / fps [s], with the ball sliding along x when ``moving``. Depth is uint16
millimetres, exact (no sensor noise or holes), registered to the colour image.

With ``draw_robot`` the robot stands at the table as the physical head camera sees it: every frame draws it,
at the newest joint positions given (:meth:`SyntheticScene.set_joint_positions`, the measured
``/joint_states`` in the node), over the scene, with the stack's robot renderer
(:class:`~rynn_teleop.core.robot_render.RobotRenderer`) through the same head camera the scene is seen from
(the description's, :func:`~rynn_teleop.core.camera_view.camera_pose`, and the scene's intrinsics).

The physical twin: given ``twin_scene_topic`` (the twin node's latched ``/twin/scene``) the source follows the
twin. When a scene arrives, the tabletop becomes the twin's (:class:`~.scene.TwinTabletop`: its table, fixed
objects and target regions, ray-cast once, in a background thread so that frames keep coming meanwhile; the old
layer is shown until the new one is ready), and every frame draws the twin's movable objects at the newest poses
received on ``twin_objects_topic`` (``/twin/objects``, ``base_link``) by its delivery, with the robot, in colour
and depth, through the same renderer (:class:`~rynn_teleop.core.robot_render.RobotRenderer`). Until a scene
arrives the procedural tabletop is drawn.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ...core.arm_teleop import DEFAULT_HOME
from ...core.camera import DEFAULT_DEPTH_SCALE, CameraFrame, CameraIntrinsics, parse_profile, profile_problem
from ...core.camera_view import DEFAULT_CAMERA_FRAME, camera_pose
from ...core.layout import SIDES
from ...core.node_io import LATCHED, NodeIO, QoS, Topic, unless, when
from ...core.params import Param
from ...core.robot_geometry import Primitive
from ...core.robot_model import RobotModel, arm_joint_names
from ...core.robot_render import RobotRenderer, Shading, object_primitive
from ...core.scheduling import lower_this_thread, name_this_thread
from ...core.trackers import frame_matrices
from ...core.transforms import make_transform
from ...errors import ConfigurationError
from .base import CAMERA_BACKENDS, DEFAULT_MAX_BACKLOG, CameraContext, CameraSource, MessageInput
from .scene import SceneImage, SceneObject, TabletopScene, TwinPatch, TwinShape, TwinTabletop

__all__ = ["SceneObject", "SyntheticScene", "TwinView", "home_position", "reference_frame", "twin_view"]

_LOG = logging.getLogger(__name__)

TWIN_OBJECTS_QOS = QoS(4, reliable=False)  # the newest poses count; best effort takes any publisher
_HIDDEN = make_transform((-1000.0, 0.0, 0.0))  # a pose behind the head camera: an object there is not drawn


class FixedPosesUnknown(ValueError):
    """A twin scene with fixed objects whose poses are not known yet (no scene file here, no /twin/objects yet)."""


class TwinView(NamedTuple):
    """What the camera draws of one ``/twin/scene``: the static part, and the objects that move."""

    scene: str  # the twin's scene name
    seed: int  # its layout
    tabletop: TwinTabletop  # table, fixed objects, targets (ray-cast into the static layer)
    movable: tuple[int, ...]  # indices, in the scene's object order (/twin/objects' order), of the moving objects
    primitives: tuple[Primitive, ...]  # their shapes, drawn over the static layer every frame
    initial: np.ndarray | None  # (M, 4, 4) [m] their layout poses in base_link (None: unknown)


def _layout_poses(scene: str, seed: int, names: list[str]) -> np.ndarray | None:
    """(N, 4, 4) the layout poses of the objects ``names`` of scene ``scene`` at ``seed`` (``rynn_teleop.sim``,
    the same as the twin's: the scene file and the seed determine them), None when this machine cannot read that
    scene or its objects are not ``names``."""
    from ...sim.scene import load_scene  # the scene files (no MuJoCo)

    try:
        layout = load_scene(scene).layout(seed)
        poses = [layout.objects[name] for name in names]
    except (ConfigurationError, KeyError, OSError):
        return None
    return np.array([make_transform(p.position, _quaternion_matrix(p.quaternion)) for p in poses])


def _quaternion_matrix(q: np.ndarray) -> np.ndarray:
    return frame_matrices(np.zeros((1, 3)), np.asarray(q, dtype=float)[None])[0, :3, :3]


def twin_view(text: str, poses: np.ndarray | None = None) -> TwinView:
    """The :class:`TwinView` of one ``/twin/scene`` JSON text (the twin node's ``sim.monitor.scene_description``:
    table, objects with shape, size, colour and ``fixed``, targets with centre, size, yaw, colour).

    The fixed objects' poses come from the scene's layout when this machine has the scene file, else from
    ``poses`` (N, 4, 4), the newest ``/twin/objects`` (all objects, scene order).

    Raises:
        ValueError: not the twin's scene JSON, or no poses for the fixed objects.
    """
    try:
        doc = json.loads(text)
        scene, seed = str(doc["scene"]), int(doc["seed"])
        table = doc["table"]
        center, size = [float(v) for v in table["center"]], [float(v) for v in table["size"]]
        top = float(table.get("top_z", center[2] + size[2] / 2))
        objects = list(doc["objects"])
        names = [str(o["name"]) for o in objects]
        layout = _layout_poses(scene, seed, names)
        if layout is None and poses is not None and len(poses) == len(objects):
            layout = np.asarray(poses, dtype=float)
        fixed, movable, primitives = [], [], []
        for i, o in enumerate(objects):
            rgba = tuple(float(v) for v in o.get("color", (0.7, 0.7, 0.7, 1.0)))
            if o.get("fixed", False):
                if layout is None:
                    raise FixedPosesUnknown(f"no pose for the fixed object {o['name']!r} (its scene file is not "
                                            "here and no /twin/objects came yet)")
                fixed.append(TwinShape(str(o["shape"]), tuple(float(v) for v in o["size"]), layout[i], rgba))
            else:
                movable.append(i)
                primitives.append(object_primitive(str(o["name"]), str(o["shape"]), o["size"], rgba))
        targets = tuple(TwinPatch(np.array([float(v) for v in t["center"]]), tuple(float(v) for v in t["size"][:2]),
                                  float(t.get("yaw", 0.0)),
                                  tuple(float(v) for v in t.get("color", (0.2, 0.8, 0.3, 0.35))))
                        for t in doc.get("targets", ()))
        tabletop = TwinTabletop((center[0], center[1]), (size[0], size[1]), top,
                                tuple(float(v) for v in table.get("color", (0.62, 0.43, 0.26, 1.0))),
                                tuple(fixed), targets)
    except FixedPosesUnknown:
        raise
    except (KeyError, TypeError, ValueError, IndexError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a usable /twin/scene: {exc!r}") from None
    initial = None if layout is None else layout[movable]
    return TwinView(scene, seed, tabletop, tuple(movable), tuple(primitives), initial)


class _Ahead(NamedTuple):
    """Frame ``k`` rendered ahead of its delivery."""

    k: int
    scene: SceneImage  # the scene alone
    frame: CameraFrame | None  # the frame with the robot at ``q`` (None: not drawn yet)
    q: np.ndarray  # (54,) [rad] the joints ``frame`` shows
    objects: int  # the twin object poses it shows (:attr:`SyntheticScene._objects_version`)


def home_position(robot: RobotModel) -> np.ndarray:
    """(54,) [rad] the robot's home pose, canonical order: the arms at
    :data:`~rynn_teleop.core.arm_teleop.DEFAULT_HOME` (where the simulated arm driver starts and the teleop
    calibrates: forearms forward, hands in the head camera's view), every other joint at
    :meth:`RobotModel.neutral` (hands open)."""
    q = robot.neutral()
    q[robot.indices([n for side in SIDES for n in arm_joint_names(side)])] = DEFAULT_HOME
    return q


def reference_frame(width: int, height: int, robot: RobotModel | None = None, seed: int = 0,
                    twin_scene: str | None = None) -> np.ndarray:
    """(H, W, 3) uint8 the head camera's view without the robot: the procedural tabletop of ``seed``, or, given a
    ``/twin/scene`` JSON text, the twin's table, targets and objects at their layout poses (where an episode on
    that layout starts). The world model's reference frame: its ``render`` backend draws the commanded robot over
    it and moves nothing else (it has no physics; a learned model predicts the objects).

    Raises:
        ValueError: an unusable ``twin_scene`` (:func:`twin_view`).
    """
    scene = SyntheticScene(width, height, 30.0, seed=seed, depth=False, draw_robot=False, robot_model=robot,
                           twin_scene_topic="/twin/scene" if twin_scene is not None else "",
                           twin_in_background=False)
    scene.start(0.0)
    try:
        if twin_scene is not None:
            twin_view(twin_scene)  # a bad message is an error here, not a counter
            scene.feed("/twin/scene", twin_scene)
        return scene.read(0.0)[0].color
    finally:
        scene.close()


@CAMERA_BACKENDS.register
class SyntheticScene(CameraSource):
    """The tabletop of :class:`~.scene.TabletopScene` as a camera source on a fixed frame grid.

    Frames exist at t_k = t_start + k / fps [s]; :meth:`read` returns the ones
    not yet returned with t_k <= now, oldest first, at most ``max_backlog``
    per call (the newest; older due frames are dropped and counted in
    :attr:`dropped`). A frame depends only on (seed, k / fps), never on when
    :meth:`read` is called.

    With ``draw_robot``, each frame also shows the robot (see the module doc) at the newest joint positions
    given by :meth:`set_joint_positions` when :meth:`read` delivers it (a frame rendered ahead by
    :meth:`prepare_next` is drawn again if the joints changed since), so a frame never shows joints older
    than its delivery; before any, at :func:`home_position`. The robot is drawn over the scene where it is
    nearer than the scene, in colour and depth alike. Its depth at a pixel is where the pixel centre's ray
    enters the primitive the colour shows there (exact for these flat-faced convex shapes:
    :meth:`~rynn_teleop.core.robot_render.PrimitiveRenderer.draw_depth`), rounded to mm. Where the scene's
    depth there is nearer (or equal) the scene stays, colour and depth (an anti-aliased robot outline may
    blend one pixel into it).

    Attributes:
        scene: the geometry and ray caster.
        camera_intrinsics: intrinsics of colour and depth (known before :meth:`start`).
        T_world_camera: (4, 4) the optical frame in the scene's world frame [m].
        objects: the scene's objects (cube, cylinder, bowl, ball).
        robot_model: the description: where the head camera is (always) and the robot drawn.
        painter: the robot renderer (None without ``draw_robot``).
        joint_positions: (54,) [rad] the joints the robot is drawn at (read-only copy).
        joint_stamp: [s] the stamp given with them (None for the home pose or when none was given).
    """

    name = "synthetic"
    aligns_to_ticks = True  # its frame grid starts on a tick of the node's loop
    prepare_between_frames = True  # the next frame is rendered half a frame after one is delivered
    SETTINGS = (
        Param("profile", str, "640x480x30", "WIDTHxHEIGHTxFPS", check=profile_problem),
        Param("seed", int, 0, "random seed", min=0, max=2**31 - 1),
        Param("depth", bool, True, "also publish depth"),
        Param("draw_robot", bool, True, "draw the robot at the measured joint states over the tabletop (colour "
              "and depth), as the head camera on the robot sees it"),
        Param("joint_states_topic", str, "/joint_states", "(draw_robot) measured joint states the robot is drawn at"),
        Param("twin_scene_topic", str, "/twin/scene", "the physical twin's scene (latched JSON): once it comes, the "
              "twin's table, targets and objects are drawn instead of the procedural tabletop; empty: never"),
        Param("twin_objects_topic", str, "/twin/objects", "the twin's object poses (PoseArray, base_link, the "
              "scene's object order): each frame shows the newest received by its delivery"),
    )
    IO = NodeIO(subscriptions=(
        Topic("{joint_states_topic}", "sensor_msgs/msg/JointState", QoS(50),
              "the measured joints the robot is drawn at (any subset of the 54 per message, merged by name; "
              "drained twice a frame: 50 hold 1/6 s of the drivers' output)", when=(when("draw_robot", True),)),
        Topic("{twin_scene_topic}", "std_msgs/msg/String", LATCHED,
              "the twin's scene (table, objects, targets; again at each reset): its tabletop is drawn from then on",
              when=(unless("twin_scene_topic", ""),)),
        Topic("{twin_objects_topic}", "geometry_msgs/msg/PoseArray", TWIN_OBJECTS_QOS,
              "the twin's object poses, drawn at the newest by each frame's delivery (drained twice a frame)",
              when=(unless("twin_scene_topic", ""),)),
    ))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: CameraContext) -> SyntheticScene:
        """The scene seen from the node's robot description's head camera."""
        profile = parse_profile(settings["profile"])
        return cls(width=profile.width, height=profile.height, fps=float(profile.fps), seed=settings["seed"],
                   depth=settings["depth"], draw_robot=settings["draw_robot"], robot_model=context.robot(),
                   joint_states_topic=settings["joint_states_topic"], twin_scene_topic=settings["twin_scene_topic"],
                   twin_objects_topic=settings["twin_objects_topic"])

    def __init__(
        self,
        width: int = 640,
        height: int = 480,
        fps: float = 30.0,
        seed: int = 0,
        depth: bool = True,
        moving: bool = True,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        draw_robot: bool = False,
        robot_model: RobotModel | None = None,
        shading: Shading | None = None,
        joint_states_topic: str = "/joint_states",
        twin_scene_topic: str = "",
        twin_objects_topic: str = "/twin/objects",
        twin_in_background: bool = True,
    ) -> None:
        """
        Args:
            width, height: image size [px] (16..4096).
            fps: frame rate [Hz] (> 0).
            seed: seed of the object layout (and the wood pattern).
            depth: produce depth images.
            moving: the ball slides (otherwise every frame is the same).
            max_backlog: most frames one :meth:`read` returns [frames] (>= 1).
            draw_robot: draw the robot at the given joints over the scene (off: the tabletop alone).
            robot_model: the description: the head camera the scene is seen from and the robot drawn
                (default :meth:`RobotModel.default`, built once per process).
            shading: how the robot is lit and tessellated (default
                :class:`~rynn_teleop.core.robot_render.Shading`, as the world model's render backend).
            joint_states_topic: (``draw_robot``) the measured joint states a node hands to
                :meth:`set_joint_positions` (:attr:`joint_states_topic`: None without ``draw_robot``).
            twin_scene_topic: the twin's ``/twin/scene`` (see the module doc; empty: no twin is followed).
            twin_objects_topic: the twin's ``/twin/objects``.
            twin_in_background: ray-cast a twin scene's static layer in a background thread (False: in the
                :meth:`read` or :meth:`prepare_next` that takes it).

        Raises:
            ConfigurationError: a size, rate or backlog out of range; a description whose head camera is
                not fixed to the torso or not above the table.
        """
        super().__init__()
        self.robot_model = robot_model if robot_model is not None else RobotModel.default()
        self.scene = TabletopScene(width, height, seed, camera_pose(self.robot_model, DEFAULT_CAMERA_FRAME))
        if not (math.isfinite(fps) and fps > 0):
            raise ConfigurationError(f"synthetic camera: fps must be > 0, got {fps}")
        if int(max_backlog) < 1:
            raise ConfigurationError(f"synthetic camera: max_backlog must be >= 1, got {max_backlog}")
        self.width, self.height = self.scene.width, self.scene.height
        self.fps = float(fps)
        self.seed = self.scene.seed
        self.depth = bool(depth)
        self.moving = bool(moving)
        self.max_backlog = int(max_backlog)
        self.camera_intrinsics: CameraIntrinsics = self.scene.intrinsics
        self.T_world_camera = self.scene.T_world_camera
        self.objects = self.scene.objects
        self.draw_robot = bool(draw_robot)
        self.joint_states_topic = joint_states_topic if self.draw_robot else None
        self.twin_scene_topic = twin_scene_topic.strip()
        self.twin_objects_topic = twin_objects_topic
        self.painter = (RobotRenderer(self.robot_model, self.camera_intrinsics, shading, DEFAULT_CAMERA_FRAME,
                                      draw_robot=self.draw_robot)
                        if self.draw_robot or self.twin_scene_topic else None)
        self.twin: TwinView | None = None  # the twin scene drawn (None: the procedural tabletop)
        self.twin_scenes = 0  # [-] twin scenes drawn
        self.twin_errors = 0  # [-] /twin/scene messages that could not be drawn
        self.twin_object_updates = 0  # [-] /twin/objects messages taken
        self._twin_in_background = bool(twin_in_background)
        self._twin_text: str | None = None  # the newest /twin/scene not drawn yet
        self._twin_poses: np.ndarray | None = None  # (N, 4, 4) newest /twin/objects, scene order
        self._twin_stamp: float | None = None  # [s] its header stamp
        self._twin_build: threading.Thread | None = None
        self._twin_built: tuple[TwinView, TabletopScene] | None = None  # ready to be shown
        self._objects_version = 0  # +1 per /twin/objects taken (a frame rendered ahead shows one version)
        self._q = home_position(self.robot_model)
        self._q.flags.writeable = False
        self.joint_stamp: float | None = None
        self.joint_updates = 0  # set_joint_positions calls accepted
        self._t_start: float | None = None
        self._next_k = 0
        self._ahead: _Ahead | None = None  # frame k rendered ahead of time
        self._q_prepared = self._q  # the joints at the previous prepare_next
        self._objects_prepared = 0  # the twin object poses at the previous prepare_next
        self._closed = False

    def poll_rate(self, poll_hz: float) -> float:
        """Two ticks per frame, on the frame grid: a frame is published right at its capture time, the next one
        rendered ahead half a frame later (work right after a publish delays its delivery to other processes by
        that long: bench/camera.py). ``poll_hz`` is not used."""
        return 2.0 * self.fps

    @property
    def nominal_fps(self) -> float:
        return self.fps

    @property
    def joint_positions(self) -> np.ndarray:
        """(54,) [rad] the joints the robot is drawn at, canonical order (read-only)."""
        return self._q

    def set_joint_positions(self, q: np.ndarray, stamp: float | None = None) -> None:
        """Draw the robot at ``q`` from the next frame delivered on.

        Args:
            q: (54,) joint positions [rad] in the canonical order (``robot_model.joint_names``).
            stamp: when they were measured [s] (kept as :attr:`joint_stamp`).

        Raises:
            ValueError: not a finite (54,) vector.
        """
        q = np.array(q, dtype=float)
        if q.shape != self._q.shape or not np.all(np.isfinite(q)):
            raise ValueError(f"synthetic camera: joint positions must be a finite {self._q.shape} vector, got "
                             f"shape {q.shape}")
        q.flags.writeable = False
        self._q = q
        self.joint_stamp = None if stamp is None else float(stamp)
        self.joint_updates += 1

    # ----------------------------------------------------------------------------- the physical twin
    def message_inputs(self) -> dict[str, MessageInput]:
        """The twin's scene and objects (with ``twin_scene_topic``)."""
        if not self.twin_scene_topic:
            return {}
        return {self.twin_scene_topic: MessageInput("std_msgs/msg/String", LATCHED),
                self.twin_objects_topic: MessageInput("geometry_msgs/msg/PoseArray", TWIN_OBJECTS_QOS)}

    def feed(self, topic: str, message: Any) -> None:
        """A ``/twin/scene`` (``message.data``: JSON; drawn from a later frame on) or ``/twin/objects``
        (``message.poses``: the poses drawn from the next frame delivered on) message."""
        if topic == self.twin_scene_topic:
            self._twin_text = str(getattr(message, "data", message))
        elif topic == self.twin_objects_topic:
            poses = message.poses
            positions = [(p.position.x, p.position.y, p.position.z) for p in poses]
            quaternions = [(p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w) for p in poses]
            self.set_object_poses(frame_matrices(np.array(positions, float).reshape(-1, 3),
                                                 np.array(quaternions, float).reshape(-1, 4)))

    def set_object_poses(self, poses: np.ndarray) -> None:
        """The twin's objects (N, 4, 4) [m] in ``base_link``, in the scene's object order, drawn from the next
        frame delivered on (a pose with NaN keeps that object at its previous pose)."""
        poses = np.array(poses, dtype=float)
        old = self._twin_poses
        if old is not None and old.shape == poses.shape:
            bad = ~np.isfinite(poses).all(axis=(1, 2))
            poses[bad] = old[bad]
        self._twin_poses = poses
        self.twin_object_updates += 1
        self._objects_version += 1

    def _take_twin(self) -> None:
        """Show a twin scene that is ready; start building the newest one received (one at a time)."""
        built = self._twin_built  # set once by the build thread, as its last step
        if built is not None:
            self._twin_built = None
            view, scene = built
            self.scene, self.twin, self.objects = scene, view, scene.objects
            self.painter.set_objects(view.primitives)
            self.twin_scenes += 1
            self._ahead = None  # rendered over the old layer
            _LOG.info("synthetic camera: the twin's %s, seed %d", view.scene, view.seed)
        if self._twin_text is None or (self._twin_build is not None and self._twin_build.is_alive()):
            return
        text, self._twin_text = self._twin_text, None
        try:
            view = twin_view(text, self._twin_poses)
        except FixedPosesUnknown:
            self._twin_text = text  # again once the first /twin/objects came
            return
        except ValueError as exc:
            self.twin_errors += 1
            _LOG.error("synthetic camera: %s", exc)
            return
        if self.twin is not None and (view.scene, view.seed) == (self.twin.scene, self.twin.seed):
            return  # the same layout again (a reset to the same seed): nothing to redraw

        def build() -> None:
            scene = TabletopScene(self.width, self.height, self.seed, self.scene.T_base_camera, twin=view.tabletop)
            scene.prepare()
            self._twin_built = (view, scene)

        def build_in_background() -> None:
            # behind the frames: a lowered thread gives way to the frame loop as soon as it wakes. At the frame
            # loop's own real-time priority, on the CPU the process is placed on, it would run a whole round-robin
            # time slice (100 ms) before the frame loop got the CPU back (measured: a 0.19 s gap in the frames).
            lower_this_thread()
            name_this_thread("head_camera:twin")
            build()

        if self._twin_in_background:
            self._twin_build = threading.Thread(target=build_in_background, name="synthetic camera: twin scene",
                                                daemon=True)
            self._twin_build.start()
        else:
            build()
            self._take_twin()

    def _object_poses(self) -> np.ndarray | None:
        """(M, 4, 4) the moving objects of the twin scene drawn, at the newest poses (None: no twin)."""
        view = self.twin
        if view is None:
            return None
        poses = self._twin_poses
        if poses is not None and len(poses) > max(view.movable, default=-1):
            poses = poses[list(view.movable)]
        elif view.initial is not None:
            poses = view.initial
        else:
            poses = np.full((len(view.movable), 4, 4), np.nan)
        unknown = ~np.isfinite(poses).all(axis=(1, 2))
        if unknown.any():  # not known yet: far behind the camera (culled, not drawn)
            poses = poses.copy()
            poses[unknown] = _HIDDEN
        return poses

    def ball_center(self, t: float) -> np.ndarray:
        """(3,) world position [m] of the ball's centre at ``t`` [s since start] (its t = 0 place unless moving)."""
        return self.scene.ball_center(t if self.moving else 0.0)

    def render(self, t: float) -> CameraFrame:
        """The frame at ``t`` [s since start] (stamp = t), the robot (with ``draw_robot``) at
        :attr:`joint_positions`; identical for identical (seed, t, joints)."""
        return self._finish(self._render_scene(t), t, self._q)

    def _render_scene(self, t: float) -> SceneImage:
        """The scene alone at ``t`` (fresh arrays); with depth also when only the robot needs it."""
        ball = None if self.twin is not None else self.ball_center(t)
        return self.scene.render(ball, depth=self.depth or self.painter is not None)

    def _finish(self, image: SceneImage, t: float, q: np.ndarray) -> CameraFrame:
        """The frame at ``t`` of ``image`` (the scene, left as it is): the robot at ``q`` and the twin's objects at
        their newest poses over it, when drawn."""
        color, depth = image
        if self.painter is not None and (self.draw_robot or self.twin is not None):
            color, depth = self._draw_robot(color, depth, q)
        return CameraFrame(float(t), color, depth if self.depth else None, DEFAULT_DEPTH_SCALE)

    def _draw_robot(self, color: np.ndarray, depth_mm: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """New colour and depth images: the robot at ``q`` (and the twin's objects) over the scene ``color``
        (H, W, 3) and ``depth_mm`` (H, W) uint16 (see the class doc)."""
        drawn, depth = color.copy(), depth_mm.copy()
        objects = self._object_poses() if self.painter.objects else None
        v, u, z = self.painter.draw_depth(drawn, q, objects)
        at = v * depth.shape[1] + u  # flat pixel indices
        robot_mm = np.minimum(z * 1000.0 + 0.5, 65535.0).astype(np.uint16)  # rounded (z > 0)
        scene_mm = depth_mm.ravel()[at]
        shown = (scene_mm == 0) | (robot_mm < scene_mm)  # else the scene is nearer (or as near): it stays
        depth.ravel()[at[shown]] = robot_mm[shown]
        hidden = at[~shown]
        if len(hidden):
            drawn.reshape(-1, 3)[hidden] = color.reshape(-1, 3)[hidden]
        return drawn, depth

    # ----------------------------------------------------------------------------- source
    def start(self, now: float) -> None:
        """Start the timeline at ``now`` [s] (restarting it if already started); renders the static scene."""
        self.scene.prepare()
        self._intrinsics = self.camera_intrinsics
        self._depth_intrinsics = self.camera_intrinsics if self.depth else None
        self._t_start = float(now)
        self._next_k = 0
        self._ahead = None
        self._closed = False

    def read(self, now: float) -> list[CameraFrame]:
        """Every grid frame with t_k <= ``now`` [s] not returned yet, oldest first (at most ``max_backlog``)."""
        if self._t_start is None or self._closed:
            raise RuntimeError("SyntheticScene.read() called before start() or after close()")
        if self.twin_scene_topic:
            self._take_twin()
        last_k = math.floor((now - self._t_start) * self.fps + 1e-9)
        if last_k - self._next_k + 1 > self.max_backlog:
            skipped = last_k - self.max_backlog + 1 - self._next_k
            self.dropped += skipped
            _LOG.debug("synthetic camera: %d frames due; dropped the oldest %d", last_k - self._next_k + 1, skipped)
            self._next_k += skipped
        out: list[CameraFrame] = []
        while self._next_k <= last_k:
            t = self._next_k / self.fps
            ahead, self._ahead = self._ahead, None
            if ahead is None or ahead.k != self._next_k:
                frame = self._finish(self._render_scene(t), t, self._q)
            elif (ahead.frame is not None and np.array_equal(ahead.q, self._q)
                  and ahead.objects == self._objects_version):
                frame = ahead.frame
            else:  # the robot moved since the frame was rendered ahead: drawn again at the newest joints
                frame = self._finish(ahead.scene, t, self._q)
            out.append(frame._replace(stamp=self._t_start + t))
            self._next_k += 1
        return out

    def prepare_next(self) -> None:
        """Render the next grid frame now, so the next :meth:`read` returns it without rendering: the scene, and
        the robot (with ``draw_robot``) at the joints it has now if they did not change since the previous
        call (a still robot); :meth:`read` draws the robot again if the joints it then has differ."""
        if self._t_start is None or self._closed:
            return
        if self.twin_scene_topic:
            self._take_twin()
        if self._ahead is None or self._ahead.k != self._next_k:
            t = self._next_k / self.fps
            scene = self._render_scene(t)
            still = self.painter is None or (np.array_equal(self._q, self._q_prepared)
                                             and self._objects_version == self._objects_prepared)
            self._ahead = _Ahead(self._next_k, scene, self._finish(scene, t, self._q) if still else None, self._q,
                                 self._objects_version)
        self._q_prepared = self._q
        self._objects_prepared = self._objects_version

    def close(self) -> None:
        """Stop producing frames (idempotent); the rendered static scene is kept for a restart."""
        self._closed = True

    def diagnostics(self) -> dict[str, object]:
        values: dict[str, object] = {"dropped": self.dropped, "draw_robot": self.draw_robot}
        if self.draw_robot:
            values["joint_updates"] = self.joint_updates
        if self.twin_scene_topic:
            values["twin"] = "none" if self.twin is None else f"{self.twin.scene} seed {self.twin.seed}"
            values["twin_object_updates"] = self.twin_object_updates
            if self.twin_errors:
                values["twin_errors"] = self.twin_errors
        return values
