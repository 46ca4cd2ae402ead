"""Score a policy on fresh twins: N rollouts on randomised layouts, judged by the task's predicate (ROS-free).

``rynn-teleop policy eval`` (:mod:`.cli`) runs :func:`evaluate`. Each rollout runs in *lockstep simulated time*
with the pieces the stack puts between a policy and the robot, so that the same seeds and the same policy give
the same result whatever the machine's load:

1. **build the twin** (:func:`build_twin`): a fresh :class:`~rynn_teleop.sim.physics.PhysicsWorld` of the task's
   scene at the rollout's seed (randomised object poses, :meth:`~rynn_teleop.sim.scene.Scene.layout`), the robot at
   :func:`~rynn_teleop.sim.rollout.home_posture`; the head camera
   (:class:`~rynn_teleop.sources.camera.synthetic.SyntheticScene` at ``config/head_camera.yaml``'s synthetic
   profile size) fed the twin's ``/twin/scene`` and object poses as the head camera node feeds it, so a frame holds
   the pixels the stack's physical feed shows; the drivers' safety layers
   (:class:`~rynn_teleop.core.safety.SafetyController`, one for both arms and one for both hands, configured from
   ``config/arm_driver.yaml`` and ``config/hand_driver.yaml`` as the driver nodes configure theirs); the arm
   smoothing of a policy's commands (:class:`~rynn_teleop.core.motion.JerkLimitedFollower` at the teleoperation's
   200 Hz, :class:`~rynn_teleop.core.arm_teleop.ArmTeleopSettings`).
2. **run** (:func:`run_rollout`): three clocks, each at exact multiples of its period [s]: the *policy* at
   ``spec.fps`` (the measured joints and the head camera's frame through
   :class:`~.observation.ObservationBuilder`, then :meth:`~.base.PolicyRunner.act`), the *arm driver* at its
   ``rate_hz`` (the follower steps towards the newest arm action; its state is the arm command; the arm safety layer
   turns it into the target written to the twin), the *hand driver* at its ``rate_hz`` (the newest hand action
   through the hand safety layer). Before each event the physics steps to its time; at equal times the policy goes
   first, then the arms, then the hands.
3. **judge**: at every policy tick, before the policy acts, the task's predicate
   (:class:`~rynn_teleop.sim.monitor.TaskMonitor`, from the physics state alone, never the policy) decides: success
   ends the rollout (its time is the *time to success*), as does a failure that cannot be undone (the object fell off
   the table); at ``max_seconds`` the rollout ends and the predicate's reason is the failure's.
4. **write** (:func:`write_rollout`): the rollout's folder (``outcome.yaml``, ``preview.mp4``) and ``report.json``
   so far.

A rollout that raises (the policy crashes or returns a bad action, the physics diverges) is recorded as an
``error`` with its message and traceback, and the evaluation goes on. :func:`summarise` gives the success rate with
its Wilson 95 % interval (an error counts as not a success), the time to success over the successes and the
failures' reasons counted.

Report folder::

    OUT/report.json            settings, policy, summary, one entry per rollout (seed, outcome, reason, times)
    OUT/summary.txt            the summary lines (:meth:`EvalReport.lines`)
    OUT/seed-<S>/outcome.yaml  that rollout's entry, its final joint positions [rad] and, for an error, traceback
    OUT/seed-<S>/preview.mp4   the frames the policy was given (its first camera key, at its size) unless no video

Heavy modules (MuJoCo, the camera's renderer, PyAV) are imported when a rollout is built, not with this module:
the policy backend registry imports every module of this package.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import yaml

from ..core.layout import SIDES
from ..core.params import ParamSchema
from ..core.robot_model import CANONICAL_JOINT_NAMES, GROUPS, JointLimits, RobotModel
from ..core.yamlfile import read_yaml
from ..errors import ConfigurationError, ParameterError, RynnTeleopError
from ..paths import config_file
from .base import POLICY_BACKENDS, PolicyContext, PolicyRunner, PolicySpec, image_key
from .observation import ObservationBuilder

if TYPE_CHECKING:
    from ..core.motion import JerkLimitedFollower
    from ..core.safety import SafetyController
    from ..sim.monitor import TaskMonitor
    from ..sim.physics import PhysicsWorld
    from ..sim.scene import Scene
    from ..sources.camera.synthetic import SyntheticScene

_LOG = logging.getLogger(__name__)

DEFAULT_MAX_SECONDS = 30.0  # [s] simulated per rollout: about 2.5 x the scripted operator's plan (12.4 s)
DEFAULT_CONTEXT_RATE_HZ = 30.0  # [Hz] the rate told to a runner being built (the export's default fps); the
#                                 evaluation then calls act() at the runner's own spec.fps
Z_95 = 1.959963984540054  # [-] the standard normal quantile of a two-sided 95 % interval
CAMERAS = ("physical", "consumer")  # camera keys the twin feeds: the head camera, and the switch forwarding it
PREVIEW = "preview.mp4"
OUTCOME = "outcome.yaml"
REPORT = "report.json"
SUMMARY = "summary.txt"
_EPS = 1e-9  # [s] time comparisons on the tick grids
SAFETY_LOGGER = "rynn_teleop.core.safety"  # the safety layer's logger (core.safety's module logger)


class EvaluationError(ConfigurationError):
    """An evaluation that cannot start (a policy the twin cannot feed, a report folder that is in use)."""


class RolloutError(RynnTeleopError):
    """A rollout that cannot go on: the policy's action is unusable or the physics diverged."""


