"""The physical twin's objects in recorded episodes: their poses at the camera frames, their boxes in the head
camera's image, when they first move (ROS-free, torch-free).

A twin episode (the digital mode's recorder) holds the twin node's ``/twin/objects`` (``geometry_msgs/PoseArray``
in ``base_link``, every object in the scene file's order, stamped with the simulated instant on the node clock,
about 60 Hz) and ``/twin/scene`` (latched ``std_msgs/String``, JSON: ``scene``, ``seed``, and ``objects`` with
``name``, ``shape``, ``size`` [m], ``fixed``; :func:`rynn_teleop.sim.monitor.scene_description`); its
``episode.yaml`` names the layout in ``extra.twin`` (``scene``, ``seed``).

* **Poses at a frame** (:meth:`TwinObjects.sample`): as a frame's action is the command in force at its stamp,
  a frame's object poses are those of the newest ``/twin/objects`` message stamped at or before the frame's
  stamp (header stamps, ties in file order). A frame stamped before the first message has none.
* **Moved** (:func:`object_track`): an object is *displaced* at a frame when its pose differs from its pose at
  the episode's first usable frame by more than :data:`MOVE_THRESHOLD_M` in position or
  :data:`MOVE_THRESHOLD_RAD` in rotation; its *first move* is the first displaced frame (-1: never); it *has
  moved* at every frame from its first move on (also when it is put back). It is *lifted* when its centre is
  more than :data:`LIFT_THRESHOLD_M` above where it was at the first frame: held up, or resting on something
  higher than where it started (a platform). The twin publishes no contacts, so no grasp or contact flag is
  given: ``lifted`` is the only interaction flag the poses alone support.
* **Boxes** (:func:`project_boxes`): an object's extent is the convex hull of :meth:`SceneObject.hull_points`
  (a box's 8 corners; a cylinder's two end circles as 24-gons circumscribing them; a sphere's circumscribed
  cube, a loose but safe bound), posed at the frame's pose and projected through the dataset's camera
  (:class:`~rynn_teleop.core.camera_view.CameraView`: the head camera's intrinsics at the frames' size and the
  optical frame's pose in ``base_link`` from the robot description, what the condition images are drawn
  with). The projection of a convex body lies in the hull of its hull points' projections, so the box holds
  every pixel the object can cover (for boxes and, up to the lens model, exactly the tight box). A box is
  the half-open pixel rectangle ``[u0, u1) x [v0, v1)`` (u: columns, v: rows) of every pixel whose square
  (pixel centres at integer coordinates, pixel i spans [i - 0.5, i + 0.5)) meets the projected extent,
  clipped to the image; all zero when the object is out of view or any hull point lies behind the camera's
  near plane.

Clip files (:mod:`.clips`) of a dataset built with objects carry, beside the clip's own tensors,
``objects.poses`` (T, N, 7) float64 (x, y, z [m], quaternion x, y, z, w in ``base_link``), ``objects.boxes``
(T, N, 4) int32 [px] at the clip's frame size, ``objects.displaced``, ``objects.moved``, ``objects.lifted``
(T, N) uint8 0/1 and ``objects.first_move`` (N,) int64 (a frame index among the episode's usable frames, the
index of ``Clip.start``; -1: never), and in their metadata ``objects`` (JSON list of the objects: name, shape,
size, fixed) and ``layout`` (:func:`layout_key`). :func:`read_clip_objects` reads them back.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rynn_teleop.core.camera_view import CameraView
from rynn_teleop.recording.errors import DamagedEpisodeError, EpisodeDataError

from .clips import DatasetError

OBJECTS_TOPIC = "/twin/objects"
SCENE_TOPIC = "/twin/scene"
POSE_ARRAY = "geometry_msgs/msg/PoseArray"
STRING = "std_msgs/msg/String"
SHAPES = {"box": 3, "cylinder": 2, "sphere": 1}  # shape -> number of size values (sim.scene.SHAPE_SIZE_LENGTH)
MOVE_THRESHOLD_M = 0.005  # [m] an object further than this from its first pose is displaced ...
MOVE_THRESHOLD_RAD = math.radians(2.0)  # [rad] ... or turned further than this
LIFT_THRESHOLD_M = 0.01  # [m] an object whose centre is higher than at the first frame by more is lifted
MAX_POSE_AGE_S = 0.25  # [s] a frame whose newest object pose is older than this is warned about (stale poses)
CYLINDER_SIDES = 24  # [-] sides of the polygon circumscribing a cylinder's end circles
CLIP_KEYS = ("poses", "boxes", "displaced", "moved", "lifted", "first_move")  # tensors "objects.<key>"
OBJECTS_FORMAT = "rynn_teleop.world_model.objects/1"
OBJECTS_FILE = "objects.json"  # a dataset built with objects: what the object tensors mean (:func:`objects_doc`)


class NotTwinEpisodeError(EpisodeDataError):
    """An episode without the twin's objects (no ``/twin/objects`` or ``/twin/scene``, or ones that cannot be
    used); the message starts with the episode's path and says what is missing."""


