"""Digital episodes judged by the twin: does a generated demonstration show what physics would do? (ROS-free)

``rynn-teleop world-model judge EPISODES... --out DIR``. An episode recorded in the digital mode (the world
model's generated feed is the camera the operator sees, the physical twin runs beside it) holds the operator's
commands, the generated video and the twin's scene. Its commands are replayed on a fresh twin of the episode's
scene and layout, and the twin's outcome (the task's predicate) is set beside what the generated video shows at
the end: the task object in the target region or not. Per episode:

1. **read** (:func:`read_episode`): the twin's scene name and layout seed from ``/twin/scene`` (every message must
   name the same layout); the commands (``/arms/command``, ``/hands/command``:
   :func:`~rynn_teleop.recording.replay.load_commands`, joints checked against the robot's); the generated feed's
   (:data:`GENERATED_TOPIC`) last frame, the one with the newest header stamp (ties: the later in file order);
   and, when ``/twin/objects`` was recorded and shows the task object lifted (else moved,
   :func:`~.objects.object_track`), the generated frames at :data:`STRIP_OFFSETS_S` around that first lift
   (each the newest frame stamped at or before its instant; before the first frame: the first), for the strip.
2. **replay** (:func:`replay_on_twin`): a fresh twin (:class:`~rynn_teleop.sim.physics.PhysicsWorld` of the
   scene at the seed, the robot at :func:`~rynn_teleop.sim.rollout.home_posture`, as the twin node starts it)
   driven in lockstep simulated time by the drivers' safety layers, configured as the driver nodes configure
   theirs (:class:`~rynn_teleop.policies.evaluate.DriverSafety`: ``config/arm_driver.yaml`` for both arms at its
   ``rate_hz``, ``config/hand_driver.yaml`` for both hands at its own). The commands follow
   ``episodes replay --twin``'s sequence (:mod:`rynn_teleop.recording.replay`, :class:`ReplayOptions`): the slow
   approach from the measured joints to the first command (:func:`~rynn_teleop.recording.replay.approach`, sent
   every ``1 / publish_hz`` until it arrived within ``arrive_tolerance`` or ``arrive_timeout_s`` after it), every
   recorded command at its recorded time (divided by ``speed``) on its own topic (a driver takes the joints it
   has: :data:`~rynn_teleop.recording.replay.ARM_COMMAND_TOPIC` goes to the arm driver,
   :data:`~rynn_teleop.recording.replay.HAND_COMMAND_TOPIC` to the hand driver), then the last command of each
   stream held for ``settle_s``. At equal times a command goes first, then the arm driver's cycle, then the hand
   driver's. Then the task monitor (:class:`~rynn_teleop.sim.monitor.TaskMonitor`, the twin node's
   ``/twin/outcome``) judges: ``success`` only when the task's predicate holds; a failure or an undecided outcome
   is not a success. The same commands and options give the same outcome whatever the machine's load.
3. **hypotheses** (:func:`render_hypotheses`): the twin's head camera (the renderer the camera source draws the
   twin with: :class:`~rynn_teleop.sources.camera.synthetic.SyntheticScene`, colour only, the robot drawn) at
   the generated frame's size, the robot at the replay's final measured joints and every other object at its
   final pose in the replay, draws three images: the twin's final state; **H_in**, the task object resting upright
   at the target region's centre (its bottom on the region's surface, the yaw it started with); **H_out**, the
   task object at its start pose (the layout's: out of the target).
4. **decide** (:func:`decide`): the *target box* is the half-open pixel rectangle (the convention of
   :func:`~.objects.project_boxes`) holding the target region (a flat rectangle on its surface) and the task
   object at H_in, projected through the renderer's camera (:class:`~rynn_teleop.core.camera_view.CameraView`
   of the description's head camera with :func:`~rynn_teleop.core.camera.default_intrinsics` at the frame's size,
   the dataset's camera when an episode has no camera info). The generated last frame is compared with H_in and
   with H_out inside that box (:func:`~.metrics.box_psnr`, [dB], capped at :data:`~.metrics.PSNR_CAP_DB`): it
   *shows the task object in the target* when PSNR(H_in) > PSNR(H_out) (strictly; a box out of view gives NaN and
   False). ``margin_db`` = PSNR(H_in) - PSNR(H_out). Everything outside the box (the robot included) is the same in
   both hypotheses and is not compared.
5. **write** (:func:`write_strip`, :func:`write_report`): the report folder (refused when it holds files)::

       OUT/judge.json            settings, summary, one entry per episode (see JudgeResult.entry)
       OUT/strips/NNN-NAME.png   generated last frame | twin replay's final render | H_in | H_out, target box
                                 outlined on each; a second row with the generated frames around the first lift
                                 (the task object's recorded box outlined) when the recording shows one

The summary (:func:`summarise`) counts the episodes, the agreements (twin success == generated shows the object in
the target) with their rate and its Wilson 95 % interval, the twin's successes and the episodes whose video shows
the object in the target. Every episode is read (step 1) before any is replayed: an episode that cannot be judged
(no ``/twin/scene``, no generated feed, no command, another robot's joints, a damaged bag) ends the run before the
long part, its error naming the episode and the missing topic.

Heavy modules (MuJoCo, the camera's renderer, torch for the metrics) are imported by the steps that use them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, RobotModel
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.policies.evaluate import advance_checked, clipping_counted, driver_cycle, driver_joints
from rynn_teleop.recording.cdr import header_stamp_ns
from rynn_teleop.recording.errors import EpisodeDataError, RecordingError
from rynn_teleop.recording.frames import FEED_TOPICS, IMAGE, Bag, read_images
from rynn_teleop.recording.replay import (
    ARM_COMMAND_TOPIC,
    HAND_COMMAND_TOPIC,
    CommandTrack,
    ReplayOptions,
    approach,
    check_joint_names,
    load_commands,
)
from rynn_teleop.recording.writer import default_typestore

from .objects import (
    OBJECTS_TOPIC,
    SCENE_TOPIC,
    NotTwinEpisodeError,
    SceneObject,
    TwinObjects,
    box_visible,
    layout_key,
    object_track,
    project_boxes,
    read_twin_objects,
    scene_objects,
)

if TYPE_CHECKING:
    from rynn_teleop.core.camera_view import CameraView
    from rynn_teleop.policies.evaluate import DriverSafety
    from rynn_teleop.sim.physics import PhysicsWorld
    from rynn_teleop.sim.scene import Scene
    from rynn_teleop.sources.camera.synthetic import SyntheticScene

JUDGE_FORMAT = "rynn_teleop.world_model.judge/1"
REPORT_FILE = "judge.json"
STRIPS_DIR = "strips"
GENERATED_TOPIC = FEED_TOPICS["generated"]  # the world model's feed, as recorded
STRIP_OFFSETS_S = (-0.5, 0.0, 0.5, 1.0)  # [s] generated frames around the first lift shown in the strip's 2nd row
TARGET_THICKNESS_M = 1e-4  # [m] the target region, projected as a box this thin on its surface
STRIP_MIN_PANEL_HEIGHT = 240  # [px] a strip's panels are scaled up by a whole factor to at least this height
STRIP_LABEL_PX = 18  # [px] the text band above each panel
TARGET_BOX_COLOUR = (40, 120, 255)  # RGB outline of the target box
OBJECT_BOX_COLOUR = (230, 40, 40)  # RGB outline of the task object's recorded box (the strip's second row)
_EPS = 1e-9  # [s] comparisons on the tick grids


# --------------------------------------------------------------------------------------------- step 1: read

class EpisodeInputs(NamedTuple):
    """What :func:`read_episode` takes from one episode."""

    path: Path  # the episode directory
    scene: str  # the twin's scene (a file in config/sim/)
    seed: int  # its layout seed
    task_object: str  # the scene's task object
    target: str  # the scene's target region
    track: CommandTrack  # the recorded commands
    last_frame: np.ndarray  # (H, W, 3) uint8 RGB: the generated feed's last frame
    last_stamp_ns: int  # [ns] its header stamp
    generated_frames: int  # [-] frames on the generated feed
    event: str | None  # "first lift", "first move", or None (no /twin/objects, or the object never moved)
    event_stamp_ns: int | None  # [ns] the /twin/objects stamp of that event
    strip_frames: tuple[np.ndarray, ...]  # (H, W, 3) generated frames at STRIP_OFFSETS_S around the event
    strip_poses: tuple[np.ndarray, ...]  # (7,) the task object's recorded pose at each of those frames' stamps
    warnings: tuple[str, ...]  # what does not stop the judgement but should be known


def _scene_layout(path: Path, bag: Bag, recorded: Mapping[str, Any] | None) -> tuple[str, int, list[str]]:
    """(scene, seed, warnings) of the twin the episode ran with: every ``/twin/scene`` message must name one layout
    (the seed falls back to ``episode.yaml``'s ``extra.twin.seed``).

    Raises:
        NotTwinEpisodeError: no ``/twin/scene`` recorded or no message on it, one that is not the twin's JSON,
            layouts that change during the episode, or no seed anywhere.
    """
    if SCENE_TOPIC not in bag.types:
        raise NotTwinEpisodeError(f"{path}: no {SCENE_TOPIC} recorded: the twin's scene and layout are unknown, so its "
                                  "commands cannot be replayed on it (record in the digital mode, with the twin)",
                                  episode=path, topic=SCENE_TOPIC)
    typestore = default_typestore()
    layouts: dict[str, tuple[str, int | None]] = {}
    scan = bag.scan({SCENE_TOPIC})
    try:
        for _, _, data in scan:
            try:
                text = str(typestore.deserialize_cdr(data, bag.types[SCENE_TOPIC]).data)
                scene, seed, _ = scene_objects(text)
            except ValueError as exc:
                raise NotTwinEpisodeError(f"{path}: {SCENE_TOPIC}: {exc}", episode=path, topic=SCENE_TOPIC) from exc
            except Exception as exc:  # rosbags raises SerdeError and others for garbage
                raise NotTwinEpisodeError(f"{path}: {SCENE_TOPIC}: a message does not decode as "
                                          f"{bag.types[SCENE_TOPIC]} ({type(exc).__name__}: {exc})", episode=path,
                                          topic=SCENE_TOPIC) from exc
            layouts.setdefault(layout_key(scene, seed), (scene, seed))
    finally:
        scan.close()
    if not layouts:
        raise NotTwinEpisodeError(f"{path}: no {SCENE_TOPIC} message: the twin's scene and layout are unknown",
                                  episode=path, topic=SCENE_TOPIC)
    if len(layouts) > 1:
        raise NotTwinEpisodeError(f"{path}: the twin's layout changed during the episode "
                                  f"({', '.join(sorted(layouts))}): one replay cannot reproduce it; record one layout "
                                  "per episode", episode=path, topic=SCENE_TOPIC)
    (scene, seed), = layouts.values()
    warnings: list[str] = []
    recorded = recorded or {}
    try:
        recorded_seed = None if recorded.get("seed") is None else int(recorded["seed"])
    except (TypeError, ValueError):
        recorded_seed = None
    if seed is None:
        if recorded_seed is None:
            raise NotTwinEpisodeError(f"{path}: {SCENE_TOPIC} names no layout seed, nor does episode.yaml's "
                                      "extra.twin", episode=path, topic=SCENE_TOPIC)
        seed = recorded_seed
        warnings.append(f"{SCENE_TOPIC} names no seed: episode.yaml's extra.twin seed {seed} used")
    if recorded and (recorded.get("scene") != scene or recorded_seed != seed):
        warnings.append(f"episode.yaml's extra.twin ({recorded.get('scene')}, seed {recorded.get('seed')}) differs "
                        f"from {SCENE_TOPIC} ({scene}, seed {seed}): the twin's own {SCENE_TOPIC} is used")
    return scene, int(seed), warnings


def _generated_stamps(path: Path, bag: Bag, topic: str) -> np.ndarray:
    """(frames,) int64 header stamps [ns] of the generated feed, in file order.

    Raises:
        EpisodeDataError: the topic was not recorded, is not ``sensor_msgs/Image``, or holds no frame.
    """
    if topic not in bag.types:
        raise EpisodeDataError(f"{path}: no generated frames: {topic} was not recorded (record in the digital mode, "
                               "with the world model's feed as the camera)", episode=path, topic=topic)
    if bag.types[topic] != IMAGE:
        raise EpisodeDataError(f"{path}: {topic} is {bag.types[topic]}, not {IMAGE}", episode=path, topic=topic)
    scan = bag.scan({topic})
    try:
        stamps = np.array([header_stamp_ns(data) for _, _, data in scan], dtype=np.int64)
    finally:
        scan.close()
    if not len(stamps):
        raise EpisodeDataError(f"{path}: no generated frames on {topic}", episode=path, topic=topic)
    return stamps


def first_interaction(objects: TwinObjects, name: str) -> tuple[str, int] | None:
    """("first lift" or "first move", its /twin/objects stamp [ns]) of the object ``name`` in the recorded poses
    (:func:`~.objects.object_track` over every message, the first as reference): its first lift, else its first
    move; None when it never moved or is not in the scene."""
    names = [o.name for o in objects.objects]
    if name not in names:
        return None
    k = names.index(name)
    track = object_track(objects.poses)
    lifted = np.nonzero(track.lifted[:, k])[0]
    if len(lifted):
        return "first lift", int(objects.stamps_ns[lifted[0]])
    if track.first_move[k] >= 0:
        return "first move", int(objects.stamps_ns[track.first_move[k]])
    return None


def newest_at_or_before(stamps_ns: np.ndarray, at_ns: int) -> int:
    """Index (file order) of the frame with the newest stamp at or before ``at_ns`` [ns] (ties: the later in file
    order); the earliest frame when every frame is later."""
    stamps = np.asarray(stamps_ns, dtype=np.int64)
    order = np.argsort(stamps, kind="stable")
    k = int(np.searchsorted(stamps[order], int(at_ns), side="right")) - 1
    return int(order[max(k, 0)])


def read_episode(episode: str | os.PathLike, topic: str = GENERATED_TOPIC) -> EpisodeInputs:
    """Step *read* (see the module doc) of the episode directory ``episode``.

    Raises:
        RecordingError: not an episode directory.
        NotTwinEpisodeError: no usable ``/twin/scene`` (the message names the episode and the topic).
        EpisodeDataError: no generated frames on ``topic``, no commands, a bag that cannot be read (named);
            :class:`~rynn_teleop.recording.replay.JointNamesMismatchError`: commands of another robot's joints.
        ConfigurationError: the twin's scene is not a scene file here.
    """
    from rynn_teleop.sim.scene import load_scene

    path = Path(episode)
    if not path.is_dir():
        raise RecordingError(f"{path}: not an episode directory")
    bag = Bag.open(path)
    track = load_commands(path)
    scene_name, seed, warnings = _scene_layout(path, bag, track.twin)
    stamps = _generated_stamps(path, bag, topic)
    check_joint_names(track, CANONICAL_JOINT_NAMES)
    try:
        scene = load_scene(scene_name)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{path}: the twin's scene {scene_name!r} cannot be loaded here: {exc}") from exc
    last = newest_at_or_before(stamps, int(stamps.max()))
    event, event_ns, strip = None, None, []
    strip_poses: list[np.ndarray] = []
    if OBJECTS_TOPIC in bag.types:
        objects = read_twin_objects(bag, path)
        found = first_interaction(objects, scene.task.object)
        if found is not None:
            event, event_ns = found
            at = [event_ns + int(round(s * 1e9)) for s in STRIP_OFFSETS_S]
            strip = [newest_at_or_before(stamps, t) for t in at]
            poses, _ = objects.sample(stamps[strip])
            k = [o.name for o in objects.objects].index(scene.task.object)
            strip_poses = [p[k] for p in poses]
    else:
        warnings.append(f"no {OBJECTS_TOPIC} recorded: the strip shows no frames around the first lift")
    images = list(read_images(bag, topic, [last, *strip]))
    return EpisodeInputs(path, scene_name, seed, scene.task.object, scene.task.target, track, images[0],
                         int(stamps[last]), len(stamps), event, event_ns, tuple(images[1:]),
                         tuple(strip_poses), tuple(warnings))


# --------------------------------------------------------------------------------------------- step 2: replay

class TwinReplay(NamedTuple):
    """What :func:`replay_on_twin` gave."""

    success: bool  # the task's predicate holds at the end
    outcome: str  # success, failure (it cannot succeed any more) or undecided (:class:`LiveOutcome` label)
    reason: str  # the predicate's reason, in words
    arrived: bool  # the joints reached the first command after the approach (else the replay started anyway)
    commands_sent: int  # [-] recorded commands sent (the approach and the hold not counted)
    clipped: tuple[tuple[str, int], ...]  # (driver/reason, driver cycles) the safety layers clipped, non-zero only
    sim_time_s: float  # [s] simulated, approach and settle included
    final_joints: np.ndarray  # (54,) [rad] measured at the end, canonical order
    object_names: tuple[str, ...]  # the scene's objects in its file order (/twin/objects' order)
    start_poses: np.ndarray  # (N, 7) x, y, z [m], quaternion x, y, z, w in base_link: the layout's
    final_poses: np.ndarray  # (N, 7) at the end
    target_center: np.ndarray  # (3,) [m] the target region's centre on its surface
    target_half_size: np.ndarray  # (2,) [m] its half extents along its x and y
    target_yaw: float  # [rad] its rotation about z
    scene_json: str  # the twin's /twin/scene (sim.monitor.scene_description)


class _Driver:
    """One driver's safety layer on the twin: the joints it has, the commands it takes, its cycle."""

    def __init__(self, name: str, safety: DriverSafety, robot: RobotModel, joints: np.ndarray, order: int) -> None:
        self.name = name  # "arm" or "hand"
        self.rate_hz = float(safety.rate_hz)
        self.joints = joints  # canonical indices
        self.names = [CANONICAL_JOINT_NAMES[i] for i in joints]
        self.controller = safety.controller(robot, joints)
        self.local = {n: i for i, n in enumerate(self.names)}
        self.routes: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray] | None] = {}
        self.order = order  # at equal times: lower first
        self.ticks = 0  # the next cycle is at ticks / rate_hz

    @property
    def next_time(self) -> float:
        return self.ticks / self.rate_hz

    def take(self, names: Sequence[str], positions: np.ndarray, t: float) -> bool:
        """A command received at ``t`` [s]: the joints of ``names`` it has go to its safety layer (as the driver
        node's ``accept_command``; names it does not have are ignored); False when it has none of them."""
        key = tuple(names)
        if key not in self.routes:
            pairs = [(k, self.local[n]) for k, n in enumerate(key) if n in self.local]
            self.routes[key] = (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])) if pairs else None
        route = self.routes[key]
        if route is None:
            return False
        select, joints = route
        self.controller.command(np.asarray(positions, dtype=float)[select], t, joints)
        return True

    def cycle(self, world: PhysicsWorld) -> None:
        """The cycle due now (:func:`~rynn_teleop.policies.evaluate.driver_cycle`)."""
        driver_cycle(world, self.controller, self.names, self.next_time)
        self.ticks += 1


