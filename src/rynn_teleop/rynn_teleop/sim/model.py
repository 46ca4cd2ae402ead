"""The twin's MuJoCo model, generated from the project's own robot description (ROS-free).

:func:`build_spec` starts from the URDF that ``rynn-teleop urdf`` prints (:func:`~rynn_teleop.core.urdf_builder.
build_urdf`: the one source of joint names, limits, frames and collision primitives) and adds, with
``mujoco.MjSpec``, what a URDF cannot say:

* per joint group (arm, finger; :class:`DriveSettings`): a position actuator with stiffness ``kp`` derived from
  the joint's effort limit, critically damped (MuJoCo's ``dampratio``), the description's effort limit as
  force limit, joint damping and armature (reflected rotor inertia); the robot's own weight is compensated
  (``gravcomp``, counted in the actuator force, as the arms' and hands' controllers do);
* contact settings that hold an object for the hands (:class:`ContactSettings`: friction, condim, solref,
  solimp; elliptic cones and ``impratio`` as in MuJoCo Menagerie's hands);
* contact exclusions for robot pairs that cannot touch (:func:`excluded_pairs`), keeping fingers vs objects,
  hand vs hand and arm vs arm;
* a floor, the scene's table, objects (free bodies) and target regions (sites), a light and the head camera
  (``head_camera`` at ``camera_color_optical_frame``).

The world frame is ``base_link`` (REP-103: x forward, y left, z up). No mesh is used: the file
:func:`export_mjcf` writes opens in MuJoCo's own viewer (``python -m mujoco.viewer --mjcf=FILE``).
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import mujoco
import numpy as np

from ..core.camera import default_intrinsics
from ..core.layout import N_ARM, N_FINGER_JOINTS, N_FINGERS, SIDES
from ..core.robot_model import CANONICAL_JOINT_NAMES, RobotModel
from ..core.urdf_builder import build_urdf
from ..errors import ConfigurationError
from .scene import Layout, Scene, yaw_quaternion

HEAD_CAMERA = "head_camera"
"""Name of the MuJoCo camera at the description's ``camera_color_optical_frame``."""

TABLE_BODY = "table"
"""Name of the table's (static) body and geom."""


class DriveSettings(NamedTuple):
    """Position servo and joint dynamics of one joint group (units beside each field)."""

    full_effort_error: float  # [rad] position error at which the servo reaches the effort limit: kp = effort / this
    dampratio: float  # [-] servo damping as a share of critical damping (MuJoCo computes kv from the joint inertia)
    damping: float  # [N m s / rad] passive joint damping (friction of the transmission)
    armature: float  # [kg m^2] rotor inertia reflected through the gearbox


class ContactSettings(NamedTuple):
    """MuJoCo contact parameters of a group of geoms (see MuJoCo's "Contact parameters")."""

    friction: tuple[float, float, float]  # [-] sliding, [m] torsional, [m] rolling
    condim: int  # [-] 3: sliding friction only; 4: plus torsional (holds an object against twisting)
    solref: tuple[float, float]  # [s] time constant, [-] damping ratio of the contact's spring
    solimp: tuple[float, float, float, float, float]  # impedance dmin, dmax, width [m], midpoint, power


#: arms: stiff servos (full effort at 20 mrad), a gearbox's reflected rotor inertia as armature (estimates: the
#: vendor publishes neither gains nor inertias)
ARM_DRIVE = DriveSettings(full_effort_error=0.02, dampratio=1.0, damping=2.0, armature=0.2)
#: fingers: soft servos (full effort at 0.3 rad; estimates, as for the arms)
FINGER_DRIVE = DriveSettings(full_effort_error=0.3, dampratio=1.0, damping=0.02, armature=0.001)
#: hand geoms (palm and fingers): high friction with torsional friction, stiff contacts (Menagerie's hands use
#: friction 0.5-1, condim 4-6, solref 0.005, solimp starting at 0.5-0.95)
HAND_CONTACT = ContactSettings(friction=(1.2, 0.02, 0.0001), condim=4, solref=(0.005, 1.0),
                               solimp=(0.9, 0.99, 0.001, 0.5, 2.0))
