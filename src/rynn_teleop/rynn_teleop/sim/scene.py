"""Task scenes of the physical twin, declared in YAML (``config/sim/<name>.yaml``), and their seeded layouts.

A scene is a table, objects on it and target regions, all in the twin's world frame, which is ``base_link``
(REP-103: x forward, y left, z up; the robot stands at the origin). Each object and target declares the
ranges its initial position and yaw are drawn from; :meth:`Scene.layout` draws them from
``numpy.random.default_rng(seed)`` (same seed, same layout), keeping footprints apart. Loading validates every
key and value and fails with a :class:`SceneError` that names the file and the key (an unknown key, a negative
mass, an object whose range reaches off the table, ...).

File layout (units: metres, kilograms, radians; every key listed in :data:`SCHEMA`)::

    name: pick_place
    description: ...
    table: {center: [x, y], size: [x, y], height: z, friction: mu, colour: [r, g, b, a]}
    objects:
      - {name: red_cube, shape: box, size: [x, y, z], mass: kg, friction: mu, colour: [...],
         x: [lo, hi], y: [lo, hi], yaw: [lo, hi], fixed: false}
    targets:
      - {name: goal, size: [x, y], x: [lo, hi], y: [lo, hi], support: table}
    task: {kind: place, object: red_cube, target: goal}

Sizes: box ``[x, y, z]`` full edges; cylinder ``[radius, height]`` (upright); sphere ``[radius]``. A target
whose ``support`` is a fixed object (a platform) lies centred on its top; its ``x``/``y`` are ignored. (The key
is ``support``, not ``on``: YAML 1.1 reads a bare ``on`` key as ``true``.)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..core.yamlfile import read_yaml
from ..errors import ConfigurationError
from ..paths import config_file

SHAPES: tuple[str, ...] = ("box", "cylinder", "sphere")
"""Object shapes (MuJoCo primitives)."""

SHAPE_SIZE_LENGTH = {"box": 3, "cylinder": 2, "sphere": 1}
"""Number of ``size`` values per shape."""

TASK_KINDS: tuple[str, ...] = ("place",)
"""Task kinds with a success predicate (:mod:`.tasks`)."""

MAX_LAYOUT_TRIES = 2000  # [-] draws per object before a layout is declared impossible

SCHEMA: dict[str, dict[str, str]] = {
    "scene": {
        "name": "scene name (text)",
        "description": "what the task is (text)",
        "table": "the table (mapping)",
        "objects": "objects on the table (list of mappings)",
        "targets": "target regions (list of mappings)",
        "task": "the task and its success predicate (mapping)",
        "clearance": "[m] least gap between footprints in a layout (default 0.03)",
    },
    "table": {
        "center": "[m] x, y of the top's centre in base_link",
        "size": "[m] x, y extent of the top",
        "height": "[m] z of the top surface in base_link",
        "friction": "[-] sliding friction coefficient",
        "colour": "RGBA in [0, 1]",
    },
    "object": {
        "name": "unique object name (MuJoCo body and geom name)",
        "shape": f"one of {', '.join(SHAPES)}",
        "size": "[m] box [x, y, z] full edges; cylinder [radius, height]; sphere [radius]",
        "mass": "[kg] > 0",
        "friction": "[-] sliding friction coefficient > 0",
        "colour": "RGBA in [0, 1]",
        "x": "[m] range [lo, hi] of the initial centre x",
        "y": "[m] range [lo, hi] of the initial centre y",
        "yaw": "[rad] range [lo, hi] of the initial rotation about z (default [0, 0])",
        "fixed": "welded to the table (a platform), default false",
    },
    "target": {
        "name": "unique target name",
        "size": "[m] x, y extent of the region",
        "x": "[m] range [lo, hi] of the region's centre x",
        "y": "[m] range [lo, hi] of the region's centre y",
        "support": "'table' (default) or the name of a fixed object the region lies on",
        "colour": "RGBA in [0, 1] (how the region is drawn)",
    },
    "task": {
        "kind": f"one of {', '.join(TASK_KINDS)}",
        "object": "the object to move",
        "target": "the region it must rest in",
        "max_speed": "[m/s] resting: linear speed below this (default 0.02)",
        "max_angular_speed": "[rad/s] resting: angular speed below this (default 0.5)",
        "height_tolerance": "[m] resting: bottom at most this far above the support (default 0.01)",
    },
}
"""Every key a scene file may hold, per section, with its meaning and units."""


class SceneError(ConfigurationError):
    """A scene file is missing, malformed or inconsistent.

    Attributes:
        path: the scene file.
        key: the dotted key the message is about (``objects[0].mass``), '' for the whole file.
    """

    def __init__(self, path: str | os.PathLike, key: str, message: str) -> None:
        self.path = os.fspath(path)
        self.key = key
        where = f" {key}" if key else ""
        super().__init__(f"scene file {self.path}{where}: {message}")


class Range(NamedTuple):
    """A closed interval [lo, hi] a value is drawn from uniformly."""

    lo: float
    hi: float

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.lo, self.hi)) if self.hi > self.lo else float(self.lo)


class TableSpec(NamedTuple):
    """The table: a solid block from the floor to ``height`` (static)."""

    center: tuple[float, float]  # [m] x, y
    size: tuple[float, float]  # [m] x, y extent
    height: float  # [m] z of the top
    friction: float  # [-]
    colour: tuple[float, float, float, float]  # RGBA

    def contains(self, x: float, y: float, extent: tuple[float, float]) -> bool:
        """True if a footprint reaching ``extent`` [m] (x, y) either side of (x, y) [m] lies on the top."""
        return (abs(x - self.center[0]) + extent[0] <= self.size[0] / 2 + 1e-9
                and abs(y - self.center[1]) + extent[1] <= self.size[1] / 2 + 1e-9)


class ObjectSpec(NamedTuple):
    """One object of a scene."""

    name: str
    shape: str  # one of SHAPES
    size: tuple[float, ...]  # [m] see SHAPE_SIZE_LENGTH
    mass: float  # [kg]
    friction: float  # [-]
    colour: tuple[float, float, float, float]  # RGBA
    x: Range  # [m]
    y: Range  # [m]
    yaw: Range  # [rad]
    fixed: bool  # welded to the world (a platform)

    @property
    def extent(self) -> tuple[float, float]:
        """[m] how far the footprint reaches along x and y from its centre, at the worst yaw of its range."""
        if self.shape != "box":
            return float(self.size[0]), float(self.size[0])
        yaws = np.linspace(self.yaw.lo, self.yaw.hi, 91)
        hx, hy = self.size[0] / 2, self.size[1] / 2
        c, s = np.abs(np.cos(yaws)), np.abs(np.sin(yaws))
        return float(np.max(hx * c + hy * s)), float(np.max(hx * s + hy * c))

    @property
    def height(self) -> float:
        """[m] extent along z when resting upright."""
        if self.shape == "sphere":
            return 2 * self.size[0]
        return self.size[-1]  # box: z edge; cylinder: height


class TargetSpec(NamedTuple):
    """A target region: a rectangle on the table or on a fixed object."""

    name: str
    size: tuple[float, float]  # [m] x, y extent
    x: Range  # [m]
    y: Range  # [m]
    support: str  # "table" or a fixed object's name
    colour: tuple[float, float, float, float]  # RGBA


class TaskSpec(NamedTuple):
    """What the task is, for its success predicate (:mod:`.tasks`)."""

    kind: str  # one of TASK_KINDS
    object: str
    target: str
    max_speed: float  # [m/s]
    max_angular_speed: float  # [rad/s]
    height_tolerance: float  # [m]


class Pose(NamedTuple):
    """A pose in the world frame (``base_link``)."""

    position: np.ndarray  # (3,) [m]
    quaternion: np.ndarray  # (4,) x, y, z, w (geometry_msgs order)


class TargetRegion(NamedTuple):
    """A target region placed by a layout."""

    name: str
    center: np.ndarray  # (3,) [m] centre of the region on its supporting surface
    half_size: np.ndarray  # (2,) [m] half extents along the region's x and y
    yaw: float  # [rad] rotation of the region about z

    def contains(self, point: np.ndarray) -> bool:
        """True if the (x, y) of ``point`` [m] lies inside the rectangle."""
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        dx, dy = float(point[0] - self.center[0]), float(point[1] - self.center[1])
        u, v = c * dx + s * dy, -s * dx + c * dy
        return abs(u) <= self.half_size[0] and abs(v) <= self.half_size[1]


class Layout(NamedTuple):
    """Initial poses of one seed."""

    seed: int
    objects: dict[str, Pose]  # object name -> pose of its centre
    targets: dict[str, TargetRegion]  # target name -> region


def yaw_quaternion(yaw: float) -> np.ndarray:
    """(4,) x, y, z, w quaternion of a rotation by ``yaw`` [rad] about z."""
    return np.array([0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)])


class Scene(NamedTuple):
    """A task scene (see the module doc); build with :func:`load_scene`."""

    name: str
    description: str
    table: TableSpec
    objects: tuple[ObjectSpec, ...]
    targets: tuple[TargetSpec, ...]
    task: TaskSpec
    clearance: float  # [m]
    path: str  # the file it was read from ('' when built in code)

    def object(self, name: str) -> ObjectSpec:
        for obj in self.objects:
            if obj.name == name:
                return obj
        raise ConfigurationError(f"scene {self.name}: no object {name!r}; objects: "
                                 f"{', '.join(o.name for o in self.objects)}")

    def target(self, name: str) -> TargetSpec:
        for target in self.targets:
            if target.name == name:
                return target
        raise ConfigurationError(f"scene {self.name}: no target {name!r}; targets: "
                                 f"{', '.join(t.name for t in self.targets)}")

    def rest_height(self, obj: ObjectSpec) -> float:
        """[m] z of the object's centre resting upright on the table."""
        return self.table.height + obj.height / 2

    def layout(self, seed: int) -> Layout:
        """The initial poses of ``seed``: each object (in file order) then each target on the table draws its
        centre and yaw from its ranges until its footprint (an oriented rectangle; a round object's bounding
        square) keeps :attr:`clearance` from those placed before.

        Raises:
            ConfigurationError: no free spot within :data:`MAX_LAYOUT_TRIES` draws.
        """
        rng = np.random.default_rng(seed)
        placed: list[Footprint] = []
        poses: dict[str, Pose] = {}
        for obj in self.objects:
            half = (np.array(obj.size[:2]) / 2) if obj.shape == "box" else np.full(2, obj.size[0])
            spot = self._free_spot(rng, obj.x, obj.y, obj.yaw, half, placed, obj.name, seed)
            poses[obj.name] = Pose(np.array([*spot.center, self.rest_height(obj)]), yaw_quaternion(spot.yaw))
        regions: dict[str, TargetRegion] = {}
        for target in self.targets:
            half = np.array(target.size, dtype=float) / 2
            if target.support != "table":
                support = self.object(target.support)
                base = poses[target.support]
                center = base.position + (0.0, 0.0, support.height / 2)
                yaw = 2 * math.atan2(float(base.quaternion[2]), float(base.quaternion[3]))
            else:
                spot = self._free_spot(rng, target.x, target.y, Range(0.0, 0.0), half, placed, target.name, seed)
                center, yaw = np.array([*spot.center, self.table.height]), 0.0
            regions[target.name] = TargetRegion(target.name, center, half, yaw)
        return Layout(seed, poses, regions)

    def _free_spot(self, rng: np.random.Generator, xr: Range, yr: Range, yawr: Range, half: np.ndarray,
                   placed: list[Footprint], name: str, seed: int) -> Footprint:
        for _ in range(MAX_LAYOUT_TRIES):
            x, y = xr.draw(rng), yr.draw(rng)
            spot = Footprint(np.array([x, y]), half, yawr.draw(rng))
            if not any(spot.overlaps(other, self.clearance) for other in placed):
                placed.append(spot)
                return spot
        raise ConfigurationError(f"scene {self.name}: no free spot for {name!r} (seed {seed}) within "
                                 f"{MAX_LAYOUT_TRIES} draws; widen its x/y ranges or lower the clearance")