# --------------------------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate on. Raises ConfigurationError (at construction) for a value out of range."""

    task: str  # a scene in config/sim/ (its task is judged) or a scene YAML path
    episodes: int = 10  # [-] rollouts, one per seed
    seed: int = 0  # [-] the first layout seed: rollouts use seed .. seed + episodes - 1
    max_seconds: float = DEFAULT_MAX_SECONDS  # [s] simulated time after which a rollout without success fails
    video: bool = True  # write each rollout's preview.mp4

    def __post_init__(self) -> None:
        if int(self.episodes) < 1:
            raise ConfigurationError(f"episodes must be >= 1, got {self.episodes}")
        if not 0 <= int(self.seed) <= 2**31 - 1 - int(self.episodes):
            raise ConfigurationError(f"seed must be in [0, 2**31 - 1 - episodes], got {self.seed}")
        if not (math.isfinite(self.max_seconds) and self.max_seconds > 0):
            raise ConfigurationError(f"max_seconds must be a positive number of seconds, got {self.max_seconds}")

    @property
    def seeds(self) -> tuple[int, ...]:
        """The layout seed of each rollout, in order."""
        return tuple(range(int(self.seed), int(self.seed) + int(self.episodes)))

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "episodes": int(self.episodes), "seed": int(self.seed),
                "seeds": list(self.seeds), "max_seconds": float(self.max_seconds), "video": bool(self.video)}


class DriverSafety(NamedTuple):
    """A driver node's safety-layer parameters (``config/<node>.yaml``; see ``nodes.driver.safety_params``)."""

    rate_hz: float  # [Hz] the driver's control cycle
    command_timeout_s: float  # [s] watchdog
    ramp_threshold: float  # [rad] a command further than this from the held position is ramped to
    ramp_speed: float  # [-] ramp speed as a fraction of the velocity limits
    velocity_scale: float  # [-] the velocity limits are scaled by this

    @classmethod
    def from_config(cls, node: str) -> DriverSafety:
        """The values of ``config/<node>.yaml``.

        Raises:
            ConfigurationError: the file or a key is missing, or a value is not a positive number.
        """
        path = config_file(node)
        doc = read_yaml(path, "parameter file", mapping=True)
        try:
            params = doc[node]["ros__parameters"]
            values = {k: float(params[k]) for k in cls._fields}
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"{path}: no usable {node}.ros__parameters ({exc!r}); keys needed: "
                                     f"{', '.join(cls._fields)}") from None
        bad = [k for k, v in values.items() if not (math.isfinite(v) and (v > 0 or (k == "ramp_threshold" and v == 0)))]
        if bad:
            raise ConfigurationError(f"{path}: {node}.{bad[0]} = {values[bad[0]]} must be a positive number "
                                     "(ramp_threshold: >= 0)")
        return cls(**values)

    def limits(self, robot: RobotModel, index: np.ndarray) -> JointLimits:
        """The limits the driver's safety layer works with: the description's, velocity scaled (as the driver)."""
        lim = robot.limits[index]
        return JointLimits(lim.lower, lim.upper, lim.velocity * self.velocity_scale, lim.acceleration, lim.jerk)

    def controller(self, robot: RobotModel, index: np.ndarray) -> SafetyController:
        """A safety layer for the joints ``index`` (canonical indices), configured as the driver's."""
        from ..core.safety import SafetyController

        names = [CANONICAL_JOINT_NAMES[i] for i in index]
        return SafetyController(names, self.limits(robot, index), 1.0 / self.rate_hz,
                                command_timeout=self.command_timeout_s, ramp_threshold=self.ramp_threshold,
                                ramp_speed=self.ramp_speed)


