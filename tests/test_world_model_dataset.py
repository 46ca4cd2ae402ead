"""The world-model dataset from recorded episodes (world_model.training.dataset, recording.frames).

Episodes are recorded here without ROS (EpisodeRecorder fed with serialized messages): head-camera frames (with
or without CameraInfo), arm and hand commands (hands one side per message), and what each frame's action must
be is computed from the written messages, independently of the code under test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.camera import CameraIntrinsics, default_intrinsics
from rynn_teleop.core.camera_view import CameraView
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, RobotModel
from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder
from rynn_teleop.recording.writer import default_typestore
from rynn_teleop.world_model.conditioning import Conditioner, SkeletonStyle
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.generator import as_rgb
from rynn_teleop.world_model.training import objects as ob
from rynn_teleop.world_model.training.clips import ClipDataset, DatasetError, DatasetInfo, read_clip
from rynn_teleop.world_model.training.dataset import (
    DEFAULT_CAMERA_TOPIC,
    NoUsableEpisodeError,
    add_arguments,
    build_dataset,
    clip_bounds,
    condition_frames,
    run_cli,
    split_episodes,
    split_groups,
    split_held_out,
)

TS = default_typestore()
MS = 1_000_000  # [ns]
T0 = 1_700_000_000 * 1_000_000_000  # [ns]
FPS = 30
W, H = 64, 48  # recorded frame size [px]; the tiny preset is 96 x 64
CAMERA = DEFAULT_CAMERA_TOPIC
INFO_TOPIC = "/head_camera/color/camera_info"
K = CameraIntrinsics(W, H, 52.0, 53.5, 31.0, 24.5)  # recorded intrinsics (not the default law's)
ARM = list(CANONICAL_JOINT_NAMES[:14])
LEFT_HAND = list(CANONICAL_JOINT_NAMES[14:34])
RIGHT_HAND = list(CANONICAL_JOINT_NAMES[34:54])
RATES = {"/arms/command": 100.0, "/hands/command": 100.0, CAMERA: 30.0, INFO_TOPIC: None}
GAP_RATES = {"/hands/command": 50.0}
CLIP = 9  # frames per clip in these tests


class Recorded(NamedTuple):
    path: Path
    commands: list[tuple[int, list[str], np.ndarray]]  # (header stamp [ns], joint names, positions [rad])
    frames: dict[int, np.ndarray]  # header stamp [ns] -> the RGB frame written
    objects: list[tuple[int, np.ndarray]] = []  # (header stamp [ns], (N, 7) poses) of every /twin/objects written


# the twin's scene of these tests: a cube that is pushed and lifted, and a fixed platform
TWIN_OBJECTS = [{"name": "cube", "shape": "box", "size": [0.06, 0.06, 0.06], "color": [1, 0, 0, 1], "fixed": False},
                {"name": "platform", "shape": "cylinder", "size": [0.08, 0.04], "fixed": True}]
PUSH_S, LIFT_S = 0.4, 0.6  # [s] after the start: the cube starts moving along +y at 0.1 m/s, then rises at 0.05 m/s
OBJECTS_HZ = 50.0


def twin_scene(layout: int) -> str:
    """/twin/scene of layout ``layout`` (sim.monitor.scene_description's fields that matter here)."""
    return json.dumps({"scene": "test_scene", "seed": layout, "task": "push", "objects": TWIN_OBJECTS})


def twin_poses(t_ns: int, layout: int) -> np.ndarray:
    """(2, 7) the objects' poses at t (x, y, z [m], quaternion x, y, z, w in base_link): the cube starts where the
    layout puts it, in view of the head camera."""
    t = (t_ns - T0) * 1e-9
    cube = [0.45, -0.12 + 0.03 * layout + 0.1 * max(0.0, t - PUSH_S), 0.72 + 0.05 * max(0.0, t - LIFT_S), 0, 0, 0, 1]
    return np.array([cube, [0.55, 0.15, 0.70, 0, 0, 0, 1]], dtype=float)


# -- building episodes -------------------------------------------------------------------------


def _header(stamp_ns: int) -> object:
    time = TS.types["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
    return TS.types["std_msgs/msg/Header"](stamp=time, frame_id="camera_color_optical_frame")


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


def _camera_info(stamp_ns: int, k: CameraIntrinsics) -> bytes:
    msg = TS.types["sensor_msgs/msg/CameraInfo"](
        header=_header(stamp_ns), height=k.height, width=k.width, distortion_model=k.distortion_model,
        d=np.array(k.coeffs, float), k=k.K().ravel(), r=np.eye(3).ravel(), p=k.P().ravel(), binning_x=0,
        binning_y=0,
        roi=TS.types["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0, width=0, do_rectify=False))
    return bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/CameraInfo"))


def _home() -> np.ndarray:
    """Arms at DEFAULT_HOME, shoulders raised 0.3 rad (hands in the head camera's view), fingers at 60 % [rad]."""
    robot = RobotModel.default()
    q = robot.neutral()
    q[:14] = DEFAULT_HOME
    q[0] -= 0.3
    q[7] += 0.3
    q[14:] = robot.limits.lower[14:] + 0.6 * (robot.limits.upper[14:] - robot.limits.lower[14:])
    return q


HOME = _home()


def commanded(t_ns: int, seed: int) -> np.ndarray:
    """The 54 commanded positions at time t [rad]: around HOME, every joint moving."""
    t = (t_ns - T0) * 1e-9
    return HOME + 0.15 * np.sin(1.7 * t + np.arange(54) * 0.1 + seed)


def frame_rgb(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(1000 * seed + n).integers(0, 256, (H, W, 3), dtype=np.uint8)


def record(root: Path, *, seconds: float = 1.0, seed: int = 0, digital: bool = False, camera: bool = True,
           commands: bool = True, camera_info: CameraIntrinsics | None = K, skip_frames: tuple[int, ...] = (),
           first_frame_ms: float = 2.0, active_source: str | None = None,
           metadata: EpisodeMetadata | None = None, twin: int | None = None, objects_from_ms: float = 0.0,
           twin_reset_s: float | None = None) -> Recorded:
    """Record one episode. Arm commands at 100 Hz, hand commands at 100 Hz alternating left and right, camera
    frames at 30 Hz from ``first_frame_ms`` after the start (the first ones may come before every joint was
    commanded). ``digital``: each frame is stamped with the newest command's stamp (as the world model does).
    ``twin``: a twin episode of that layout: ``/twin/scene`` at the start (and of layout ``twin + 1`` at
    ``twin_reset_s``), ``/twin/objects`` (:func:`twin_poses`) at 50 Hz from ``objects_from_ms``, ``extra.twin`` in
    episode.yaml."""
    rates = {t: r for t, r in RATES.items() if t != INFO_TOPIC or camera_info is not None}
    if twin is not None:
        rates.update({ob.OBJECTS_TOPIC: None, ob.SCENE_TOPIC: None})
        metadata = metadata or EpisodeMetadata(task="t", operator="test",
                                               extra={"twin": {"scene": "test_scene", "seed": twin, "task": "push"}})
    rec = EpisodeRecorder(root, rates if camera and commands else {}, gap_rates=GAP_RATES, flush_period_s=10.0)
    path = rec.start(metadata or EpisodeMetadata(task="t", operator="test"), now_ns=T0)
    msgs: list[tuple[int, str, str, bytes]] = []  # (receive time, topic, type, data)
    if active_source is not None:
        msgs.append((T0 + 1 * MS, "/head_camera/active_source", "std_msgs/msg/String", _string(active_source)))
    js = "sensor_msgs/msg/JointState"
    written: list[tuple[int, list[str], np.ndarray]] = []
    for k in range(int(seconds * 100)):
        s = T0 + k * 10 * MS + 100_000
        hs = s + 5 * MS
        hand, part = (LEFT_HAND, slice(14, 34)) if k % 2 == 0 else (RIGHT_HAND, slice(34, 54))
        for stamp, names, q in ((s, ARM, commanded(s, seed)[:14]), (hs, hand, commanded(hs, seed)[part])):
            written.append((stamp, names, q))
            if commands:
                msgs.append((stamp + 3 * MS, "/arms/command" if names is ARM else "/hands/command", js,
                             _joint_state(stamp, names, q)))
        if not commands:  # something else on the bag
            msgs.append((s + 2 * MS, "/joint_states", js, _joint_state(s, ARM, commanded(s, seed)[:14])))
    stamps = sorted(c[0] for c in written)
    frames: dict[int, np.ndarray] = {}
    for n in range(int(seconds * FPS)):
        tick = T0 + int(first_frame_ms * MS) + n * 10**9 // FPS
        if n in skip_frames or not camera:
            continue
        stamp = max((c for c in stamps if c <= tick - 2 * MS), default=None) if digital else tick
        if stamp is None:  # the world model generates nothing before a command
            continue
        frames[stamp] = frame_rgb(n, seed)
        msgs.append((tick + 4 * MS, CAMERA, "sensor_msgs/msg/Image", _image(stamp, frames[stamp])))
        if camera_info is not None:
            msgs.append((tick + 4 * MS, INFO_TOPIC, "sensor_msgs/msg/CameraInfo", _camera_info(stamp, camera_info)))
    objects: list[tuple[int, np.ndarray]] = []
    if twin is not None:
        string = "std_msgs/msg/String"
        msgs.append((T0 + 1 * MS, ob.SCENE_TOPIC, string, _string(twin_scene(twin))))
        if twin_reset_s is not None:
            msgs.append((T0 + int(twin_reset_s * 1e9), ob.SCENE_TOPIC, string, _string(twin_scene(twin + 1))))
        for k in range(int((seconds - objects_from_ms * 1e-3) * OBJECTS_HZ)):
            stamp = T0 + int(objects_from_ms * MS) + int(k * 1e9 / OBJECTS_HZ)
            objects.append((stamp, twin_poses(stamp, twin)))
            msgs.append((stamp + 2 * MS, ob.OBJECTS_TOPIC, "geometry_msgs/msg/PoseArray",
                         _pose_array(stamp, objects[-1][1])))
    for t, topic, type_name, data in sorted(msgs, key=lambda m: m[0]):
        rec.submit(topic, type_name, data, t)
    rec.stop(now_ns=T0 + int(seconds * 1e9))
    return Recorded(path, written if commands else [], frames, objects)


def _string(text: str) -> bytes:
    return bytes(TS.serialize_cdr(TS.types["std_msgs/msg/String"](data=text), "std_msgs/msg/String"))


def _pose_array(stamp_ns: int, poses: np.ndarray) -> bytes:
    types = TS.types
    msg = types["geometry_msgs/msg/PoseArray"](header=_header(stamp_ns), poses=[
        types["geometry_msgs/msg/Pose"](position=types["geometry_msgs/msg/Point"](x=p[0], y=p[1], z=p[2]),
                                        orientation=types["geometry_msgs/msg/Quaternion"](x=p[3], y=p[4], z=p[5],
                                                                                         w=p[6]))
        for p in poses])
    return bytes(TS.serialize_cdr(msg, "geometry_msgs/msg/PoseArray"))


def newest_poses(objects: list[tuple[int, np.ndarray]], t_ns: int) -> np.ndarray | None:
    """The poses of the newest /twin/objects stamped at or before t (None before the first)."""
    before = [poses for stamp, poses in objects if stamp <= t_ns]
    return before[-1] if before else None


def in_force(commands: list[tuple[int, list[str], np.ndarray]], t_ns: int) -> np.ndarray:
    """The 54-D command in force at t: per joint, the value of the newest message stamped at or before t."""
    q = np.full(54, np.nan)
    newest = np.full(54, -1)
    for stamp, names, positions in commands:
        for name, value in zip(names, positions):
            j = CANONICAL_JOINT_NAMES.index(name)
            if newest[j] <= stamp <= t_ns:
                q[j], newest[j] = value, stamp
    return q


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> dict[str, Recorded]:
    root = tmp_path_factory.mktemp("episodes")
    return {
        "physical": record(root / "a", seed=0),
        "digital": record(root / "b", seed=1, digital=True),
        **{f"more{i}": record(root / f"m{i}", seconds=0.5, seed=2 + i) for i in range(3)},
    }


@pytest.fixture(scope="module")
def dataset(episodes, tmp_path_factory) -> tuple[Path, DatasetInfo]:
    out = tmp_path_factory.mktemp("datasets") / "ds"
    info = build_dataset([e.path for e in episodes.values()], out, clip_frames=CLIP, val_fraction=0.4, seed=3,
                         echo=None)
    return out, info


def _clips(out: Path, info: DatasetInfo, episode: dict) -> list:
    return [read_clip(out / f) for f in episode["clips"]]


# -- the contract ------------------------------------------------------------------------------


def test_every_clip_frame_has_the_command_in_force_at_its_stamp(dataset, episodes):
    out, info = dataset
    by_path = {str(e.path): e for e in episodes.values()}
    checked = 0
    for entry in info.episodes:
        rec = by_path[entry["path"]]
        for clip in _clips(out, info, entry):
            for stamp, action, frame in zip(clip.stamps_ns, clip.actions, clip.frames):
                expected = in_force(rec.commands, int(stamp))
                assert not np.isnan(expected).any()
                np.testing.assert_array_equal(action, expected.astype(np.float32))
                np.testing.assert_array_equal(frame, as_rgb(rec.frames[int(stamp)], TINY.width, TINY.height))
                checked += 1
    assert checked > 0
    assert info.joint_names == list(CANONICAL_JOINT_NAMES)


def test_frames_are_in_stamp_order_and_early_frames_are_dropped_and_counted(dataset, episodes):
    out, info = dataset
    entry = next(e for e in info.episodes if e["path"] == str(episodes["physical"].path))
    rec = episodes["physical"]
    complete = [s for s in sorted(rec.frames) if not np.isnan(in_force(rec.commands, s)).any()]
    assert entry["dropped_leading_frames"] == len(rec.frames) - len(complete) == 1  # right hand comes at +15 ms
    assert entry["frames"] == len(complete)
    stamps = [int(s) for c in _clips(out, info, entry) for s in c.stamps_ns]
    assert stamps[0] == complete[0] and stamps == sorted(stamps)
    used = sorted(set(stamps))
    assert used == complete[: len(used)] and len(complete) - len(used) == entry["unused_frames"]


def test_a_digital_frame_stamped_with_a_command_takes_that_command(dataset, episodes):
    out, info = dataset
    rec = episodes["digital"]
    command_stamps = {c[0] for c in rec.commands}
    entry = next(e for e in info.episodes if e["path"] == str(rec.path))
    exact = 0
    for clip in _clips(out, info, entry):
        for stamp, action in zip(clip.stamps_ns, clip.actions):
            if int(stamp) in command_stamps:
                newest = next(c for c in rec.commands if c[0] == int(stamp))
                idx = [CANONICAL_JOINT_NAMES.index(n) for n in newest[1]]
                np.testing.assert_array_equal(action[idx], newest[2].astype(np.float32))
                exact += 1
    assert exact > 0


def test_conditions_are_the_nodes_drawing_at_the_recorded_intrinsics_resized(dataset):
    out, info = dataset
    conditioner = Conditioner(RobotModel.default(), K, SkeletonStyle())
    clip = read_clip(out / info.clip_files("train")[0])
    for action, condition in zip(clip.actions, clip.conditions):
        expected = as_rgb(conditioner.condition_image(action.astype(float)), TINY.width, TINY.height)
        np.testing.assert_array_equal(condition, expected)
    assert clip.conditions.any(), "the robot is in view: the skeleton is drawn"
    np.testing.assert_array_equal(condition_frames(conditioner, clip.actions, TINY.width, TINY.height),
                                  clip.conditions)
    assert info.condition["intrinsics"] == {**K._asdict(), "coeffs": list(K.coeffs)}
    assert info.condition["style"]["colormap"] == "plasma" and info.condition["style"]["near"] == SkeletonStyle().near
    assert all(e["intrinsics_source"] == INFO_TOPIC for e in info.episodes)


def test_the_style_is_the_world_model_nodes_default():
    pytest.importorskip("rclpy")
    from rynn_teleop.nodes.world_model import WorldModelNode

    defaults = WorldModelNode.SCHEMA.defaults()
    style = SkeletonStyle()
    assert (defaults["condition.colormap"], defaults["condition.near_m"], defaults["condition.far_m"],
            defaults["condition.radius_px"], defaults["condition.reference_m"]) == (
        style.colormap, style.near, style.far, style.radius, style.reference_depth)


def test_clips_are_1_plus_4k_frames_and_consecutive_clips_share_their_boundary_frame(dataset):
    out, info = dataset
    for entry in info.episodes:
        clips = _clips(out, info, entry)
        assert clips and all(c.length >= 5 and (c.length - 1) % 4 == 0 for c in clips)
        assert all(c.length == CLIP for c in clips[:-1])
        for a, b in zip(clips, clips[1:]):
            assert b.start == a.start + a.length - 1 and b.stamps_ns[0] == a.stamps_ns[-1]
        assert all(c.episode == entry["name"] for c in clips)
    assert info.clip_frames == CLIP and info.width == TINY.width and info.height == TINY.height
    assert info.fps == pytest.approx(FPS, rel=0.01)


@given(frames=st.integers(0, 400), k=st.integers(1, 30))
def test_clip_bounds_cover_the_frames_with_whole_clips(frames, k):
    clip_frames = 1 + 4 * k
    bounds = clip_bounds(frames, clip_frames)
    if frames < 5:
        assert bounds == []
        return
    assert bounds[0][0] == 0
    for (s0, n0), (s1, _) in zip(bounds, bounds[1:]):
        assert s1 == s0 + n0 - 1 and n0 == clip_frames
    start, length = bounds[-1]
    assert 5 <= length <= clip_frames and (length - 1) % 4 == 0
    assert 0 <= frames - (start + length) <= 3  # fewer than a latent frame of 4 is left over


def test_the_split_is_by_episode_disjoint_and_seeded(dataset, episodes):
    out, info = dataset
    splits = {e["path"]: e["split"] for e in info.episodes}
    assert len(splits) == len(episodes) == 5
    assert sorted(splits.values()).count("val") == 2  # round(0.4 * 5)
    train, val = set(info.clip_files("train")), set(info.clip_files("val"))
    assert train and val and not train & val
    for e in info.episodes:
        assert all(c.startswith(f"clips/{e['split']}/") for c in e["clips"])
        assert {read_clip(out / c).episode for c in e["clips"]} == {e["name"]}
    on_disk = {str(p.relative_to(out)) for p in (out / "clips").rglob("*.safetensors")}
    assert on_disk == train | val
    assert len(ClipDataset(out, "train")) == len(train) and len(ClipDataset(out, "val")) == len(val)
    assert split_episodes(5, 0.4, 3) == [splits[str(e.path)] for e in episodes.values()]
    assert split_episodes(5, 0.4, 3) == split_episodes(5, 0.4, 3)
    assert len({tuple(split_episodes(5, 0.4, s)) for s in range(20)}) > 1
    assert split_episodes(10, 0.05, 0).count("val") == 1  # at least one
    assert split_episodes(2, 0.99, 0).count("train") == 1  # never all


def test_one_episode_is_all_train_with_a_warning(episodes, tmp_path):
    lines: list[str] = []
    info = build_dataset([episodes["physical"].path], tmp_path / "ds", clip_frames=CLIP, echo=lines.append)
    assert [e["split"] for e in info.episodes] == ["train"] and not info.clip_files("val")
    assert any("warning" in line and "only one usable episode" in line for line in lines)


def test_repeated_episodes_are_read_once(episodes, tmp_path):
    path = episodes["physical"].path
    info = build_dataset([path, path.parent], tmp_path / "ds", clip_frames=CLIP, echo=None)
    assert [e["path"] for e in info.episodes] == [str(path)]


def test_generated_frames_on_the_camera_topic_and_another_robot_are_warned_about(tmp_path):
    path = record(tmp_path / "g", seconds=0.5, active_source="generated",
                  metadata=EpisodeMetadata(task="t", robot_description_hash="sha256:another")).path
    lines: list[str] = []
    info = build_dataset([path], tmp_path / "ds", clip_frames=CLIP, echo=lines.append)
    assert info.episodes[0]["camera_sources"] == ["generated"]
    warnings = info.episodes[0]["warnings"]
    assert any("generated feed" in w for w in warnings) and any("robot description" in w for w in warnings)
    assert sum(line.startswith("warning:") for line in lines) >= 2


# -- bad input ---------------------------------------------------------------------------------


def test_episodes_without_camera_frames_or_commands_are_skipped_with_their_reason(episodes, tmp_path):
    no_camera = record(tmp_path / "nc", seconds=0.5, camera=False).path
    no_commands = record(tmp_path / "ncmd", seconds=0.5, commands=False).path
    lines: list[str] = []
    info = build_dataset([no_camera, episodes["physical"].path, no_commands], tmp_path / "ds", clip_frames=CLIP,
                         echo=lines.append)
    assert [e["path"] for e in info.episodes] == [str(episodes["physical"].path)]
    reasons = {s["path"]: s["reason"] for s in info.skipped}
    assert "no camera frames" in reasons[str(no_camera)] and CAMERA in reasons[str(no_camera)]
    assert "no commands" in reasons[str(no_commands)] and "/arms/command" in reasons[str(no_commands)]
    assert any(str(no_camera) in line and "skipped" in line for line in lines)
    assert DatasetInfo.read(tmp_path / "ds").skipped == info.skipped

    with pytest.raises(DatasetError) as err:
        build_dataset([no_camera, no_commands], tmp_path / "none", clip_frames=CLIP, echo=None)
    assert str(no_camera) in str(err.value) and str(no_commands) in str(err.value)
    assert "no camera frames" in str(err.value) and "no commands" in str(err.value)
    assert not (tmp_path / "none").exists() and not list(tmp_path.glob(".none*"))


def test_an_episode_failing_its_check_is_skipped_unless_problems_are_included(episodes, tmp_path):
    gap = record(tmp_path / "gap", seconds=1.0, skip_frames=tuple(range(8, 16))).path
    info = build_dataset([gap, episodes["physical"].path], tmp_path / "ds", clip_frames=CLIP, echo=None)
    assert [s["path"] for s in info.skipped] == [str(gap)]
    assert "episodes check" in info.skipped[0]["reason"] and any("gap" in p for p in info.skipped[0]["problems"])
    info = build_dataset([gap], tmp_path / "ds2", clip_frames=CLIP, include_problems=True, echo=None)
    assert not info.skipped and info.episodes[0]["problems"]


def test_without_camera_info_the_default_intrinsics_are_used_and_other_cameras_are_not_mixed(episodes, tmp_path):
    plain = record(tmp_path / "plain", seconds=0.5, camera_info=None).path
    info = build_dataset([plain, episodes["physical"].path], tmp_path / "ds", clip_frames=CLIP, echo=None)
    assert info.condition["intrinsics"]["fx"] == default_intrinsics(W, H).fx
    assert info.episodes[0]["intrinsics_source"].startswith("default_intrinsics")
    assert [s["path"] for s in info.skipped] == [str(episodes["physical"].path)]
    assert "intrinsics" in info.skipped[0]["reason"]
    conditioner = Conditioner(RobotModel.default(), default_intrinsics(W, H))
    clip = read_clip(tmp_path / "ds" / info.clip_files("train")[0])
    np.testing.assert_array_equal(clip.conditions, condition_frames(conditioner, clip.actions, TINY.width,
                                                                    TINY.height))


def test_bad_arguments_are_named(episodes, tmp_path):
    path = episodes["physical"].path
    for clip_frames in (8, 1, 0, 82):
        with pytest.raises(DatasetError, match=f"clip_frames {clip_frames}"):
            build_dataset([path], tmp_path / "ds", clip_frames=clip_frames, echo=None)
    with pytest.raises(DatasetError, match="val_fraction 1.0"):
        build_dataset([path], tmp_path / "ds", val_fraction=1.0, echo=None)
    with pytest.raises(DatasetError, match="neither an episode"):
        build_dataset([tmp_path], tmp_path / "ds", echo=None)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not an empty folder"):
        build_dataset([path], tmp_path / "full", clip_frames=CLIP, echo=None)
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    build_dataset([path], tmp_path / "empty", clip_frames=CLIP, echo=None)  # an empty folder is fine
    assert DatasetInfo.read(tmp_path / "empty").episodes


# -- the twin's objects -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twin_episodes(tmp_path_factory) -> dict[str, Recorded]:
    root = tmp_path_factory.mktemp("twin")
    layouts = {"a0": 0, "b0": 0, "c1": 1, "d2": 2, "e1": 1}
    return {key: record(root / key, seconds=1.0, seed=10 + k, twin=layout)
            for k, (key, layout) in enumerate(layouts.items())}


@pytest.fixture(scope="module")
def twin_dataset(twin_episodes, tmp_path_factory) -> tuple[Path, DatasetInfo]:
    out = tmp_path_factory.mktemp("twin_datasets") / "ds"
    info = build_dataset([e.path for e in twin_episodes.values()], out, clip_frames=CLIP, val_fraction=0.34, seed=0,
                         objects=True, echo=None)
    return out, info


def test_twin_clips_carry_the_objects_at_each_frame(twin_dataset, twin_episodes):
    out, info = twin_dataset
    by_path = {str(e.path): e for e in twin_episodes.values()}
    view = CameraView.from_robot(RobotModel.default(), K.scaled(TINY.width, TINY.height))
    objects = ob.objects_from_docs(TWIN_OBJECTS)
    checked = 0
    for entry in info.episodes:
        rec = by_path[entry["path"]]
        episode_poses = []
        for f in entry["clips"]:
            clip, carried = read_clip(out / f), ob.read_clip_objects(out / f)
            assert carried.objects == objects and carried.layout == entry["layout"]
            for t, stamp in enumerate(clip.stamps_ns):
                expected = newest_poses(rec.objects, int(stamp))
                np.testing.assert_array_equal(carried.poses[t], expected)
                np.testing.assert_array_equal(carried.boxes[t], ob.project_boxes(view, objects, expected[None])[0])
                if not episode_poses or t > 0:
                    episode_poses.append(expected)
                checked += 1
        # the cube's first move: the first frame more than 5 mm from where it was at the first frame
        shift = np.linalg.norm(np.stack(episode_poses)[:, 0, :3] - episode_poses[0][0, :3], axis=1)
        first = int(np.argmax(shift > 0.005))
        assert entry["objects"]["first_move"] == [first, -1] and first > 0
        lifted = np.stack(episode_poses)[:, 0, 2] - episode_poses[0][0, 2] > 0.01
        for f in entry["clips"]:
            clip, carried = read_clip(out / f), ob.read_clip_objects(out / f)
            frames = clip.start + np.arange(clip.length)
            assert carried.moved[:, 0].tolist() == (frames >= first).tolist()
            assert carried.lifted[:, 0].tolist() == lifted[frames].tolist()
            assert not carried.moved[:, 1].any()  # the platform is fixed
            assert ob.box_visible(carried.boxes[:, 0]).all()  # the cube is in the head camera's view
    assert checked > 0


def test_the_layout_split_holds_out_whole_layouts(twin_dataset):
    out, info = twin_dataset
    splits: dict[str, set[str]] = {}
    for e in info.episodes:
        assert e["split_group"] == e["layout"] == f"test_scene/seed={e['objects']['seed']}"
        splits.setdefault(e["layout"], set()).add(e["split"])
    assert all(len(s) == 1 for s in splits.values())  # a layout is in train or in val, never both
    assert sorted(s.pop() for s in splits.values()).count("val") == 1  # round(0.34 * 3 layouts)
    doc = json.loads((out / ob.OBJECTS_FILE).read_text())
    assert doc["split_by"] == "layout" and not set(doc["layouts"]["train"]) & set(doc["layouts"]["val"])
    assert doc["camera"]["intrinsics"]["width"] == TINY.width


@given(groups=st.lists(st.integers(0, 6), min_size=1, max_size=30), fraction=st.floats(0.0, 0.9),
       seed=st.integers(0, 100))
def test_split_groups_keep_every_group_on_one_side(groups, fraction, seed):
    keys = [f"layout{g}" for g in groups]
    splits = split_groups(keys, fraction, seed)
    assert all(len({s for k2, s in zip(keys, splits) if k2 == k}) == 1 for k in keys)
    distinct = list(dict.fromkeys(keys))
    per_key = dict(zip(keys, splits))
    assert [per_key[k] for k in distinct] == split_episodes(len(distinct), fraction, seed)
    assert split_groups([str(i) for i in range(7)], 0.3, seed) == split_episodes(7, 0.3, seed)


def test_objects_refuse_an_episode_without_twin_objects_with_the_reason(episodes, twin_episodes, tmp_path):
    plain, twin = episodes["physical"].path, twin_episodes["a0"].path
    lines: list[str] = []
    info = build_dataset([plain, twin], tmp_path / "ds", clip_frames=CLIP, objects=True, echo=lines.append)
    assert [e["path"] for e in info.episodes] == [str(twin)]
    assert info.skipped[0]["path"] == str(plain)
    assert info.skipped[0]["reason"] == "no /twin/objects recorded: not a twin episode"
    assert f"{plain}: skipped: no /twin/objects recorded: not a twin episode" in lines
    with pytest.raises(NoUsableEpisodeError, match=f"{plain}: no /twin/objects recorded: not a twin episode"):
        build_dataset([plain], tmp_path / "none", clip_frames=CLIP, objects=True, echo=None)
    # without objects the twin episode is an ordinary one: no object tensors, no objects.json, split by episode
    info = build_dataset([plain, twin], tmp_path / "plain", clip_frames=CLIP, val_fraction=0.5, echo=None)
    assert all(ob.read_clip_objects(tmp_path / "plain" / f) is None for e in info.episodes for f in e["clips"])
    assert not (tmp_path / "plain" / ob.OBJECTS_FILE).exists()
    assert [e["split_group"] for e in info.episodes] == [str(plain), str(twin)]
    assert [e["layout"] for e in info.episodes] == [None, "test_scene/seed=0"]


def test_frames_before_the_first_object_pose_are_left_out_and_a_changed_layout_is_refused(tmp_path):
    late = record(tmp_path / "late", seconds=1.0, twin=3, objects_from_ms=200.0)
    reset = record(tmp_path / "reset", seconds=1.0, twin=3, twin_reset_s=0.5)
    info = build_dataset([late.path, reset.path], tmp_path / "ds", clip_frames=CLIP, objects=True, echo=None)
    entry = info.episodes[0]
    first_pose = late.objects[0][0]
    early = sum(1 for s in late.frames if s < first_pose)
    assert entry["objects"]["dropped_before_poses"] == early - 1  # one of them was already left out (commands)
    assert entry["dropped_leading_frames"] == early
    first = read_clip(tmp_path / "ds" / entry["clips"][0])
    assert first.stamps_ns[0] == min(s for s in late.frames if s >= first_pose)
    assert info.skipped[0]["path"] == str(reset.path)
    assert "layout changed during the episode" in info.skipped[0]["reason"]
    assert "test_scene/seed=3" in info.skipped[0]["reason"] and "test_scene/seed=4" in info.skipped[0]["reason"]


def test_held_out_layouts_are_exactly_the_ones_named(twin_episodes, tmp_path):
    paths = [e.path for e in twin_episodes.values()]
    info = build_dataset(paths, tmp_path / "ds", clip_frames=CLIP, objects=True, echo=None,
                         held_out=["test_scene/seed=1"])
    assert {e["layout"]: e["split"] for e in info.episodes} == {
        "test_scene/seed=0": "train", "test_scene/seed=1": "val", "test_scene/seed=2": "train"}
    assert sum(e["split"] == "val" for e in info.episodes) == 2  # both episodes of layout 1
    info = build_dataset(paths, tmp_path / "two", clip_frames=CLIP, objects=True, echo=None,
                         held_out=["test_scene/seed=2", "test_scene/seed=0"])
    assert [e["path"] for e in info.episodes if e["split"] == "train"] == [str(twin_episodes[k].path)
                                                                          for k in ("c1", "e1")]
    with pytest.raises(DatasetError, match=r"held out test_scene/seed=7: no usable episode has it .*seed=0"):
        build_dataset(paths, tmp_path / "missing", clip_frames=CLIP, objects=True, echo=None,
                      held_out=["test_scene/seed=7"])
    with pytest.raises(DatasetError, match="every group"):
        build_dataset(paths, tmp_path / "all", clip_frames=CLIP, objects=True, echo=None,
                      held_out=[f"test_scene/seed={k}" for k in range(3)])
    with pytest.raises(DatasetError, match="a list of keys"):
        build_dataset(paths, tmp_path / "str", clip_frames=CLIP, objects=True, echo=None,
                      held_out="test_scene/seed=1")
    assert not any((tmp_path / name).exists() for name in ("missing", "all", "str"))


def test_held_out_episodes_are_matched_however_the_path_is_spelled(episodes, tmp_path, monkeypatch):
    a, b = episodes["physical"].path, episodes["digital"].path
    monkeypatch.chdir(b.parent)
    info = build_dataset([a, b], tmp_path / "ds", clip_frames=CLIP, echo=None, held_out=[f"./{b.name}"])
    assert [e["split"] for e in info.episodes] == ["train", "val"]
    assert split_held_out(["x", "y", "x", "z"], ["x"]) == ["val", "train", "val", "train"]


def test_split_by_is_checked(episodes, tmp_path):
    with pytest.raises(DatasetError, match="split_by 'scene'"):
        build_dataset([episodes["physical"].path], tmp_path / "ds", split_by="scene", echo=None)


# -- latents and the command line --------------------------------------------------------------


def test_latents_are_the_vaes_normalised_latents_of_frames_and_conditions(episodes, tmp_path):
    torch = pytest.importorskip("torch")
    from rynn_teleop.world_model.diffusion.model import save_model, untrained_model
    from rynn_teleop.world_model.diffusion.vae import StreamingVAE, rgb_to_pixels
    from rynn_teleop.world_model.diffusion.weights import load_base

    base = tmp_path / "base"
    save_model(untrained_model(TINY, 0), base, tmp_path / "weights", tmp_path / "prompt.safetensors")
    short = record(tmp_path / "short", seconds=0.35, seed=7).path
    info = build_dataset([short], tmp_path / "ds", clip_frames=5, latents=(base, "cpu"), echo=None)
    assert info.has_latents
    vae = StreamingVAE(load_base(base, TINY).vae)
    clips = [read_clip(tmp_path / "ds" / f) for f in info.clip_files("train")]
    assert clips
    for clip in clips:
        t = 1 + (clip.length - 1) // 4
        assert clip.latents.shape == clip.condition_latents.shape == (48, t, TINY.height // 16, TINY.width // 16)
        stream = vae.new_stream()  # the engine's way: the anchor alone, then blocks of 4 frames
        streamed = torch.cat([vae.encode(rgb_to_pixels(clip.frames[:1]), stream),
                              vae.encode(rgb_to_pixels(clip.frames[1:]), stream)], dim=2)[0].numpy()
        np.testing.assert_allclose(clip.latents, streamed, atol=1e-4)
        np.testing.assert_allclose(clip.condition_latents, vae.encode(rgb_to_pixels(clip.conditions))[0].numpy(),
                                   atol=1e-4)


def test_the_command_line_builds_a_dataset_from_a_folder_of_episodes(episodes, tmp_path, capsys):
    root = episodes["more0"].path.parent  # a recorder's output folder
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([str(root), str(episodes["physical"].path), "--out", str(tmp_path / "ds"),
                              "--clip-frames", "5", "--val-fraction", "0.5", "--seed", "1"])
    assert run_cli(args) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "1 train" in printed and "1 val" in printed
    doc = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert doc["clip_frames"] == 5 and doc["seed"] == 1 and doc["preset"] == "tiny" and not doc["has_latents"]
    assert {e["path"] for e in doc["episodes"]} == {str(episodes["more0"].path), str(episodes["physical"].path)}
    with pytest.raises(SystemExit):
        parser.parse_args([str(root), "--out", str(tmp_path / "x"), "--preset", "huge"])
    args = parser.parse_args([str(root), "--out", str(tmp_path / "y"), "--objects", "--split-by", "episode"])
    assert args.objects and args.split_by == "episode"
    assert parser.parse_args([str(root), "--out", str(tmp_path / "y")]).split_by is None
    args = parser.parse_args([str(root), "--out", str(tmp_path / "z"), "--held-out", "p/seed=1", "--held-out",
                              "p/seed=2"])
    assert args.held_out == ["p/seed=1", "p/seed=2"]
    assert parser.parse_args([str(root), "--out", str(tmp_path / "z")]).held_out is None