class LockstepDrivers:
    """The arm and hand drivers' safety layers driving ``world`` in simulated time (see the module doc, step 2).

    :meth:`send` hands a command to the driver of its topic; :meth:`advance` runs every driver cycle due before a
    time and steps the physics to it.
    """

    def __init__(self, world: PhysicsWorld, robot: RobotModel, arm: DriverSafety, hand: DriverSafety) -> None:
        arms, hands = driver_joints()
        self.world = world
        self.drivers = {
            ARM_COMMAND_TOPIC: _Driver("arm", arm, robot, arms, 0),
            HAND_COMMAND_TOPIC: _Driver("hand", hand, robot, hands, 1),
        }

    def send(self, topic: str, names: Sequence[str], positions: np.ndarray, t: float) -> bool:
        """The command ``names`` -> ``positions`` [rad] on ``topic``, received at ``t`` [s]; False when no driver
        takes it (another topic, or none of its joints)."""
        driver = self.drivers.get(topic)
        return driver is not None and driver.take(names, positions, t)

    def advance(self, t: float) -> None:
        """Run every driver cycle due before ``t`` [s] (cycles at ``t`` run after the commands sent at ``t``), each
        after the physics stepped to its time, then step the physics to ``t``.

        Raises:
            RolloutError: the physics diverged (MuJoCo reset its state: its time jumped back).
        """
        drivers = sorted(self.drivers.values(), key=lambda d: d.order)
        while True:
            due = min(drivers, key=lambda d: (d.next_time, d.order))
            if due.next_time >= t - _EPS:
                break
            self._step_to(due.next_time)
            due.cycle(self.world)
        self._step_to(t)

    def _step_to(self, t: float) -> None:
        advance_checked(self.world, t)

    def clipped(self) -> tuple[tuple[str, int], ...]:
        """Driver cycles in which each safety layer clipped, by reason (position limit, max step), non-zero only:
        (("arm/position", n), ...), as the policy evaluation reports them."""
        return tuple((f"{d.name}/{why}", int(n)) for d in sorted(self.drivers.values(), key=lambda d: d.order)
                     for why, n in d.controller.clamp_counts.items() if n)

    def measured(self, names: Sequence[str]) -> np.ndarray:
        """[rad] the measured positions of ``names`` now."""
        return self.world.joint_state(list(names)).position