#: objects, the table and the rest of the robot
DEFAULT_CONTACT = ContactSettings(friction=(0.8, 0.005, 0.0001), condim=3, solref=(0.005, 1.0),
                                  solimp=(0.9, 0.99, 0.001, 0.5, 2.0))


@dataclass(frozen=True)
class TwinSettings:
    """Everything the twin adds to the description (units beside each field)."""

    timestep: float = 0.002  # [s] physics step (500 Hz)
    arm: DriveSettings = ARM_DRIVE
    finger: DriveSettings = FINGER_DRIVE
    hand_contact: ContactSettings = HAND_CONTACT
    contact: ContactSettings = DEFAULT_CONTACT
    impratio: float = 10.0  # [-] frictional-to-normal impedance ratio (less slip; Menagerie's hands use 10-100)
    # [s], [-] joint limits: stiffer than MuJoCo's default (0.02, 1; 0.9, 0.95) so that a finger pressed by an
    # object stays within mrad of its range, as against a hard stop (the time constant must stay >= 2 timesteps)
    limit_solref: tuple[float, float] = (0.004, 1.0)
    limit_solimp: tuple[float, float, float, float, float] = (0.99, 0.999, 0.001, 0.5, 2.0)  # near-hard stops
    gravity_compensation: bool = True  # the robot's own weight is compensated by its controllers
    offscreen_size: tuple[int, int] = (1280, 960)  # [px] largest offscreen render (MuJoCo's Renderer)
    overlay: str | os.PathLike | Mapping[str, Any] | None = field(default=None)  # overrides of urdf/robot.yaml

    def __post_init__(self) -> None:
        if not 1e-4 <= self.timestep <= 0.01:
            raise ConfigurationError(f"twin timestep {self.timestep} s out of [0.0001, 0.01]")
        for name in ("arm", "finger"):
            drive = getattr(self, name)
            if not (drive.full_effort_error > 0 and drive.dampratio >= 0 and drive.damping >= 0
                    and drive.armature >= 0):
                raise ConfigurationError(f"twin {name} drive: {drive} needs full_effort_error > 0 and "
                                         "dampratio, damping, armature >= 0")


def _side_of(name: str) -> str | None:
    for side in SIDES:
        if name.startswith(f"{side}_"):
            return side
    return None


def _is_hand_body(name: str) -> bool:
    return "_palm_link" in name or "_finger" in name


def _finger_link(name: str) -> tuple[int, int] | None:
    """(finger 1..5, link 1..4) of ``{side}_finger{F}_link{L}``, None for other bodies."""
    if "_finger" not in name or "_link" not in name or name.endswith("_tip_link"):
        return None
    finger, link = name.split("_finger", 1)[1].split("_link")
    return int(finger), int(link)


def _arm_link(name: str) -> int | None:
    """Link number 1..7 of ``{side}_arm_link{N}``, None for other bodies."""
    prefix = "_arm_link"
    return int(name.split(prefix, 1)[1]) if prefix in name else None


