"""The description's visual primitives, posed at a joint configuration.

Pinocchio parses the URDF ``<visual>`` elements (boxes, cylinders, spheres);
this module turns them into plain records that a marker publisher or a
renderer can draw without knowing Pinocchio. ROS-free.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pinocchio as pin

from .robot_model import RobotModel


class Primitive(NamedTuple):
    """One visual shape.

    ``size`` [m] is the full extent along the shape's own x, y, z axes (box:
    edge lengths; cylinder: diameter, diameter, length along z; sphere: three
    diameters), the same convention as ``visualization_msgs/Marker.scale``.
    """

    name: str
    link: str
    kind: str  # "box" | "cylinder" | "sphere"
    size: np.ndarray
    rgba: np.ndarray


def _primitive(obj: pin.GeometryObject, link: str) -> Primitive:
    geom = obj.geometry
    kind = type(geom).__name__.lower()
    if kind == "box":
        size = 2.0 * np.asarray(geom.halfSide, dtype=float)
    elif kind == "cylinder":
        size = np.array([2 * geom.radius, 2 * geom.radius, 2 * geom.halfLength])
    elif kind == "sphere":
        size = np.full(3, 2 * geom.radius)
    else:
        raise ValueError(f"unsupported visual geometry {kind!r} on link {link!r}")
    return Primitive(obj.name, link, kind, size, np.asarray(obj.meshColor, dtype=float))


_HOMOGENEOUS = pin.SE3.homogeneous.fget  # SE3 -> (4, 4) array, without a per-call attribute lookup


class RobotGeometry:
    """Visual primitives of a :class:`RobotModel` and their poses."""

    def __init__(self, robot: RobotModel) -> None:
        self.robot = robot
        self._geom = pin.buildGeomFromUrdfString(robot.model, robot.urdf, pin.GeometryType.VISUAL)
        self._geom_data = self._geom.createData()
        self._data = robot.model.createData()
        self.primitives = tuple(
            _primitive(obj, robot.model.frames[obj.parentFrame].name) for obj in self._geom.geometryObjects
        )

    def poses(self, q: np.ndarray) -> np.ndarray:
        """(N, 4, 4) poses of :attr:`primitives` in ``base_link`` at ``q`` (54,) [rad]."""
        pin.forwardKinematics(self.robot.model, self._data, self.robot.to_pinocchio(q))
        pin.updateGeometryPlacements(self.robot.model, self._data, self._geom, self._geom_data)
        return np.array(list(map(_HOMOGENEOUS, self._geom_data.oMg.tolist())))