class ReplayRun(NamedTuple):
    """How :func:`run_replay` went."""

    arrived: bool
    commands_sent: int


def run_replay(drivers: LockstepDrivers, track: CommandTrack, options: ReplayOptions) -> ReplayRun:
    """Approach, send, settle (``episodes replay``'s sequence, see the module doc) in simulated time from the
    world's time 0; returns whether the approach arrived and the commands sent."""
    period = 1.0 / options.publish_hz
    streams = {(c.topic, c.names): c for c in reversed(track.commands)}  # each stream's first command
    goal = track.first_pose()
    names = list(goal)
    target = np.array([goal[n] for n in names])
    plan = approach(dict(zip(CANONICAL_JOINT_NAMES, drivers.measured(CANONICAL_JOINT_NAMES))), goal, options)
    index = {n: i for i, n in enumerate(plan.names)}

    def arrived_now() -> bool:
        return bool(np.all(np.abs(drivers.measured(names) - target) <= options.arrive_tolerance))

    k, t = 0, 0.0
    while (t := k * period) < plan.duration + options.arrive_timeout_s:
        drivers.advance(t)
        values = plan.sample(t)
        for topic, stream in streams:
            drivers.send(topic, stream, np.array([values[index[n]] for n in stream]), t)
        if t >= plan.duration and arrived_now():
            break
        k += 1
    arrived = arrived_now()
    start = t
    for command in track.commands:
        at = start + command.time / options.speed
        drivers.advance(at)
        drivers.send(command.topic, command.names, command.position, at)
    end = start + track.duration / options.speed
    last = track.last_commands()
    k = 0
    while (t := end + k * period) < end + options.settle_s:  # the last commands held while the scene comes to rest
        drivers.advance(t)
        for c in last:
            drivers.send(c.topic, c.names, c.position, t)
        k += 1
    drivers.advance(end + options.settle_s)
    return ReplayRun(arrived, len(track.commands))