def excluded_pairs(body_names: Iterable[str]) -> list[tuple[str, str]]:
    """Robot body pairs whose contacts are switched off: pairs that cannot touch, or whose primitive
    geometry overlaps at the joints.

    Rules (per side; parent-child pairs MuJoCo filters itself), checked against contact counts over random
    configurations (tests/test_sim_model.py):

    * the static robot (``base_link``, ``torso_link``, head, camera, the arm's base) vs arm links 1-3 (the
      shoulder: its cylinders overlap the torso block);
    * arm links two joints apart (their joint caps overlap);
    * the wrist: arm links 4-7, the flange and the palm among themselves (joints 5-7 meet at one point, the
      forearm cylinder of link 4 ends in it, and joint 6's +-60 deg keep the hand off the forearm);
    * fingers 2-5 of one hand among themselves (side by side, their primitives overlap when spread);
    * finger links 1-2 and the thumb's links 1-3 vs the palm they are mounted in, and the thumb's links 1-2 vs
      the other fingers (the thumb's base sits inside the palm block).

    Kept: every finger and the palm vs objects and the table; the fingertips (links 3-4) vs the palm (a fist);
    the thumb's links 3-4 vs the other fingers' links (a pinch); the left hand vs the right hand; the left arm
    vs the right arm; the forearms and hands vs the torso.
    """
    names = list(body_names)
    body = [n for n in names if n in ("base_link", "torso_link", "head_link", "camera_link")]
    out: list[tuple[str, str]] = []
    for side in SIDES:
        static = [*body, f"{side}_arm_base_link"]
        arm = {i: f"{side}_arm_link{i}" for i in range(1, N_ARM + 1)}
        palm, flange = f"{side}_palm_link", f"{side}_arm_flange"
        fingers = {(f, j): f"{side}_finger{f}_link{j}" for f in range(1, N_FINGERS + 1)
                   for j in range(1, N_FINGER_JOINTS + 1)}
        out += [(s, arm[i]) for s in static for i in (1, 2, 3)]
        out += [(arm[i], arm[i + 2]) for i in range(1, N_ARM - 1)]
        wrist = [arm[4], arm[5], arm[6], arm[7], flange, palm]
        out += [(a, b) for i, a in enumerate(wrist) for b in wrist[i + 1:]]
        out += [(fingers[f, j], fingers[g, k]) for f in range(2, N_FINGERS + 1) for g in range(f + 1, N_FINGERS + 1)
                for j in range(1, N_FINGER_JOINTS + 1) for k in range(1, N_FINGER_JOINTS + 1)]
        out += [(b, fingers[f, j]) for b in (palm, flange) for f in range(1, N_FINGERS + 1)
                for j in ((1, 2, 3) if f == 1 else (1, 2))]
        out += [(fingers[1, j], fingers[f, k]) for j in (1, 2) for f in range(2, N_FINGERS + 1)
                for k in range(1, N_FINGER_JOINTS + 1)]
    present = set(names)
    return [(a, b) for a, b in dict.fromkeys(out) if a in present and b in present]


def _materials(urdf: str) -> dict[str, tuple[float, ...]]:
    """Link name -> RGBA of its first visual's material in the description."""
    root = ET.fromstring(urdf)
    colours = {m.get("name"): tuple(float(v) for v in m.find("color").get("rgba").split())
               for m in root.findall("material") if m.find("color") is not None}
    out = {}
    for link in root.findall("link"):
        visual = link.find("visual/material")
        if visual is not None and visual.get("name") in colours:
            out[link.get("name")] = colours[visual.get("name")]
    return out


def _apply_contact(geom: Any, contact: ContactSettings) -> None:
    geom.friction = list(contact.friction)
    geom.condim = contact.condim
    geom.solref = list(contact.solref)
    geom.solimp = list(contact.solimp)