class Rig(NamedTuple):
    """The stack's pieces between a policy and the twin, as configured (read once per evaluation)."""

    camera_size: tuple[int, int]  # (width, height) [px] of the head camera (its synthetic profile)
    arm: DriverSafety  # the arm driver's safety layer
    hand: DriverSafety  # the hand driver's safety layer
    follower_rate_hz: float  # [Hz] the arm smoothing's cycle (the teleoperation's)
    follower_margin: float  # [rad] its targets stay this far inside the position limits

    @classmethod
    def from_config(cls) -> Rig:
        """From ``config/head_camera.yaml``, ``config/arm_driver.yaml``, ``config/hand_driver.yaml`` and
        :class:`~rynn_teleop.core.arm_teleop.ArmTeleopSettings`."""
        from ..core.arm_teleop import ArmTeleopSettings
        from ..core.camera import parse_profile

        path = config_file("head_camera")
        doc = read_yaml(path, "parameter file", mapping=True)
        try:
            profile = parse_profile(doc["head_camera"]["ros__parameters"]["synthetic"]["profile"])
        except (KeyError, TypeError) as exc:
            raise ConfigurationError(f"{path}: no head_camera.ros__parameters.synthetic.profile ({exc!r})") from None
        teleop = ArmTeleopSettings()
        return cls((profile.width, profile.height), DriverSafety.from_config("arm_driver"),
                   DriverSafety.from_config("hand_driver"), teleop.rate_hz, teleop.target_margin)


# --------------------------------------------------------------------------------------------- results

class Interval(NamedTuple):
    """A confidence interval of a proportion."""

    low: float  # [-] in [0, 1]
    high: float  # [-] in [0, 1]


def wilson_interval(successes: int, n: int, z: float = Z_95) -> Interval:
    """The Wilson score interval of ``successes`` out of ``n`` trials (``z``: the normal quantile; default 95 %).

    (0, 1) for ``n`` = 0. Unlike the normal approximation it stays within [0, 1] and is not empty at 0 or n
    successes.
    """
    if n <= 0:
        return Interval(0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n} trials")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # exactly 0 at no success and 1 at all (where the two terms cancel, up to rounding)
    return Interval(0.0 if successes == 0 else max(0.0, centre - half),
                    1.0 if successes == n else min(1.0, centre + half))


OUTCOMES = ("success", "failure", "error")


@dataclass(frozen=True)
class RolloutResult:
    """One rollout's record (``report.json``'s entry; ``outcome.yaml`` adds the final joints and traceback)."""

    index: int  # [-] 0-based position in the evaluation
    seed: int  # [-] the layout seed
    outcome: str  # one of OUTCOMES
    reason: str  # the task predicate's reason, or the error's message
    time_to_success: float | None  # [s] simulated time at which the predicate first held (successes only)
    sim_time: float  # [s] simulated time the rollout ran
    steps: int  # [-] policy steps (act() calls)
    wall_s: float  # [s] wall-clock time of the rollout (building the twin included)
    final_joints: tuple[float, ...] = ()  # (54,) [rad] measured at the end (empty when the twin was never built)
    error: str | None = None  # "Type: message" of an error
    traceback: str | None = None  # of an error
    folder: str = ""  # the rollout's folder, relative to the report folder
    clipped: tuple[tuple[str, int], ...] = ()  # (driver/reason, driver cycles) of the safety layers' clipping

    @property
    def success(self) -> bool:
        return self.outcome == "success"

    def entry(self) -> dict[str, Any]:
        """The ``report.json`` entry (no joints, no traceback)."""
        return {"index": self.index, "seed": self.seed, "outcome": self.outcome, "reason": self.reason,
                "time_to_success_s": _round(self.time_to_success), "sim_time_s": _round(self.sim_time),
                "steps": self.steps, "wall_s": _round(self.wall_s, 3), "error": self.error, "folder": self.folder,
                "clipped_cycles": dict(self.clipped)}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def reason_kind(reason: str) -> str:
    """A failure reason without its measurements (the parenthesised parts), so that equal kinds count together:
    ``"red_cube is outside goal (0.153 m from its centre)"`` -> ``"red_cube is outside goal"``."""
    return re.sub(r"\s*\([^()]*\)", "", reason).strip() or reason


