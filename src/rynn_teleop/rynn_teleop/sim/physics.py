"""One MuJoCo world for both arms, both hands and a task scene (ROS-free).

:class:`PhysicsWorld` holds the twin's model (:mod:`.model`) and its state. Joints are addressed by the
project's canonical names (:data:`~rynn_teleop.core.robot_model.CANONICAL_JOINT_NAMES`); every joint has a
position servo whose target is set with :meth:`PhysicsWorld.set_targets`. Time advances in fixed steps of
``timestep`` (2 ms: 500 Hz) with :meth:`PhysicsWorld.step` or :meth:`PhysicsWorld.advance_to`. Reads give
measured joint positions, velocities and actuator efforts, object poses and velocities in the world frame
(``base_link``, REP-103: x forward, y left, z up; quaternions x, y, z, w), contacts, and which hand touches an
object.

Determinism: MuJoCo's step is deterministic; the same scene, seed, initial joints and the same sequence of
targets and steps give bit-identical states (tested).

Thread safety: one re-entrant lock, :attr:`PhysicsWorld.lock`, guards the state. Every public method takes it
for its whole duration, so each call is atomic: an arm driver loop and a hand driver loop may each set their
own joints' targets, read their joints and call :meth:`~PhysicsWorld.advance_to` with their clock (the world
steps to the latest time asked for; a time already passed steps nothing). Several calls that must see one
state (read, then decide, then write) hold ``with world.lock:`` around them. Rendering copies the kinematic
state out under the lock (:meth:`~PhysicsWorld.copy_kinematics`) and draws without it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import NamedTuple

import mujoco
import numpy as np

from ..core.layout import SIDES
from ..core.robot_model import CANONICAL_JOINT_NAMES, RobotModel
from ..errors import ConfigurationError, JointNotFoundError
from .model import TABLE_BODY, ModelIndex, TwinSettings, build_model, index_model
from .scene import Layout, Pose, Scene, load_scene

_LOG = logging.getLogger(__name__)
_STATE = mujoco.mjtState.mjSTATE_INTEGRATION


class JointSample(NamedTuple):
    """Measured joints at one instant (order: the names asked for)."""

    time: float  # [s] simulated time
    position: np.ndarray  # [rad]
    velocity: np.ndarray  # [rad/s]
    effort: np.ndarray  # [N m] actuator torque (gravity compensation included)


class ObjectState(NamedTuple):
    """A movable object's pose and twist in the world frame."""

    position: np.ndarray  # (3,) [m] centre
    quaternion: np.ndarray  # (4,) x, y, z, w
    linear_velocity: np.ndarray  # (3,) [m/s]
    angular_velocity: np.ndarray  # (3,) [rad/s]

    @property
    def pose(self) -> Pose:
        return Pose(self.position, self.quaternion)


class Contact(NamedTuple):
    """One active contact between two bodies."""

    body1: str
    body2: str
    position: np.ndarray  # (3,) [m] world frame
    depth: float  # [m] penetration (> 0 when the geoms overlap)
    normal_force: float  # [N]


class ObjectContacts(NamedTuple):
    """What touches one object."""

    hands: tuple[str, ...]  # sides whose palm or fingers touch it
    table: bool  # it touches the table
    others: tuple[str, ...]  # other bodies touching it (objects, arm links, the floor)