def build_replay_twin(scene: Scene, seed: int, robot: RobotModel | None = None) -> tuple[PhysicsWorld, LockstepDrivers]:
    """A fresh twin of ``scene`` at ``seed`` with the robot at home (as the twin node starts it) and its drivers'
    safety layers as configured (``config/arm_driver.yaml``, ``config/hand_driver.yaml``)."""
    from rynn_teleop.policies.evaluate import DriverSafety
    from rynn_teleop.sim.physics import PhysicsWorld
    from rynn_teleop.sim.rollout import home_posture

    robot = robot or RobotModel.default()
    world = PhysicsWorld(scene, int(seed), initial=home_posture(robot))
    drivers = LockstepDrivers(world, robot, DriverSafety.from_config("arm_driver"),
                              DriverSafety.from_config("hand_driver"))
    return world, drivers


def _pose_rows(poses: Iterable[Any]) -> np.ndarray:
    """(N, 7) of :class:`~rynn_teleop.sim.scene.Pose` s."""
    return np.array([[*p.position, *p.quaternion] for p in poses], dtype=float).reshape(-1, 7)


def replay_on_twin(scene: str | Scene, seed: int, track: CommandTrack, options: ReplayOptions | None = None,
                   robot: RobotModel | None = None) -> TwinReplay:
    """Step *replay* (see the module doc): ``track`` on a fresh twin of ``scene`` at ``seed``, judged at the end.

    Raises:
        ConfigurationError: an unknown scene, an unusable driver configuration, options out of range.
        RolloutError: the physics diverged.
    """
    from rynn_teleop.sim.monitor import TaskMonitor, object_poses, scene_description
    from rynn_teleop.sim.scene import load_scene

    options = (options or ReplayOptions()).check()
    scene = load_scene(scene) if isinstance(scene, str) else scene
    world, drivers = build_replay_twin(scene, seed, robot)
    start = _pose_rows(object_poses(world))
    with clipping_counted():  # counted in the result instead
        run = run_replay(drivers, track, options)
    live = TaskMonitor(world).update()
    region = world.layout.targets[scene.task.target]
    return TwinReplay(live.success is True, live.label, live.reason, run.arrived, run.commands_sent,
                      drivers.clipped(), world.time,
                      world.joint_state().position.copy(), tuple(o.name for o in scene.objects), start,
                      _pose_rows(object_poses(world)), np.asarray(region.center, dtype=float).copy(),
                      np.asarray(region.half_size, dtype=float).copy(), float(region.yaw),
                      json.dumps(scene_description(world)))


