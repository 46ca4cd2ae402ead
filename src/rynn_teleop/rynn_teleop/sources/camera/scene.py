"""The synthetic tabletop's geometry and ray caster (pure numpy, no clock, ROS-free).

World frame: z up, the table top is the plane z = 0, y points away from the robot (``base_link``'s x), origin
on the table top straight below the camera (:func:`world_from_base`). The camera is the robot's head camera
where the description puts it (:func:`~rynn_teleop.core.camera_view.camera_pose`; by default 0.70 m above the
table top, pitched 45 deg down; optical axes x right, y down, z forward), with
:func:`~rynn_teleop.core.camera.default_intrinsics`; the table is fixed to the robot (:data:`TABLE_TOP_Z`). A
wooden table stands in front of a wall above a floor; a red cube, a green cylinder, a blue bowl and a yellow
ball are placed from ``numpy.random.default_rng(seed)``, lit by one directional light (:data:`LIGHT_DIR`) with
soft shadows on the table. :meth:`TabletopScene.render` draws the ball at a given centre over the static rest.

Given a :class:`TwinTabletop` (the physical twin's scene, ``rynn_teleop.sim``), the static layer is that scene's
instead: its table (extent, height, colour, with the same wood grain), its fixed objects (a platform) and its
target regions (painted onto the table or the platform top, blended by their alpha), and no procedural objects
and no ball: the twin's movable objects move, and the camera source draws them over this layer each frame
(``sources.camera.synthetic``).

Colour: RGB uint8, 2x2 supersampled. Depth: uint16 [mm] of z in the optical frame at the pixel centres,
0 where no surface; colour, depth and intrinsics agree exactly. Equal (size, seed, ball centre) give
bit-identical images.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import NamedTuple

import cv2
import numpy as np

from ...core.camera import CameraIntrinsics, default_intrinsics
from ...core.camera_view import camera_pose
from ...core.robot_model import RobotModel
from ...core.transforms import is_rigid
from ...errors import ConfigurationError

_LOG = logging.getLogger(__name__)

# The camera is the robot's head camera as the description poses it (urdf/robot.yaml: pitched 45 deg down,
# optical centre 1.381 m above base_link and 0.11 m ahead of it); the table is fixed to the robot, its top
# TABLE_TOP_Z above base_link: 0.70 m below the default camera and just below the hands at the arms' home
# posture, so the robot drawn over this scene (synthetic camera, world model) stands at the table.
TABLE_TOP_Z = 0.681  # [m] height of the table top in base_link
MIN_CAMERA_HEIGHT = 0.05  # [m] the camera's optical centre must be at least this far above the table top
_R_WORLD_BASE = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # base_link axes -> world axes
TABLE_HALF_WIDTH = 0.55  # [m] table spans x in [-0.55, 0.55]
TABLE_FAR_Y = 1.10  # [m] far edge of the table (the near edge is below the image)
TABLE_NEAR_Y = -0.20  # [m]
WALL_Y = 1.40  # [m] the wall behind the table
FLOOR_Z = -0.75  # [m] the floor, below the table top
PLANK_WIDTH = 0.14  # [m] table planks run along y
LIGHT_DIR = np.array([-0.35, -0.45, 1.0]) / np.linalg.norm([-0.35, -0.45, 1.0])  # towards the light
AMBIENT = 0.42  # [-] ambient share of the lighting
DIFFUSE = 0.75  # [-] Lambertian share
SHADOW_STRENGTH = 0.55  # [-] fraction of the light a full shadow removes
SPECULAR = 0.35  # [-] highlight strength of the ball and the cylinder
SUPERSAMPLING = 2  # [-] colour samples per pixel along u and v

CUBE_SIZE = 0.07  # [m] edge
CYLINDER_RADIUS, CYLINDER_HEIGHT = 0.035, 0.12  # [m]
BOWL_RADIUS = 0.065  # [m] a hemisphere, open at the top
BALL_RADIUS = 0.035  # [m]
BALL_AMPLITUDE = 0.11  # [m] half the ball's travel along x
BALL_PERIOD_S = 6.0  # [s] one back-and-forth of the ball

MIN_SIZE, MAX_SIZE = 16, 4096  # [px] image width and height

_BG, _TABLE, _WALL, _FLOOR, _CUBE, _CYLINDER, _BOWL = range(7)  # surface ids
_FIRST_TWIN_SURFACE = 7  # the twin's fixed objects: this id and up
_ALBEDO = {  # RGB reflectance [-]
    _WALL: (0.80, 0.82, 0.86),
    _FLOOR: (0.30, 0.30, 0.33),
    _CUBE: (0.82, 0.12, 0.10),
    _CYLINDER: (0.14, 0.62, 0.22),
    _BOWL: (0.16, 0.32, 0.82),
}
_BOWL_INSIDE = (0.40, 0.58, 0.92)
_BALL_ALBEDO = np.array([0.96, 0.80, 0.08])
_CUBE_CORNERS = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], float)  # (8, 3)
_SQUARE_CORNERS = np.array([[sx, sy, 0.0] for sx in (-1, 1) for sy in (-1, 1)])  # (4, 3), in the z = 0 plane
_TABLE_ALBEDO = np.array([0.62, 0.43, 0.26])
_EPS_T = 1e-6  # [m] hits closer than this along a ray are ignored (self-intersection)


class SceneObject(NamedTuple):
    """One object of the synthetic scene (world frame, z up, table top at z = 0)."""

    name: str  # "red_cube" | "green_cylinder" | "blue_bowl" | "yellow_ball"
    center: np.ndarray  # (3,) [m] centre of its footprint on the table (the ball's at t = 0)
    size: float  # [m] edge (cube), diameter (others)


class SceneImage(NamedTuple):
    """One rendered view."""

    color: np.ndarray  # (H, W, 3) uint8 RGB
    depth: np.ndarray | None  # (H, W) uint16 [mm], z in the optical frame; None when not asked for


class StaticLayer(NamedTuple):
    """The scene without the ball, per pixel (H, W); world coordinates [m] of the surface seen at the centre."""

    color_f: np.ndarray  # (H, W, 3) float32 RGB in [0, 1]
    color: np.ndarray  # (H, W, 3) uint8 RGB (color_f rounded)
    depth_m: np.ndarray  # (H, W) float32 [m], 0 where no surface
    depth: np.ndarray  # (H, W) uint16 [mm]
    px: np.ndarray  # (H, W) float32 [m] world x of the surface point
    py: np.ndarray  # (H, W) float32 [m] world y
    pz: np.ndarray  # (H, W) float32 [m] world z
    table: np.ndarray  # (H, W) float32 [-] share of the pixel's colour samples that see the table


class TwinShape(NamedTuple):
    """A fixed object of the twin's scene (``base_link``)."""

    shape: str  # "box" | "cylinder" | "sphere"
    size: tuple[float, ...]  # [m] as the scene file: box (x, y, z) edges; cylinder (radius, height); sphere (radius,)
    pose: np.ndarray  # (4, 4) its centre's pose in base_link [m]
    rgba: tuple[float, float, float, float]


