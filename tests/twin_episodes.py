"""Episodes of the physical twin's task built without ROS: the scripted operator's plan (``sim.rollout``) turned
into the commands a teleoperation session records (``/arms/command`` at 100 Hz, ``/hands/command`` one hand per
message), with the twin's scene and seed in ``episode.yaml`` as the recorder writes them; with
:func:`scripted_twin_episode` also the twin's ``/twin/scene``, ``/twin/objects`` and head-camera frames."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
from recording_episodes import MS, T0, TS, _header, _image, _joint_state, _string, frame_rgb

from rynn_teleop.core.layout import SIDES
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, GROUPS
from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder
from rynn_teleop.recording.frames import FEED_TOPICS
from rynn_teleop.sim.rollout import run_scripted_episode

ARM = list(CANONICAL_JOINT_NAMES[:14])
JS = "sensor_msgs/msg/JointState"


def command_messages(targets) -> list[tuple[int, str, str, bytes]]:
    """(receive time [ns], topic, type, CDR) of a rollout's (t [s], q (54,) [rad]) targets as the stack sends them:
    one arm command, then one command per hand, each a few ms after its stamp."""
    msgs = []
    for t, q in targets:
        s = T0 + int(round(t * 1e9))
        msgs.append((s + 1 * MS, "/arms/command", JS, _joint_state(s, ARM, q[:14])))
        for k, side in enumerate(SIDES):
            group = GROUPS.hand(side)
            msgs.append((s + (2 + k) * MS, "/hands/command", JS,
                         _joint_state(s + k * MS, list(CANONICAL_JOINT_NAMES[group]), q[group])))
    return msgs


@functools.cache
def scripted_targets(scene: str, seed: int) -> tuple[tuple[tuple[float, np.ndarray], ...], str]:
    """The scripted plan of ``scene`` at ``seed`` run in pure physics (once per test process): its 54 joint
    targets at every control period (plan time [s], targets [rad]) and its outcome label."""
    targets: list[tuple[float, np.ndarray]] = []

    def on_period(world, t):
        targets.append((t, world.targets().copy()))

    result = run_scripted_episode(scene, seed, on_period=on_period)
    return tuple(targets), result.outcome.label


def scripted_episode(output_dir: Path, scene: str = "pick_place", seed: int = 0,
                     names: list[str] | None = None) -> tuple[Path, str]:
    """Record the scripted plan's joint targets of ``scene`` at ``seed`` as an episode's commands (``names``:
    other arm joint names, to make an episode of another robot); returns its directory and the outcome the plan
    had in pure physics."""
    targets, label = scripted_targets(scene, seed)
    rec = EpisodeRecorder(output_dir, {"/arms/command": 100.0, "/hands/command": 200.0}, flush_period_s=10.0)
    meta = EpisodeMetadata(task="scripted", operator="rollout", extra={"twin": {"scene": scene, "seed": seed}})
    path = rec.start(meta, now_ns=T0)
    arm_names = names or ARM
    for t, q in targets:
        s = T0 + int(round(t * 1e9))
        rec.submit("/arms/command", JS, _joint_state(s, arm_names, q[:14]), s + 1 * MS)
        for k, side in enumerate(SIDES):
            group = GROUPS.hand(side)
            hand = list(CANONICAL_JOINT_NAMES[group])
            rec.submit("/hands/command", JS, _joint_state(s + k * MS, hand, q[group]), s + (2 + k) * MS)
    rec.stop(now_ns=T0 + int(round((targets[-1][0] + 0.01) * 1e9)))
    return path, label


class TwinRun(NamedTuple):
    """One scripted run of the twin, as its node would have published it (:func:`scripted_twin_run`)."""

    targets: tuple[tuple[float, np.ndarray], ...]  # (plan time [s], the 54 joint targets [rad]) per control period
    objects: tuple[tuple[float, np.ndarray], ...]  # (plan time [s], (N, 7) poses: x, y, z [m], quaternion x, y, z, w)
    scene_json: str  # /twin/scene: sim.monitor.scene_description of the world as laid out
    label: str  # the outcome the plan had in pure physics


@functools.cache
def scripted_twin_run(scene: str, seed: int) -> TwinRun:
    """The scripted plan of ``scene`` at ``seed`` run in pure physics (once per test process), with every
    object's pose at each control period (``sim.monitor.object_poses``, what ``/twin/objects`` carries) and the
    scene as ``/twin/scene`` describes it."""
    from rynn_teleop.sim.monitor import object_poses, scene_description

    targets: list[tuple[float, np.ndarray]] = []
    objects: list[tuple[float, np.ndarray]] = []
    scene_doc: list[str] = []

    def on_period(world, t):
        if not scene_doc:
            scene_doc.append(json.dumps(scene_description(world)))
        targets.append((t, world.targets().copy()))
        objects.append((t, np.array([[*p.position, *p.quaternion] for p in object_poses(world)], dtype=float)))

    result = run_scripted_episode(scene, seed, on_period=on_period)
    return TwinRun(tuple(targets), tuple(objects), scene_doc[0], result.outcome.label)


def _pose_array(stamp_ns: int, poses: np.ndarray) -> bytes:
    types = TS.types
    msg = types["geometry_msgs/msg/PoseArray"](header=_header(stamp_ns), poses=[
        types["geometry_msgs/msg/Pose"](position=types["geometry_msgs/msg/Point"](x=p[0], y=p[1], z=p[2]),
                                        orientation=types["geometry_msgs/msg/Quaternion"](x=p[3], y=p[4], z=p[5],
                                                                                         w=p[6]))
        for p in np.asarray(poses, dtype=float)])
    return bytes(TS.serialize_cdr(msg, "geometry_msgs/msg/PoseArray"))


def scripted_twin_episode(output_dir: Path, scene: str = "pick_place", seed: int = 0, fps: float = 10.0,
                          objects_every: int = 2) -> tuple[Path, TwinRun]:
    """Record the scripted run of ``scene`` at ``seed`` as a digital-mode session records it: the commands (as
    :func:`scripted_episode`), ``/twin/scene`` (latched, at the start), ``/twin/objects`` every
    ``objects_every`` control periods (100 Hz / 2 = the twin's 50 Hz order of magnitude), head-camera frames at
    ``fps`` (plain frames of :func:`recording_episodes.frame_rgb`: the frames' content is not what is tested)
    and ``extra.twin`` in ``episode.yaml``. Returns the episode's directory and the run."""
    run = scripted_twin_run(scene, seed)
    camera = FEED_TOPICS["consumer"]
    rec = EpisodeRecorder(output_dir, {"/arms/command": 100.0, "/hands/command": 200.0, camera: fps,
                                       "/twin/objects": None, "/twin/scene": None}, flush_period_s=10.0)
    meta = EpisodeMetadata(task="scripted", operator="rollout", extra={"twin": {"scene": scene, "seed": seed}})
    path = rec.start(meta, now_ns=T0)
    msgs: list[tuple[int, str, str, bytes]] = [(T0 + 1 * MS, "/twin/scene", "std_msgs/msg/String",
                                                _string(run.scene_json))]
    msgs += command_messages(run.targets)
    for k, (t, poses) in enumerate(run.objects):
        if k % objects_every == 0:
            s = T0 + int(round(t * 1e9))
            msgs.append((s + 1 * MS, "/twin/objects", "geometry_msgs/msg/PoseArray", _pose_array(s, poses)))
    end = run.targets[-1][0]
    for n in range(int(end * fps)):
        s = T0 + 25 * MS + int(round(n * 1e9 / fps))
        msgs.append((s + 4 * MS, camera, "sensor_msgs/msg/Image", _image(s, frame_rgb(n))))
    for receive, topic, type_name, data in sorted(msgs, key=lambda m: m[0]):
        rec.submit(topic, type_name, data, receive)
    rec.stop(now_ns=T0 + int(round((end + 0.01) * 1e9)))
    return path, run