class Footprint(NamedTuple):
    """An oriented rectangle on the table."""

    center: np.ndarray  # (2,) [m]
    half: np.ndarray  # (2,) [m] half extents along its own x and y
    yaw: float  # [rad]

    def axes(self) -> np.ndarray:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        return np.array([[c, s], [-s, c]])

    def overlaps(self, other: Footprint, gap: float = 0.0) -> bool:
        """True if the rectangles come closer than ``gap`` [m] along any of their axes (separating axes)."""
        d = other.center - self.center
        a, b = self.axes(), other.axes()
        for axis in (*a, *b):
            ra = float(np.abs(a @ axis) @ self.half)
            rb = float(np.abs(b @ axis) @ other.half)
            if abs(float(d @ axis)) >= ra + rb + gap:
                return False
        return True


# ------------------------------------------------------------------------------------ loading
def scene_path(name: str | os.PathLike) -> Path:
    """The file of a scene: a path as given, or the name of a file in ``config/sim/`` (``pick_place``)."""
    path = Path(name)
    if path.suffix or len(path.parts) > 1:
        return path
    return config_file(f"sim/{name}.yaml")


def available_scenes() -> tuple[str, ...]:
    """Names of the scenes in ``config/sim/``."""
    folder = config_file("sim/x.yaml").parent
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))