class PhysicsWorld:
    """The twin's physics (see the module doc)."""

    def __init__(self, scene: Scene | str | None = "pick_place", seed: int = 0, *,
                 settings: TwinSettings | None = None, initial: np.ndarray | None = None) -> None:
        """
        Args:
            scene: a :class:`~.scene.Scene`, the name of a file in ``config/sim/``, or None (robot alone).
            seed: the layout seed (initial object poses, :meth:`~.scene.Scene.layout`).
            settings: drives and contacts (default :class:`~.model.TwinSettings`).
            initial: (54,) initial joint positions [rad] in canonical order (default: the robot's neutral
                posture); clipped into the joint ranges.
        """
        self.scene = load_scene(scene) if isinstance(scene, str) else scene
        self.settings = settings or TwinSettings()
        self.lock = threading.RLock()
        self.layout: Layout | None = self.scene.layout(seed) if self.scene is not None else None
        self.model = build_model(self.scene, self.layout, self.settings)
        self.data = mujoco.MjData(self.model)
        self.index: ModelIndex = index_model(self.model)
        self._joint = {n: i for i, n in enumerate(CANONICAL_JOINT_NAMES)}
        self._body_names = [self.model.body(b).name for b in range(self.model.nbody)]
        self._table_body = (mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, TABLE_BODY)
                            if self.scene is not None else -1)
        self._hand_bodies = {side: {int(self.model.geom_bodyid[g]) for g in self.index.hand_geoms[side]}
                             for side in SIDES}
        self._initial = RobotModel.default().neutral() if initial is None else np.asarray(initial, float)
        self.seed = seed
        self.reset(seed, self._initial)

    # ------------------------------------------------------------------ set-up
    @property
    def joint_names(self) -> tuple[str, ...]:
        return CANONICAL_JOINT_NAMES

    @property
    def timestep(self) -> float:
        """[s] the physics step."""
        return float(self.model.opt.timestep)

    @property
    def time(self) -> float:
        """[s] simulated time since the last :meth:`reset`."""
        with self.lock:
            return float(self.data.time)

    def indices(self, names: Sequence[str] | None) -> np.ndarray:
        """Canonical indices of joint ``names`` (all 54 for None); :class:`JointNotFoundError` lists them."""
        if names is None:
            return np.arange(len(CANONICAL_JOINT_NAMES))
        try:
            return np.array([self._joint[n] for n in names], dtype=int)
        except KeyError as exc:
            raise JointNotFoundError(exc.args[0], CANONICAL_JOINT_NAMES) from None

    def reset(self, seed: int | None = None, initial: np.ndarray | None = None) -> None:
        """Time 0; objects at the layout of ``seed`` (default: the current one), joints at rest at ``initial``
        (default: the constructor's) with their targets there."""
        with self.lock:
            q0 = self._initial if initial is None else np.asarray(initial, dtype=float)
            if q0.shape != (len(CANONICAL_JOINT_NAMES),) or not np.all(np.isfinite(q0)):
                raise ConfigurationError(f"initial joint positions must be 54 finite values, got shape {q0.shape}")
            q0 = np.clip(q0, self.index.lower, self.index.upper)
            mujoco.mj_resetData(self.model, self.data)
            if self.scene is not None and seed is not None and seed != self.seed:
                self.layout = self.scene.layout(seed)
                self._place_layout()
            self.seed = self.seed if seed is None else seed
            if self.layout is not None:
                for name, body in self.index.objects.items():
                    pose = self.layout.objects[name]
                    adr = self.model.jnt_qposadr[self.model.body_jntadr[body]]
                    x, y, z, w = pose.quaternion
                    self.data.qpos[adr:adr + 7] = (*pose.position, w, x, y, z)
            self.data.qpos[self.index.qpos] = q0
            self.data.ctrl[self.index.actuator] = q0
            mujoco.mj_forward(self.model, self.data)

    def _place_layout(self) -> None:
        """Move the fixed objects and the target regions' sites to the current layout (the model was compiled
        with another seed's)."""
        for obj in self.scene.objects:
            if obj.fixed:
                pose = self.layout.objects[obj.name]
                x, y, z, w = pose.quaternion
                body = self.model.body(obj.name)
                body.pos[:] = pose.position
                body.quat[:] = (w, x, y, z)
        for name, region in self.layout.targets.items():
            site = self.model.site(name)
            site.pos[:] = region.center + (0.0, 0.0, 0.0005)
            site.quat[:] = (math.cos(region.yaw / 2), 0.0, 0.0, math.sin(region.yaw / 2))

    # ------------------------------------------------------------------ commands
    def set_targets(self, positions: np.ndarray | Sequence[float], names: Sequence[str] | None = None) -> np.ndarray:
        """Set the position servo targets [rad] of joints ``names`` (default: all 54, canonical order).

        Returns the targets actually applied: each clipped into its joint's range (MuJoCo's ``ctrlrange``);
        a clipped value is logged.
        """
        idx = self.indices(names)
        q = np.asarray(positions, dtype=float)
        if q.shape != idx.shape or not np.all(np.isfinite(q)):
            raise ConfigurationError(f"expected {idx.size} finite joint targets, got {q.shape}")
        lo, hi = self.index.lower[idx], self.index.upper[idx]
        applied = np.clip(q, lo, hi)
        if np.any(applied != q):
            bad = [CANONICAL_JOINT_NAMES[i] for i in idx[applied != q]]
            _LOG.warning("twin: targets of %s outside their joint ranges were clipped", ", ".join(bad))
        with self.lock:
            self.data.ctrl[self.index.actuator[idx]] = applied
        return applied

    def targets(self, names: Sequence[str] | None = None) -> np.ndarray:
        """The current servo targets [rad]."""
        with self.lock:
            return self.data.ctrl[self.index.actuator[self.indices(names)]].copy()

    # ------------------------------------------------------------------ time
    def step(self, n: int = 1) -> None:
        """Advance ``n`` physics steps."""
        with self.lock:
            for _ in range(int(n)):
                mujoco.mj_step(self.model, self.data)

    def advance_to(self, t: float) -> int:
        """Step until the simulated time reaches ``t`` [s] (to the nearest step); returns the steps taken (0 when
        ``t`` has passed)."""
        with self.lock:
            n = int(math.floor((t - self.data.time) / self.model.opt.timestep + 0.5))
            if n > 0:
                self.step(n)
            return max(n, 0)

    # ------------------------------------------------------------------ reads
    def joint_state(self, names: Sequence[str] | None = None) -> JointSample:
        """Measured positions, velocities and efforts of ``names`` (default: all 54)."""
        idx = self.indices(names)
        with self.lock:
            d = self.data
            return JointSample(float(d.time), d.qpos[self.index.qpos[idx]].copy(), d.qvel[self.index.dof[idx]].copy(),
                               d.actuator_force[self.index.actuator[idx]].copy())

    def object_names(self) -> tuple[str, ...]:
        """The movable objects."""
        return tuple(self.index.objects)

    def object_state(self, name: str) -> ObjectState:
        """Pose and twist of a movable object (world frame)."""
        body = self._object_body(name)
        with self.lock:
            d = self.data
            w, x, y, z = d.xquat[body]
            vel = np.empty(6)
            mujoco.mj_objectVelocity(self.model, d, mujoco.mjtObj.mjOBJ_BODY, body, vel, 0)
            return ObjectState(d.xpos[body].copy(), np.array([x, y, z, w]), vel[3:].copy(), vel[:3].copy())

    def object_states(self) -> dict[str, ObjectState]:
        """:meth:`object_state` of every movable object, at one instant."""
        with self.lock:
            return {name: self.object_state(name) for name in self.index.objects}

    def _object_body(self, name: str) -> int:
        try:
            return self.index.objects[name]
        except KeyError:
            raise ConfigurationError(f"twin: no movable object {name!r}; objects: "
                                     f"{', '.join(self.index.objects) or 'none'}") from None

    def contacts(self) -> list[Contact]:
        """Every active contact (after the last step)."""
        out = []
        with self.lock:
            m, d = self.model, self.data
            force = np.empty(6)
            for i in range(d.ncon):
                c = d.contact[i]
                mujoco.mj_contactForce(m, d, i, force)
                b1, b2 = (self._body_names[m.geom_bodyid[g]] for g in c.geom)
                out.append(Contact(b1, b2, c.pos.copy(), float(-c.dist), float(force[0])))
        return out

    def max_penetration(self) -> float:
        """[m] the deepest overlap of any active contact (0 when none)."""
        with self.lock:
            d = self.data
            return float(max([-d.contact[i].dist for i in range(d.ncon)], default=0.0))

    def object_contacts(self, name: str) -> ObjectContacts:
        """Which hands, whether the table, and which other bodies touch object ``name``."""
        body = self._object_body(name)
        hands: set[str] = set()
        others: set[str] = set()
        table = False
        with self.lock:
            m, d = self.model, self.data
            for i in range(d.ncon):
                b1, b2 = (int(m.geom_bodyid[g]) for g in d.contact[i].geom)
                if body not in (b1, b2):
                    continue
                other = b2 if b1 == body else b1
                side = next((s for s in SIDES if other in self._hand_bodies[s]), None)
                if side is not None:
                    hands.add(side)
                elif other == self._table_body:
                    table = True
                else:
                    others.add(self._body_names[other])
        return ObjectContacts(tuple(s for s in SIDES if s in hands), table, tuple(sorted(others)))

    def state(self) -> np.ndarray:
        """Everything the next steps depend on (MuJoCo's ``mjSTATE_INTEGRATION``: time, positions, velocities,
        warm start, the servo targets), as one vector; :meth:`set_state` restores it."""
        with self.lock:
            out = np.empty(mujoco.mj_stateSize(self.model, _STATE))
            mujoco.mj_getState(self.model, self.data, out, _STATE)
        return out

    def set_state(self, state: np.ndarray) -> None:
        """Restore a :meth:`state` of this world (the layout is not part of it)."""
        state = np.asarray(state, dtype=float)
        with self.lock:
            if state.shape != (mujoco.mj_stateSize(self.model, _STATE),):
                raise ConfigurationError(f"twin: a state of {state.shape} does not fit this world")
            mujoco.mj_setState(self.model, self.data, state, _STATE)
            mujoco.mj_forward(self.model, self.data)

    def copy_kinematics(self, dst: mujoco.MjData) -> None:
        """Copy time and positions into ``dst`` (an ``MjData`` of :attr:`model`) and update its frames
        (``mj_kinematics``), so a renderer can draw it without holding :attr:`lock`."""
        with self.lock:
            dst.time = self.data.time
            dst.qpos[:] = self.data.qpos
        mujoco.mj_kinematics(self.model, dst)