@dataclass(frozen=True)
class Summary:
    """What the rollouts add up to."""

    episodes: int  # [-]
    successes: int  # [-]
    failures: int  # [-] the predicate did not hold by the end
    errors: int  # [-] rollouts that raised
    success_rate: float  # [-] successes / episodes (an error is not a success)
    interval: Interval  # Wilson 95 % interval of the success rate
    time_to_success_mean: float | None  # [s] over the successes (None: none)
    time_to_success_median: float | None  # [s]
    failure_reasons: dict[str, int]  # reason kind (reason_kind; "error: Type" for errors) -> count, most first

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "successes": self.successes, "failures": self.failures,
                "errors": self.errors, "success_rate": round(self.success_rate, 4),
                "interval_95": [round(self.interval.low, 4), round(self.interval.high, 4)],
                "time_to_success_mean_s": _round(self.time_to_success_mean),
                "time_to_success_median_s": _round(self.time_to_success_median),
                "failure_reasons": dict(self.failure_reasons)}


def summarise(results: Sequence[RolloutResult]) -> Summary:
    """Success rate with its Wilson 95 % interval, time to success (mean, median) and failure reasons counted."""
    n = len(results)
    successes = sum(r.success for r in results)
    times = [r.time_to_success for r in results if r.success and r.time_to_success is not None]
    kinds = Counter(reason_kind(r.reason) if r.outcome == "failure" else f"error: {(r.error or '').split(':')[0]}"
                    for r in results if not r.success)
    failures, errors = (sum(r.outcome == kind for r in results) for kind in ("failure", "error"))
    return Summary(n, successes, failures, errors, successes / n if n else 0.0, wilson_interval(successes, n),
                   statistics.fmean(times) if times else None, statistics.median(times) if times else None,
                   dict(kinds.most_common()))


@dataclass(frozen=True)
class EvalReport:
    """An evaluation's result; :attr:`folder` holds it on disk (see the module doc)."""

    settings: EvalSettings
    scene: str  # the scene's name
    task: str  # the task in words ("place red_cube in goal")
    policy: dict[str, Any]  # what was evaluated: spec (source, fps, cameras) and what the caller added (backend...)
    rollouts: tuple[RolloutResult, ...]
    summary: Summary
    folder: Path
    wall_s: float  # [s] the whole evaluation
    complete: bool = True  # every rollout ran (False: a report written while running)

    def to_dict(self) -> dict[str, Any]:
        """``report.json``."""
        return {"complete": self.complete, "settings": {**self.settings.to_dict(), "scene": self.scene},
                "task": self.task, "policy": self.policy, "summary": self.summary.to_dict(),
                "wall_s": round(self.wall_s, 2), "rollouts": [r.entry() for r in self.rollouts]}

    def lines(self) -> list[str]:
        """The summary in words (``summary.txt``, and what the command prints)."""
        s, st = self.summary, self.settings
        seeds = f"seed {st.seeds[0]}" if len(st.seeds) == 1 else f"seeds {st.seeds[0]}-{st.seeds[-1]}"
        out = [f"policy: {self.policy.get('source') or '?'}"
               + (f" (backend {self.policy['backend']})" if self.policy.get("backend") else ""),
               f"task: {self.scene}: {self.task}; {seeds}; at most {st.max_seconds:g} s each",
               f"success: {s.successes}/{s.episodes} = {100 * s.success_rate:.0f} % (95 % interval "
               f"{100 * s.interval.low:.0f}-{100 * s.interval.high:.0f} %, Wilson)"]
        if s.time_to_success_mean is not None:
            out.append(f"time to success: mean {s.time_to_success_mean:.2f} s, median {s.time_to_success_median:.2f} s "
                       f"(over {s.successes} successes)")
        else:
            out.append("time to success: - (no success)")
        for kind, count in s.failure_reasons.items():
            out.append(f"failed {count} x: {kind}")
        clipping = Counter()
        for r in self.rollouts:
            clipping.update(dict(r.clipped))
        if clipping:
            n = sum(1 for r in self.rollouts if r.clipped)
            out.append(f"safety layers clipped the commands in {n} of {len(self.rollouts)} rollouts (driver cycles: "
                       + ", ".join(f"{k} {v}" for k, v in sorted(clipping.items())) + ")")
        for r in self.rollouts:
            if r.outcome == "error":
                out.append(f"error in seed {r.seed}: {r.error}")
        return out


# --------------------------------------------------------------------------------------------- prepare