# --------------------------------------------------------------------------------------------- step 3: hypotheses

class Hypotheses(NamedTuple):
    """The images the generated last frame is compared with (:func:`render_hypotheses`), (H, W, 3) uint8 RGB."""

    twin_final: np.ndarray  # the twin's final state
    inside: np.ndarray  # H_in: the task object resting at the target's centre
    outside: np.ndarray  # H_out: the task object at its start pose
    box: np.ndarray  # (4,) int32 [px] the target box u0, v0, u1, v1 (half-open; zeros: out of view)
    inside_pose: np.ndarray  # (7,) the task object's pose in H_in
    outside_pose: np.ndarray  # (7,) ... in H_out


def task_scene_object(scene: Scene, name: str) -> SceneObject:
    """The scene's object ``name`` as :mod:`.objects` projects it."""
    spec = scene.object(name)
    return SceneObject(spec.name, spec.shape, tuple(float(v) for v in spec.size), bool(spec.fixed))


def resting_in_target(scene: Scene, replay: TwinReplay, name: str) -> np.ndarray:
    """(7,) H_in's pose of object ``name``: upright at the target region's centre, its bottom on the region's
    surface, the orientation it started with (the layout's)."""
    k = replay.object_names.index(name)
    height = scene.object(name).height
    centre = replay.target_center
    return np.array([centre[0], centre[1], centre[2] + height / 2, *replay.start_poses[k, 3:]])


def target_box(view: CameraView, scene: Scene, replay: TwinReplay, name: str, inside_pose: np.ndarray) -> np.ndarray:
    """(4,) int32 the target box (see the module doc, step 4): the pixel box holding the target region (a box
    :data:`TARGET_THICKNESS_M` thin, centred on its surface) and object ``name`` at ``inside_pose``; zeros when
    neither is in view."""
    from rynn_teleop.sim.scene import yaw_quaternion

    half = replay.target_half_size
    region = SceneObject("target", "box", (2 * float(half[0]), 2 * float(half[1]), TARGET_THICKNESS_M), True)
    poses = np.array([[*replay.target_center, *yaw_quaternion(replay.target_yaw)], inside_pose], dtype=float)
    boxes = project_boxes(view, [region, task_scene_object(scene, name)], poses[None])[0]
    seen = boxes[box_visible(boxes)]
    if not len(seen):
        return np.zeros(4, dtype=np.int32)
    return np.array([seen[:, 0].min(), seen[:, 1].min(), seen[:, 2].max(), seen[:, 3].max()], dtype=np.int32)


def twin_camera(width: int, height: int, scene_json: str, robot: RobotModel) -> SyntheticScene:
    """The twin's head camera at ``width`` x ``height`` [px] showing the twin scene ``scene_json`` (colour only,
    the robot drawn), ready for :func:`render_state`."""
    from rynn_teleop.sources.camera.synthetic import SyntheticScene

    camera = SyntheticScene(int(width), int(height), 30.0, depth=False, draw_robot=True, robot_model=robot,
                            twin_scene_topic=SCENE_TOPIC, twin_objects_topic=OBJECTS_TOPIC, twin_in_background=False)
    camera.start(0.0)
    camera.feed(SCENE_TOPIC, scene_json)
    camera.read(0.0)  # takes the scene (its static layer is ray-cast here)
    if camera.twin is None:
        raise ConfigurationError("the head camera could not draw the twin's scene")
    return camera


