"""The robot drawn through the head camera: posed visual primitives painted into an image (ROS-free, torch-free).

The stack's one robot renderer: the world model's ``render`` backend draws the commanded robot over a
reference frame with it, the synthetic head camera draws the measured robot over its tabletop.

:class:`PrimitiveRenderer` paints primitives (boxes, cylinders, spheres:
:class:`~rynn_teleop.core.robot_geometry.RobotGeometry`) given their poses in the camera's optical frame
(x right, y down, z forward), projected through the view's intrinsics (:class:`~.camera_view.CameraView`):
a box as its 6 faces, a cylinder as ``Shading.cylinder_segments`` side facets and two end caps, a sphere as
a disc; faces pointing away from the camera are culled (every primitive is convex); each face is filled in
the primitive's URDF colour, Lambert-shaded by one directional light fixed in the camera frame (ambient +
diffuse * max(0, n . l)); primitives are painted far to near by the optical z of their centre; faces crossing
the near plane are clipped at it. On request it also returns the depth of what it paints
(:meth:`PrimitiveRenderer.draw_depth`). :class:`RobotRenderer` poses a description's primitives at a joint vector
and draws them through its head camera, together with scene objects posed in ``base_link`` (the physical twin's
boxes, cylinders and spheres: :func:`object_primitive`), all in one painter's order.

The result depends only on (image, poses): the same inputs give a bit-identical image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import cv2
import numpy as np

from .camera import CameraIntrinsics
from .camera_view import DEFAULT_CAMERA_FRAME, SUBPIXEL, SUBPIXEL_BITS, CameraView, fixed_point
from .robot_geometry import Primitive, RobotGeometry
from .robot_model import RobotModel
from .settings import Settings, setting


def _direction_problem(light: list[float]) -> str | None:
    return "is not a direction (its length is zero)" if np.linalg.norm(light) < 1e-9 else None


@dataclass(frozen=True)
class Shading(Settings):
    """How the primitives are lit and tessellated (each field declared as a parameter: :mod:`.settings`).

    Raises:
        ParameterError: a bad field; ``key`` (and the message) name it.
    """

    SETTINGS_NAME: ClassVar[str] = "shading"

    light: tuple[float, float, float] = setting((-0.3, -0.6, -0.75), "direction towards the light, camera optical "
                                                "frame (normalised)", length=3, min=-1e6, max=1e6,
                                                check=_direction_problem)
    ambient: float = setting(0.35, "share of the colour every face gets", min=0.0, max=2.0)
    diffuse: float = setting(0.7, "Lambertian share, times max(0, n . light)", min=0.0, max=2.0)
    cylinder_segments: int = setting(16, "facets around a cylinder (and vertices of its caps)", min=3, max=128)
    antialias: bool = setting(True, "anti-aliased silhouettes (each primitive's outline is drawn with cv2.LINE_AA)")
    near: float = setting(0.02, "near clip plane in the optical frame", units="m", min=1e-6, max=1e3)

    def __post_init__(self) -> None:
        super().__post_init__()
        light = np.asarray(self.light, dtype=float)
        object.__setattr__(self, "light", tuple(float(v) for v in light / np.linalg.norm(light)))


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


class PixelDepths(NamedTuple):
    """The pixels a drawing covered and the depth of the surface drawn at each
    (:meth:`PrimitiveRenderer.draw_depth`)."""

    v: np.ndarray  # (P,) int64 rows
    u: np.ndarray  # (P,) int64 columns
    z: np.ndarray  # (P,) [m] optical z of the surface at the pixel centre


class _Faces(NamedTuple):
    """The faces :meth:`PrimitiveRenderer.draw` fills, in drawing order (F faces)."""

    polygons: list[np.ndarray]  # F fixed-point polygons (K_f, 2) int32
    points: np.ndarray  # (P, 2) int32 their vertices concatenated
    offsets: list[int]  # (F + 1) where each polygon starts in ``points``, with the end last
    prim: np.ndarray  # (F,) their primitives
    colors: np.ndarray  # (F, 3) uint8 RGB
    normals: np.ndarray | None = None  # (F, 3) unit outward normals, optical frame (only for depth)
    plane: np.ndarray | None = None  # (F,) [m] n . p of the points p of each face's plane (only for depth)
    z_min: np.ndarray | None = None  # (F,) [m] nearest optical z of each face (at least the near plane)
    z_max: np.ndarray | None = None  # (F,) [m] farthest optical z of each face


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
        self._radius = np.zeros(len(self.primitives))  # [m] per primitive: a sphere's radius, else 0
        self._radius[self._spheres] = self._sphere_radius
        self._rgb = np.array([np.asarray(p.rgba, dtype=float)[:3] for p in self.primitives]).reshape(-1, 3)
        self._light = np.asarray(self.shading.light)
        self._line = cv2.LINE_AA if self.shading.antialias else cv2.LINE_8

        intr = view.intrinsics
        # pinhole constants (u, v) = f * (x, y) / z + c, for views without distortion
        self._f = None if view.distorted else np.array([intr.fx, intr.fy])
        self._c = None if view.distorted else np.array([intr.cx, intr.cy])
        # image bounds in fixed point (pixel centres at integers): a face entirely beyond one is not filled
        self._lo = -0.5 * SUBPIXEL
        self._hi = np.array([intr.width - 0.5, intr.height - 0.5]) * SUBPIXEL
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
        Raises:
            ValueError: poses or image of the wrong shape.
        """
        self._paint(image, poses_cam, None)
        return image

    def draw_depth(self, image: np.ndarray, poses_cam: np.ndarray) -> PixelDepths:
        """Paint like :meth:`draw`, and return the depth of what was painted.

        The faces are also rasterised without anti-aliasing, in the same painter's order, into a map of which
        face (or disc) covers each pixel centre, so the depth is that of the primitive the colour shows there:
        the optical z where the pixel centre's ray ((u - cx) / fx, (v - cy) / fy, 1) enters that primitive (the
        last of its faces' planes the ray crosses: exact for these convex, planar-faced shapes, also at the
        seams between faces); on a sphere's disc, its front surface. A pixel centre just beyond a primitive's
        outline (the rasteriser covers centres up to about half a pixel outside a polygon) gets that value
        clipped to the primitive's depth range. Only for views without distortion.

        Returns:
            The covered pixels and their depth [m] (:class:`PixelDepths`, row-major order).
        Raises:
            ValueError: poses or image of the wrong shape; a distorted view.
        """
        if self._f is None:
            raise ValueError("render: depth is drawn only through views without distortion")
        labels = np.full(image.shape[:2], -1, dtype=np.int32)
        faces, spheres, t = self._paint(image, poses_cam, labels)
        return self._depths(labels, faces, spheres, t)

    def _paint(
        self, image: np.ndarray, poses_cam: np.ndarray, labels: np.ndarray | None
    ) -> tuple[_Faces | None, dict[int, tuple[tuple[int, int], int, list[int]]], np.ndarray]:
        """Paint into ``image``; with ``labels`` (H, W) int32 (-1 = nothing), also write there which face
        (its index in drawing order) or sphere (-2 - its primitive) covers each pixel centre. Returns the
        faces, the sphere discs and the primitives' positions (N, 3) in the optical frame."""
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
        faces = self._faces(R, t, self._visible(t), rank, planes=labels is not None)
        spheres = self._sphere_items(t)
        if faces is None and not spheres:
            return faces, spheres, t

        # (rank, primitive, first face, end face, outline colour or None), in drawing order; spheres have no faces
        items: list[tuple[int, int, int, int, list[int] | None]] = []
        polygons: list[np.ndarray] = []
        colors: list[list[int]] = []
        points, offsets = np.empty((0, 2), dtype=np.int32), [0]
        if faces is not None:
            polygons, points, offsets, prim, shaded = faces[:5]
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
                if labels is not None:
                    cv2.circle(labels, centre, radius, -2 - i, -1, line8, shift)
                continue
            if outline_color is not None:  # anti-aliased silhouette under the faces: a smooth outline, no inner seams
                outline = cv2.convexHull(points[offsets[start] : offsets[end]])
                fill(image, outline, outline_color, cv2.LINE_AA, shift)
            for polygon, color in zip(polygons[start:end], colors[start:end]):
                fill(image, polygon, color, line8, shift)
            if labels is not None:
                for j in range(start, end):
                    fill(labels, polygons[j], j, line8, shift)
        return faces, spheres, t

    def _depths(
        self,
        labels: np.ndarray,
        faces: _Faces | None,
        spheres: dict[int, tuple[tuple[int, int], int, list[int]]],
        t: np.ndarray,
    ) -> PixelDepths:
        """The optical z [m] of the labelled pixels (see :meth:`draw_depth`): a face's pixel, where its ray
        enters the face's primitive (:meth:`_entry_depths`); sphere i's, the front root of |z r - t_i| = radius
        along the pixel centre's ray r. Only the box around what was painted is searched."""
        boxes = []  # (u0, v0, u1, v1) [px] around the painted polygons and discs
        if faces is not None:
            lo, hi = faces.points.min(axis=0) >> SUBPIXEL_BITS, faces.points.max(axis=0) >> SUBPIXEL_BITS
            boxes.append((lo[0], lo[1], hi[0], hi[1]))
        for (cu, cv), radius, _ in spheres.values():
            boxes.append(((cu - radius) >> SUBPIXEL_BITS, (cv - radius) >> SUBPIXEL_BITS,
                          (cu + radius) >> SUBPIXEL_BITS, (cv + radius) >> SUBPIXEL_BITS))
        height, width = labels.shape
        none = PixelDepths(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))
        if not boxes:
            return none
        b = np.array(boxes, dtype=np.int64)
        u0, v0 = max(int(b[:, 0].min()) - 1, 0), max(int(b[:, 1].min()) - 1, 0)
        u1, v1 = min(int(b[:, 2].max()) + 2, width), min(int(b[:, 3].max()) + 2, height)
        if u1 <= u0 or v1 <= v0:
            return none
        found = cv2.findNonZero((labels[v0:v1, u0:u1] != -1).view(np.uint8))  # (u, v) pairs, row-major
        if found is None:
            return none
        found = found.reshape(-1, 2)
        u = found[:, 0].astype(np.int64) + u0
        v = found[:, 1].astype(np.int64) + v0
        flat = labels.ravel()
        at = v * width + u
        label = flat[at]
        # seams: pixels whose label differs from one of their 8 neighbours', or on the image border (the rest
        # lie inside their face; a pixel whose 4 neighbours share its label can still sit on a diagonal seam)
        seam = (u == 0) | (u == width - 1) | (v == 0) | (v == height - 1)
        for step in (1, width, width + 1, width - 1):
            seam |= flat[np.minimum(at + step, flat.size - 1)] != label
            seam |= flat[np.maximum(at - step, 0)] != label
        z = np.empty(len(label))
        on_face = label >= 0
        if faces is not None and on_face.any():
            z[on_face] = self._entry_depths(faces, label[on_face], u[on_face], v[on_face], seam[on_face])
        if not on_face.all():
            intr = self.view.intrinsics
            s = ~on_face
            i = -2 - label[s]
            c, r = t[i], self._radius[i]
            sa, sb = (u[s] - intr.cx) / intr.fx, (v[s] - intr.cy) / intr.fy
            A = sa * sa + sb * sb + 1.0
            B = sa * c[:, 0] + sb * c[:, 1] + c[:, 2]
            disc = np.maximum(B * B - A * (np.einsum("ij,ij->i", c, c) - r * r), 0.0)
            z[s] = (B - np.sqrt(disc)) / A
        return PixelDepths(v, u, z)

    def _entry_depths(
        self, faces: _Faces, j: np.ndarray, u: np.ndarray, v: np.ndarray, seam: np.ndarray
    ) -> np.ndarray:
        """(P,) [m] depths of the pixels (u, v) (P,), (P,) labelled with faces ``j`` (P,).

        A ray enters a convex primitive where it crosses the last of the planes of the primitive's faces towards
        the camera, at z = max over them of (n . c) / (n . r), r = ((u - cx) / fx, (v - cy) / fy, 1): exact for a
        ray through the primitive, whichever of its faces the rasteriser gave the pixel. Computed as
        1 / min over the primitive's drawn faces of 1 / z, which is affine in (u, v) per face (faces the ray
        leaves through give 1 / z <= 0 and are skipped). A ray just beyond the primitive's outline gets that
        value clipped to the primitive's depth range. Pixels not on a ``seam`` (P,) (every 4-neighbour has
        their label) lie inside their face: its plane alone gives their depth.
        """
        intr = self.view.intrinsics
        n, d = faces.normals, faces.plane
        inv_u, inv_v = n[:, 0] / (intr.fx * d), n[:, 1] / (intr.fy * d)  # [1/m] per face: 1/z = A u + B v + C
        inv_1 = (n[:, 2] - n[:, 0] * intr.cx / intr.fx - n[:, 1] * intr.cy / intr.fy) / d
        prim = faces.prim
        first = np.flatnonzero(np.r_[True, prim[1:] != prim[:-1]])  # each primitive's faces are consecutive
        count = np.r_[first[1:], len(prim)] - first
        block = np.searchsorted(first, j, side="right") - 1
        start, final = first[block], count[block] - 1
        uf, vf = u.astype(np.float64), v.astype(np.float64)
        best = inv_u[j] * uf + inv_v[j] * vf + inv_1[j]  # [1/m] of the pixel's own face
        s = np.flatnonzero(seam)
        if len(s):
            start, final, us, vs = start[s], final[s], uf[s], vf[s]
            edge = np.where(best[s] > 0.0, best[s], np.inf)
            for k in range(int(count.max())):
                f = start + np.minimum(final, k)  # a primitive with fewer faces repeats its last
                inv = inv_u[f] * us + inv_v[f] * vs + inv_1[f]
                np.minimum(edge, inv, out=edge, where=inv > 0.0)
            best[s] = edge
        lo = np.minimum.reduceat(faces.z_min, first)[block]
        hi = np.maximum.reduceat(faces.z_max, first)[block]
        with np.errstate(divide="ignore"):
            return np.clip(1.0 / best, lo, hi)

    def _faces(
        self, R: np.ndarray, t: np.ndarray, visible: np.ndarray, rank: np.ndarray, planes: bool = False
    ) -> _Faces | None:
        """The faces to fill of the primitives flagged ``visible`` (N,), posed by ``R`` (N, 3, 3), ``t`` (N, 3),
        in drawing order: by the primitives' ``rank`` (N,), then quads before caps, each by index; with their
        planes and depth ranges if ``planes``.

        A face is filled if it faces the camera (outward normal against the ray to its centroid) and lies
        in front of the near plane and not entirely beyond one image border, or if it faces the camera and
        crosses the near plane (then clipped at it).

        Returns:
            The faces (:class:`_Faces`); None when there are none.
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
        n = n[order]
        out = _Faces(polygons, points, [0, *ends.tolist()], prim, self._shade(prim, n))
        if not planes:
            return out
        # each face's plane n . p = n . centroid (a clipped face keeps its plane) and its corners' depth range
        depth_groups = []
        for f, *_ in groups:
            z = take(V[:, 2], f)
            depth_groups.append((z.min(axis=1), z.max(axis=1)))
        z_min, z_max = (np.concatenate([g[j] for g in depth_groups]) for j in (0, 1))
        face = kept[order]
        return out._replace(
            normals=n,
            plane=np.einsum("ni,ni->n", n, centroid[face]),
            z_min=np.maximum(z_min[face], near),
            z_max=np.maximum(z_max[face], near),
        )

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
        radii = np.round(focal * r / c[:, 2] * SUBPIXEL).astype(np.int64).tolist()
        towards_camera = -c / np.linalg.norm(c, axis=1, keepdims=True)
        colors = self._shade(idx, towards_camera).tolist()
        for k, i in enumerate(idx.tolist()):
            out[i] = (tuple(centres[k]), radii[k], colors[k])
        return out


def object_primitive(name: str, shape: str, size: Sequence[float], rgba: Sequence[float]) -> Primitive:
    """The :class:`~.robot_geometry.Primitive` of a scene object given as a scene file does (``rynn_teleop.sim``):
    ``shape`` box (``size`` x, y, z edges), cylinder (radius, height along z) or sphere (radius) [m]; ``rgba`` in
    [0, 1]. Its pose is its centre's.

    Raises:
        ValueError: an unknown shape or a size of the wrong length.
    """
    size = [float(v) for v in size]
    lengths = {"box": 3, "cylinder": 2, "sphere": 1}
    if shape not in lengths or len(size) != lengths[shape]:
        raise ValueError(f"render: object {name!r}: expected a box (3 sizes), cylinder (2) or sphere (1), got "
                         f"{shape!r} with {len(size)}")
    extent = {"box": size, "cylinder": [2 * size[0], 2 * size[0], size[1] if len(size) > 1 else 0.0],
              "sphere": [2 * size[0]] * 3}[shape]
    return Primitive(name, name, shape, np.array(extent), np.asarray(rgba, dtype=float))


class RobotRenderer:
    """A robot description drawn through its head camera at a joint vector, with scene objects.

    Poses the description's visual primitives (:class:`~.robot_geometry.RobotGeometry`) at ``q``, expresses
    them in the camera's optical frame (the description's ``camera_frame``, fixed to the torso:
    :meth:`CameraView.from_robot`) and paints them with a :class:`PrimitiveRenderer`; the scene objects
    (:meth:`set_objects`, posed in ``base_link`` at each draw) are painted in the same pass, so the robot and the
    objects occlude each other by the painter's order of their centres.

    Attributes:
        robot: the robot model (joint order, kinematics, the camera frame).
        geometry: its visual primitives.
        view: the head camera (intrinsics and optical frame in ``base_link``).
        objects: the scene objects' primitives (drawn after the robot's in :attr:`renderer`'s list).
        draw_robot: False: the robot is not drawn (the objects only).
        renderer: the painter of :attr:`geometry`'s primitives (with ``draw_robot``) and :attr:`objects`.
    """

    def __init__(
        self,
        robot: RobotModel,
        intrinsics: CameraIntrinsics,
        shading: Shading | None = None,
        camera_frame: str = DEFAULT_CAMERA_FRAME,
        objects: Sequence[Primitive] = (),
        *,
        draw_robot: bool = True,
    ) -> None:
        """
        Args:
            robot: the robot model.
            intrinsics: the camera's intrinsics (the size of the images drawn into).
            shading: light, tessellation, anti-aliasing, near plane (default :class:`Shading`).
            camera_frame: the camera's optical frame in the description.
            objects: scene objects (:func:`object_primitive`), posed at each draw.
            draw_robot: False: draw the objects only.

        Raises:
            FrameNotFoundError: ``camera_frame`` is not in the description.
            ConfigurationError: the frame moves with a joint, or bad intrinsics.
        """
        self.robot = robot
        self.shading = shading if shading is not None else Shading()
        self.geometry = RobotGeometry(robot)
        self.view = CameraView.from_robot(robot, intrinsics, camera_frame, self.shading.near)
        self.draw_robot = bool(draw_robot)
        self.set_objects(objects)

    def set_objects(self, objects: Sequence[Primitive]) -> None:
        """Draw these scene objects from now on (each draw then takes one pose per object)."""
        self.objects = tuple(objects)
        robot = self.geometry.primitives if self.draw_robot else ()
        self.renderer = PrimitiveRenderer((*robot, *self.objects), self.view, self.shading)

    def joint_vector(self, q: np.ndarray) -> np.ndarray:
        """``q`` as the float (54,) [rad] joint vector the robot is painted at (a copy).

        Raises:
            ValueError: not a finite (54,) joint vector.
        """
        q = np.array(q, dtype=float, copy=True)
        if q.shape != (len(self.robot.joint_names),) or not np.all(np.isfinite(q)):
            raise ValueError(f"render: expected a finite ({len(self.robot.joint_names)},) joint vector, got "
                             f"{q.shape}")
        return q

    def poses(self, q: np.ndarray, object_poses: np.ndarray | None = None) -> np.ndarray:
        """(N, 4, 4) poses in the optical frame of the robot's primitives at ``q`` (54,) [rad], canonical order
        (none without :attr:`draw_robot`), then of the objects at ``object_poses`` (M, 4, 4) in ``base_link``.

        Raises:
            ValueError: not a finite (54,) joint vector; not one pose per object.
        """
        parts = []
        if self.draw_robot:
            parts.append(self.view.T_camera_base @ self.geometry.poses(self.joint_vector(q)))
        if self.objects:
            T = np.asarray(object_poses if object_poses is not None else (), dtype=float)
            if T.shape != (len(self.objects), 4, 4):
                raise ValueError(f"render: expected ({len(self.objects)}, 4, 4) object poses, got {T.shape}")
            parts.append(self.view.T_camera_base @ T)
        return np.concatenate(parts) if parts else np.empty((0, 4, 4))

    def draw(self, image: np.ndarray, q: np.ndarray, object_poses: np.ndarray | None = None) -> np.ndarray:
        """Paint the robot at ``q`` (54,) [rad] and the objects at ``object_poses`` (M, 4, 4) in ``base_link`` into
        ``image`` (in place); returns ``image``."""
        return self.renderer.draw(image, self.poses(q, object_poses))

    def draw_depth(self, image: np.ndarray, q: np.ndarray, object_poses: np.ndarray | None = None) -> PixelDepths:
        """Paint the robot at ``q`` (54,) [rad] and the objects at ``object_poses`` (M, 4, 4) in ``base_link`` into
        ``image`` (in place); returns the pixels they cover and their depth (:meth:`PrimitiveRenderer.draw_depth`)."""
        return self.renderer.draw_depth(image, self.poses(q, object_poses))