def build_runner(backend: str, settings: Mapping[str, Any], robot: RobotModel | None = None,
                 rate_hz: float = DEFAULT_CONTEXT_RATE_HZ) -> PolicyRunner:
    """Step *prepare runner*: the policy backend ``backend`` built from ``settings`` (its own keys, without the
    ``<backend>.`` prefix; validated against its SETTINGS, defaults filled in).

    Raises:
        UnknownBackendError: no such backend.
        ParameterError: an unknown setting or a bad value (named ``<backend>.<key>``).
        RynnTeleopError: the backend refuses the policy (missing files, another robot's...).
    """
    cls = POLICY_BACKENDS.backend(backend)
    schema = ParamSchema(backend, cls.SETTINGS, what="policy backend")
    try:
        values = schema.validate(dict(settings))
    except ParameterError as exc:
        raise ParameterError(f"{backend}.{exc.key}", f"{backend} backend: {exc}") from None
    robot = robot or RobotModel.default()
    return POLICY_BACKENDS.create(backend, {f"{backend}.{k}": v for k, v in values.items()},
                                  PolicyContext(robot, float(rate_hz)))


def check_policy(spec: PolicySpec) -> None:
    """A policy the twin can feed: this robot's joints (:meth:`PolicySpec.check`) and only cameras the twin draws
    (:data:`CAMERAS`).

    Raises:
        ConfigurationError: naming what does not fit (:class:`EvaluationError` for a camera).
    """
    spec.check()
    if not spec.images:
        raise EvaluationError(f"the policy takes no camera image ({spec.source}); the evaluation feeds one")
    other = [k for k in spec.images if k not in CAMERAS]
    if other:
        raise EvaluationError(f"the policy takes camera {other[0]!r}, which the twin cannot draw (it draws the head "
                              f"camera: {', '.join(CAMERAS)}); {spec.source}")


def prepare_folder(out: str | Path) -> Path:
    """The report folder, created; refused when it exists and is not empty (an earlier report is never mixed in).

    Raises:
        EvaluationError: it exists and holds files, or is a file.
    """
    folder = Path(out)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise EvaluationError(f"{folder} exists and is not an empty folder: give another --out")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --------------------------------------------------------------------------------------------- the twin

def driver_joints() -> tuple[np.ndarray, np.ndarray]:
    """Canonical indices of the arm driver's joints (both arms) and of the hand driver's (both hands)."""
    every = np.arange(len(CANONICAL_JOINT_NAMES))
    return (np.concatenate([every[GROUPS.arm(s)] for s in SIDES]),
            np.concatenate([every[GROUPS.hand(s)] for s in SIDES]))


def driver_cycle(world: PhysicsWorld, safety: SafetyController, names: Sequence[str], t: float) -> None:
    """A driver's cycle at ``t`` [s] on the twin ``world``: its safety layer's target for the measured joints
    ``names``, written as the twin's position targets (nothing when the layer holds no target)."""
    out = safety.step(t, world.joint_state(names).position)
    if out.target is not None:
        world.set_targets(out.target, names)


def advance_checked(world: PhysicsWorld, t: float) -> None:
    """Step the physics of ``world`` to ``t`` [s]. Raises RolloutError when MuJoCo reset its state (a diverging
    simulation: its time jumps back)."""
    world.advance_to(t)
    if abs(world.time - t) > 2 * world.timestep:
        raise RolloutError(f"the physics diverged: its time is {world.time:.3f} s where {t:.3f} s was "
                           "expected (MuJoCo reset an unstable state)")