def build_spec(scene: Scene | None = None, layout: Layout | None = None,
               settings: TwinSettings | None = None) -> mujoco.MjSpec:
    """The twin's model as an editable ``MjSpec`` (see the module doc).

    Args:
        scene: the task scene (table, objects, targets); None for the robot alone above a floor.
        layout: the initial poses (default: ``scene.layout(0)``).
        settings: the twin's drives and contact settings (default :class:`TwinSettings`).
    """
    settings = settings or TwinSettings()
    urdf = build_urdf(settings.overlay)
    robot = RobotModel.from_urdf(urdf)
    spec = mujoco.MjSpec.from_string(urdf)
    spec.modelname = "rynn_twin"
    spec.compiler.fusestatic = False  # keep every description frame (palm, tips, optical frames) as a body
    spec.compiler.discardvisual = True  # the description's visuals repeat its collision primitives
    opt = spec.option
    opt.timestep = settings.timestep
    opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    opt.impratio = settings.impratio
    spec.visual.global_.offwidth, spec.visual.global_.offheight = settings.offscreen_size
    colours = _materials(urdf)

    pin = robot.model
    for body in spec.bodies:
        if body.name == "world":
            continue
        hand = _is_hand_body(body.name)
        for geom in body.geoms:
            _apply_contact(geom, settings.hand_contact if hand else settings.contact)
            geom.rgba = list(colours.get(body.name, (0.7, 0.7, 0.7, 1.0)))
        if settings.gravity_compensation and _side_of(body.name):  # the arms and hands (static bodies: no effect)
            body.gravcomp = 1.0
    for name in CANONICAL_JOINT_NAMES:
        joint = spec.joint(name)
        drive = settings.finger if "_finger" in name else settings.arm
        effort = float(pin.effortLimit[pin.joints[pin.getJointId(name)].idx_v])
        joint.solref_limit = list(settings.limit_solref)
        joint.solimp_limit = list(settings.limit_solimp)
        joint.damping = [drive.damping, 0.0, 0.0]  # linear term (MuJoCo 4: polynomial coefficients)
        joint.armature = drive.armature
        joint.actfrclimited = mujoco.mjtLimited.mjLIMITED_TRUE
        joint.actfrcrange = [-effort, effort]
        joint.actgravcomp = settings.gravity_compensation
        act = spec.add_actuator(name=name, target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=effort / drive.full_effort_error, dampratio=drive.dampratio)
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.ctrlrange = list(joint.range)
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.forcerange = [-effort, effort]
    for a, b in excluded_pairs(body.name for body in spec.bodies):
        spec.add_exclude(bodyname1=a, bodyname2=b)

    optical = spec.body("camera_color_optical_frame")
    # MuJoCo cameras look along -z with y up; the optical frame looks along +z with y down: pi about x
    optical.add_camera(name=HEAD_CAMERA, quat=[0.0, 1.0, 0.0, 0.0], fovy=_default_fovy())
    world = spec.worldbody
    world.add_light(name="sun", pos=[0.6, 0.5, 3.0], dir=[-0.2, -0.2, -1.0],
                    type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL, diffuse=[0.7, 0.7, 0.7],
                    ambient=[0.35, 0.35, 0.35], castshadow=True)
    floor = world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[3.0, 3.0, 0.05],
                           rgba=[0.3, 0.3, 0.33, 1.0])
    _apply_contact(floor, settings.contact)
    if scene is not None:
        _add_scene(spec, scene, layout if layout is not None else scene.layout(0), settings)
    return spec


def _default_fovy() -> float:
    """[deg] vertical field of view of the default head camera intrinsics (core.camera)."""
    k = default_intrinsics(640, 480)
    return math.degrees(2 * math.atan(k.height / (2 * k.fy)))


def _add_scene(spec: mujoco.MjSpec, scene: Scene, layout: Layout, settings: TwinSettings) -> None:
    table = scene.table
    t = spec.worldbody.add_body(name=TABLE_BODY, pos=[table.center[0], table.center[1], table.height / 2])
    top = t.add_geom(name=TABLE_BODY, type=mujoco.mjtGeom.mjGEOM_BOX,
                     size=[table.size[0] / 2, table.size[1] / 2, table.height / 2], rgba=list(table.colour))
    _apply_contact(top, settings.contact._replace(friction=(table.friction, *settings.contact.friction[1:])))
    for obj in scene.objects:
        pose = layout.objects[obj.name]
        x, y, z, w = pose.quaternion
        body = spec.worldbody.add_body(name=obj.name, pos=list(pose.position), quat=[w, x, y, z])
        if not obj.fixed:
            body.add_freejoint(name=obj.name)
        kind, size = _primitive(obj.shape, obj.size)
        geom = body.add_geom(name=obj.name, type=kind, size=size, mass=obj.mass, rgba=list(obj.colour))
        _apply_contact(geom, settings.contact._replace(friction=(obj.friction, *settings.contact.friction[1:])))
    for target in scene.targets:
        region = layout.targets[target.name]
        yaw = yaw_quaternion(region.yaw)
        spec.worldbody.add_site(name=target.name, type=mujoco.mjtGeom.mjGEOM_BOX,
                                pos=list(region.center + (0.0, 0.0, 0.0005)),
                                quat=[yaw[3], 0.0, 0.0, yaw[2]],
                                size=[*region.half_size, 0.0005], rgba=list(target.colour))