class SceneObject(NamedTuple):
    """One object of a twin scene, as ``/twin/scene`` describes it."""

    name: str
    shape: str  # box, cylinder (axis along its z) or sphere
    size: tuple[float, ...]  # [m] box: x, y, z full edges; cylinder: radius, height; sphere: radius
    fixed: bool  # welded to the table (never moves)

    def hull_points(self) -> np.ndarray:
        """(M, 3) [m] points in the object's frame (origin at its centre) whose convex hull contains it (see the
        module docstring)."""
        if self.shape == "box":
            half = np.asarray(self.size, dtype=float) / 2
            signs = np.array([(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=float)
            return signs * half
        if self.shape == "cylinder":
            r = self.size[0] / math.cos(math.pi / CYLINDER_SIDES)  # the polygon's corners: it circumscribes
            a = 2 * math.pi * np.arange(CYLINDER_SIDES) / CYLINDER_SIDES
            ring = np.stack([r * np.cos(a), r * np.sin(a)], axis=1)
            h = self.size[1] / 2
            return np.concatenate([np.column_stack([ring, np.full(len(ring), z)]) for z in (-h, h)])
        r = self.size[0]  # sphere: its circumscribed cube
        return np.array([(x, y, z) for x in (-r, r) for y in (-r, r) for z in (-r, r)], dtype=float)

    def doc(self) -> dict[str, Any]:
        """JSON-ready fields (what clip metadata and dataset entries record)."""
        return {"name": self.name, "shape": self.shape, "size": list(self.size), "fixed": self.fixed}


def scene_objects(text: str) -> tuple[str, int | None, tuple[SceneObject, ...]]:
    """(scene name, layout seed or None, objects in ``/twin/objects``' order) of a ``/twin/scene`` JSON text.

    Raises:
        ValueError: not the twin's scene JSON, or an object of an unknown shape or size (named).
    """
    try:
        doc = json.loads(text)
        scene = str(doc["scene"])
        seed = doc.get("seed")
        seed = None if seed is None else int(seed)
        objects = objects_from_docs(doc["objects"])
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not the twin's scene JSON ({type(exc).__name__}: {exc})") from None
    return scene, seed, objects


def objects_from_docs(docs: Sequence[Mapping[str, Any]]) -> tuple[SceneObject, ...]:
    """The objects of ``/twin/scene``'s ``objects`` list (or :meth:`SceneObject.doc` dicts).

    Raises:
        ValueError: an object of an unknown shape or size (named).
        KeyError, TypeError: a field missing or of the wrong type.
    """
    objects = []
    for k, o in enumerate(docs):
        name, shape = str(o["name"]), str(o["shape"])
        size = tuple(float(v) for v in o["size"])
        if SHAPES.get(shape) != len(size) or not all(math.isfinite(v) and v > 0 for v in size):
            raise ValueError(f"object {k} ({name!r}): shape {shape!r} with size {list(size)}; expected one of "
                             f"{', '.join(f'{s} ({n} sizes > 0)' for s, n in SHAPES.items())}")
        objects.append(SceneObject(name, shape, size, bool(o.get("fixed", False))))
    return tuple(objects)


def layout_key(scene: str, seed: int | None) -> str:
    """The name of a layout, ``<scene>/seed=<seed>``: episodes with the same key started with the same object
    layout (the scene file and the seed determine the initial poses)."""
    return f"{scene}/seed={'?' if seed is None else int(seed)}"


def episode_layout(doc: Mapping[str, Any]) -> str | None:
    """The layout key of an episode from its description (``episode.yaml``'s ``extra.twin``: ``scene``,
    ``seed``, written by the recorder when a twin ran); None when it names none."""
    twin = (doc.get("extra") or {}).get("twin") if isinstance(doc.get("extra"), Mapping) else None
    if not isinstance(twin, Mapping) or not twin.get("scene"):
        return None
    seed = twin.get("seed")
    try:
        return layout_key(str(twin["scene"]), None if seed is None else int(seed))
    except (TypeError, ValueError):
        return None


# ---- poses ---------------------------------------------------------------------------------------------------


def quaternion_matrices(quaternions: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotation matrices of (..., 4) quaternions (x, y, z, w; normalised here)."""
    q = np.asarray(quaternions, dtype=float)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    x, y, z, w = np.moveaxis(q, -1, 0)
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], axis=-1),
        np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], axis=-1),
        np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], axis=-1),
    ], axis=-2)


class TwinObjects(NamedTuple):
    """One episode's ``/twin/objects`` and ``/twin/scene`` (:func:`read_twin_objects`)."""

    scene: str  # the twin's scene name
    seed: int | None  # its layout seed
    objects: tuple[SceneObject, ...]  # in the poses' order
    stamps_ns: np.ndarray  # (M,) int64 header stamps [ns], non-decreasing
    poses: np.ndarray  # (M, N, 7) float64: x, y, z [m], quaternion x, y, z, w, in base_link

    @property
    def layout(self) -> str:
        """:func:`layout_key` of the scene and seed ``/twin/scene`` named."""
        return layout_key(self.scene, self.seed)

    def sample(self, at_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The poses in force at each of the stamps ``at_ns`` [ns] (see the module docstring).

        Returns:
            (poses (len, N, 7), age (len,) int64 [ns] of each pose, -1 where no message is stamped at or before
            the stamp; those rows of ``poses`` are NaN).
        """
        at = np.asarray(at_ns, dtype=np.int64)
        k = np.searchsorted(self.stamps_ns, at, side="right") - 1
        poses = np.full((len(at), len(self.objects), 7), np.nan)
        age = np.full(len(at), -1, dtype=np.int64)
        ok = k >= 0
        poses[ok] = self.poses[k[ok]]
        age[ok] = at[ok] - self.stamps_ns[k[ok]]
        return poses, age


def read_twin_objects(bag: Any, episode: str | os.PathLike, typestore: Any = None) -> TwinObjects:
    """The objects of an episode's bag (a :class:`~rynn_teleop.recording.frames.Bag`): every ``/twin/objects``
    message in header-stamp order (stable), named by ``/twin/scene``.

    Raises:
        NotTwinEpisodeError: ``/twin/objects`` or ``/twin/scene`` not recorded, of another type, empty, a
            ``/twin/scene`` that is not the twin's JSON, scenes that disagree (the twin was reset to another layout
            during the episode: the objects jumped), or poses of another number than the scene's objects.
        DamagedEpisodeError: a message that does not decode (from the bag's reader).
    """
    from rynn_teleop.recording.writer import default_typestore

    path = Path(episode)
    typestore = default_typestore() if typestore is None else typestore
    if bag.types.get(OBJECTS_TOPIC) is None:
        raise NotTwinEpisodeError(f"{path}: no {OBJECTS_TOPIC} recorded: not a twin episode", episode=path,
                                  topic=OBJECTS_TOPIC)
    for topic, kind in ((OBJECTS_TOPIC, POSE_ARRAY), (SCENE_TOPIC, STRING)):
        if topic in bag.types and bag.types[topic] != kind:
            raise NotTwinEpisodeError(f"{path}: {topic} is {bag.types[topic]}, not {kind}", episode=path, topic=topic)
    if SCENE_TOPIC not in bag.types:
        raise NotTwinEpisodeError(f"{path}: no {SCENE_TOPIC} recorded: the objects on {OBJECTS_TOPIC} cannot be "
                                  "named", episode=path, topic=SCENE_TOPIC)
    scenes: list[tuple[str, int | None, tuple[SceneObject, ...]]] = []
    stamps: list[int] = []
    poses: list[np.ndarray] = []
    scan = bag.scan({OBJECTS_TOPIC, SCENE_TOPIC})
    try:
        for topic, _, data in scan:
            try:
                msg = typestore.deserialize_cdr(data, bag.types[topic])
            except Exception as exc:  # rosbags raises SerdeError and others for garbage
                raise DamagedEpisodeError(f"{path}: damaged: a message on {topic} does not decode "
                                          f"({type(exc).__name__}: {exc})", episode=path, topic=topic) from exc
            if topic == SCENE_TOPIC:
                try:
                    scenes.append(scene_objects(str(msg.data)))
                except ValueError as exc:
                    raise NotTwinEpisodeError(f"{path}: {SCENE_TOPIC}: {exc}", episode=path, topic=topic) from exc
                continue
            stamps.append(int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec))
            poses.append(np.array([(p.position.x, p.position.y, p.position.z, p.orientation.x, p.orientation.y,
                                    p.orientation.z, p.orientation.w) for p in msg.poses], dtype=float).reshape(-1, 7))
    finally:
        scan.close()
    if not scenes:
        raise NotTwinEpisodeError(f"{path}: no {SCENE_TOPIC} message: the objects on {OBJECTS_TOPIC} cannot be named",
                                  episode=path, topic=SCENE_TOPIC)
    if not poses:
        raise NotTwinEpisodeError(f"{path}: no {OBJECTS_TOPIC} message: not a twin episode", episode=path,
                                  topic=OBJECTS_TOPIC)
    distinct = sorted({layout_key(s, seed) for s, seed, _ in scenes})
    if len(distinct) > 1 or len({objs for _, _, objs in scenes}) > 1:
        raise NotTwinEpisodeError(f"{path}: the twin's layout changed during the episode ({', '.join(distinct)}): "
                                  "its objects jumped; record one layout per episode", episode=path, topic=SCENE_TOPIC)
    scene, seed, objects = scenes[0]
    counts = sorted({len(p) for p in poses})
    if counts != [len(objects)]:
        raise NotTwinEpisodeError(f"{path}: {OBJECTS_TOPIC} holds {', '.join(map(str, counts))} pose(s) per message; "
                                  f"{SCENE_TOPIC} names {len(objects)} object(s)", episode=path, topic=OBJECTS_TOPIC)
    order = np.argsort(np.asarray(stamps, dtype=np.int64), kind="stable")
    all_poses = np.stack(poses)[order]
    if not np.all(np.isfinite(all_poses)) or np.any(np.linalg.norm(all_poses[..., 3:], axis=-1) < 1e-9):
        raise NotTwinEpisodeError(f"{path}: {OBJECTS_TOPIC} holds non-finite poses or zero quaternions",
                                  episode=path, topic=OBJECTS_TOPIC)
    return TwinObjects(scene, seed, objects, np.asarray(stamps, dtype=np.int64)[order], all_poses)


# ---- per frame: moved, lifted, boxes -------------------------------------------------------------------------


class ObjectTrack(NamedTuple):
    """The objects at T consecutive frames of an episode (:func:`object_track`); frame 0 is the reference."""

    poses: np.ndarray  # (T, N, 7) float64 [m], quaternion x, y, z, w
    displaced: np.ndarray  # (T, N) bool: further than the thresholds from the frame-0 pose
    moved: np.ndarray  # (T, N) bool: at or after the first move
    lifted: np.ndarray  # (T, N) bool: centre more than LIFT_THRESHOLD_M above its frame-0 height
    first_move: np.ndarray  # (N,) int64 frame index of the first displaced frame, -1: never


def rotation_angles(q0: np.ndarray, q1: np.ndarray) -> np.ndarray:
    """[rad] angle of the rotation between quaternions ``q0`` and ``q1`` (..., 4), in [0, pi]."""
    a = np.asarray(q0, dtype=float)
    b = np.asarray(q1, dtype=float)
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return 2 * np.arccos(np.clip(np.abs(np.sum(a * b, axis=-1)), 0.0, 1.0))


def object_track(poses: np.ndarray, move_m: float = MOVE_THRESHOLD_M, move_rad: float = MOVE_THRESHOLD_RAD,
                 lift_m: float = LIFT_THRESHOLD_M) -> ObjectTrack:
    """Displaced, moved, lifted and first move of each object over ``poses`` (T, N, 7) (see the module
    docstring; the reference pose is frame 0's).

    Raises:
        ValueError: ``poses`` not (T >= 1, N, 7) and finite.
    """
    p = np.asarray(poses, dtype=float)
    if p.ndim != 3 or p.shape[-1] != 7 or len(p) < 1 or not np.all(np.isfinite(p)):
        raise ValueError(f"object poses must be finite (T >= 1, N, 7); got shape {p.shape}")
    shift = np.linalg.norm(p[:, :, :3] - p[:1, :, :3], axis=-1)
    turn = rotation_angles(p[:1, :, 3:], p[:, :, 3:])
    displaced = (shift > move_m) | (turn > move_rad)
    first = np.where(displaced.any(axis=0), np.argmax(displaced, axis=0), -1).astype(np.int64)
    index = np.arange(len(p))[:, None]
    moved = (first[None] >= 0) & (index >= first[None])
    lifted = p[:, :, 2] - p[:1, :, 2] > lift_m
    return ObjectTrack(p, displaced, moved, lifted, first)


def project_boxes(view: CameraView, objects: Sequence[SceneObject], poses: np.ndarray) -> np.ndarray:
    """(T, N, 4) int32 pixel boxes ``u0, v0, u1, v1`` (half-open, see the module docstring) of ``objects`` at
    ``poses`` (T, N, 7) through ``view`` (its intrinsics' size is the image's); all zero where an object is out of
    view or reaches behind the near plane."""
    p = np.asarray(poses, dtype=float)
    w, h = int(view.intrinsics.width), int(view.intrinsics.height)
    boxes = np.zeros(p.shape[:2] + (4,), dtype=np.int32)
    for k, obj in enumerate(objects):
        local = obj.hull_points()  # (M, 3)
        rot = quaternion_matrices(p[:, k, 3:])  # (T, 3, 3)
        world = np.einsum("tij,mj->tmi", rot, local) + p[:, k, None, :3]  # (T, M, 3)
        uv = view.project(world.reshape(-1, 3)).uv.reshape(len(p), len(local), 2)
        seen = np.isfinite(uv).all(axis=(1, 2))
        if not seen.any():
            continue
        lo, hi = uv[seen].min(axis=1), uv[seen].max(axis=1)  # (t, 2) [px]
        u0 = np.clip(np.floor(lo[:, 0] + 0.5), 0, w)
        v0 = np.clip(np.floor(lo[:, 1] + 0.5), 0, h)
        u1 = np.clip(np.floor(hi[:, 0] + 0.5) + 1, 0, w)
        v1 = np.clip(np.floor(hi[:, 1] + 0.5) + 1, 0, h)
        box = np.stack([u0, v0, u1, v1], axis=1).astype(np.int32)
        box[(box[:, 2] <= box[:, 0]) | (box[:, 3] <= box[:, 1])] = 0
        boxes[seen, k] = box
    return boxes


def box_visible(boxes: np.ndarray) -> np.ndarray:
    """(...,) bool: the boxes (..., 4) cover at least one pixel."""
    b = np.asarray(boxes)
    return (b[..., 2] > b[..., 0]) & (b[..., 3] > b[..., 1])


# ---- in clip files -------------------------------------------------------------------------------------------


class ClipObjects(NamedTuple):
    """The objects of one clip (see the module docstring); T is the clip's length, N the scene's objects."""

    objects: tuple[SceneObject, ...]
    layout: str  # layout_key of the episode
    poses: np.ndarray  # (T, N, 7) float64
    boxes: np.ndarray  # (T, N, 4) int32 [px]
    displaced: np.ndarray  # (T, N) bool
    moved: np.ndarray  # (T, N) bool
    lifted: np.ndarray  # (T, N) bool
    first_move: np.ndarray  # (N,) int64, episode frame index (-1: never)

    def check(self, frames: int, where: str = "clip") -> ClipObjects:
        """Itself, once its arrays have the shapes of ``frames`` frames of its objects.

        Raises:
            DatasetError: naming ``where`` and the array.
        """
        t, n = frames, len(self.objects)
        shapes = {"poses": (t, n, 7), "boxes": (t, n, 4), "displaced": (t, n), "moved": (t, n), "lifted": (t, n),
                  "first_move": (n,)}
        for key, shape in shapes.items():
            if np.shape(getattr(self, key)) != shape:
                raise DatasetError(f"{where}: objects.{key} has shape {np.shape(getattr(self, key))}, expected {shape} "
                                   f"({t} frames, {n} objects)")
        return self

    @property
    def movers(self) -> np.ndarray:
        """(N,) bool: the objects that move during their episode (``first_move`` >= 0) and are not fixed."""
        return (self.first_move >= 0) & ~np.array([o.fixed for o in self.objects], dtype=bool)

    def mover_mask(self, height: int, width: int, margin_px: int = 0) -> np.ndarray:
        """(T, height, width) bool: per frame, the union of the :attr:`movers`' boxes, each grown by ``margin_px``
        on every side and clipped to the frame (boxes out of view add nothing)."""
        mask = np.zeros((len(self.boxes), height, width), dtype=bool)
        for t, k in zip(*np.nonzero(box_visible(self.boxes) & self.movers[None]), strict=True):
            u0, v0, u1, v1 = (int(v) for v in self.boxes[t, k])
            mask[t, max(v0 - margin_px, 0):max(v1 + margin_px, 0), max(u0 - margin_px, 0):max(u1 + margin_px, 0)] = True
        return mask

    def slice(self, start: int, stop: int) -> ClipObjects:
        """Frames ``start:stop`` (first_move stays an episode frame index)."""
        s = slice(start, stop)
        return self._replace(poses=self.poses[s], boxes=self.boxes[s], displaced=self.displaced[s],
                             moved=self.moved[s], lifted=self.lifted[s])

    def tensors(self) -> dict[str, np.ndarray]:
        """The arrays as stored in a clip file (``objects.<key>``)."""
        return {"objects.poses": np.ascontiguousarray(self.poses, dtype=np.float64),
                "objects.boxes": np.ascontiguousarray(self.boxes, dtype=np.int32),
                "objects.displaced": np.ascontiguousarray(self.displaced, dtype=np.uint8),
                "objects.moved": np.ascontiguousarray(self.moved, dtype=np.uint8),
                "objects.lifted": np.ascontiguousarray(self.lifted, dtype=np.uint8),
                "objects.first_move": np.ascontiguousarray(self.first_move, dtype=np.int64)}


def episode_objects(objects: TwinObjects, stamps_ns: np.ndarray) -> tuple[ClipObjects, np.ndarray]:
    """The objects at an episode's usable frames ``stamps_ns`` (all stamped at or after the first pose), without
    boxes (zeros: they need the camera, :func:`with_boxes`), and the age [ns] of each frame's pose."""
    poses, age = objects.sample(stamps_ns)
    if np.any(age < 0):
        raise ValueError("episode_objects: frames stamped before the first object pose")
    track = object_track(poses)
    boxes = np.zeros(poses.shape[:2] + (4,), dtype=np.int32)
    return ClipObjects(objects.objects, objects.layout, track.poses, boxes, track.displaced, track.moved,
                       track.lifted, track.first_move), age


def with_boxes(clip_objects: ClipObjects, view: CameraView) -> ClipObjects:
    """``clip_objects`` with its boxes projected through ``view`` (:func:`project_boxes`)."""
    return clip_objects._replace(boxes=project_boxes(view, clip_objects.objects, clip_objects.poses))


def add_to_clip_file(path: str | os.PathLike, clip_objects: ClipObjects) -> None:
    """Add ``clip_objects`` to the clip file ``path`` (written by :func:`.clips.write_clip`): the file is
    written again with its own tensors and metadata and the object tensors and metadata beside them, then
    replaces the old one (a reader of the clip sees no difference).

    Raises:
        DatasetError: not a clip file, or objects of another number of frames (named).
    """
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = Path(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: not a readable clip file ({exc})") from exc
    if "frames" not in tensors:
        raise DatasetError(f"{path}: not a clip file (no frames)")
    clip_objects.check(len(tensors["frames"]), str(path))
    tensors.update(clip_objects.tensors())
    meta.update({"objects": json.dumps([o.doc() for o in clip_objects.objects]), "layout": clip_objects.layout})
    staged = path.with_name(f".{path.name}.objects")
    save_file(tensors, str(staged), metadata=meta)
    os.replace(staged, path)


def read_clip_objects(path: str | os.PathLike) -> ClipObjects | None:
    """The objects stored in the clip file ``path``; None when it has none (a dataset built without objects).

    Raises:
        DatasetError: an unreadable file, or object tensors that are incomplete or of the wrong shapes (named).
    """
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            keys = set(f.keys())
            if "objects" not in meta:
                return None
            arrays = {k: f.get_tensor(f"objects.{k}") for k in CLIP_KEYS if f"objects.{k}" in keys}
            frames = f.get_slice("frames").get_shape()[0] if "frames" in keys else None
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: not a readable clip file ({exc})") from exc
    missing = [k for k in CLIP_KEYS if k not in arrays]
    if missing or frames is None:
        raise DatasetError(f"{path}: objects metadata without objects.{', objects.'.join(missing or ['frames'])}")
    try:
        objects = objects_from_docs(json.loads(meta["objects"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: objects metadata: {exc}") from exc
    return ClipObjects(objects, str(meta.get("layout", "")), arrays["poses"].astype(np.float64),
                       arrays["boxes"].astype(np.int32), arrays["displaced"].astype(bool),
                       arrays["moved"].astype(bool), arrays["lifted"].astype(bool),
                       arrays["first_move"].astype(np.int64)).check(int(frames), str(path))


def objects_doc(intrinsics: Mapping[str, Any], camera_frame: str, split_by: str,
                layouts: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The dataset-level ``objects.json`` of a dataset built with objects: what the clip tensors mean, the
    thresholds, the camera the boxes were projected through (at the frames' size) and the layouts of each split."""
    return {
        "format": OBJECTS_FORMAT,
        "topics": {"poses": OBJECTS_TOPIC, "scene": SCENE_TOPIC},
        "thresholds": {"move_m": MOVE_THRESHOLD_M, "move_rad": MOVE_THRESHOLD_RAD, "lift_m": LIFT_THRESHOLD_M},
        "boxes": "half-open pixel rectangles [u0, v0, u1, v1) of the projected convex hull of each object's extent "
                 "(box corners; cylinder end circles as circumscribed 24-gons; sphere's circumscribed cube), clipped "
                 "to the frame; zeros when out of view",
        "camera": {"intrinsics": dict(intrinsics), "camera_frame": camera_frame},
        "contact": "not recorded: the twin publishes poses only; 'lifted' (centre above its first height by more "
                   "than lift_m) is the interaction flag",
        "split_by": split_by,
        "layouts": {k: sorted(v) for k, v in layouts.items()},
    }


def read_objects_doc(root: str | os.PathLike) -> dict[str, Any] | None:
    """``root/objects.json`` (:func:`objects_doc`); None when the dataset was built without objects.

    Raises:
        DatasetError: a file that is not such a document.
    """
    path = Path(root) / OBJECTS_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != OBJECTS_FORMAT:
        raise DatasetError(f"{path}: not an objects document of format {OBJECTS_FORMAT!r}")
    return doc


__all__ = [
    "LIFT_THRESHOLD_M",
    "MOVE_THRESHOLD_M",
    "MOVE_THRESHOLD_RAD",
    "OBJECTS_FILE",
    "OBJECTS_TOPIC",
    "SCENE_TOPIC",
    "ClipObjects",
    "NotTwinEpisodeError",
    "ObjectTrack",
    "SceneObject",
    "TwinObjects",
    "add_to_clip_file",
    "box_visible",
    "episode_layout",
    "episode_objects",
    "layout_key",
    "object_track",
    "objects_doc",
    "objects_from_docs",
    "project_boxes",
    "read_clip_objects",
    "read_objects_doc",
    "read_twin_objects",
    "scene_objects",
    "with_boxes",
]