class Twin:
    """One rollout's twin and the stack's pieces around it (see the module doc, step 1): built by
    :func:`build_twin`, driven by :func:`run_rollout`."""

    def __init__(self, world: PhysicsWorld, camera: SyntheticScene, spec: PolicySpec, rig: Rig,
                 robot: RobotModel) -> None:
        from ..core.motion import JerkLimitedFollower
        from ..sim.monitor import TaskMonitor

        self.world = world
        self.camera = camera
        self.spec = spec
        self.rig = rig
        self.monitor: TaskMonitor = TaskMonitor(world)
        self.builder = ObservationBuilder(spec)
        self.arms, self.hands = driver_joints()
        self.arm_names = [CANONICAL_JOINT_NAMES[i] for i in self.arms]
        self.hand_names = [CANONICAL_JOINT_NAMES[i] for i in self.hands]
        self.arm_safety = rig.arm.controller(robot, self.arms)
        self.hand_safety = rig.hand.controller(robot, self.hands)
        self.follower: JerkLimitedFollower = JerkLimitedFollower(robot.limits[self.arms], 1.0 / rig.follower_rate_hz,
                                                                 target_margin=rig.follower_margin)
        self.follower.reset(world.joint_state(self.arm_names).position)
        self._follower_time = 0.0  # [s] of the follower's state
        self.action: np.ndarray | None = None  # (54,) [rad] the newest action (None: none yet)
        self.steps = 0  # [-] actions taken
        self.frames: list[np.ndarray] = []  # the primary camera's images given to the policy (when kept)
        self.keep_frames = False

    def measured(self) -> np.ndarray:
        """(54,) [rad] the measured joints now (canonical order)."""
        return self.world.joint_state().position

    def frame(self, t: float, q: np.ndarray) -> np.ndarray:
        """The head camera's colour frame at ``t`` [s] with the robot at ``q`` and the objects where they are now
        ((H, W, 3) uint8 RGB at the camera's size)."""
        from ..core.trackers import frame_matrices
        from ..sim.monitor import object_poses

        poses = object_poses(self.world)
        self.camera.set_object_poses(frame_matrices(np.array([p.position for p in poses]),
                                                    np.array([p.quaternion for p in poses])))
        self.camera.set_joint_positions(q, t)
        frames = self.camera.read(t)
        if not frames or abs(frames[-1].stamp - t) > 1e-6:
            raise RolloutError(f"the head camera gave no frame at t = {t:.4f} s")
        return frames[-1].color

    def observe(self, t: float) -> dict[str, np.ndarray]:
        """Policy step, first half: the observation at ``t`` [s] (the measured joints and the head camera's frame
        through the :class:`ObservationBuilder`)."""
        stamp = round(t * 1e9)
        q = self.measured()
        if not np.all(np.isfinite(q)):
            raise RolloutError(f"the physics diverged: non-finite joint positions at t = {t:.3f} s")
        self.builder.add_joint_state(CANONICAL_JOINT_NAMES, q, stamp)
        rgb = self.frame(t, q)
        for camera in self.spec.images:
            self.builder.add_image(camera, rgb, stamp)
        observation = self.builder.build()
        if observation is None:  # cannot happen: a state and every camera's frame were given at this stamp
            raise RolloutError(f"no observation at t = {t:.4f} s")
        if self.keep_frames:
            self.frames.append(observation.values[image_key(self.builder.cameras[0])])
        return observation.values

    def take_action(self, action: Any) -> None:
        """Policy step, second half: the (54,) [rad] action becomes the goal of the arms and hands.

        Raises:
            RolloutError: not 54 finite numbers.
        """
        a = np.asarray(action, dtype=float).reshape(-1)
        if a.shape != (len(CANONICAL_JOINT_NAMES),) or not np.all(np.isfinite(a)):
            raise RolloutError(f"the policy's action is not {len(CANONICAL_JOINT_NAMES)} finite joint positions "
                               f"(shape {np.shape(action)}, {int(np.sum(~np.isfinite(a)))} not finite)")
        self.action = a
        self.steps += 1

    def step_arms(self, t: float) -> None:
        """The arm driver's cycle at ``t`` [s]: the follower advances to ``t`` towards the newest arm action; its
        position is the command the safety layer receives; the safety layer's target is written to the twin."""
        if self.action is not None:
            dt = t - self._follower_time
            state = self.follower.step(self.action[self.arms], dt=dt if dt > 0 else None)
            self._follower_time = t
            self.arm_safety.command(state.position, t)
        self._write(self.arm_safety, self.arm_names, t)

    def step_hands(self, t: float) -> None:
        """The hand driver's cycle at ``t`` [s]: the newest hand action through the hand safety layer."""
        if self.action is not None:
            self.hand_safety.command(self.action[self.hands], t)
        self._write(self.hand_safety, self.hand_names, t)

    def _write(self, safety: SafetyController, names: Sequence[str], t: float) -> None:
        """A driver's cycle at ``t`` [s] (:func:`driver_cycle`)."""
        driver_cycle(self.world, safety, names, t)

    def clipped(self) -> tuple[tuple[str, int], ...]:
        """Driver cycles in which each safety layer clipped, by reason (position limit, max step), non-zero only:
        (("arm/position", n), ...)."""
        counts = (("arm", self.arm_safety.clamp_counts), ("hand", self.hand_safety.clamp_counts))
        return tuple((f"{driver}/{why}", int(n)) for driver, c in counts for why, n in c.items() if n)

    def advance(self, t: float) -> None:
        """Step the physics to ``t`` [s]. Raises RolloutError when MuJoCo reset its state (a diverging
        simulation: its time jumps back)."""
        advance_checked(self.world, t)