class TwinPatch(NamedTuple):
    """A target region of the twin's scene: a rectangle on the table or on a fixed object's top (``base_link``)."""

    center: np.ndarray  # (3,) [m] centre on its supporting surface
    size: tuple[float, float]  # [m] x, y extent along its own axes
    yaw: float  # [rad] about z
    rgba: tuple[float, float, float, float]  # drawn blended by its alpha


class TwinTabletop(NamedTuple):
    """The static part of the twin's scene as the camera draws it (``base_link``, REP-103; units m, rad)."""

    table_center: tuple[float, float]  # [m] x, y of the top's centre
    table_size: tuple[float, float]  # [m] x, y extent of the top
    table_top: float  # [m] z of the top surface
    table_rgba: tuple[float, float, float, float]
    fixed: tuple[TwinShape, ...] = ()
    targets: tuple[TwinPatch, ...] = ()


class Hits(NamedTuple):
    """The nearest surface along each of N rays."""

    t: np.ndarray  # (N,) ray parameter of the hit (= depth [m] for camera rays), inf where nothing is hit
    ids: np.ndarray  # (N,) int8 surface id (``_BG`` where nothing is hit)
    points: np.ndarray  # (N, 3) [m] hit points (the origin where nothing is hit)
    normals: np.ndarray  # (N, 3) unit surface normals (0 where nothing is hit)
    rays: np.ndarray  # (N, 3) the ray directions


HitFunction = Callable[..., tuple[np.ndarray, np.ndarray]]  # (o, d, *shape args) -> (t, normals)


class StaticObject(NamedTuple):
    """A static object as the ray caster sees it."""

    surface: int  # surface id
    hit: HitFunction  # its intersection function
    args: tuple  # the shape arguments after (o, d)
    corners: np.ndarray  # (8, 3) [m] corners of an upright box around it


# ------------------------------------------------------------------------------------ geometry helpers
def world_from_base(T_base_camera: np.ndarray) -> np.ndarray:
    """(4, 4) T_world_base: the scene's world frame in terms of ``base_link``, for a camera whose optical frame
    is ``T_base_camera`` (4, 4) in ``base_link`` [m].

    The world frame is ``base_link`` turned +90 deg about z (world y = ``base_link`` x, forward; world x =
    -``base_link`` y, to the robot's right; z up) with its origin on the table top (:data:`TABLE_TOP_Z`)
    straight below the camera's optical centre.
    """
    foot = np.array([T_base_camera[0, 3], T_base_camera[1, 3], TABLE_TOP_Z])
    T = np.eye(4)
    T[:3, :3] = _R_WORLD_BASE
    T[:3, 3] = -_R_WORLD_BASE @ foot
    return T


def sphere_span(x: float, z: float, radius: float, f: float, c: float, lo: int, hi: int) -> tuple[int, int]:
    """Pixel indices [first, end) along one image axis, within [lo, hi), outside which no ray through a pixel
    (within 0.5 px of its centre) meets a sphere of ``radius`` [m] centred at ``x`` (that axis' optical
    coordinate) [m] and depth ``z`` [m]; ``f``, ``c`` are the axis' focal length and principal point [px].

    The bounds are the tangent planes through the optical centre (x = k z), widened by 1 px; a centre within
    the radius of the camera (no tangent planes) gives [lo, hi).
    """
    q = z * z - radius * radius
    if q <= 0.0:
        return lo, hi
    root = radius * math.sqrt(x * x + q)
    first = math.floor(f * (x * z - root) / q + c - 1.5)
    end = math.ceil(f * (x * z + root) / q + c + 1.5) + 1
    return max(first, lo), min(end, hi)


def _smoothstep(e0: float | np.ndarray, e1: float | np.ndarray, x: np.ndarray) -> np.ndarray:
    s = np.clip((x - e0) / (e1 - e0), 0.0, 1.0)
    return s * s * (3.0 - 2.0 * s)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=-1)


# ------------------------------------------------------------------------------------ ray intersections
# Rays are P(t) = o + t * d. Camera rays use d = R_world_camera @ ((u - cx) / fx, (v - cy) / fy, 1), so
# the parameter t of a hit is its depth (z in the optical frame) [m]. Each function takes (N, 3) directions
# and one origin (3,) or one origin per ray (N, 3), and returns (t (N,), normal (N, 3)), t = inf where the ray
# misses.


