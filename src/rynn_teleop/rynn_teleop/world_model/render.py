"""The ``render`` backend: the robot's arms and hands drawn over the reference frame (ROS-free, torch-free).

Each step poses the description's visual primitives (boxes, cylinders,
spheres: :class:`~rynn_teleop.core.robot_geometry.RobotGeometry`) at the
commanded joints, expresses them in the head camera's optical frame (x right,
y down, z forward), projects them through the camera intrinsics and paints
them over a copy of the reference frame:

* a box is its 6 faces, a cylinder its side as ``Shading.cylinder_segments``
  flat facets plus its two end caps (polygons), a sphere a disc;
* faces that point away from the camera are culled (every primitive is
  convex, so the visible faces of one primitive never overlap);
* each face is filled in the primitive's URDF colour, Lambert-shaded by one
  directional light fixed in the camera frame (ambient + diffuse * max(0, n . l));
* primitives are painted far to near (painter's algorithm, by the optical z
  of their centre) so nearer parts cover farther ones;
* faces entirely behind the near plane are dropped, faces crossing it are
  clipped at it; faces entirely outside the image are skipped.

The result depends only on (reference, joint vector): the same inputs give a
bit-identical image. The robot is not occluded by the scene (the reference
frame has no depth here): it is always drawn on top.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from ..core.camera import CameraIntrinsics, default_intrinsics
from ..core.robot_geometry import Primitive, RobotGeometry
from ..core.robot_model import RobotModel
from ..errors import ParameterError
from .conditioning import DEFAULT_CAMERA_FRAME, SUBPIXEL_BITS, CameraView, fixed_point
from .generator import Generator, as_rgb

_SUBPIXEL = float(1 << SUBPIXEL_BITS)
DEFAULT_WIDTH, DEFAULT_HEIGHT = 640, 480  # [px]


@dataclass(frozen=True)
class Shading:
    """How the primitives are lit and tessellated.

    Raises:
        ParameterError: a bad field; ``key`` (and the message) name it.
    """

    light: tuple[float, float, float] = (-0.3, -0.6, -0.75)  # direction towards the light, camera optical frame
    ambient: float = 0.35  # [-] share of the colour every face gets
    diffuse: float = 0.7  # [-] Lambertian share, times max(0, n . light)
    cylinder_segments: int = 16  # [-] facets around a cylinder (and vertices of its caps)
    antialias: bool = True  # anti-aliased silhouettes (each primitive's outline is drawn with cv2.LINE_AA)
    near: float = 0.02  # [m] near clip plane in the optical frame

    def __post_init__(self) -> None:
        try:
            light = np.asarray(self.light, dtype=float)
        except (TypeError, ValueError):
            light = np.empty(0)
        if light.shape != (3,) or not np.all(np.isfinite(light)) or np.linalg.norm(light) < 1e-9:
            raise ParameterError("light", f"shading: light must be a non-zero direction (x, y, z), got {self.light!r}")
        object.__setattr__(self, "light", tuple(float(v) for v in light / np.linalg.norm(light)))
        for name in ("ambient", "diffuse"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0.0 <= v <= 2.0):
                raise ParameterError(name, f"shading: {name} must be a number in [0, 2], got {v!r}")
            object.__setattr__(self, name, float(v))
        n = self.cylinder_segments
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 3 <= n <= 128:
            raise ParameterError(
                "cylinder_segments", f"shading: cylinder_segments must be an integer in 3..128, got {n!r}"
            )
        object.__setattr__(self, "cylinder_segments", int(n))
        if not isinstance(self.antialias, (bool, np.bool_)):
            raise ParameterError("antialias", f"shading: antialias must be a bool, got {self.antialias!r}")
        object.__setattr__(self, "antialias", bool(self.antialias))
        v = self.near
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0.0):
            raise ParameterError("near", f"shading: near must be a number > 0 [m], got {v!r}")
        object.__setattr__(self, "near", float(v))


def _box_mesh(size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(8, 3) vertices [m], (6, 4) faces (vertex indices, in order around), (6, 3) outward normals of a centred box."""
    corners = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=float)
    faces, normals = [], []
    for axis in range(3):
        b, c = (axis + 1) % 3, (axis + 2) % 3
        for sign in (-1.0, 1.0):
            loop = []
            for sb, sc in ((-1, -1), (1, -1), (1, 1), (-1, 1)):
                want = np.zeros(3)
                want[axis], want[b], want[c] = sign, sb, sc
                loop.append(int(np.flatnonzero((corners == want).all(axis=1))[0]))
            faces.append(loop)
            n = np.zeros(3)
            n[axis] = sign
            normals.append(n)
    return 0.5 * corners * size, np.array(faces), np.array(normals)