def build_twin(scene: Scene, seed: int, spec: PolicySpec, rig: Rig, camera: SyntheticScene | None = None,
               robot: RobotModel | None = None) -> Twin:
    """Step *build twin*: a fresh world of ``scene`` at ``seed``, the robot at home, and the head camera (``camera``,
    reused across rollouts when given: it is fed this world's scene) showing it (see the module doc).

    Raises:
        ValueError: a ``camera`` of another rate than ``spec.fps`` or another size than the rig's.
    """
    from ..sim.monitor import scene_description
    from ..sim.physics import PhysicsWorld
    from ..sim.rollout import home_posture

    if camera is not None and (camera.fps != spec.fps or (camera.width, camera.height) != tuple(rig.camera_size)):
        raise ValueError(f"a {camera.width}x{camera.height} camera at {camera.fps} Hz cannot serve a policy at "
                         f"{spec.fps} Hz with a {rig.camera_size[0]}x{rig.camera_size[1]} head camera")
    robot = robot or RobotModel.default()
    world = PhysicsWorld(scene, int(seed), initial=home_posture(robot))
    camera = camera or make_camera(rig, spec.fps, robot)
    camera.start(0.0)
    camera.feed("/twin/scene", json.dumps(scene_description(world)))
    return Twin(world, camera, spec, rig, robot)


def make_camera(rig: Rig, fps: float, robot: RobotModel | None = None) -> SyntheticScene:
    """The head camera as the stack's head camera node draws the twin (synthetic backend, robot drawn, the twin's
    scene followed; no depth: the policy takes colour), at ``fps`` [Hz] (the policy's: a frame at each policy
    tick)."""
    from ..sources.camera.synthetic import SyntheticScene

    width, height = rig.camera_size
    return SyntheticScene(width, height, float(fps), depth=False, draw_robot=True, robot_model=robot,
                          twin_scene_topic="/twin/scene", twin_in_background=False)


class RolloutRun(NamedTuple):
    """What :func:`run_rollout` gave."""

    success: bool
    reason: str  # the task predicate's
    time_to_success: float | None  # [s]
    sim_time: float  # [s]
    steps: int  # [-] act() calls


def run_rollout(twin: Twin, runner: PolicyRunner, max_seconds: float) -> RolloutRun:
    """Step *run* and *judge*: the policy drives ``twin`` until the task succeeds, fails for good, or ``max_seconds``
    [s] of simulated time (see the module doc, steps 2 and 3). Raises what the policy or the physics raises."""
    fps = twin.spec.fps
    rates = (fps, twin.rig.arm.rate_hz, twin.rig.hand.rate_hz)
    ticks = [0, 0, 0]  # the next tick of the policy, the arm driver, the hand driver
    runner.reset()
    while True:
        times = [k / r for k, r in zip(ticks, rates)]
        t = min(times)
        twin.advance(t)
        if times[0] <= t + _EPS:  # the policy's tick: observe, judge, act
            observation = twin.observe(t)
            live = twin.monitor.update()
            if live.success is not None or t >= max_seconds - _EPS:
                success = bool(live.success)
                return RolloutRun(success, live.reason, t if success else None, twin.world.time, twin.steps)
            twin.take_action(runner.act(observation))
            ticks[0] += 1
        if times[1] <= t + _EPS:
            twin.step_arms(t)
            ticks[1] += 1
        if times[2] <= t + _EPS:
            twin.step_hands(t)
            ticks[2] += 1


# --------------------------------------------------------------------------------------------- write

def write_rollout(folder: Path, result: RolloutResult, frames: Sequence[np.ndarray], fps: float) -> None:
    """Step *write*: ``folder/outcome.yaml`` (the entry, final joints, traceback) and, given ``frames``,
    ``folder/preview.mp4`` (H.264 at ``fps`` rounded to whole Hz; an odd width or height loses its last column or
    row, which 4:2:0 video cannot hold)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {**result.entry(), "final_joints": dict(zip(CANONICAL_JOINT_NAMES, result.final_joints))}
    if result.traceback:
        doc["traceback"] = result.traceback
    (folder / OUTCOME).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    if frames:
        write_preview(folder / PREVIEW, frames, fps)


def write_preview(path: Path, frames: Sequence[np.ndarray], fps: float) -> None:
    """``frames`` ((H, W, 3) uint8 RGB, one size) as an H.264 MP4 at ``fps`` [Hz] rounded to whole Hz."""
    from ..recording.lerobot import VideoOptions, VideoWriter

    height, width = (d - d % 2 for d in frames[0].shape[:2])
    writer = VideoWriter(path, width=width, height=height, fps=max(1, round(fps)), options=VideoOptions())
    try:
        for image in frames:
            writer.write(np.ascontiguousarray(image[:height, :width]))
    except BaseException:
        writer.abort()
        raise
    writer.close()


def write_report(report: EvalReport) -> None:
    """``report.json`` and ``summary.txt`` in the report's folder (rewritten after each rollout)."""
    folder = report.folder
    tmp = folder / (REPORT + ".partial")
    tmp.write_text(json.dumps(report.to_dict(), indent=1, default=str) + "\n")
    tmp.replace(folder / REPORT)
    (folder / SUMMARY).write_text("\n".join(report.lines()) + "\n")