def _hit_plane(o: np.ndarray, d: np.ndarray, axis: int, value: float) -> np.ndarray:
    """t (N,) where the rays meet the plane (world coordinate ``axis``) = ``value`` [m]; inf if never ahead."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (value - o[..., axis]) / d[:, axis]
    return np.where(t > _EPS_T, t, np.inf)


def _hit_box(o: np.ndarray, d: np.ndarray, center: np.ndarray, half: float, yaw: float):
    """A cube of half edge ``half`` [m] centred at ``center`` [m], turned by ``yaw`` [rad] about z."""
    c, s = math.cos(yaw), math.sin(yaw)
    R = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])  # box axes -> world
    return _hit_oriented_box(o, d, center, half, R)


def _hit_oriented_box(o: np.ndarray, d: np.ndarray, center: np.ndarray, half: float | np.ndarray, R: np.ndarray):
    """A box of half edges ``half`` [m] (one, or one per own axis) centred at ``center`` [m], its axes the columns
    of ``R`` (3, 3) in the world."""
    ol = (o - center) @ R  # rows: R.T @ (o - center)
    dl = d @ R
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = (-half - ol) / dl
        t2 = (half - ol) / dl
    tn = np.nan_to_num(np.minimum(t1, t2), nan=-np.inf)
    tf = np.nan_to_num(np.maximum(t1, t2), nan=np.inf)
    t_near, t_far = tn.max(axis=1), tf.min(axis=1)
    hit = (t_far >= t_near) & (t_near > _EPS_T)
    rows, axis = np.arange(len(d)), tn.argmax(axis=1)
    nl = np.zeros_like(d)
    nl[rows, axis] = -np.sign(dl[rows, axis])
    return np.where(hit, t_near, np.inf), nl @ R.T


def _hit_cylinder(o: np.ndarray, d: np.ndarray, center: np.ndarray, radius: float, height: float):
    """A solid vertical cylinder [m] standing on z = center z (its side and its top)."""
    oc = o - center
    ox, oy = oc[..., 0], oc[..., 1]
    a = d[:, 0] ** 2 + d[:, 1] ** 2
    b = ox * d[:, 0] + oy * d[:, 1]
    disc = b * b - a * (ox * ox + oy * oy - radius * radius)
    with np.errstate(invalid="ignore", divide="ignore"):
        t_side = (-b - np.sqrt(disc)) / a
    z = oc[..., 2] + t_side * d[:, 2]
    side = (disc >= 0) & (t_side > _EPS_T) & (z >= 0.0) & (z <= height)
    t_side = np.where(side, t_side, np.inf)
    t_top = _hit_plane(oc, d, 2, height)
    px, py = ox + t_top * d[:, 0], oy + t_top * d[:, 1]
    with np.errstate(invalid="ignore"):
        t_top = np.where(px * px + py * py <= radius * radius, t_top, np.inf)
    t = np.minimum(t_side, t_top)
    on_side = np.isfinite(t_side) & (t_side <= t_top)
    tt = np.where(np.isfinite(t), t, 0.0)
    n = np.zeros_like(d)
    n[:, 0] = np.where(on_side, (ox + tt * d[:, 0]) / radius, 0.0)
    n[:, 1] = np.where(on_side, (oy + tt * d[:, 1]) / radius, 0.0)
    n[:, 2] = np.where(on_side, 0.0, 1.0)
    return t, n


def _hit_sphere(o: np.ndarray, d: np.ndarray, center: np.ndarray, radius: float):
    """A solid sphere [m]."""
    t1, _ = _sphere_roots(o, d, center, radius)
    t = np.where(t1 > _EPS_T, t1, np.inf)
    return t, (_point(o, d, t) - center) / radius


def _sphere_roots(o: np.ndarray, d: np.ndarray, center: np.ndarray, radius: float):
    """Both ray parameters (t1 <= t2) where the rays meet a sphere; inf for both where they miss."""
    oc = o - center
    a = _dot(d, d)
    b = _dot(d, oc)
    disc = b * b - a * (_dot(oc, oc) - radius * radius)
    root = np.sqrt(np.maximum(disc, 0.0))
    miss = disc < 0
    return np.where(miss, np.inf, (-b - root) / a), np.where(miss, np.inf, (-b + root) / a)


def _point(o: np.ndarray, d: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(N, 3) points o + t d; the origin where t is inf."""
    return o + np.where(np.isfinite(t), t, 0.0)[:, None] * d


def _hit_bowl(o: np.ndarray, d: np.ndarray, center: np.ndarray, radius: float):
    """The lower half of a sphere (z <= centre z): outside seen from below the rim, inside through the opening."""
    t1, t2 = _sphere_roots(o, d, center, radius)
    outer = (t1 > _EPS_T) & np.isfinite(t1) & (_point(o, d, t1)[:, 2] <= center[2])
    inner = ~outer & (t2 > _EPS_T) & np.isfinite(t2) & (_point(o, d, t2)[:, 2] <= center[2])
    t = np.where(outer, t1, np.where(inner, t2, np.inf))
    n = (_point(o, d, t) - center) / radius
    return t, np.where(inner[:, None], -n, n)