def render_state(camera: SyntheticScene, joints: np.ndarray, poses: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 the camera's image with the robot at ``joints`` (54,) [rad] and the scene's objects at
    ``poses`` (N, 7) (scene order; x, y, z [m], quaternion x, y, z, w in base_link)."""
    from rynn_teleop.core.trackers import frame_matrices

    p = np.asarray(poses, dtype=float)
    camera.set_object_poses(frame_matrices(p[:, :3], p[:, 3:]))
    camera.set_joint_positions(joints)
    return camera.render(0.0).color


def render_hypotheses(inputs: EpisodeInputs, replay: TwinReplay, robot: RobotModel | None = None) -> Hypotheses:
    """Step *hypotheses* (see the module doc) at the size of ``inputs.last_frame``."""
    from rynn_teleop.core.camera import default_intrinsics
    from rynn_teleop.core.camera_view import CameraView
    from rynn_teleop.sim.scene import load_scene

    robot = robot or RobotModel.default()
    scene = load_scene(inputs.scene)
    height, width = inputs.last_frame.shape[:2]
    camera = twin_camera(width, height, replay.scene_json, robot)
    try:
        k = replay.object_names.index(inputs.task_object)
        inside_pose = resting_in_target(scene, replay, inputs.task_object)
        outside_pose = replay.start_poses[k].copy()
        images = []
        for pose in (None, inside_pose, outside_pose):
            poses = replay.final_poses.copy()
            if pose is not None:
                poses[k] = pose
            images.append(render_state(camera, replay.final_joints, poses))
    finally:
        camera.close()
    view = CameraView.from_robot(robot, default_intrinsics(width, height))
    box = target_box(view, scene, replay, inputs.task_object, inside_pose)
    return Hypotheses(images[0], images[1], images[2], box, inside_pose, outside_pose)


# --------------------------------------------------------------------------------------------- step 4: decide

class Decision(NamedTuple):
    """What the generated last frame shows (:func:`decide`)."""

    shows_in_target: bool  # PSNR(H_in) > PSNR(H_out) inside the target box
    psnr_in_db: float  # [dB] against H_in (NaN: the box is out of view)
    psnr_out_db: float  # [dB] against H_out


def decide(frame: np.ndarray, hypotheses: Hypotheses) -> Decision:
    """Step *decide* (see the module doc).

    Raises:
        ValueError: ``frame`` not of the hypotheses' size.
    """
    from .metrics import box_psnr

    psnr_in = box_psnr(frame, hypotheses.inside, hypotheses.box)
    psnr_out = box_psnr(frame, hypotheses.outside, hypotheses.box)
    return Decision(bool(psnr_in > psnr_out), float(psnr_in), float(psnr_out))


# --------------------------------------------------------------------------------------------- results

def _finite(value: float, digits: int = 3) -> float | None:
    return round(float(value), digits) if math.isfinite(value) else None


@dataclass(frozen=True)
class JudgeResult:
    """One episode's judgement (``judge.json``'s entry: :meth:`entry`)."""

    episode: str  # the episode directory
    scene: str  # the twin's scene
    seed: int  # its layout seed
    twin_success: bool  # the replay on the twin did the task
    twin_reason: str  # the task predicate's reason
    generated_shows_in_target: bool  # the generated last frame is nearer H_in than H_out in the target box
    psnr_in_db: float  # [dB] generated last frame against H_in in the target box (NaN: box out of view)
    psnr_out_db: float  # [dB] ... against H_out
    twin_outcome: str = ""  # success, failure or undecided
    task_object: str = ""
    target: str = ""
    target_box: tuple[int, int, int, int] = (0, 0, 0, 0)  # [px] u0, v0, u1, v1 at frame_size
    frame_size: tuple[int, int] = (0, 0)  # (width, height) [px] of the generated frames
    last_frame_stamp_ns: int = 0  # [ns]
    generated_frames: int = 0  # [-]
    arrived: bool = True  # the replay's approach reached the first command
    commands_sent: int = 0  # [-]
    clipped: tuple[tuple[str, int], ...] = ()  # (driver/reason, driver cycles) the safety layers clipped
    sim_time_s: float = 0.0  # [s] the replay, approach and settle included
    final_joints: tuple[float, ...] = ()  # (54,) [rad]
    final_object_poses: dict[str, list[float]] = field(default_factory=dict)  # name -> x, y, z, qx, qy, qz, qw
    event: str | None = None  # the strip's second row: "first lift", "first move" or None
    strip: str = ""  # the strip PNG, relative to the report folder
    warnings: tuple[str, ...] = ()
    wall_s: float = 0.0  # [s]

    @property
    def agree(self) -> bool:
        """The twin's outcome and what the generated video shows agree."""
        return self.twin_success == self.generated_shows_in_target

    @property
    def margin_db(self) -> float:
        """[dB] PSNR(H_in) - PSNR(H_out): > 0 the video shows the object in the target."""
        return self.psnr_in_db - self.psnr_out_db

    def entry(self) -> dict[str, Any]:
        """The ``judge.json`` entry (NaN written as null)."""
        return {"episode": self.episode, "scene": self.scene, "seed": self.seed, "twin_success": self.twin_success,
                "twin_outcome": self.twin_outcome, "twin_reason": self.twin_reason,
                "generated_shows_in_target": self.generated_shows_in_target, "agree": self.agree,
                "psnr_in_db": _finite(self.psnr_in_db), "psnr_out_db": _finite(self.psnr_out_db),
                "margin_db": _finite(self.margin_db), "task_object": self.task_object, "target": self.target,
                "target_box": list(self.target_box), "frame_size": list(self.frame_size),
                "last_frame_stamp_ns": self.last_frame_stamp_ns, "generated_frames": self.generated_frames,
                "replay": {"arrived": self.arrived, "commands_sent": self.commands_sent,
                           "clipped_cycles": dict(self.clipped), "sim_time_s": round(self.sim_time_s, 4)},
                "final_joints": dict(zip(CANONICAL_JOINT_NAMES, (round(v, 6) for v in self.final_joints))),
                "final_object_poses": self.final_object_poses, "event": self.event, "strip": self.strip,
                "warnings": list(self.warnings), "wall_s": round(self.wall_s, 2)}


@dataclass(frozen=True)
class JudgeSummary:
    """What the judgements add up to."""

    episodes: int  # [-]
    agreements: int  # [-] twin_success == generated_shows_in_target
    agreement_rate: float  # [-] agreements / episodes (0 without episodes)
    agreement_interval: tuple[float, float]  # Wilson 95 % interval of the rate
    twin_successes: int  # [-]
    generated_in_target: int  # [-]
    both: int  # [-] twin success and shown in the target
    twin_only: int  # [-] twin success, not shown
    generated_only: int  # [-] shown, but the twin failed
    neither: int  # [-]

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "agreements": self.agreements,
                "agreement_rate": round(self.agreement_rate, 4),
                "agreement_interval_95": [round(v, 4) for v in self.agreement_interval],
                "twin_successes": self.twin_successes, "generated_in_target": self.generated_in_target,
                "confusion": {"both": self.both, "twin_only": self.twin_only, "generated_only": self.generated_only,
                              "neither": self.neither}}

    def lines(self) -> list[str]:
        """The summary in words."""
        low, high = self.agreement_interval
        return [f"episodes: {self.episodes}; twin successes: {self.twin_successes}; generated video shows the object "
                f"in the target: {self.generated_in_target}",
                f"agreement: {self.agreements}/{self.episodes} = {100 * self.agreement_rate:.0f} % (95 % interval "
                f"{100 * low:.0f}-{100 * high:.0f} %, Wilson)",
                f"both {self.both}, twin only {self.twin_only}, video only {self.generated_only}, neither "
                f"{self.neither}"]