def _primitive(shape: str, size: tuple[float, ...]) -> tuple[mujoco.mjtGeom, list[float]]:
    """MuJoCo geom type and size (half extents, radius, half height) of a scene shape of full ``size`` [m]."""
    if shape == "box":
        return mujoco.mjtGeom.mjGEOM_BOX, [s / 2 for s in size]
    if shape == "cylinder":
        return mujoco.mjtGeom.mjGEOM_CYLINDER, [size[0], size[1] / 2, 0.0]
    return mujoco.mjtGeom.mjGEOM_SPHERE, [size[0], 0.0, 0.0]


def build_model(scene: Scene | None = None, layout: Layout | None = None,
                settings: TwinSettings | None = None) -> mujoco.MjModel:
    """The compiled model of :func:`build_spec`.

    Raises:
        ConfigurationError: MuJoCo refuses the model (its message is kept).
    """
    spec = build_spec(scene, layout, settings)
    try:
        return spec.compile()
    except ValueError as exc:
        raise ConfigurationError(f"MuJoCo cannot compile the twin model: {exc}") from exc


def export_mjcf(path: str | os.PathLike, scene: Scene | None = None, layout: Layout | None = None,
                settings: TwinSettings | None = None) -> Path:
    """Write the twin's MJCF (robot, scene at ``layout``) to ``path``; returns the path.

    The file needs no mesh or other asset: ``python -m mujoco.viewer --mjcf=PATH`` opens it. MuJoCo's writer
    keeps 6 significant digits (joint ranges within 5 urad of the description's).
    """
    spec = build_spec(scene, layout, settings)
    try:
        spec.compile()
    except ValueError as exc:
        raise ConfigurationError(f"MuJoCo cannot compile the twin model: {exc}") from exc
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(spec.to_xml(), encoding="utf-8")
    return out


class ModelIndex(NamedTuple):
    """Addresses in a compiled twin model, by the project's names."""

    qpos: np.ndarray  # (54,) qpos address of each canonical joint
    dof: np.ndarray  # (54,) dof address of each canonical joint
    actuator: np.ndarray  # (54,) actuator id of each canonical joint
    lower: np.ndarray  # (54,) [rad] joint range
    upper: np.ndarray  # (54,) [rad]
    objects: dict[str, int]  # movable object name -> body id
    hand_geoms: dict[str, np.ndarray]  # side -> geom ids of its palm and fingers
    robot_geoms: np.ndarray  # geom ids of every robot body


def index_model(model: mujoco.MjModel) -> ModelIndex:
    """The :class:`ModelIndex` of a model built by :func:`build_model`."""
    ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in CANONICAL_JOINT_NAMES]
    acts = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, n) for n in CANONICAL_JOINT_NAMES]
    missing = [n for n, i, a in zip(CANONICAL_JOINT_NAMES, ids, acts) if i < 0 or a < 0]
    if missing:
        raise ConfigurationError(f"twin model lacks joints or actuators {missing}")
    objects = {}
    for j in range(model.njnt):
        if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
            body = int(model.jnt_bodyid[j])
            objects[model.body(body).name] = body
    body_names = [model.body(b).name for b in range(model.nbody)]
    geom_body = model.geom_bodyid
    hand = {side: np.array([g for g in range(model.ngeom) if _is_hand_body(body_names[geom_body[g]])
                            and body_names[geom_body[g]].startswith(f"{side}_")], dtype=int) for side in SIDES}
    robot = np.array([g for g in range(model.ngeom) if _side_of(body_names[geom_body[g]])
                      or body_names[geom_body[g]] in ("base_link", "torso_link", "head_link", "camera_link")],
                     dtype=int)
    return ModelIndex(
        qpos=model.jnt_qposadr[ids].copy(),
        dof=model.jnt_dofadr[ids].copy(),
        actuator=np.array(acts),
        lower=model.jnt_range[ids, 0].copy(),
        upper=model.jnt_range[ids, 1].copy(),
        objects=objects,
        hand_geoms=hand,
        robot_geoms=robot,
    )