def load_scene(name: str | os.PathLike) -> Scene:
    """Read and validate a scene file (a path, or a name in ``config/sim/``).

    Raises:
        SceneError: the file is missing or malformed, has an unknown key, a value out of its range (a
            non-positive mass, size or friction, a reversed range), a name used twice or not found, or an
            object or target whose range reaches off the table.
    """
    path = scene_path(name)
    data = read_yaml(path, "scene file", error=lambda message: SceneError(path, "", message), mapping=True)
    return _Parser(path).scene(data)


class _Parser:
    """Turns a scene file's document into a :class:`Scene`, raising :class:`SceneError` with the key."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> SceneError:
        return SceneError(self.path, key, message)

    def keys(self, data: Any, section: str, key: str, required: Sequence[str]) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            raise self.fail(key, f"must be a mapping, got {type(data).__name__}")
        known = SCHEMA[section]
        for k in data:
            if not isinstance(k, str) or k not in known:
                raise self.fail(f"{key}.{k}" if key else str(k),
                                f"unknown key {k!r}; known keys: {', '.join(known)}")
        for k in required:
            if k not in data:
                raise self.fail(f"{key}.{k}" if key else k, f"missing ({known[k]})")
        return data

    def number(self, value: Any, key: str, *, positive: bool = False, nonnegative: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.fail(key, f"must be > 0, got {value!r}")
        if nonnegative and value < 0:
            raise self.fail(key, f"must be >= 0, got {value!r}")
        return float(value)

    def vector(self, value: Any, key: str, n: int | Sequence[int], **bounds: bool) -> tuple[float, ...]:
        lengths = (n,) if isinstance(n, int) else tuple(n)
        if not isinstance(value, (list, tuple)) or len(value) not in lengths:
            raise self.fail(key, f"must be a list of {' or '.join(map(str, lengths))} numbers, got {value!r}")
        return tuple(self.number(v, f"{key}[{i}]", **bounds) for i, v in enumerate(value))

    def range(self, value: Any, key: str, default: Range | None = None) -> Range:
        if value is None and default is not None:
            return default
        lo, hi = self.vector(value, key, 2)
        if lo > hi:
            raise self.fail(key, f"range [{lo}, {hi}] is reversed")
        return Range(lo, hi)

    def colour(self, value: Any, key: str, default: tuple[float, ...]) -> tuple[float, float, float, float]:
        if value is None:
            return tuple(default)  # type: ignore[return-value]
        rgba = self.vector(value, key, (3, 4), nonnegative=True)
        if any(c > 1.0 for c in rgba):
            raise self.fail(key, f"colour values must lie in [0, 1], got {list(rgba)}")
        return (*rgba, 1.0) if len(rgba) == 3 else rgba  # type: ignore[return-value]

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value

    # ------------------------------------------------------------------ sections
    def scene(self, data: Mapping[str, Any]) -> Scene:
        data = self.keys(data, "scene", "", ("name", "table", "objects", "targets", "task"))
        table = self.table(data["table"])
        objects = self.items(data["objects"], "objects", self.object)
        targets = self.items(data["targets"], "targets", self.target)
        self.unique([o.name for o in objects] + [t.name for t in targets], "objects")
        fixed = {o.name: o for o in objects if o.fixed}
        for i, obj in enumerate(objects):
            self.on_table(table, obj.x, obj.y, obj.extent, f"objects[{i}]", obj.name)
        for i, target in enumerate(targets):
            key = f"targets[{i}]"
            if target.support == "table":
                self.on_table(table, target.x, target.y, (target.size[0] / 2, target.size[1] / 2), key, target.name)
            elif target.support not in fixed:
                raise self.fail(f"{key}.support", f"{target.support!r} is neither 'table' nor a fixed object "
                                             f"({', '.join(fixed) or 'none'})")
            elif fixed[target.support].shape != "box":
                raise self.fail(f"{key}.support", f"a target can only lie on a box, {target.support!r} is a "
                                             f"{fixed[target.support].shape}")
        task = self.task(data["task"], objects, targets)
        clearance = self.number(data.get("clearance", 0.03), "clearance", nonnegative=True)
        return Scene(self.text(data["name"], "name"), str(data.get("description", "")), table, objects,
                     targets, task, clearance, os.fspath(self.path))

    def items(self, value: Any, key: str, parse: Any) -> tuple:
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"must be a non-empty list, got {value!r}")
        return tuple(parse(item, f"{key}[{i}]") for i, item in enumerate(value))

    def unique(self, names: list[str], key: str) -> None:
        seen = set()
        for name in names:
            if name in seen:
                raise self.fail(key, f"name {name!r} is used twice (object and target names must be unique)")
            seen.add(name)

    def on_table(self, table: TableSpec, xr: Range, yr: Range, extent: tuple[float, float], key: str,
                 name: str) -> None:
        for x in xr:
            for y in yr:
                if not table.contains(x, y, extent):
                    raise self.fail(key, f"{name!r} at x={x}, y={y} (reaching {extent[0]:.3f} m, {extent[1]:.3f} m "
                                         f"from its centre) lies outside the table (centre {list(table.center)}, "
                                         f"size {list(table.size)}); narrow its x/y ranges")

    def table(self, data: Any) -> TableSpec:
        d = self.keys(data, "table", "table", ("center", "size", "height"))
        return TableSpec(
            center=self.vector(d["center"], "table.center", 2),  # type: ignore[arg-type]
            size=self.vector(d["size"], "table.size", 2, positive=True),  # type: ignore[arg-type]
            height=self.number(d["height"], "table.height", positive=True),
            friction=self.number(d.get("friction", 0.8), "table.friction", positive=True),
            colour=self.colour(d.get("colour"), "table.colour", (0.62, 0.43, 0.26, 1.0)),
        )

    def object(self, data: Any, key: str) -> ObjectSpec:
        d = self.keys(data, "object", key, ("name", "shape", "size", "mass", "x", "y"))
        shape = d["shape"]
        if shape not in SHAPES:
            raise self.fail(f"{key}.shape", f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
        fixed = d.get("fixed", False)
        if not isinstance(fixed, bool):
            raise self.fail(f"{key}.fixed", f"must be true or false, got {fixed!r}")
        return ObjectSpec(
            name=self.text(d["name"], f"{key}.name"),
            shape=shape,
            size=self.vector(d["size"], f"{key}.size", SHAPE_SIZE_LENGTH[shape], positive=True),
            mass=self.number(d["mass"], f"{key}.mass", positive=True),
            friction=self.number(d.get("friction", 0.8), f"{key}.friction", positive=True),
            colour=self.colour(d.get("colour"), f"{key}.colour", (0.7, 0.7, 0.7, 1.0)),
            x=self.range(d["x"], f"{key}.x"),
            y=self.range(d["y"], f"{key}.y"),
            yaw=self.range(d.get("yaw"), f"{key}.yaw", Range(0.0, 0.0)),
            fixed=fixed,
        )

    def target(self, data: Any, key: str) -> TargetSpec:
        d = self.keys(data, "target", key, ("name", "size"))
        support = d.get("support", "table")
        if support == "table" and ("x" not in d or "y" not in d):
            raise self.fail(key, "a target on the table needs x and y ranges")
        return TargetSpec(
            name=self.text(d["name"], f"{key}.name"),
            size=self.vector(d["size"], f"{key}.size", 2, positive=True),  # type: ignore[arg-type]
            x=self.range(d.get("x"), f"{key}.x", Range(0.0, 0.0)),
            y=self.range(d.get("y"), f"{key}.y", Range(0.0, 0.0)),
            support=self.text(support, f"{key}.support"),
            colour=self.colour(d.get("colour"), f"{key}.colour", (0.2, 0.8, 0.3, 0.35)),
        )

    def task(self, data: Any, objects: Sequence[ObjectSpec], targets: Sequence[TargetSpec]) -> TaskSpec:
        d = self.keys(data, "task", "task", ("kind", "object", "target"))
        if d["kind"] not in TASK_KINDS:
            raise self.fail("task.kind", f"unknown task kind {d['kind']!r}; one of {', '.join(TASK_KINDS)}")
        movable = [o.name for o in objects if not o.fixed]
        if d["object"] not in movable:
            raise self.fail("task.object", f"{d['object']!r} is not a movable object ({', '.join(movable)})")
        if d["target"] not in [t.name for t in targets]:
            raise self.fail("task.target", f"{d['target']!r} is not a target "
                                           f"({', '.join(t.name for t in targets)})")
        return TaskSpec(
            kind=d["kind"],
            object=d["object"],
            target=d["target"],
            max_speed=self.number(d.get("max_speed", 0.02), "task.max_speed", positive=True),
            max_angular_speed=self.number(d.get("max_angular_speed", 0.5), "task.max_angular_speed",
                                          positive=True),
            height_tolerance=self.number(d.get("height_tolerance", 0.01), "task.height_tolerance",
                                         positive=True),
        )