def summarise(results: Sequence[JudgeResult]) -> JudgeSummary:
    """Counts, the agreement rate and its Wilson 95 % interval
    (:func:`~rynn_teleop.policies.evaluate.wilson_interval`)."""
    from rynn_teleop.policies.evaluate import wilson_interval

    n = len(results)
    agree = sum(r.agree for r in results)
    twin = [r.twin_success for r in results]
    shown = [r.generated_shows_in_target for r in results]
    pairs = list(zip(twin, shown))
    return JudgeSummary(n, agree, agree / n if n else 0.0, tuple(wilson_interval(agree, n)), sum(twin), sum(shown),
                        sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs),
                        sum(b and not a for a, b in pairs), sum(not a and not b for a, b in pairs))


@dataclass(frozen=True)
class JudgeReport:
    """A judging run's result; :attr:`folder` holds it on disk (see the module doc)."""

    results: tuple[JudgeResult, ...]
    summary: JudgeSummary
    folder: Path
    options: ReplayOptions
    topic: str  # the generated feed's topic
    wall_s: float  # [s]
    complete: bool = True  # every episode judged (False: written while running)

    def to_dict(self) -> dict[str, Any]:
        """``judge.json``."""
        return {"format": JUDGE_FORMAT, "complete": self.complete,
                "settings": {"generated_topic": self.topic, "replay": self.options._asdict(),
                             "strip_offsets_s": list(STRIP_OFFSETS_S),
                             "decision": "generated_shows_in_target = psnr_in_db > psnr_out_db over the target box"},
                "summary": self.summary.to_dict(), "wall_s": round(self.wall_s, 2),
                "episodes": [r.entry() for r in self.results]}


# --------------------------------------------------------------------------------------------- step 5: write