# --------------------------------------------------------------------------------------------- the pipeline

@dataclass
class _Evaluation:
    """The state of one :func:`evaluate` call between its steps."""

    runner: PolicyRunner
    settings: EvalSettings
    scene: Scene
    rig: Rig
    folder: Path
    policy: dict[str, Any]
    robot: RobotModel
    camera: SyntheticScene | None = None
    results: list[RolloutResult] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def report(self, complete: bool) -> EvalReport:
        from ..sim.tasks import task_for

        return EvalReport(self.settings, self.scene.name, task_for(self.scene).name, self.policy,
                          tuple(self.results), summarise(self.results), self.folder,
                          time.perf_counter() - self.started, complete)


@contextlib.contextmanager
def clipping_counted() -> Iterator[None]:
    """While a rollout runs, the safety layers' once-a-second "clipped" warnings are not logged: a rollout runs
    faster than real time, so they would come many times a second; the clipping is counted in the result's
    ``clipped`` (``report.json``'s ``clipped_cycles``) instead."""
    log = logging.getLogger(SAFETY_LOGGER)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _rollout(ev: _Evaluation, index: int, seed: int) -> tuple[RolloutResult, list[np.ndarray]]:
    """One rollout, built, run and judged; an exception becomes an ``error`` result."""
    start = time.perf_counter()
    folder = f"seed-{seed}"
    twin: Twin | None = None
    try:
        twin = build_twin(ev.scene, seed, ev.runner.spec, ev.rig, ev.camera, ev.robot)
        ev.camera = twin.camera
        twin.keep_frames = ev.settings.video
        with clipping_counted():
            run = run_rollout(twin, ev.runner, ev.settings.max_seconds)
        result = RolloutResult(index, seed, "success" if run.success else "failure", run.reason, run.time_to_success,
                               run.sim_time, run.steps, time.perf_counter() - start,
                               tuple(float(v) for v in twin.measured()), folder=folder, clipped=twin.clipped())
    except Exception as exc:  # noqa: BLE001 - a crashing rollout is a result; the evaluation goes on
        message = f"{type(exc).__name__}: {exc}"
        _LOG.warning("policy eval: seed %d: %s", seed, message)
        sim_time, steps = (twin.world.time, twin.steps) if twin is not None else (0.0, 0)
        joints = tuple(float(v) for v in twin.measured()) if twin is not None else ()
        result = RolloutResult(index, seed, "error", message, None, sim_time, steps, time.perf_counter() - start,
                               joints, message, traceback.format_exc(), folder)
        ev.camera = None  # a camera left mid-frame is not trusted with the next rollout
    return result, (twin.frames if twin is not None else [])


def evaluate(runner: PolicyRunner, settings: EvalSettings, out: str | Path, *,
             policy: Mapping[str, Any] | None = None,
             progress: Callable[[RolloutResult], None] | None = None) -> EvalReport:
    """Score ``runner`` on ``settings.episodes`` fresh twins (see the module doc) and write the report into ``out``.

    Args:
        runner: a built policy (not closed here).
        settings: task, seeds, duration, video.
        out: the report folder (created; refused when it holds files).
        policy: what to record about the policy besides its spec (backend name, settings).
        progress: called with each rollout's result as it is written.

    Raises:
        ConfigurationError: an unknown task, a policy the twin cannot feed (another robot's joints, a camera it
            does not draw), a used report folder, an unusable configuration.
    """
    from ..sim.scene import load_scene

    scene = load_scene(settings.task)
    spec = runner.spec
    check_policy(spec)
    rig = Rig.from_config()
    folder = prepare_folder(out)
    described = {"source": spec.source, "fps": spec.fps,
                 "cameras": {k: list(v) for k, v in spec.images.items()}, **(policy or {})}
    ev = _Evaluation(runner, settings, scene, rig, folder, described, RobotModel.default())
    for index, seed in enumerate(settings.seeds):
        result, frames = _rollout(ev, index, seed)
        ev.results.append(result)
        write_rollout(folder / result.folder, result, frames, spec.fps)
        write_report(ev.report(complete=False))
        if progress is not None:
            progress(result)
    report = ev.report(complete=True)
    write_report(report)
    return report
