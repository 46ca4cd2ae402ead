"""Recorded episodes built without ROS, for the recording, export and integrity tests.

:func:`build_episode` feeds an :class:`~rynn_teleop.recording.EpisodeRecorder` the serialized messages a
teleoperation session records (commands, joint states, camera frames, the active feed), as a raw
subscription hands them over: a digital episode (generated frames stamped with the newest command's stamp)
or a physical one, optionally with aligned depth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rosbags.typesys import Stores, get_typestore

from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES
from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder
from rynn_teleop.recording.export import DEPTH_TOPICS, FEED_TOPICS

TS = get_typestore(Stores.ROS2_KILTED)
MS = 1_000_000  # [ns]
T0 = 1_700_000_000 * 1_000_000_000  # [ns]
FPS = 30
W, H = 64, 48  # [px]
ARM = list(CANONICAL_JOINT_NAMES[:14])
LEFT_HAND = list(CANONICAL_JOINT_NAMES[14:34])
RIGHT_HAND = list(CANONICAL_JOINT_NAMES[34:54])
RATES = {"/arms/command": 100.0, "/hands/command": 100.0, "/joint_states": 150.0, "/head_camera/color/image_raw": 30.0,
         "/head_camera/active_source": None}
GAP_RATES = {"/joint_states": 100.0, "/hands/command": 50.0}


def _header(stamp_ns: int) -> object:
    Time = TS.types["builtin_interfaces/msg/Time"]
    return TS.types["std_msgs/msg/Header"](stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id="")


def _joint_state(stamp_ns: int, names: list[str], positions: np.ndarray) -> bytes:
    msg = TS.types["sensor_msgs/msg/JointState"](header=_header(stamp_ns), name=names,
                                                  position=np.asarray(positions, float),
                                                  velocity=np.zeros(0), effort=np.zeros(0))
    return bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/JointState"))


def _image(stamp_ns: int, rgb: np.ndarray) -> bytes:
    msg = TS.types["sensor_msgs/msg/Image"](header=_header(stamp_ns), height=rgb.shape[0], width=rgb.shape[1],
                                             encoding="rgb8", is_bigendian=0, step=rgb.shape[1] * 3,
                                             data=np.frombuffer(rgb.tobytes(), np.uint8))
    return bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/Image"))


def _depth_image(stamp_ns: int, depth_mm: np.ndarray) -> bytes:
    msg = TS.types["sensor_msgs/msg/Image"](header=_header(stamp_ns), height=depth_mm.shape[0], width=depth_mm.shape[1],
                                             encoding="16UC1", is_bigendian=0, step=depth_mm.shape[1] * 2,
                                             data=np.frombuffer(depth_mm.astype("<u2").tobytes(), np.uint8))
    return bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/Image"))


def _string(text: str) -> bytes:
    return bytes(TS.serialize_cdr(TS.types["std_msgs/msg/String"](data=text), "std_msgs/msg/String"))


def commanded(t_ns: int) -> np.ndarray:
    """The 54 commanded positions at time t [rad]."""
    t = (t_ns - T0) * 1e-9
    return 0.4 * np.sin(1.3 * t + np.arange(54) * 0.1)


def frame_rgb(n: int) -> np.ndarray:
    """Frame n: a uniform colour that differs clearly from its neighbours'."""
    colour = np.array([(n * 40) % 256, (n * 90 + 60) % 256, (255 - n * 25) % 256], np.uint8)
    return np.broadcast_to(colour, (H, W, 3)).copy()


def frame_depth(n: int) -> np.ndarray:
    """Depth image n [mm]: a slope from 0.4 m over 2 m, 10 mm farther each frame, a patch without reading (0)
    and a patch at 3 m."""
    y, x = np.mgrid[0:H, 0:W]
    depth = 400 + 25 * x + 7 * y + 10 * n
    depth[:4, :6] = 0
    depth[-4:, -6:] = 3000
    return depth.astype(np.uint16)


def build_episode(output_dir: Path, *, digital: bool, seconds: float = 2.0, task: str = "pick the cube",
                  outcome: str = "success", skip_frames: tuple[int, ...] = (), start_ns: int = T0,
                  depth: bool = False, crcs: bool = True) -> Path:
    """Record one episode; returns its directory. Messages arrive a few ms after their stamps, out of order.

    With ``depth`` (physical only) the camera's aligned depth (``frame_depth``) goes with every colour frame,
    same stamp, on the physical and the consumer depth topics. ``crcs``: the writer's CRCs (see the recorder)."""
    topics = dict(RATES)
    feed = FEED_TOPICS["generated"] if digital else FEED_TOPICS["physical"]
    topics[feed] = 30.0
    if depth:
        assert not digital, "the generated feed has no depth"
        topics.update({DEPTH_TOPICS["physical"]: None, DEPTH_TOPICS["consumer"]: None})
    rec = EpisodeRecorder(output_dir, topics, gap_rates=GAP_RATES, flush_period_s=10.0, crcs=crcs)
    path = rec.start(EpisodeMetadata(task=task, operator="test", notes="n", outcome=outcome,
                                     camera_sources=["generated" if digital else "physical"]), now_ns=start_ns)
    stop = start_ns + int(seconds * 1e9)
    msgs: list[tuple[int, str, str, bytes]] = []  # (receive time, topic, type, data)
    js, st = "sensor_msgs/msg/JointState", "sensor_msgs/msg/Image"
    msgs.append((start_ns + 1 * MS, "/head_camera/active_source", "std_msgs/msg/String",
                 _string("generated" if digital else "physical")))
    cmd_stamps: list[int] = []
    for k in range(int(seconds * 100)):
        s = start_ns + k * 10 * MS + 100_000
        msgs.append((s + 3 * MS, "/arms/command", js, _joint_state(s, ARM, commanded(s)[:14])))
        cmd_stamps.append(s)
        hand = LEFT_HAND if k % 2 == 0 else RIGHT_HAND
        hs = s + 5 * MS
        sl = slice(14, 34) if k % 2 == 0 else slice(34, 54)
        msgs.append((hs + 1 * MS, "/hands/command", js, _joint_state(hs, hand, commanded(hs)[sl])))
        cmd_stamps.append(hs)
        ms = s + 2 * MS
        msgs.append((ms + 1 * MS, "/joint_states", js, _joint_state(ms, ARM, commanded(ms - 20 * MS)[:14])))
        if k % 2 == 1:
            msgs.append((ms + 2 * MS, "/joint_states", js,
                         _joint_state(ms, LEFT_HAND + RIGHT_HAND, commanded(ms - 30 * MS)[14:])))
    cmd_stamps.sort()
    n_frames = int(seconds * FPS)
    for n in range(n_frames):
        tick = start_ns + 40 * MS + n * 10**9 // FPS
        if n in skip_frames:
            continue
        if digital:  # the world model stamps a frame with the newest command it used
            stamp = max(c for c in cmd_stamps if c <= tick - 2 * MS)
        else:
            stamp = tick
        data = _image(stamp, frame_rgb(n))
        msgs.append((tick + 4 * MS, feed, st, data))
        msgs.append((tick + 5 * MS, FEED_TOPICS["consumer"], st, data))
        if depth:
            ddata = _depth_image(stamp, frame_depth(n))
            msgs.append((tick + 6 * MS, DEPTH_TOPICS["physical"], st, ddata))
            msgs.append((tick + 7 * MS, DEPTH_TOPICS["consumer"], st, ddata))
    for t, topic, type_name, data in sorted(msgs, key=lambda m: m[0]):
        rec.submit(topic, type_name, data, t)
    rec.stop(now_ns=stop)
    return path