def _shade(albedo: np.ndarray, normals: np.ndarray, d: np.ndarray, specular: np.ndarray) -> np.ndarray:
    """RGB (N, 3) of surfaces with (N, 3) albedo and unit normals seen along rays (N, 3); ``specular`` (N,) [-]."""
    lambert = np.clip(normals @ LIGHT_DIR, 0.0, 1.0)
    rgb = albedo * (AMBIENT + DIFFUSE * lambert)[:, None]
    shiny = np.nonzero(specular)[0]
    if shiny.size:
        n, view = normals[shiny], -d[shiny] / np.linalg.norm(d[shiny], axis=1, keepdims=True)
        refl = 2.0 * lambert[shiny, None] * n - LIGHT_DIR
        spec = np.clip(_dot(refl, view), 0.0, 1.0) ** 24
        rgb[shiny] += (SPECULAR * specular[shiny] * spec)[:, None]
    return rgb


# ------------------------------------------------------------------------------------ the scene
class TabletopScene:
    """The tabletop of one seed seen by a ``width`` x ``height`` camera (see the module doc).

    Attributes:
        intrinsics: the camera's intrinsics (:func:`~rynn_teleop.core.camera.default_intrinsics`).
        T_base_camera: (4, 4) the optical frame in ``base_link`` [m] (the description's head camera).
        T_world_base: (4, 4) ``base_link`` in the world frame [m] (:func:`world_from_base`).
        T_world_camera: (4, 4) the optical frame in the world frame [m].
        objects: cube, cylinder, bowl, ball, in this order.

    The static layer (everything but the ball) is ray-cast once, on the first :meth:`prepare` or
    :meth:`render`; a render copies it and redraws the ball and its shadow in their bounding boxes.
    """

    def __init__(self, width: int, height: int, seed: int = 0, T_base_camera: np.ndarray | None = None,
                 twin: TwinTabletop | None = None) -> None:
        """
        Args:
            width, height: image size [px] (16..4096).
            seed: seed of the object layout and the wood pattern.
            T_base_camera: (4, 4) the camera's optical frame in ``base_link`` [m] (default: the head camera of
                the default description, :func:`~rynn_teleop.core.camera_view.camera_pose`).
            twin: draw the twin's table, fixed objects and targets instead of the procedural tabletop (see the
                module doc); :attr:`objects` is then empty and there is no ball.

        Raises:
            ConfigurationError: a size out of range; a camera pose that is not a rigid transform or whose
                optical centre is less than :data:`MIN_CAMERA_HEIGHT` above the table top.
        """
        if not (MIN_SIZE <= int(width) <= MAX_SIZE and MIN_SIZE <= int(height) <= MAX_SIZE):
            raise ConfigurationError(
                f"synthetic camera: size {width}x{height} out of range ({MIN_SIZE}..{MAX_SIZE} px)"
            )
        self.width, self.height, self.seed = int(width), int(height), int(seed)
        self.intrinsics: CameraIntrinsics = default_intrinsics(self.width, self.height)
        T = camera_pose(RobotModel.default()) if T_base_camera is None else np.array(T_base_camera, dtype=float)
        if not is_rigid(T):
            raise ConfigurationError(f"synthetic camera: T_base_camera must be a (4, 4) rigid transform, got {T!r}")
        if T[2, 3] - TABLE_TOP_Z < MIN_CAMERA_HEIGHT:
            raise ConfigurationError(
                f"synthetic camera: the camera ({T[2, 3]:.3f} m above base_link) must be at least "
                f"{MIN_CAMERA_HEIGHT} m above the table top ({TABLE_TOP_Z} m)"
            )
        self.T_base_camera = T
        self.T_world_base = world_from_base(T)
        self.T_world_camera = self.T_world_base @ T
        self.twin = twin
        # the table top: x0, x1, y0, y1, z in the world frame [m]; its RGB reflectance
        self._table = (-TABLE_HALF_WIDTH, TABLE_HALF_WIDTH, TABLE_NEAR_Y, TABLE_FAR_Y, 0.0)
        self._table_albedo = _TABLE_ALBEDO
        self._albedos = dict(_ALBEDO)  # surface id -> RGB
        self._fixed: list[StaticObject] = []
        if twin is None:
            self.objects, self._cube_yaw, self._plank_phase = self._layout(np.random.default_rng(self.seed))
        else:
            self.objects, self._cube_yaw = (), 0.0
            self._plank_phase = np.random.default_rng(self.seed).uniform(0.0, 2 * math.pi, size=32)
            self._set_twin(twin)
        self._static: StaticLayer | None = None

    def _set_twin(self, twin: TwinTabletop) -> None:
        """The table, fixed objects and targets of the twin (``base_link``) in the world frame."""
        (cx, cy), (sx, sy) = twin.table_center, twin.table_size
        corners = np.array([[cx + a * sx / 2, cy + b * sy / 2, twin.table_top, 1.0] for a in (-1, 1) for b in (-1, 1)])
        world = (self.T_world_base @ corners.T).T
        self._table = (world[:, 0].min(), world[:, 0].max(), world[:, 1].min(), world[:, 1].max(), world[0, 2])
        self._table_albedo = np.asarray(twin.table_rgba[:3], dtype=float)
        unit = np.array([[sx_, sy_, sz_] for sx_ in (-1, 1) for sy_ in (-1, 1) for sz_ in (-1, 1)], float)
        for k, shape in enumerate(twin.fixed):
            sid = _FIRST_TWIN_SURFACE + k
            T = self.T_world_base @ np.asarray(shape.pose, dtype=float)
            R, c = T[:3, :3], T[:3, 3]
            size = np.asarray(shape.size, dtype=float)
            if shape.shape == "box":
                half = size / 2
                hit, args = _hit_oriented_box, (c, half, R)
            elif shape.shape == "cylinder":  # upright (a fixed cylinder stands on its base)
                half = np.array([size[0], size[0], size[1] / 2])
                hit, args = _hit_cylinder, (c - (0.0, 0.0, size[1] / 2), float(size[0]), float(size[1]))
            elif shape.shape == "sphere":
                half = np.full(3, size[0])
                hit, args = _hit_sphere, (c, float(size[0]))
            else:
                raise ConfigurationError(f"synthetic camera: unknown twin shape {shape.shape!r}")
            self._albedos[sid] = tuple(float(v) for v in shape.rgba[:3])
            self._fixed.append(StaticObject(sid, hit, args, c + (unit * half) @ R.T))
        self._T_base_world = np.linalg.inv(self.T_world_base)

    # ----------------------------------------------------------------------------- layout
    def project(self, p: np.ndarray) -> tuple[float, float, float]:
        """(u, v, depth) [px, px, m] of a world point [m]."""
        R, c = self.T_world_camera[:3, :3], self.T_world_camera[:3, 3]
        x, y, z = R.T @ (np.asarray(p, float) - c)
        K = self.intrinsics
        return K.fx * x / z + K.cx, K.fy * y / z + K.cy, z

    def _layout(self, rng: np.random.Generator) -> tuple[tuple[SceneObject, ...], float, np.ndarray]:
        """(objects, cube yaw [rad], (32,) plank phases [rad]). The ball's spot is drawn first; each static
        object then takes the first random spot in view, clear of the ball's lane and of the objects placed."""
        ball_y = rng.uniform(0.58, 0.72)
        ball_x = rng.uniform(-0.06, 0.06)
        cube_yaw = rng.uniform(0.0, math.pi / 2)
        plank_phase = rng.uniform(0.0, 2 * math.pi, size=32)
        placed: list[tuple[float, float, float]] = []  # x, y, footprint radius [m]
        objects: list[SceneObject] = []
        specs = (
            ("red_cube", CUBE_SIZE * 0.72, CUBE_SIZE, CUBE_SIZE),
            ("green_cylinder", CYLINDER_RADIUS, 2 * CYLINDER_RADIUS, CYLINDER_HEIGHT),
            ("blue_bowl", BOWL_RADIUS, 2 * BOWL_RADIUS, BOWL_RADIUS),
        )
        margin = 0.08 * self.width, 0.08 * self.height
        for name, radius, size, top in specs:
            for _ in range(2000):
                x, y = rng.uniform(-0.30, 0.30), rng.uniform(0.40, 1.00)
                clear_lane = abs(y - ball_y) > radius + BALL_RADIUS + 0.04 or (
                    abs(x - ball_x) > BALL_AMPLITUDE + radius + BALL_RADIUS + 0.04
                )
                apart = all(math.hypot(x - px, y - py) > radius + pr + 0.05 for px, py, pr in placed)
                u0, v0, _ = self.project((x, y, 0.0))
                u1, v1, _ = self.project((x, y, top))
                visible = all(
                    margin[0] <= u <= self.width - margin[0] and margin[1] <= v <= self.height - margin[1]
                    for u, v in ((u0, v0), (u1, v1))
                )
                if clear_lane and apart and visible:
                    break
            else:
                _LOG.warning("synthetic camera: no free spot for the %s (seed %d); it may overlap", name, self.seed)
            placed.append((x, y, radius))
            objects.append(SceneObject(name, np.array([x, y, 0.0]), size))
        objects.append(SceneObject("yellow_ball", np.array([ball_x, ball_y, 0.0]), 2 * BALL_RADIUS))
        return tuple(objects), cube_yaw, plank_phase

    def ball_center(self, t: float) -> np.ndarray:
        """(3,) world position [m] of the ball's centre at ``t`` [s]: x(t) = x0 + A sin(2 pi t / P).

        A = :data:`BALL_AMPLITUDE`, P = :data:`BALL_PERIOD_S`; the ball rests on the table.
        """
        ball = self.objects[-1].center
        x = ball[0] + BALL_AMPLITUDE * math.sin(2 * math.pi * t / BALL_PERIOD_S)
        return np.array([x, ball[1], BALL_RADIUS])

    # ----------------------------------------------------------------------------- ray casting
    def _rays(self, us: np.ndarray, vs: np.ndarray) -> np.ndarray:
        """(N, 3) world ray directions (optical z component 1) of pixel coordinates (N,), (N,) [px]."""
        K = self.intrinsics
        cam = np.stack([(us - K.cx) / K.fx, (vs - K.cy) / K.fy, np.ones_like(us)], axis=1)
        return cam @ self.T_world_camera[:3, :3].T

    def _pixel_box(self, corners: np.ndarray, pad: int = 2) -> tuple[int, int, int, int]:
        """(u0, v0, u1, v1) [px, end exclusive, clipped to the image] around world points (N, 3) [m] in front."""
        R, c = self.T_world_camera[:3, :3], self.T_world_camera[:3, 3]
        cam = (np.asarray(corners, float) - c) @ R
        K = self.intrinsics
        u = K.fx * cam[:, 0] / cam[:, 2] + K.cx
        v = K.fy * cam[:, 1] / cam[:, 2] + K.cy
        u0, v0 = math.floor(u.min()) - pad, math.floor(v.min()) - pad
        u1, v1 = math.ceil(u.max()) + pad + 1, math.ceil(v.max()) + pad + 1
        return max(u0, 0), max(v0, 0), min(u1, self.width), min(v1, self.height)

    def _static_objects(self) -> list[StaticObject]:
        """The cube, the cylinder and the bowl (the twin's fixed objects with a twin scene)."""
        if self.twin is not None:
            return self._fixed
        cube, cyl, bowl = (obj.center for obj in self.objects[:3])
        unit = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (0, 1)], float)

        def box(c: np.ndarray, r: float, h: float) -> np.ndarray:  # corners of an upright box around a footprint
            return c + unit * (r, r, h)

        half_diag = CUBE_SIZE / math.sqrt(2.0)
        return [
            StaticObject(_CUBE, _hit_box, (cube + (0.0, 0.0, CUBE_SIZE / 2), CUBE_SIZE / 2, self._cube_yaw),
                         box(cube, half_diag, CUBE_SIZE)),
            StaticObject(_CYLINDER, _hit_cylinder, (cyl, CYLINDER_RADIUS, CYLINDER_HEIGHT),
                         box(cyl, CYLINDER_RADIUS, CYLINDER_HEIGHT)),
            StaticObject(_BOWL, _hit_bowl, (bowl + (0.0, 0.0, BOWL_RADIUS), BOWL_RADIUS),
                         box(bowl, BOWL_RADIUS, BOWL_RADIUS)),
        ]

    def _cast_static(self, us: np.ndarray, vs: np.ndarray) -> Hits:
        """The static scene's nearest surfaces for pixel coordinates (N,), (N,) [px]."""
        o = self.T_world_camera[:3, 3]
        d = self._rays(us, vs)
        t_best = np.full(len(d), np.inf)
        ids = np.full(len(d), _BG, dtype=np.int8)
        normals = np.zeros_like(d)

        def keep(sid: int, t: np.ndarray, n, sel: np.ndarray | None = None) -> None:
            if sel is None:
                closer = np.nonzero(t < t_best)[0]
                t_closer = t[closer]
            else:
                hit = t < t_best[sel]
                closer, t_closer = sel[hit], t[hit]
                n = n[hit]
            t_best[closer] = t_closer
            ids[closer] = sid
            normals[closer] = n if np.ndim(n) == 1 else n[closer] if sel is None else n

        x0, x1, y0, y1, z_table = self._table
        t_table = _hit_plane(o, d, 2, z_table)
        with np.errstate(invalid="ignore"):
            px, py = o[0] + t_table * d[:, 0], o[1] + t_table * d[:, 1]
            on_table = (px >= x0) & (px <= x1) & (py >= y0) & (py <= y1)
        keep(_TABLE, np.where(on_table, t_table, np.inf), np.array([0.0, 0.0, 1.0]))
        keep(_WALL, _hit_plane(o, d, 1, WALL_Y), np.array([0.0, -1.0, 0.0]))
        keep(_FLOOR, _hit_plane(o, d, 2, FLOOR_Z), np.array([0.0, 0.0, 1.0]))
        for obj in self._static_objects():
            u0, v0, u1, v1 = self._pixel_box(obj.corners)
            sel = np.nonzero((us >= u0) & (us < u1) & (vs >= v0) & (vs < v1))[0]
            if sel.size:
                t, n = obj.hit(o, d[sel], *obj.args)
                keep(obj.surface, t, n, sel)
        return Hits(t_best, ids, _point(o, d, t_best), normals, d)

    def _albedo(self, ids: np.ndarray, points: np.ndarray, normals: np.ndarray) -> np.ndarray:
        """(N, 3) reflectance [-] of the surfaces ``ids`` at world ``points`` [m] (wood grain, wall gradient)."""
        albedo = np.zeros((len(ids), 3))
        for sid, rgb in self._albedos.items():
            albedo[ids == sid] = rgb
        albedo[(ids == _BOWL) & (normals[:, 2] > 0.0)] = _BOWL_INSIDE  # the inside faces up
        table = ids == _TABLE
        if table.any():
            x, y = points[table, 0], points[table, 1]
            across = (x - self._table[0]) / PLANK_WIDTH
            plank = np.clip(np.floor(across).astype(int), 0, len(self._plank_phase) - 1)
            phase = self._plank_phase[plank]
            grain = 0.65 * np.sin(2 * math.pi * (x * 23.0 + 0.5 * np.sin(y * 5.0 + phase)) + 3.0 * phase) + 0.35 * (
                np.sin(2 * math.pi * (x * 67.0 + 0.25 * np.sin(y * 11.0 + 2.0 * phase)))
            )
            tone = 0.93 + 0.14 * (phase / (2 * math.pi) - 0.5)  # each plank a little different
            gap = 0.55 + 0.45 * _smoothstep(0.0, 0.02, np.abs(across - np.round(across)))
            falloff = 1.08 - 0.22 * np.clip(y, 0.0, TABLE_FAR_Y)  # light fades towards the far edge
            albedo[table] = self._table_albedo * ((0.86 + 0.14 * grain) * tone * gap * falloff)[:, None]
        wall = ids == _WALL
        if wall.any():  # lighter towards the top, darker to the sides
            z, x = points[wall, 2], points[wall, 0]
            albedo[wall] *= (0.80 + 0.25 * np.clip(z + 0.3, 0.0, 1.0) - 0.12 * np.abs(x))[:, None]
        if self.twin is not None and self.twin.targets:
            self._paint_targets(albedo, ids, points, normals)
        return albedo

    def _paint_targets(self, albedo: np.ndarray, ids: np.ndarray, points: np.ndarray, normals: np.ndarray) -> None:
        """Blend the twin's target regions (their colour by its alpha) into ``albedo`` (N, 3) where the surfaces
        ``ids`` at world ``points`` face up within 2 mm of a region's surface and inside its rectangle."""
        up = (normals[:, 2] > 0.5) & (ids != _BG) & (ids != _FLOOR)
        if not up.any():
            return
        base = points @ self._T_base_world[:3, :3].T + self._T_base_world[:3, 3]  # the points in base_link
        for patch in self.twin.targets:
            c, s = math.cos(patch.yaw), math.sin(patch.yaw)
            dx, dy = base[:, 0] - patch.center[0], base[:, 1] - patch.center[1]
            inside = (up & (np.abs(c * dx + s * dy) <= patch.size[0] / 2)
                      & (np.abs(-s * dx + c * dy) <= patch.size[1] / 2)
                      & (np.abs(base[:, 2] - patch.center[2]) < 0.002))
            if inside.any():
                a = float(patch.rgba[3])
                albedo[inside] = (1.0 - a) * albedo[inside] + a * np.asarray(patch.rgba[:3])

    def _static_shadow(self, points: np.ndarray) -> np.ndarray:
        """(N,) float32: 1 where a static object blocks the light (towards LIGHT_DIR) of table points (N, 3) [m]."""
        blocked = np.zeros(len(points), dtype=bool)
        lean = math.hypot(LIGHT_DIR[0], LIGHT_DIR[1]) / LIGHT_DIR[2]  # [m] shadow length per [m] of height
        for obj in self._static_objects():
            center = obj.corners.mean(axis=0)
            reach = np.linalg.norm(obj.corners[0, :2] - center[:2]) + lean * obj.corners[:, 2].max() + 0.01
            near = np.nonzero(np.hypot(points[:, 0] - center[0], points[:, 1] - center[1]) < reach)[0]
            if near.size:
                o = points[near] + np.array([0.0, 0.0, 1e-4])
                t, _ = obj.hit(o, np.broadcast_to(LIGHT_DIR, o.shape), *obj.args)
                blocked[near] |= np.isfinite(t)
        return blocked.astype(np.float32)

    def prepare(self) -> StaticLayer:
        """The static layer, ray-cast on the first call (colour supersampled, soft shadows blurred)."""
        if self._static is not None:
            return self._static
        H, W, ss = self.height, self.width, SUPERSAMPLING
        v, u = np.mgrid[0:H, 0:W]
        u, v = u.ravel().astype(float), v.ravel().astype(float)
        centre = self._cast_static(u, v)
        color = np.zeros((H * W, 3))
        table_cover = np.zeros(H * W)
        offsets = (np.arange(ss) + 0.5) / ss - 0.5
        for du in offsets:  # colour: ss x ss samples per pixel, averaged
            for dv in offsets:
                s = self._cast_static(u + du, v + dv)
                color += _shade(
                    self._albedo(s.ids, s.points, s.normals), s.normals, s.rays, np.where(s.ids == _CYLINDER, 0.6, 0.0)
                )
                table_cover += s.ids == _TABLE
        color /= ss * ss
        table_cover /= ss * ss
        shadow = np.zeros(H * W, dtype=np.float32)  # soft shadows of the static objects on the table
        table = np.nonzero(centre.ids == _TABLE)[0]
        shadow[table] = self._static_shadow(centre.points[table])
        shadow = cv2.GaussianBlur(shadow.reshape(H, W), (0, 0), max(1.0, 0.006 * W)).ravel()
        color = np.clip(color * (1.0 - SHADOW_STRENGTH * shadow * table_cover)[:, None], 0.0, 1.0)
        depth_m = np.where(np.isfinite(centre.t), centre.t, 0.0).reshape(H, W)
        points = centre.points.reshape(H, W, 3)
        self._static = StaticLayer(
            color_f=color.reshape(H, W, 3).astype(np.float32),
            color=np.round(color.reshape(H, W, 3) * 255.0).astype(np.uint8),
            depth_m=depth_m.astype(np.float32),
            depth=np.clip(np.round(depth_m * 1000.0), 0, 65535).astype(np.uint16),
            px=points[..., 0].astype(np.float32),
            py=points[..., 1].astype(np.float32),
            pz=points[..., 2].astype(np.float32),
            table=table_cover.reshape(H, W).astype(np.float32),
        )
        return self._static

    # ----------------------------------------------------------------------------- the ball
    def render(self, ball_center: np.ndarray | None, depth: bool = True) -> SceneImage:
        """The image with the ball centred at ``ball_center`` (3,) [m] (on the table: z = :data:`BALL_RADIUS`;
        None, or a twin scene: no ball).

        Returns fresh arrays (the static layer is copied); depth None unless ``depth``.
        """
        static = self.prepare()
        color = static.color.copy()
        depth_mm = static.depth.copy() if depth else None
        if ball_center is None or self.twin is not None:
            return SceneImage(color, depth_mm)
        center = np.asarray(ball_center, dtype=float)
        r = BALL_RADIUS
        ball_box = self._pixel_box(center + r * _CUBE_CORNERS)
        shadow_c = center - (center[2] / LIGHT_DIR[2]) * LIGHT_DIR  # the shadow of the centre on the table
        reach = 1.6 * r / LIGHT_DIR[2]
        shadow_box = self._pixel_box(shadow_c + reach * _SQUARE_CORNERS)
        u0, v0 = min(ball_box[0], shadow_box[0]), min(ball_box[1], shadow_box[1])
        u1, v1 = max(ball_box[2], shadow_box[2]), max(ball_box[3], shadow_box[3])
        if u1 <= u0 or v1 <= v0:
            return SceneImage(color, depth_mm)
        rgb = static.color_f[v0:v1, u0:u1].copy()
        su0, sv0, su1, sv1 = shadow_box
        if su1 > su0 and sv1 > sv0:
            self._darken_shadow(static, center, rgb[sv0 - v0 : sv1 - v0, su0 - u0 : su1 - u0], shadow_box)
        bu0, bv0, bu1, bv1 = ball_box
        if bu1 > bu0 and bv1 > bv0:
            sub = (slice(bv0 - v0, bv1 - v0), slice(bu0 - u0, bu1 - u0))
            ball_depth = self._draw_ball(static, center, rgb[sub], ball_box, depth_mm is not None)
            if depth_mm is not None:
                depth_mm[bv0:bv1, bu0:bu1] = ball_depth
        color[v0:v1, u0:u1] = np.round(np.clip(rgb, 0.0, 1.0) * 255.0).astype(np.uint8)
        return SceneImage(color, depth_mm)

    def _darken_shadow(
        self, static: StaticLayer, center: np.ndarray, rgb: np.ndarray, box: tuple[int, int, int, int]
    ) -> None:
        """Darken ``rgb`` (the float colour of ``box``, in place) by the soft shadow of the ball at ``center``."""
        u0, v0, u1, v1 = box
        dx = center[0] - static.px[v0:v1, u0:u1]
        dy = center[1] - static.py[v0:v1, u0:u1]
        dz = center[2] - static.pz[v0:v1, u0:u1]
        along = dx * LIGHT_DIR[0] + dy * LIGHT_DIR[1] + dz * LIGHT_DIR[2]
        dist = np.sqrt(np.maximum(dx * dx + dy * dy + dz * dz - along * along, 0.0))
        r = BALL_RADIUS
        soft = 0.25 * r + 0.35 * np.maximum(along, 0.0)  # [m] the penumbra widens away from the ball
        shadow = (along > 0) * (1.0 - _smoothstep(r - soft, r + soft, dist)) * static.table[v0:v1, u0:u1]
        rgb *= (1.0 - SHADOW_STRENGTH * shadow)[..., None]

    def _draw_ball(
        self, static: StaticLayer, center: np.ndarray, rgb: np.ndarray, box: tuple[int, int, int, int],
        depth: bool = True,
    ) -> np.ndarray | None:
        """Draw the ball into ``rgb`` (the float colour of ``box``, in place); return the box's depth (uint16 mm),
        None unless ``depth``.

        Ray casting in the optical frame, separably: ray (a, b, 1) with a per
        column and b per row, so every quantity is an (h, w) broadcast; the
        ``SUPERSAMPLING`` x ``SUPERSAMPLING`` colour samples of a pixel are a
        leading axis (offset du outer, dv inner) and are summed in that order.
        Colour is cast only in the part of ``box`` the ball's outline can
        reach (:func:`sphere_span`): no sample outside it hits the ball.
        """
        u0, v0, u1, v1 = box
        K = self.intrinsics
        R, o = self.T_world_camera[:3, :3], self.T_world_camera[:3, 3]
        c = R.T @ (center - o)  # ball centre in the optical frame [m]
        light = R.T @ LIGHT_DIR
        r = BALL_RADIUS
        cc = float(c @ c) - r * r

        def cast(a: np.ndarray, b: np.ndarray, bg_depth: np.ndarray):
            A = a * a + b * b + 1.0
            B = a * c[0] + b * c[1] + c[2]
            disc = B * B - A * cc
            t = (B - np.sqrt(np.maximum(disc, 0.0))) / A
            return t, (disc >= 0.0) & (t < bg_depth), A

        cu0, cu1 = sphere_span(c[0], c[2], r, K.fx, K.cx, u0, u1)
        cv0, cv1 = sphere_span(c[1], c[2], r, K.fy, K.cy, v0, v1)
        if cu1 > cu0 and cv1 > cv0:
            a0 = ((np.arange(cu0, cu1) - K.cx) / K.fx)[None, :]
            b0 = ((np.arange(cv0, cv1) - K.cy) / K.fy)[:, None]
            ss = SUPERSAMPLING
            offsets = (np.arange(ss) + 0.5) / ss - 0.5
            du, dv = np.repeat(offsets, ss)[:, None, None], np.tile(offsets, ss)[:, None, None]
            a, b = a0 + du / K.fx, b0 + dv / K.fy  # (S, 1, w), (S, h, 1)
            t, hit, A = cast(a, b, static.depth_m[cv0:cv1, cu0:cu1])  # (S, h, w)
            nx, ny, nz = (t * a - c[0]) / r, (t * b - c[1]) / r, (t - c[2]) / r
            lambert = np.clip(nx * light[0] + ny * light[1] + nz * light[2], 0.0, 1.0)
            # reflection of the light about n, against the view direction -(a, b, 1) / sqrt(A)
            twice = 2 * lambert
            rx, ry, rz = twice * nx - light[0], twice * ny - light[1], twice * nz - light[2]
            facing = np.clip(-(rx * a + ry * b + rz) / np.sqrt(A), 0.0, 1.0)
            spec = np.power(facing, 24, out=np.zeros_like(facing), where=hit & (facing > 0.0))  # 0 where no hit
            # sums over the samples that hit the ball
            shade = np.where(hit, AMBIENT + DIFFUSE * lambert, 0.0).sum(axis=0)
            gloss = spec.sum(axis=0)
            cover = hit.sum(axis=0)
            n = ss * ss
            part = rgb[cv0 - v0 : cv1 - v0, cu0 - u0 : cu1 - u0]
            part *= (1.0 - cover / n)[..., None]
            part += _BALL_ALBEDO * (shade / n)[..., None] + (SPECULAR * gloss / n)[..., None]
        if not depth:
            return None
        bg_depth = static.depth_m[v0:v1, u0:u1]
        a0 = ((np.arange(u0, u1) - K.cx) / K.fx)[None, :]
        b0 = ((np.arange(v0, v1) - K.cy) / K.fy)[:, None]
        t, hit, _ = cast(a0, b0, bg_depth)
        depth_m = np.where(hit, t, bg_depth)
        return np.clip(np.round(depth_m * 1000.0), 0, 65535).astype(np.uint16)
