"""Generate the robot's URDF from the data tables in ``urdf/``.

Generated in Python rather than xacro: the arm comes from the vendor's modified-DH table and the hand from its
joint table, both reproduced to 1e-6 m; DH rows to URDF origins is arithmetic xacro cannot express readably.
``rynn-teleop urdf`` prints it; ``urdf/rynn_m6_wuji.urdf`` is the committed default output (a test keeps it
equal, :mod:`.urdf_compare`). Geometry is primitives only (no meshes). Tree (every name is public interface)::

    base_link -> torso_link -> head_link -> camera_link -> camera_color_optical_frame
                                                        -> camera_depth_optical_frame
    torso_link -> {side}_arm_base_link -> {side}_arm_link1 .. link7 -> {side}_arm_flange
      -> {side}_palm_link -> {side}_finger{1..5}_link{1..4} -> {side}_finger{N}_tip_link
"""

from __future__ import annotations

import copy
import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigurationError
from ..paths import urdf_file
from .layout import N_ARM, N_FINGER_JOINTS, N_FINGERS, SIDES
from .yamlfile import read_yaml

DEFAULT_URDF_NAME = "rynn_m6_wuji.urdf"

# Optical frame: x right, y down, z forward, relative to a REP-103 body frame.
OPTICAL_RPY = (-math.pi / 2, 0.0, -math.pi / 2)

# Plausible masses [kg] for the inertials (the vendors publish none for the arm).
_ARM_LINK_MASS = (2.5, 2.5, 2.2, 1.8, 1.6, 1.0, 0.6)
_FINGER_LINK_MASS = (0.02, 0.015, 0.012, 0.008)


# --------------------------------------------------------------------------- maths
def rpy_to_matrix(rpy: Sequence[float]) -> np.ndarray:
    """URDF fixed-axis roll/pitch/yaw [rad] -> rotation matrix Rz(y) Ry(p) Rx(r)."""
    r, p, y = rpy
    cr, sr, cp, sp, cy, sy = math.cos(r), math.sin(r), math.cos(p), math.sin(p), math.cos(y), math.sin(y)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


def matrix_to_rpy(rot: np.ndarray) -> tuple[float, float, float]:
    """Rotation matrix -> URDF roll/pitch/yaw [rad] (inverse of :func:`rpy_to_matrix`)."""
    sp = -float(rot[2, 0])
    if abs(sp) > 1.0 - 1e-12:  # gimbal lock: put everything in yaw
        pitch = math.copysign(math.pi / 2, sp)
        return 0.0, pitch, math.atan2(-float(rot[0, 1]), float(rot[1, 1]))
    return (
        math.atan2(float(rot[2, 1]), float(rot[2, 2])),
        math.asin(sp),
        math.atan2(float(rot[1, 0]), float(rot[0, 0])),
    )