def _cylinder_mesh(
    size: np.ndarray, segments: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A centred cylinder along z: (2n, 3) vertices (bottom ring, then top ring), (n, 4) side quads and
    their (n, 3) normals, (2, n) caps (bottom, top) and their (2, 3) normals."""
    n = segments
    theta = 2.0 * np.pi * np.arange(n) / n
    r, h = 0.5 * size[0], 0.5 * size[2]
    ring = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)
    vertices = np.concatenate([np.c_[ring, np.full(n, -h)], np.c_[ring, np.full(n, h)]])
    k = np.arange(n)
    quads = np.stack([k, (k + 1) % n, n + (k + 1) % n, n + k], axis=1)
    mid = theta + np.pi / n
    quad_normals = np.stack([np.cos(mid), np.sin(mid), np.zeros(n)], axis=1)
    caps = np.stack([k, n + k])
    cap_normals = np.array([[0.0, 0.0, -1.0], [0.0, 0.0, 1.0]])
    return vertices, quads, quad_normals, caps, cap_normals


def _clip_near(polygon: np.ndarray, near: float) -> np.ndarray:
    """The part of a convex 3D polygon (K, 3) [m, optical frame] with z >= near (Sutherland-Hodgman, one plane)."""
    out = []
    for k in range(len(polygon)):
        a, b = polygon[k], polygon[(k + 1) % len(polygon)]
        a_in, b_in = a[2] >= near, b[2] >= near
        if a_in:
            out.append(a)
        if a_in != b_in:
            s = (near - a[2]) / (b[2] - a[2])
            p = a + s * (b - a)
            p[2] = near
            out.append(p)
    return np.array(out).reshape(-1, 3)


class PrimitiveRenderer:
    """Paints posed primitives into an image through a camera view (see the module doc).

    The meshes are built once; :meth:`draw` is vectorised over every face and
    loops in Python only over the faces it fills.
    """

    def __init__(self, primitives: Sequence[Primitive], view: CameraView, shading: Shading | None = None) -> None:
        """
        Args:
            primitives: the shapes (their ``size`` [m] and ``rgba`` in [0, 1]).
            view: the camera (its intrinsics give the image size to draw into).
            shading: light, tessellation, anti-aliasing, near plane.

        Raises:
            ValueError: a primitive of an unknown kind.
        """
        self.shading = shading if shading is not None else Shading()
        self.view = view
        self.primitives = tuple(primitives)
        segments = self.shading.cylinder_segments
        vertices, vprim, quads, qnormals, qprim, caps, cnormals, cprim, spheres = [], [], [], [], [], [], [], [], []
        offset = 0
        for i, prim in enumerate(self.primitives):
            size = np.asarray(prim.size, dtype=float)
            if prim.kind == "box":
                v, q, qn = _box_mesh(size)
            elif prim.kind == "cylinder":
                v, q, qn, c, cn = _cylinder_mesh(size, segments)
                caps.append(c + offset)
                cnormals.append(cn)
                cprim += [i] * len(c)
            elif prim.kind == "sphere":
                spheres.append(i)
                continue
            else:
                raise ValueError(f"render: unsupported primitive kind {prim.kind!r} ({prim.name})")
            vertices.append(v)
            vprim += [i] * len(v)
            quads.append(q + offset)
            qnormals.append(qn)
            qprim += [i] * len(q)
            offset += len(v)
        self._vertices = np.concatenate(vertices) if vertices else np.empty((0, 3))
        self._vprim = np.array(vprim, dtype=np.int64)
        self._quads = np.concatenate(quads) if quads else np.empty((0, 4), dtype=np.int64)
        self._qnormals = np.concatenate(qnormals) if qnormals else np.empty((0, 3))
        self._qprim = np.array(qprim, dtype=np.int64)
        self._caps = np.concatenate(caps) if caps else np.empty((0, segments), dtype=np.int64)
        self._cnormals = np.concatenate(cnormals) if cnormals else np.empty((0, 3))
        self._cprim = np.array(cprim, dtype=np.int64)
        self._spheres = np.array(spheres, dtype=np.int64)
        self._sphere_radius = np.array([0.5 * float(np.max(self.primitives[i].size)) for i in spheres])
        self._rgb = np.array([np.asarray(p.rgba, dtype=float)[:3] for p in self.primitives]).reshape(-1, 3)
        self._light = np.asarray(self.shading.light)
        self._line = cv2.LINE_AA if self.shading.antialias else cv2.LINE_8

    def _shade(self, prim: np.ndarray, normals: np.ndarray) -> np.ndarray:
        """(F, 3) uint8 RGB of faces of primitives ``prim`` (F,) with camera-frame unit normals (F, 3)."""
        s = self.shading
        light = s.ambient + s.diffuse * np.maximum(normals @ self._light, 0.0)
        return np.round(np.clip(self._rgb[prim] * light[:, None], 0.0, 1.0) * 255.0).astype(np.uint8)

    def _fixed(self, points_cam: np.ndarray) -> np.ndarray:
        """(N, 2) int32 fixed-point pixels of optical-frame points with z > 0."""
        return fixed_point(self.view.project_unmasked(points_cam))

    def draw(self, image: np.ndarray, poses_cam: np.ndarray) -> np.ndarray:
        """Paint the primitives at ``poses_cam`` (N, 4, 4) (their poses in the optical frame) into ``image``.

        Args:
            image: (H, W, 3) uint8 RGB of the view's size, drawn into (in place).
            poses_cam: one pose per primitive, in :attr:`primitives` order.
        Returns:
            ``image``.
        """
        T = np.asarray(poses_cam, dtype=float)
        if T.shape != (len(self.primitives), 4, 4):
            raise ValueError(f"render: expected ({len(self.primitives)}, 4, 4) poses, got {T.shape}")
        intr = self.view.intrinsics
        if image.shape != (intr.height, intr.width, 3) or image.dtype != np.uint8:
            raise ValueError(f"render: expected a ({intr.height}, {intr.width}, 3) uint8 image, got {image.shape}")
        R, t = T[:, :3, :3], T[:, :3, 3]
        near = self.shading.near
        height, width = image.shape[:2]
        lo, hi = -0.5 * _SUBPIXEL, np.array([width - 0.5, height - 0.5]) * _SUBPIXEL  # image bounds in fixed point

        V = np.einsum("nij,nj->ni", R[self._vprim], self._vertices) + t[self._vprim]  # (NV, 3) optical frame
        front = V[:, 2] > near
        px = np.zeros((len(V), 2), dtype=np.int32)
        if front.any():
            px[front] = self._fixed(V[front])

        # visible faces of both groups (quads: box faces and cylinder sides; caps), gathered per primitive
        faces_of: dict[int, list[tuple[np.ndarray, list[int]]]] = {}
        for faces, normals_local, prim in (
            (self._quads, self._qnormals, self._qprim),
            (self._caps, self._cnormals, self._cprim),
        ):
            if not len(faces):
                continue
            n = np.einsum("nij,nj->ni", R[prim], normals_local)
            facing = np.einsum("ni,ni->n", n, V[faces].mean(axis=1)) < 0.0  # outward normal against the view ray
            all_front = front[faces].all(axis=1)
            poly = px[faces]  # (F, K, 2) fixed point; meaningful where all_front
            onscreen = (
                (poly[..., 0].max(axis=1) >= lo)
                & (poly[..., 0].min(axis=1) <= hi[0])
                & (poly[..., 1].max(axis=1) >= lo)
                & (poly[..., 1].min(axis=1) <= hi[1])
            )
            clipped = facing & ~all_front & front[faces].any(axis=1)
            keep = np.flatnonzero((facing & all_front & onscreen) | clipped)
            colors = self._shade(prim[keep], n[keep]).tolist()
            for k, f in enumerate(keep.tolist()):
                if clipped[f]:
                    part = _clip_near(V[faces[f]], near)
                    if len(part) < 3:
                        continue
                    polygon = self._fixed(part)
                else:
                    polygon = poly[f]
                faces_of.setdefault(int(prim[f]), []).append((polygon, colors[k]))
        spheres = self._sphere_items(t)

        # painter's order: primitives far to near by the optical z of their centre (stable: ties keep URDF order)
        order = np.argsort(-t[:, 2], kind="stable").tolist()
        antialias = self.shading.antialias
        for i in order:
            if i in spheres:
                centre, radius, color = spheres[i]
                cv2.circle(image, centre, radius, color, -1, self._line, SUBPIXEL_BITS)
                continue
            polygons = faces_of.get(i)
            if not polygons:
                continue
            if antialias:  # anti-aliased silhouette under the faces: a smooth outline without seams inside
                outline = cv2.convexHull(np.concatenate([p for p, _ in polygons]))
                mean = np.mean([c for _, c in polygons], axis=0)
                cv2.fillConvexPoly(image, outline, tuple(round(float(v)) for v in mean), cv2.LINE_AA, SUBPIXEL_BITS)
            for polygon, color in polygons:
                cv2.fillConvexPoly(image, polygon, color, cv2.LINE_8, SUBPIXEL_BITS)
        return image

    def _sphere_items(self, t: np.ndarray) -> dict[int, tuple[tuple[int, int], int, list[int]]]:
        """Discs of the spheres entirely in front of the near plane: {primitive: (centre, radius, colour)}.

        Centres and radii are fixed point (:data:`SUBPIXEL_BITS`); the radius is f * r / z.
        """
        out: dict[int, tuple[tuple[int, int], int, list[int]]] = {}
        if not len(self._spheres):
            return out
        c = t[self._spheres]
        ok = c[:, 2] - self._sphere_radius > self.shading.near
        if not ok.any():
            return out
        idx, c, r = self._spheres[ok], c[ok], self._sphere_radius[ok]
        centres = self._fixed(c).tolist()
        focal = 0.5 * (self.view.intrinsics.fx + self.view.intrinsics.fy)
        radii = np.round(focal * r / c[:, 2] * _SUBPIXEL).astype(np.int64).tolist()
        towards_camera = -c / np.linalg.norm(c, axis=1, keepdims=True)
        colors = self._shade(idx, towards_camera).tolist()
        for k, i in enumerate(idx.tolist()):
            out[i] = (tuple(centres[k]), radii[k], colors[k])
        return out


class RenderGenerator(Generator):
    """The embedded default backend: the robot drawn over the reference frame, one frame per step.

    ``condition`` images are accepted and ignored: the frame is drawn from the
    joint vector itself. Timings: stages ``fk`` (primitive poses) and ``draw``
    (copying the reference and painting) [ms].
    """

    def __init__(
        self,
        robot: RobotModel | None = None,
        intrinsics: CameraIntrinsics | None = None,
        shading: Shading | None = None,
        *,
        width: int | None = None,
        height: int | None = None,
        camera_frame: str = DEFAULT_CAMERA_FRAME,
    ) -> None:
        """
        Args:
            robot: the robot model (default :meth:`RobotModel.default`).
            intrinsics: the head camera's intrinsics (default: the D435-like
                :func:`default_intrinsics` of the output size).
            shading: light, tessellation, anti-aliasing, near plane.
            width, height: output size [px], both or neither (default: the
                intrinsics' size, else 640x480); intrinsics of another size
                are scaled to it (:meth:`CameraIntrinsics.scaled`).
            camera_frame: the camera's optical frame in the description.
        """
        super().__init__()
        if (width is None) != (height is None):
            raise ValueError(f"render: give both width and height or neither, got {width} x {height}")
        self.robot = robot if robot is not None else RobotModel.default()
        if intrinsics is None:
            intrinsics = default_intrinsics(width or DEFAULT_WIDTH, height or DEFAULT_HEIGHT)
        width, height = int(width or intrinsics.width), int(height or intrinsics.height)
        if (width, height) != (intrinsics.width, intrinsics.height):
            intrinsics = intrinsics.scaled(width, height)
        self.width, self.height = width, height
        self.shading = shading if shading is not None else Shading()
        self.geometry = RobotGeometry(self.robot)
        self.view = CameraView.from_robot(self.robot, intrinsics, camera_frame, self.shading.near)
        self.renderer = PrimitiveRenderer(self.geometry.primitives, self.view, self.shading)
        self._reference: np.ndarray | None = None
        self._observed: np.ndarray | None = None

    @property
    def intrinsics(self) -> CameraIntrinsics:
        return self.view.intrinsics

    @property
    def reference(self) -> np.ndarray | None:
        """The current reference frame (read-only (H, W, 3) uint8 RGB), None before :meth:`reset`."""
        return self._reference

    @property
    def observed(self) -> np.ndarray | None:
        """The newest real frame handed to :meth:`observe` (read-only), None if none."""
        return self._observed

    def _own(self, frame: np.ndarray) -> np.ndarray:
        out = np.array(as_rgb(frame, self.width, self.height), copy=True)
        out.flags.writeable = False
        return out

    def reset(self, reference: np.ndarray) -> None:
        """Start a stream over ``reference`` (RGB uint8, any size: resized to the output size)."""
        self._reference = self._own(reference)

    def reanchor(self, frame: np.ndarray) -> None:
        """Replace the reference frame by ``frame`` now."""
        self._reference = self._own(frame)

    def observe(self, frame: np.ndarray) -> None:
        """Keep the newest real frame (it does not change the output until :meth:`reanchor`)."""
        self._observed = self._own(frame)

    def render(self, q: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """``reference`` (H, W, 3) uint8 (copied) with the robot at ``q`` (54,) [rad] painted over it."""
        q = np.asarray(q, dtype=float)
        if q.shape != (len(self.robot.joint_names),) or not np.all(np.isfinite(q)):
            raise ValueError(f"render: expected a finite ({len(self.robot.joint_names)},) joint vector, got {q.shape}")
        with self.timer.stage("fk"):
            poses = self.view.T_camera_base @ self.geometry.poses(q)
        with self.timer.stage("draw"):
            frame = reference.copy()
            self.renderer.draw(frame, poses)
        return frame

    def step(self, action: np.ndarray, condition: np.ndarray | None = None) -> list[np.ndarray]:
        """[the reference with the robot at ``action`` (54,) [rad] drawn over it]; ``condition`` is ignored.

        Raises:
            RuntimeError: called before :meth:`reset`.
            ValueError: not a finite (54,) joint vector.
        """
        if self._reference is None:
            raise RuntimeError("RenderGenerator.step() before reset(reference)")
        return [self.render(action, self._reference)]
