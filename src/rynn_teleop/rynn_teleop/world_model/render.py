"""The ``render`` backend: the robot's arms and hands drawn over the reference frame (ROS-free, torch-free).

Each step poses the description's visual primitives (boxes, cylinders, spheres:
:class:`~rynn_teleop.core.robot_geometry.RobotGeometry`) at the commanded joints, expresses them in the head
camera's optical frame (x right, y down, z forward), projects them through the camera intrinsics and paints
them over a copy of the reference frame: a box as its 6 faces, a cylinder as ``Shading.cylinder_segments``
side facets and two end caps, a sphere as a disc; faces pointing away from the camera are culled (every
primitive is convex); each face is filled in the primitive's URDF colour, Lambert-shaded by one directional
light fixed in the camera frame (ambient + diffuse * max(0, n . l)); primitives are painted far to near by the
optical z of their centre; faces crossing the near plane are clipped at it.

The result depends only on (reference, joint vector): the same inputs give a bit-identical image. The robot
is not occluded by the scene (the reference frame has no depth here): it is always drawn on top.
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
    """The part of a convex 3D polygon (K, 3) [m, optical frame] with z >= near (Sutherland-Hodgman, one plane).

    Vertex k is kept if it is in front, followed by the cut of edge (k, k + 1) where that edge crosses the plane.
    """
    points = polygon.tolist()
    out = []
    for k, a in enumerate(points):
        b = points[k + 1 - len(points)]
        a_in = a[2] >= near
        if a_in:
            out.append(a)
        if a_in != (b[2] >= near):
            s = (near - a[2]) / (b[2] - a[2])
            out.append([a[0] + s * (b[0] - a[0]), a[1] + s * (b[1] - a[1]), near])
    return np.array(out, dtype=float).reshape(-1, 3)


# outcode masks (one flag per byte of a uint64): beyond one image border; behind the near plane
_BESIDE = int(np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=np.uint8).view(np.uint64)[0])
_BEHIND = int(np.array([0, 0, 0, 0, 1, 0, 0, 0], dtype=np.uint8).view(np.uint64)[0])
_CULL_MARGIN = 4.0  # [px] a primitive is culled only if its bounding sphere projects this far outside the image


def _frustum_planes(intrinsics: CameraIntrinsics, margin: float) -> np.ndarray:
    """(4, 3) inward unit normals of the planes through the optical centre bounding the rays that project
    inside the image grown by ``margin`` [px] (pixel centres at integers, no distortion).

    A point p with z > 0 projects inside that rectangle iff normals @ p >= 0 for all four.
    """
    fx, fy, cx, cy = intrinsics.fx, intrinsics.fy, intrinsics.cx, intrinsics.cy
    u0, u1 = -0.5 - margin, intrinsics.width - 0.5 + margin
    v0, v1 = -0.5 - margin, intrinsics.height - 0.5 + margin
    planes = np.array([
        [fx, 0.0, cx - u0],  # u >= u0: fx x + (cx - u0) z >= 0
        [-fx, 0.0, u1 - cx],  # u <= u1
        [0.0, fy, cy - v0],  # v >= v0
        [0.0, -fy, v1 - cy],  # v <= v1
    ])
    return planes / np.linalg.norm(planes, axis=1, keepdims=True)


class PrimitiveRenderer:
    """Paints posed primitives into an image through a camera view (see the module doc).

    The meshes, their per-face data and the view's culling planes are built
    once. :meth:`draw` culls whole primitives outside the view frustum (by
    bounding sphere; never one that could touch the image), is vectorised
    over the faces of the rest and loops in Python only over the faces it
    fills and the primitives it outlines.
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
        quads = np.concatenate(quads) if quads else np.empty((0, 4), dtype=np.int64)
        caps = np.concatenate(caps) if caps else np.empty((0, segments), dtype=np.int64)
        # every face, quads (box faces, cylinder sides) first, then caps: local outward normals and primitive
        self._fnormals = np.concatenate([*qnormals, *cnormals]) if vertices else np.empty((0, 3))
        self._fprim = np.array(qprim + cprim, dtype=np.int64)
        self._nquads = len(quads)
        self._quads, self._caps = quads, caps  # (Fq, 4), (Fc, segments) vertex indices, in order around
        self._spheres = np.array(spheres, dtype=np.int64)
        self._sphere_radius = np.array([0.5 * float(np.max(self.primitives[i].size)) for i in spheres])
        self._rgb = np.array([np.asarray(p.rgba, dtype=float)[:3] for p in self.primitives]).reshape(-1, 3)
        self._light = np.asarray(self.shading.light)
        self._line = cv2.LINE_AA if self.shading.antialias else cv2.LINE_8

        intr = view.intrinsics
        # pinhole constants (u, v) = f * (x, y) / z + c, for views without distortion
        self._f = None if view.distorted else np.array([intr.fx, intr.fy])
        self._c = None if view.distorted else np.array([intr.cx, intr.cy])
        # image bounds in fixed point (pixel centres at integers): a face entirely beyond one is not filled
        self._lo = -0.5 * _SUBPIXEL
        self._hi = np.array([intr.width - 0.5, intr.height - 0.5]) * _SUBPIXEL
        # bounding-sphere radii [m] about each primitive's origin (its mesh is centred), slightly grown
        bound = np.zeros(len(self.primitives))
        np.maximum.at(bound, self._vprim, np.linalg.norm(self._vertices, axis=1))
        self._bound = bound * (1.0 + 1e-9) + 1e-9
        self._frustum = None if view.distorted else _frustum_planes(intr, _CULL_MARGIN)

    def _shade(self, prim: np.ndarray, normals: np.ndarray) -> np.ndarray:
        """(F, 3) uint8 RGB of faces of primitives ``prim`` (F,) with camera-frame unit normals (F, 3)."""
        s = self.shading
        light = s.ambient + s.diffuse * np.maximum(normals @ self._light, 0.0)
        return np.round(np.clip(self._rgb[prim] * light[:, None], 0.0, 1.0) * 255.0).astype(np.uint8)

    def _fixed(self, points_cam: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
        """(N, 2) int32 fixed-point pixels of optical-frame points with z > 0 (:func:`fixed_point` of
        :meth:`CameraView.project_unmasked`, the same arithmetic in fewer steps when there is no distortion).

        ``z`` (N, 1) replaces the points' depths (without distortion only).
        """
        if self._f is None:
            return fixed_point(self.view.project_unmasked(points_cam))
        uv = points_cam[:, :2] / (points_cam[:, 2:3] if z is None else z)
        uv *= self._f
        uv += self._c
        return fixed_point(uv)

    def _visible(self, t: np.ndarray) -> np.ndarray:
        """(N,) bool: primitive i (origin ``t[i]`` [m], optical frame) may reach the image.

        False only if its bounding sphere lies entirely behind the near plane or, without distortion,
        entirely outside the view frustum grown by :data:`_CULL_MARGIN` px: then every face of it is either
        behind the near plane or projects (also once clipped at the near plane) beyond the image border by
        more than the anti-aliased edge reaches, so it is not drawn or draws nothing.
        """
        visible = t[:, 2] + self._bound > self.shading.near
        if self._frustum is not None:
            visible &= (t @ self._frustum.T > -self._bound[:, None]).all(axis=1)
        return visible

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
        # painter's order: primitives far to near by the optical z of their centre (stable: ties keep URDF order)
        rank = np.empty(len(t), dtype=np.int64)
        rank[np.argsort(-t[:, 2], kind="stable")] = np.arange(len(t))
        faces = self._faces(R, t, self._visible(t), rank)
        spheres = self._sphere_items(t)
        if faces is None and not spheres:
            return image

        # (rank, primitive, first face, end face, outline colour or None), in drawing order; spheres have no faces
        items: list[tuple[int, int, int, int, list[int] | None]] = []
        polygons: list[np.ndarray] = []
        colors: list[list[int]] = []
        points, offsets = np.empty((0, 2), dtype=np.int32), [0]
        if faces is not None:
            polygons, points, offsets, prim, shaded = faces
            colors = shaded.tolist()
            starts = np.flatnonzero(np.r_[True, prim[1:] != prim[:-1]])
            ends = np.r_[starts[1:], len(prim)]
            if self.shading.antialias:  # the outline's colour: the rounded mean colour of the primitive's faces
                sums = np.add.reduceat(shaded.astype(np.float64), starts, axis=0)
                outline = np.round(sums / (ends - starts)[:, None]).astype(np.int64).tolist()
            else:
                outline = [None] * len(starts)
            first = prim[starts]
            items = list(zip(rank[first].tolist(), first.tolist(), starts.tolist(), ends.tolist(), outline))
        if spheres:
            items = sorted(items + [(int(rank[i]), i, -1, -1, None) for i in spheres], key=lambda item: item[0])

        fill, line8, shift = cv2.fillConvexPoly, cv2.LINE_8, SUBPIXEL_BITS
        for _, i, start, end, outline_color in items:
            if start < 0:
                centre, radius, color = spheres[i]
                cv2.circle(image, centre, radius, color, -1, self._line, shift)
                continue
            if outline_color is not None:  # anti-aliased silhouette under the faces: a smooth outline, no inner seams
                outline = cv2.convexHull(points[offsets[start] : offsets[end]])
                fill(image, outline, outline_color, cv2.LINE_AA, shift)
            for polygon, color in zip(polygons[start:end], colors[start:end]):
                fill(image, polygon, color, line8, shift)
        return image

    def _faces(
        self, R: np.ndarray, t: np.ndarray, visible: np.ndarray, rank: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray, list[int], np.ndarray, np.ndarray] | None:
        """The faces to fill of the primitives flagged ``visible`` (N,), posed by ``R`` (N, 3, 3), ``t`` (N, 3),
        in drawing order: by the primitives' ``rank`` (N,), then quads before caps, each by index.

        A face is filled if it faces the camera (outward normal against the ray to its centroid) and lies
        in front of the near plane and not entirely beyond one image border, or if it faces the camera and
        crosses the near plane (then clipped at it).

        Returns:
            (the fixed-point polygons (K_f, 2) int32; their vertices concatenated (P, 2); where each polygon
            starts there, with the end last (F + 1,); their primitives (F,); their (F, 3) uint8 RGB); None when
            there are none.
        """
        fsel = np.flatnonzero(visible[self._fprim])
        if not len(fsel):
            return None
        near = self.shading.near
        take = np.take  # gathers rows (also of strided views) without fancy indexing's overhead
        nq = int(np.searchsorted(fsel, self._nquads))
        # the vertices of the visible primitives, and the faces re-indexed into them
        vsel = np.flatnonzero(visible[self._vprim])
        remap = np.empty(len(self._vprim), dtype=np.int64)
        remap[vsel] = np.arange(len(vsel))
        vprim = self._vprim[vsel]
        V = np.einsum("nij,nj->ni", take(R, vprim, 0), take(self._vertices, vsel, 0)) + take(t, vprim, 0)
        front = V[:, 2] > near
        if self._f is not None:  # pixels of every vertex, those not in front (never used) projected at z = 1
            px = self._fixed(V, np.where(front, V[:, 2], 1.0)[:, None])
        else:
            px = np.zeros((len(V), 2), dtype=np.int32)
            if front.any():
                px[front] = self._fixed(V[front])
        # outcodes, one flag per byte: left of / above the image, right of / below it (fixed point), not in front
        flags = np.zeros((len(V), 8), dtype=bool)
        np.less(px, self._lo, out=flags[:, 0:2])
        np.greater(px, self._hi, out=flags[:, 2:4])
        np.logical_not(front, out=flags[:, 4])
        code = flags.view(np.uint64)[:, 0]

        prim = self._fprim[fsel]
        n = np.einsum("nij,nj->ni", take(R, prim, 0), take(self._fnormals, fsel, 0))  # camera-frame outward normals
        groups = []  # per face group: faces (F, K) into V, AND and OR of their vertices' outcodes, centroids
        for faces, sel in ((self._quads, fsel[:nq]), (self._caps, fsel[nq:] - self._nquads)):
            if not len(sel):
                continue
            f = take(remap, take(faces, sel, 0))
            if f.shape[1] <= 4:  # the vertex mean summed column by column (the same sums as np.mean, fewer steps)
                fv, codes = take(V, f, 0), take(code, f)
                s, every = fv[:, 0], codes[:, 0]
                some = every
                for k in range(1, f.shape[1]):
                    s = s + fv[:, k]
                    c = codes[:, k]
                    every, some = every & c, some | c
                centroid = s / f.shape[1]
            else:
                codes = take(code, f)
                every, some = np.bitwise_and.reduce(codes, axis=1), np.bitwise_or.reduce(codes, axis=1)
                centroid = take(V, f, 0).mean(axis=1)
            groups.append((f, every, some, centroid))
        if len(groups) == 1:
            every, some, centroid = groups[0][1:]
        else:
            every, some, centroid = (np.concatenate([g[j] for g in groups]) for j in (1, 2, 3))
        facing = np.einsum("ni,ni->n", n, centroid) < 0.0
        all_front = (some & _BEHIND) == 0
        clipped = facing & ~all_front & ((every & _BEHIND) == 0)
        keep = (facing & all_front & ((every & _BESIDE) == 0)) | clipped
        kept = np.flatnonzero(keep)
        if not len(kept):
            return None

        # the kept faces' polygons (views of per-group (F, K, 2) arrays), and every visible face's points with
        # the groups concatenated (face j's start and length there)
        f0, f1 = groups[0][0], groups[-1][0]
        nf0 = len(f0)
        m = int(np.searchsorted(kept, nf0)) if len(groups) > 1 else len(kept)
        polygons = list(take(px, take(f0, kept[:m], 0), 0))
        if m < len(kept):
            polygons += list(take(px, take(f1, kept[m:] - nf0, 0), 0))
        corners = take(px, np.concatenate([f0.ravel(), f1.ravel()]) if len(groups) > 1 else f0.ravel(), 0)
        later = kept >= nf0
        start = np.where(later, nf0 * f0.shape[1] + (kept - nf0) * f1.shape[1], kept * f0.shape[1])
        length = np.where(later, f1.shape[1], f0.shape[1])
        cut = np.flatnonzero(clipped[kept])
        if len(cut):  # clipped faces: their part in front of the near plane, appended to the points
            parts, cuts, drop = [], [], []
            size = len(corners)
            for k in cut.tolist():
                j = int(kept[k])
                part = _clip_near(V[f0[j] if j < nf0 else f1[j - nf0]], near)
                if len(part) < 3:
                    drop.append(k)
                    continue
                parts.append(part)
                cuts.append(k)
                start[k], length[k] = size, len(part)
                size += len(part)
            if parts:
                fixed = self._fixed(np.concatenate(parts))
                corners = np.concatenate([corners, fixed])
                for k in cuts:
                    polygons[k] = fixed[start[k] - len(corners) + len(fixed) :][: length[k]]
            if drop:
                kept, start, length = (np.delete(a, drop) for a in (kept, start, length))
                polygons = [polygons[k] for k in np.delete(np.arange(len(polygons)), drop).tolist()]
                if not len(kept):
                    return None
        prim, n = prim[kept], n[kept]
        order = np.argsort(rank[prim], kind="stable")
        prim, start, length = prim[order], start[order], length[order]
        ends = np.cumsum(length)
        points = take(corners, np.repeat(start - (ends - length), length) + np.arange(ends[-1]), 0)
        polygons = [polygons[k] for k in order.tolist()]
        return polygons, points, [0, *ends.tolist()], prim, self._shade(prim, n[order])

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
    joint vector itself (:attr:`uses_condition` is False, so callers need not
    draw them). Timings: stages ``fk`` (primitive poses) and ``draw``
    (copying the reference and painting) [ms].
    """

    #: :meth:`step` ignores its ``condition`` image
    uses_condition = False

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