def mdh_transform(alpha: float, a: float, d: float, theta: float) -> np.ndarray:
    """Craig modified-DH transform RotX(alpha) TransX(a) RotZ(theta) TransZ(d); SI units."""
    ca, sa, ct, st = math.cos(alpha), math.sin(alpha), math.cos(theta), math.sin(theta)
    return np.array(
        [
            [ct, -st, 0.0, a],
            [st * ca, ct * ca, -sa, -d * sa],
            [st * sa, ct * sa, ca, d * ca],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )


@dataclass(frozen=True)
class Origin:
    """A URDF ``<origin>``: translation xyz [m] and fixed-axis rpy [rad]."""

    xyz: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rpy: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @classmethod
    def from_matrix(cls, t: np.ndarray) -> Origin:
        return cls(tuple(float(v) for v in t[:3, 3]), matrix_to_rpy(t[:3, :3]))

    def matrix(self) -> np.ndarray:
        t = np.eye(4)
        t[:3, :3] = rpy_to_matrix(self.rpy)
        t[:3, 3] = self.xyz
        return t


def _segment_origin(p: np.ndarray) -> Origin:
    """Origin of a primitive whose z axis runs from the link origin to point ``p``."""
    length = float(np.linalg.norm(p))
    z = np.array([0.0, 0.0, 1.0])
    v = p / length
    axis = np.cross(z, v)
    s, c = float(np.linalg.norm(axis)), float(np.dot(z, v))
    if s < 1e-12:
        rot = np.eye(3) if c > 0 else np.diag([1.0, -1.0, -1.0])
    else:
        k = axis / s
        kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
        rot = np.eye(3) + s * kx + (1 - c) * kx @ kx
    return Origin(tuple(float(x) for x in p / 2), matrix_to_rpy(rot))


# --------------------------------------------------------------------------- config
def _read_yaml(path: Path) -> dict[str, Any]:
    return read_yaml(path, "robot description file", mapping=True)

def _merge(base: dict[str, Any], overlay: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in out:
            raise ConfigurationError(f"unknown robot description key {path!r}; known: {', '.join(map(str, out))}")
        if isinstance(out[key], dict):
            if not isinstance(value, Mapping):
                raise ConfigurationError(f"robot description key {path!r} must be a mapping")
            out[key] = _merge(out[key], value, path)
        else:
            out[key] = value
    return out


def load_description_config(overlay: str | Path | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The description parameters of ``urdf/robot.yaml``, optionally overlaid.

    Args:
        overlay: a YAML path or a mapping with a subset of the same keys; an
            unknown key is a :class:`ConfigurationError`.
    """
    config = _read_yaml(urdf_file("robot.yaml"))
    if overlay is not None:
        data = overlay if isinstance(overlay, Mapping) else _read_yaml(Path(overlay))
        config = _merge(config, data)
    return config


def load_arm_table() -> dict[str, Any]:
    """The Marvin M6 modified-DH table (vendor units: deg, mm) from ``urdf/marvin_m6.yaml``."""
    table = _read_yaml(urdf_file("marvin_m6.yaml"))
    if len(table.get("joints", ())) != N_ARM or len(table.get("flange", ())) != 4:
        raise ConfigurationError("marvin_m6.yaml must have 7 joint rows and a 4-value flange row")
    return table


def load_hand_table() -> dict[str, Any]:
    """The Wuji hand joint table (SI units) from ``urdf/wuji_hand.yaml``."""
    return _read_yaml(urdf_file("wuji_hand.yaml"))


# --------------------------------------------------------------------------- XML
def _fmt(values: Sequence[float]) -> str:
    return " ".join(format(float(v) + 0.0, ".15g") for v in values)  # +0.0 turns -0.0 into 0.0


class _UrdfWriter:
    """Accumulates links and joints of a ``<robot>`` element."""

    def __init__(self, name: str) -> None:
        self.robot = ET.Element("robot", name=name)
        for mat, rgba in (
            ("base_dark", (0.2, 0.2, 0.22, 1.0)),
            ("marvin_white", (0.9, 0.9, 0.92, 1.0)),
            ("joint_grey", (0.45, 0.47, 0.5, 1.0)),
            ("hand_white", (0.9, 0.92, 0.93, 1.0)),
            ("camera_black", (0.08, 0.08, 0.08, 1.0)),
        ):
            ET.SubElement(ET.SubElement(self.robot, "material", name=mat), "color", rgba=_fmt(rgba))

    @staticmethod
    def _origin(parent: ET.Element, origin: Origin) -> None:
        ET.SubElement(parent, "origin", xyz=_fmt(origin.xyz), rpy=_fmt(origin.rpy))

    def link(
        self, name: str, shapes: Sequence[tuple[str, Origin, dict[str, float]]], mass: float, material: str
    ) -> None:
        """Add a link; ``shapes`` are (kind, origin, dims) with kind box/cylinder/sphere.

        The inertial is that of the first shape, taken as a solid of ``mass`` [kg].
        """
        link = ET.SubElement(self.robot, "link", name=name)
        if shapes:
            kind, origin, dims = shapes[0]
            inertial = ET.SubElement(link, "inertial")
            self._origin(inertial, origin)
            ET.SubElement(inertial, "mass", value=_fmt([mass]))
            ixx, iyy, izz = _solid_inertia(kind, dims, mass)
            ET.SubElement(
                inertial, "inertia", ixx=_fmt([ixx]), ixy="0", ixz="0", iyy=_fmt([iyy]), iyz="0", izz=_fmt([izz])
            )
        for tag in ("visual", "collision"):
            for kind, origin, dims in shapes:
                el = ET.SubElement(link, tag)
                self._origin(el, origin)
                ET.SubElement(ET.SubElement(el, "geometry"), kind, _shape_attrs(dims))
                if tag == "visual":
                    ET.SubElement(el, "material", name=material)

    def joint(
        self,
        name: str,
        kind: str,
        parent: str,
        child: str,
        origin: Origin,
        axis: Sequence[float] | None = None,
        limit: Mapping[str, float] | None = None,
    ) -> None:
        joint = ET.SubElement(self.robot, "joint", name=name, type=kind)
        self._origin(joint, origin)
        ET.SubElement(joint, "parent", link=parent)
        ET.SubElement(joint, "child", link=child)
        if axis is not None:
            ET.SubElement(joint, "axis", xyz=_fmt(axis))
        if limit is not None:
            ET.SubElement(joint, "limit", {k: _fmt([v]) for k, v in limit.items()})

    def tostring(self, header: str) -> str:
        ET.indent(self.robot, space="  ")
        body = ET.tostring(self.robot, encoding="unicode")
        return f'<?xml version="1.0" encoding="utf-8"?>\n<!-- {header} -->\n{body}\n'


def _solid_inertia(kind: str, dims: Mapping[str, float], m: float) -> tuple[float, float, float]:
    if kind == "box":
        x, y, z = dims["size"]
        return m * (y * y + z * z) / 12, m * (x * x + z * z) / 12, m * (x * x + y * y) / 12
    if kind == "cylinder":
        r, h = dims["radius"], dims["length"]
        ixx = m * (3 * r * r + h * h) / 12
        return ixx, ixx, m * r * r / 2
    r = dims["radius"]
    return (2 / 5 * m * r * r,) * 3


def _shape_attrs(dims: Mapping[str, Any]) -> dict[str, str]:
    """URDF geometry attributes: scalars and vectors (box ``size``) as text."""
    return {k: _fmt(v if isinstance(v, (tuple, list)) else [v]) for k, v in dims.items()}


def _box(origin: Origin, size: Sequence[float]) -> tuple[str, Origin, dict[str, Any]]:
    return "box", origin, {"size": tuple(size)}


def _segment(p: np.ndarray, radius: float) -> list[tuple[str, Origin, dict[str, Any]]]:
    """A cylinder from the link origin to ``p`` (link frame), or nothing if ``p`` is ~0."""
    length = float(np.linalg.norm(p))
    if length < 1e-4:
        return []
    return [("cylinder", _segment_origin(p), {"radius": radius, "length": length})]


# --------------------------------------------------------------------------- builder
def build_urdf(overlay: str | Path | Mapping[str, Any] | None = None) -> str:
    """The complete robot URDF as a string.

    Args:
        overlay: optional overrides of ``urdf/robot.yaml`` (path or mapping).
    """
    cfg = load_description_config(overlay)
    arm = load_arm_table()
    hand = load_hand_table()
    w = _UrdfWriter(str(cfg["name"]))

    torso = Origin(tuple(cfg["torso"]["xyz"]), tuple(cfg["torso"]["rpy"]))
    stand_h = max(float(torso.xyz[2]), 0.3)  # the stand column below torso_link [m]
    w.link("base_link", [_box(Origin((0.0, 0.0, 0.1)), (0.6, 0.5, 0.2))], 40.0, "base_dark")
    w.joint("torso_joint", "fixed", "base_link", "torso_link", torso)
    w.link(
        "torso_link",
        [_box(Origin((0.0, 0.0, -stand_h / 2 + 0.1)), (0.18, 0.2, stand_h - 0.2)), _box(Origin(), (0.14, 0.26, 0.12))],
        20.0,
        "base_dark",
    )
    head = Origin(tuple(cfg["head"]["xyz"]), tuple(cfg["head"]["rpy"]))
    w.joint("head_joint", "fixed", "torso_link", "head_link", head)
    w.link("head_link", [_box(Origin((0.0, 0.0, 0.0)), (0.1, 0.14, 0.1))], 1.0, "base_dark")
    camera = Origin(tuple(cfg["camera"]["xyz"]), tuple(cfg["camera"]["rpy"]))
    w.joint("camera_joint", "fixed", "head_link", "camera_link", camera)
    w.link("camera_link", [_box(Origin(), (0.025, 0.09, 0.025))], 0.072, "camera_black")
    w.joint("camera_color_optical_joint", "fixed", "camera_link", "camera_color_optical_frame", Origin(rpy=OPTICAL_RPY))
    w.link("camera_color_optical_frame", [], 0.0, "camera_black")
    # unaligned depth images (depth/image_rect_raw) are in the depth frame; as in realsense-ros, camera_link is
    # the depth origin. The colour imager's few-mm offset is per unit (device extrinsics) and not modelled.
    w.joint(
        "camera_depth_optical_joint", "fixed", "camera_link", "camera_depth_optical_frame", Origin(rpy=OPTICAL_RPY)
    )
    w.link("camera_depth_optical_frame", [], 0.0, "camera_black")

    for side in SIDES:
        mount = cfg["arm_mounts"][side]
        base = f"{side}_arm_base_link"
        w.joint(
            f"{side}_arm_mount_joint", "fixed", "torso_link", base, Origin(tuple(mount["xyz"]), tuple(mount["rpy"]))
        )
        _add_arm(w, side, arm)
        adapter = cfg["hand_adapters"][side]
        w.joint(
            f"{side}_hand_adapter_joint",
            "fixed",
            f"{side}_arm_flange",
            f"{side}_palm_link",
            Origin(tuple(adapter["xyz"]), tuple(adapter["rpy"])),
        )
        _add_hand(w, side, hand[side])
    return w.tostring(f"{cfg['name']}: generated by `rynn-teleop urdf` from urdf/*.yaml; do not edit by hand")


def _arm_rows(arm: Mapping[str, Any]) -> list[np.ndarray]:
    """Per-joint origin transforms (SI), then the flange transform."""
    rows = [r[:4] for r in arm["joints"]] + [arm["flange"]]
    return [mdh_transform(math.radians(al), a / 1000.0, d / 1000.0, math.radians(th)) for al, a, d, th in rows]


def _add_arm(w: _UrdfWriter, side: str, arm: Mapping[str, Any]) -> None:
    origins = _arm_rows(arm)
    parent = f"{side}_arm_base_link"
    radii = (0.055, 0.05, 0.045, 0.045, 0.04, 0.035, 0.035)
    w.link(parent, [("cylinder", Origin((0.0, 0.0, 0.04)), {"radius": 0.06, "length": 0.08})], 2.0, "joint_grey")
    for i in range(N_ARM):
        _, _, _, _, lower, upper, vel, _acc, effort = arm["joints"][i]
        link = f"{side}_arm_link{i + 1}"
        w.joint(
            f"{side}_arm_joint{i + 1}",
            "revolute",
            parent,
            link,
            Origin.from_matrix(origins[i]),
            axis=(0.0, 0.0, 1.0),
            limit={
                "lower": math.radians(lower),
                "upper": math.radians(upper),
                "effort": effort,
                "velocity": math.radians(vel),
            },
        )
        nxt = origins[i + 1][:3, 3]
        joint_shape = ("cylinder", Origin(), {"radius": radii[i] + 0.005, "length": 2.2 * radii[i]})
        shapes = _segment(nxt, radii[i]) + [joint_shape]
        w.link(link, shapes, _ARM_LINK_MASS[i], "marvin_white" if i % 2 else "joint_grey")
        parent = link
    w.joint(f"{side}_arm_flange_joint", "fixed", parent, f"{side}_arm_flange", Origin.from_matrix(origins[-1]))
    flange = ("cylinder", Origin((0.0, 0.0, 0.005)), {"radius": 0.035, "length": 0.01})
    w.link(f"{side}_arm_flange", [flange], 0.1, "joint_grey")


def _add_hand(w: _UrdfWriter, side: str, table: Mapping[str, Any]) -> None:
    w.link(f"{side}_palm_link", [_box(Origin((-0.004, 0.0, 0.05)), (0.028, 0.085, 0.09))], 0.17, "hand_white")
    for f in range(1, N_FINGERS + 1):
        finger = table[f"finger{f}"]
        parent = f"{side}_palm_link"
        for j in range(1, N_FINGER_JOINTS + 1):
            spec = finger[f"joint{j}"]
            link = f"{side}_finger{f}_link{j}"
            w.joint(
                f"{side}_finger{f}_joint{j}",
                "revolute",
                parent,
                link,
                Origin(tuple(spec["xyz"]), tuple(spec["rpy"])),
                axis=tuple(spec["axis"]),
                limit={k: spec[k] for k in ("lower", "upper", "effort", "velocity")},
            )
            nxt = np.asarray(finger[f"joint{j + 1}"]["xyz"] if j < N_FINGER_JOINTS else finger["tip"], dtype=float)
            shapes = _segment(nxt, 0.0085 - 0.0005 * j) or [("sphere", Origin(), {"radius": 0.009})]
            w.link(link, shapes, _FINGER_LINK_MASS[j - 1], "hand_white")
            parent = link
        tip = f"{side}_finger{f}_tip_link"
        w.joint(f"{side}_finger{f}_tip_fixed", "fixed", parent, tip, Origin(tuple(finger["tip"])))
        w.link(tip, [], 0.0, "hand_white")

