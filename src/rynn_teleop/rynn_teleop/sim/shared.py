"""The physics world of a process, shared by name between the twin node and the drivers' sim backends (ROS-free).

One process holds at most one world per name (:data:`DEFAULT_WORLD` unless told otherwise). The twin node
creates it (:func:`create_world`: its scene and seed) and steps it; the arm and hand drivers' ``sim`` backends
(``hardware.twin``) attach to it when they connect (:func:`attach`) and set and read their own joints. Without
a twin node in the process, the first backend to connect creates the world itself: the robot alone (no table,
no objects), which a twin node started later in the process then refuses to replace (:class:`TwinWorldExistsError`).
The world leaves the registry when its last user detaches.

Time: the world's simulated time runs against a clock the users share (the nodes' clock, seconds):
:meth:`SharedWorld.advance` steps to ``now`` minus the clock time of simulated time 0 (:attr:`SharedWorld.epoch`,
set by the first call). Every user may call it with its own clock reading; the world steps to the latest time
asked for. A process stalled for longer than :data:`MAX_CATCH_UP_S` does not catch up in one call: the epoch
slips (counted in :attr:`SharedWorld.slipped_s`), so that no caller holds the world's lock for seconds.

A reset (:meth:`SharedWorld.reset`: a new layout, the robot back at its home posture) is a jump of the measured
joints: it increments :attr:`SharedWorld.generation`, from which a backend tells its driver that the safety
layer must start again from the measurement.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigurationError

if TYPE_CHECKING:  # the physics imports MuJoCo: only the code that builds a world loads it
    from .physics import PhysicsWorld

_LOG = logging.getLogger(__name__)

DEFAULT_WORLD = "twin"  # the name the twin node and the drivers' sim backends share by default
MAX_CATCH_UP_S = 0.1  # [s] the most simulated time one advance steps; a process further behind slips instead


class TwinWorldError(ConfigurationError):
    """The process's shared physics world cannot be used as asked."""


class TwinWorldExistsError(TwinWorldError):
    """A world of that name exists in this process already (made by ``owner``).

    Attributes:
        name: the world's name.
        owner: who created the existing one.
    """

    def __init__(self, name: str, owner: str) -> None:
        self.name, self.owner = name, owner
        super().__init__(f"the process already has a physics world {name!r}, created by {owner}: start the twin "
                         "node before (or with) the drivers whose sim backend uses it, in the same process "
                         "(e.g. rynn-teleop run twin arm_driver hand_driver)")


class SharedWorld:
    """A :class:`~.physics.PhysicsWorld` with the clock mapping and the users of one process.

    Args:
        name: the registry name.
        world: the physics.
        owner: who created it, in words (for errors and diagnostics).
        home: (54,) [rad] the joints a reset puts the robot at (default: the world's initial joints).
    """

    def __init__(self, name: str, world: PhysicsWorld, owner: str, home: np.ndarray | None = None) -> None:
        self.name = name
        self.world = world
        self.owner = owner
        self.home = (world.joint_state().position if home is None else np.asarray(home, dtype=float)).copy()
        self.epoch: float | None = None  # [s] clock time of simulated time 0 (set by the first advance)
        self.generation = 0  # incremented by every reset: the joints jumped
        self.slipped_s = 0.0  # [s] simulated time skipped because the process stalled
        self.users: set[str] = set()

    @property
    def lock(self) -> threading.RLock:
        """The world's lock (:attr:`~.physics.PhysicsWorld.lock`)."""
        return self.world.lock

    def advance(self, now: float) -> int:
        """Step the world to clock time ``now`` [s]; returns the steps taken (0 when it is there already)."""
        world = self.world
        with world.lock:
            if self.epoch is None:
                self.epoch = now - world.time
            target = now - self.epoch
            behind = target - world.time
            if behind > MAX_CATCH_UP_S:
                slip = behind - MAX_CATCH_UP_S
                self.epoch += slip
                self.slipped_s += slip
                target -= slip
            return world.advance_to(target)

    def clock_time(self, sim_time: float) -> float:
        """[s] the clock time of simulated time ``sim_time`` [s] (``sim_time`` itself before the first advance)."""
        return sim_time + (self.epoch or 0.0)

    def reset(self, now: float | None, seed: int | None = None) -> None:
        """Objects at the layout of ``seed`` (default: the current one), the robot at rest at :attr:`home`,
        simulated time 0 at clock time ``now`` [s] (None: at the next advance)."""
        with self.world.lock:
            self.world.reset(seed, self.home)
            self.epoch = now
            self.generation += 1


_REGISTRY: dict[str, SharedWorld] = {}
_REGISTRY_LOCK = threading.Lock()


def create_world(name: str, make: Callable[[], PhysicsWorld], owner: str, *,
                 home: np.ndarray | None = None) -> SharedWorld:
    """Create the process's world ``name`` with ``make()`` and attach ``owner`` to it.

    Raises:
        TwinWorldExistsError: the process has a world of that name already.
    """
    with _REGISTRY_LOCK:
        existing = _REGISTRY.get(name)
        if existing is not None:
            raise TwinWorldExistsError(name, existing.owner)
        shared = SharedWorld(name, make(), owner, home)
        shared.users.add(owner)
        _REGISTRY[name] = shared
        return shared


def find_world(name: str) -> SharedWorld | None:
    """The process's world ``name``, or None."""
    with _REGISTRY_LOCK:
        return _REGISTRY.get(name)


def attach(name: str, user: str, make: Callable[[], PhysicsWorld] | None = None, *,
           home: np.ndarray | None = None) -> SharedWorld:
    """The process's world ``name`` with ``user`` attached; created by ``make()`` (owner ``user``) if there is none.

    Raises:
        TwinWorldError: there is none and no ``make`` was given.
    """
    with _REGISTRY_LOCK:
        shared = _REGISTRY.get(name)
        if shared is None:
            if make is None:
                raise TwinWorldError(f"no physics world {name!r} in this process: start the twin node in the same "
                                     "process (rynn-teleop run twin arm_driver hand_driver)")
            shared = _REGISTRY[name] = SharedWorld(name, make(), user, home)
        shared.users.add(user)
        return shared


def detach(name: str, user: str) -> None:
    """``user`` is done with world ``name``; the world leaves the registry when no user remains (idempotent)."""
    with _REGISTRY_LOCK:
        shared = _REGISTRY.get(name)
        if shared is None:
            return
        shared.users.discard(user)
        if not shared.users:
            del _REGISTRY[name]