def _panel(image: np.ndarray, scale: int, label: str, boxes: Sequence[tuple[np.ndarray, tuple[int, int, int]]]
           ) -> np.ndarray:
    """``image`` scaled up ``scale`` times (nearest), ``boxes`` (box, RGB colour) outlined, ``label`` above it."""
    import cv2

    h, w = image.shape[:2]
    big = cv2.resize(np.ascontiguousarray(image), (w * scale, h * scale), interpolation=cv2.INTER_NEAREST)
    for box, colour in boxes:
        if box_visible(np.asarray(box)):
            u0, v0, u1, v1 = (int(v) * scale for v in box)
            cv2.rectangle(big, (u0, v0), (u1 - 1, v1 - 1), colour, max(1, scale // 2))
    band = np.full((STRIP_LABEL_PX, big.shape[1], 3), 255, np.uint8)
    cv2.putText(band, label, (3, STRIP_LABEL_PX - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    return np.concatenate([band, big], axis=0)


def _row(panels: Sequence[np.ndarray], width: int) -> np.ndarray:
    """``panels`` side by side, padded with white to ``width`` [px]."""
    row = np.concatenate(list(panels), axis=1)
    if row.shape[1] < width:
        row = np.concatenate([row, np.full((row.shape[0], width - row.shape[1], 3), 255, np.uint8)], axis=1)
    return row


def strip_image(inputs: EpisodeInputs, replay: TwinReplay, hypotheses: Hypotheses, decision: Decision,
                robot: RobotModel | None = None) -> np.ndarray:
    """(H, W, 3) uint8 RGB: the strip (see the module doc, step 5), headed by the verdict."""
    import cv2

    h = inputs.last_frame.shape[0]
    scale = max(1, math.ceil(STRIP_MIN_PANEL_HEIGHT / h))
    target = [(hypotheses.box, TARGET_BOX_COLOUR)]
    top = _row([
        _panel(inputs.last_frame, scale, "generated: last frame", target),
        _panel(hypotheses.twin_final, scale, f"twin replay: {replay.outcome}", target),
        _panel(hypotheses.inside, scale, f"H_in  {decision.psnr_in_db:.2f} dB", target),
        _panel(hypotheses.outside, scale, f"H_out  {decision.psnr_out_db:.2f} dB", target),
    ], 0)
    rows = [top]
    if inputs.strip_frames:
        from rynn_teleop.core.camera import default_intrinsics
        from rynn_teleop.core.camera_view import CameraView
        from rynn_teleop.sim.scene import load_scene

        robot = robot or RobotModel.default()
        width = inputs.last_frame.shape[1]
        view = CameraView.from_robot(robot, default_intrinsics(width, h))
        obj = task_scene_object(load_scene(inputs.scene), inputs.task_object)
        poses = np.asarray(inputs.strip_poses, dtype=float)
        finite = np.isfinite(poses).all(axis=1)
        boxes = np.zeros((len(poses), 4), dtype=np.int32)
        if finite.any():
            boxes[finite] = project_boxes(view, [obj], poses[finite][:, None])[:, 0]
        rows.append(_row([_panel(frame, scale, f"generated, {inputs.event} {offset:+.1f} s",
                                 [(box, OBJECT_BOX_COLOUR)])
                          for frame, offset, box in zip(inputs.strip_frames, STRIP_OFFSETS_S, boxes)], top.shape[1]))
    verdict = (f"{inputs.path.name}: twin {'success' if replay.success else 'no success'} ({replay.reason}); "
               f"video shows {inputs.task_object} in {inputs.target}: {'yes' if decision.shows_in_target else 'no'} "
               f"(margin {decision.psnr_in_db - decision.psnr_out_db:+.2f} dB)")
    head = np.full((STRIP_LABEL_PX + 4, top.shape[1], 3), 255, np.uint8)
    cv2.putText(head, verdict, (3, STRIP_LABEL_PX - 3), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return np.concatenate([head, *rows], axis=0)


def write_strip(path: Path, image: np.ndarray) -> None:
    """``image`` (RGB) as a PNG at ``path`` (its folder created).

    Raises:
        OSError: it cannot be written.
    """
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR)):
        raise OSError(f"cannot write {path}")


def write_report(report: JudgeReport) -> None:
    """``judge.json`` in the report's folder (rewritten after each episode, through a temporary file)."""
    tmp = report.folder / (REPORT_FILE + ".partial")
    tmp.write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
    tmp.replace(report.folder / REPORT_FILE)


# --------------------------------------------------------------------------------------------- the pipeline

def strip_name(index: int, episode: Path) -> str:
    """The strip's path in the report folder: ``strips/NNN-<episode folder name>.png``."""
    return f"{STRIPS_DIR}/{index:03d}-{episode.name}.png"


def judge_episode(inputs: EpisodeInputs, folder: Path, index: int, options: ReplayOptions,
                  robot: RobotModel | None = None) -> JudgeResult:
    """Steps *replay*, *hypotheses*, *decide* and the strip of one read episode (``index``: its place in the run)."""
    start = time.perf_counter()
    robot = robot or RobotModel.default()
    replay = replay_on_twin(inputs.scene, inputs.seed, inputs.track, options, robot)
    hypotheses = render_hypotheses(inputs, replay, robot)
    decision = decide(inputs.last_frame, hypotheses)
    strip = strip_name(index, inputs.path)
    write_strip(folder / strip, strip_image(inputs, replay, hypotheses, decision, robot))
    h, w = inputs.last_frame.shape[:2]
    return JudgeResult(
        episode=str(inputs.path), scene=inputs.scene, seed=inputs.seed, twin_success=replay.success,
        twin_reason=replay.reason, generated_shows_in_target=decision.shows_in_target,
        psnr_in_db=decision.psnr_in_db, psnr_out_db=decision.psnr_out_db, twin_outcome=replay.outcome,
        task_object=inputs.task_object, target=inputs.target, target_box=tuple(int(v) for v in hypotheses.box),
        frame_size=(int(w), int(h)), last_frame_stamp_ns=inputs.last_stamp_ns,
        generated_frames=inputs.generated_frames, arrived=replay.arrived, commands_sent=replay.commands_sent,
        clipped=replay.clipped, sim_time_s=float(replay.sim_time_s),
        final_joints=tuple(float(v) for v in replay.final_joints),
        final_object_poses={name: [round(float(v), 6) for v in pose]
                            for name, pose in zip(replay.object_names, replay.final_poses)},
        event=inputs.event, strip=strip, warnings=inputs.warnings, wall_s=time.perf_counter() - start)


def judge(episodes: Sequence[str | os.PathLike], out: str | os.PathLike, *, options: ReplayOptions | None = None,
          topic: str = GENERATED_TOPIC, progress: Callable[[JudgeResult], None] | None = None) -> JudgeReport:
    """Judge ``episodes`` (see the module doc): every one read first, then each replayed, decided and written into
    the report folder ``out`` (``judge.json`` rewritten after each).

    Raises:
        ConfigurationError: no episode, options out of range, a report folder that holds files
            (:class:`~rynn_teleop.policies.evaluate.EvaluationError`), a scene that is not here.
        RecordingError, EpisodeDataError, NotTwinEpisodeError: an episode that cannot be judged (see
            :func:`read_episode`); nothing is replayed then.
    """
    from rynn_teleop.policies.evaluate import prepare_folder

    if not episodes:
        raise ConfigurationError("judge: no episode given")
    options = (options or ReplayOptions()).check()
    started = time.perf_counter()
    inputs = [read_episode(e, topic) for e in episodes]
    folder = prepare_folder(out)
    robot = RobotModel.default()
    results: list[JudgeResult] = []
    for index, item in enumerate(inputs):
        results.append(judge_episode(item, folder, index, options, robot))
        write_report(JudgeReport(tuple(results), summarise(results), folder, options, topic,
                                 time.perf_counter() - started, complete=False))
        if progress is not None:
            progress(results[-1])
    report = JudgeReport(tuple(results), summarise(results), folder, options, topic, time.perf_counter() - started)
    write_report(report)
    return report


# --------------------------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rynn-teleop world-model judge``."""
    d = ReplayOptions()
    parser.add_argument("episodes", nargs="+", metavar="EPISODE",
                        help="episode folders recorded in the digital mode with the twin (the generated feed, "
                             f"{SCENE_TOPIC}, the commands)")
    parser.add_argument("--out", required=True, help=f"report folder (created; refused when it holds files): "
                        f"{REPORT_FILE}, {STRIPS_DIR}/*.png")
    parser.add_argument("--settle", type=float, default=d.settle_s,
                        help=f"the last commands are held this long on the twin before it judges [s] "
                             f"(default {d.settle_s:g})")
    parser.add_argument("--speed", type=float, default=d.speed,
                        help=f"replay speed factor (default {d.speed:g}: as recorded)")
    parser.add_argument("--topic", default=GENERATED_TOPIC,
                        help=f"the generated feed's topic (default {GENERATED_TOPIC})")


def describe(result: JudgeResult) -> str:
    """One line per judged episode."""
    margin = "n/a" if not math.isfinite(result.margin_db) else f"{result.margin_db:+.2f} dB"
    return (f"{result.episode}: twin {result.twin_outcome} ({result.twin_reason}); video shows "
            f"{result.task_object} in {result.target}: {'yes' if result.generated_shows_in_target else 'no'} "
            f"(margin {margin}); {'agree' if result.agree else 'DISAGREE'}")


def run_cli(args: argparse.Namespace) -> int:
    """Run :func:`judge` from parsed :func:`add_arguments`: a line per episode, the summary, then the JSON's path.
    Exit 0 once judged (whatever the agreement)."""
    options = ReplayOptions(speed=args.speed, settle_s=args.settle).check()
    report = judge(args.episodes, args.out, options=options, topic=args.topic,
                   progress=lambda r: print(describe(r), flush=True))
    print("\n".join(report.summary.lines()))
    print(report.folder / REPORT_FILE)
    return 0


__all__ = [
    "GENERATED_TOPIC",
    "JUDGE_FORMAT",
    "REPORT_FILE",
    "STRIPS_DIR",
    "STRIP_OFFSETS_S",
    "Decision",
    "EpisodeInputs",
    "Hypotheses",
    "JudgeReport",
    "JudgeResult",
    "JudgeSummary",
    "LockstepDrivers",
    "TwinReplay",
    "add_arguments",
    "build_replay_twin",
    "decide",
    "first_interaction",
    "judge",
    "judge_episode",
    "read_episode",
    "render_hypotheses",
    "replay_on_twin",
    "run_cli",
    "run_replay",
    "summarise",
    "write_report",
    "write_strip",
]
