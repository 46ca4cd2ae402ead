"""The synthetic head camera: a procedurally drawn tabletop on a fixed frame grid (deterministic, ROS-free).

The scene (geometry, ray caster, units) is :mod:`.scene`; this module is the camera source that plays it:
frame k shows the scene at t = k / fps [s], with the ball sliding along x when ``moving``. Depth is uint16
millimetres, exact (no sensor noise or holes), registered to the colour image.

With ``draw_robot`` the robot stands at the table as the physical head camera sees it: every frame draws it,
at the newest joint positions given (:meth:`SyntheticScene.set_joint_positions`, the measured
``/joint_states`` in the node), over the scene, with the stack's robot renderer
(:class:`~rynn_teleop.core.robot_render.RobotRenderer`) through the same head camera the scene is seen from
(the description's, :func:`~rynn_teleop.core.camera_view.camera_pose`, and the scene's intrinsics).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ...core.arm_teleop import DEFAULT_HOME
from ...core.camera import DEFAULT_DEPTH_SCALE, CameraFrame, CameraIntrinsics, parse_profile, profile_problem
from ...core.camera_view import DEFAULT_CAMERA_FRAME, camera_pose
from ...core.layout import SIDES
from ...core.params import Param
from ...core.robot_model import RobotModel, arm_joint_names
from ...core.robot_render import RobotRenderer, Shading
from ...errors import ConfigurationError
from .base import CAMERA_BACKENDS, DEFAULT_MAX_BACKLOG, CameraContext, CameraSource
from .scene import SceneImage, SceneObject, TabletopScene

__all__ = ["SceneObject", "SyntheticScene", "home_position"]

_LOG = logging.getLogger(__name__)


class _Ahead(NamedTuple):
    """Frame ``k`` rendered ahead of its delivery."""

    k: int
    scene: SceneImage  # the scene alone
    frame: CameraFrame | None  # the frame with the robot at ``q`` (None: not drawn yet)
    q: np.ndarray  # (54,) [rad] the joints ``frame`` shows


def home_position(robot: RobotModel) -> np.ndarray:
    """(54,) [rad] the robot's home pose, canonical order: the arms at
    :data:`~rynn_teleop.core.arm_teleop.DEFAULT_HOME` (where the simulated arm driver starts and the teleop
    calibrates: forearms forward, hands in the head camera's view), every other joint at
    :meth:`RobotModel.neutral` (hands open)."""
    q = robot.neutral()
    q[robot.indices([n for side in SIDES for n in arm_joint_names(side)])] = DEFAULT_HOME
    return q


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
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: CameraContext) -> SyntheticScene:
        """The scene seen from the node's robot description's head camera."""
        profile = parse_profile(settings["profile"])
        return cls(width=profile.width, height=profile.height, fps=float(profile.fps), seed=settings["seed"],
                   depth=settings["depth"], draw_robot=settings["draw_robot"], robot_model=context.robot(),
                   joint_states_topic=settings["joint_states_topic"])

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
        self.painter = (RobotRenderer(self.robot_model, self.camera_intrinsics, shading, DEFAULT_CAMERA_FRAME)
                        if self.draw_robot else None)
        self._q = home_position(self.robot_model)
        self._q.flags.writeable = False
        self.joint_stamp: float | None = None
        self.joint_updates = 0  # set_joint_positions calls accepted
        self._t_start: float | None = None
        self._next_k = 0
        self._ahead: _Ahead | None = None  # frame k rendered ahead of time
        self._q_prepared = self._q  # the joints at the previous prepare_next
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

    def ball_center(self, t: float) -> np.ndarray:
        """(3,) world position [m] of the ball's centre at ``t`` [s since start] (its t = 0 place unless moving)."""
        return self.scene.ball_center(t if self.moving else 0.0)

    def render(self, t: float) -> CameraFrame:
        """The frame at ``t`` [s since start] (stamp = t), the robot (with ``draw_robot``) at
        :attr:`joint_positions`; identical for identical (seed, t, joints)."""
        return self._finish(self._render_scene(t), t, self._q)

    def _render_scene(self, t: float) -> SceneImage:
        """The scene alone at ``t`` (fresh arrays); with depth also when only the robot needs it."""
        return self.scene.render(self.ball_center(t), depth=self.depth or self.draw_robot)

    def _finish(self, image: SceneImage, t: float, q: np.ndarray) -> CameraFrame:
        """The frame at ``t`` of ``image`` (the scene, left as it is): the robot at ``q`` over it, when drawn."""
        color, depth = image
        if self.painter is not None:
            color, depth = self._draw_robot(color, depth, q)
        return CameraFrame(float(t), color, depth if self.depth else None, DEFAULT_DEPTH_SCALE)

    def _draw_robot(self, color: np.ndarray, depth_mm: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """New colour and depth images: the robot at ``q`` over the scene ``color`` (H, W, 3) and ``depth_mm``
        (H, W) uint16 (see the class doc)."""
        drawn, depth = color.copy(), depth_mm.copy()
        v, u, z = self.painter.draw_depth(drawn, q)
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
            elif ahead.frame is not None and np.array_equal(ahead.q, self._q):
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
        if self._ahead is None or self._ahead.k != self._next_k:
            t = self._next_k / self.fps
            scene = self._render_scene(t)
            still = self.painter is None or np.array_equal(self._q, self._q_prepared)
            self._ahead = _Ahead(self._next_k, scene, self._finish(scene, t, self._q) if still else None, self._q)
        self._q_prepared = self._q

    def close(self) -> None:
        """Stop producing frames (idempotent); the rendered static scene is kept for a restart."""
        self._closed = True

    def diagnostics(self) -> dict[str, object]:
        values: dict[str, object] = {"dropped": self.dropped, "draw_robot": self.draw_robot}
        if self.draw_robot:
            values["joint_updates"] = self.joint_updates
        return values
