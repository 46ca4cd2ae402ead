"""Episodes exported as LeRobot datasets (recording.export, recording.lerobot), checked against the bags.

The episodes are built here without ROS (EpisodeRecorder fed with serialized messages): a digital one
(generated frames stamped with the newest command's stamp) and a physical one. The dataset is then
read back three ways: pyarrow/PyAV (rows, video frame counts, metadata), the CLI, and LeRobot's own
``LeRobotDataset`` in the separate environment of ``scripts/lerobot_env.sh`` (the real client).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import recording_episodes
from hypothesis import given, settings
from hypothesis import strategies as st
from recording_episodes import (
    FPS,
    MS,
    T0,
    TS,
    H,
    W,
    _image,
    _joint_state,
    build_episode,
    frame_rgb,
)
from rosbags.rosbag2 import Reader

from rynn_teleop.core.image import resize_rgb
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES
from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder
from rynn_teleop.recording.export import (
    DEPTH_TOPICS,
    FEED_TOPICS,
    IDLE_TOLERANCE_RAD,
    ExportError,
    export_lerobot,
    idle_start_rows,
    parse_image_size,
)
from rynn_teleop.recording.inspect import episodes_main
from rynn_teleop.recording.lerobot import VideoOptions, encoder_available

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("episodes")
    return {
        "digital": build_episode(root / "a", digital=True, task="pick the cube", outcome="success"),
        "physical": build_episode(root / "b", digital=False, seconds=1.5, task="place the cube", outcome="failure"),
    }


@pytest.fixture(scope="module")
def exported(episodes, tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("datasets") / "ds"
    report = export_lerobot([episodes["digital"], episodes["physical"]], out, "test/rynn", fps=FPS,
                            images=["consumer"], workers=2)
    return out, report


DEPTH_MAX_M = 2.0  # the export's default [m]


@pytest.fixture(scope="module")
def depth_episode(tmp_path_factory) -> Path:
    return build_episode(tmp_path_factory.mktemp("depth_episodes") / "d", digital=False, seconds=1.5,
                         task="stack the cups", depth=True)


@pytest.fixture(scope="module")
def depth_exported(depth_episode, tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("depth_datasets") / "ds"
    report = export_lerobot([depth_episode], out, "test/depth", fps=FPS, images=["consumer"], depth="consumer",
                            workers=1)
    return out, report


def textured_rgb(n: int) -> np.ndarray:
    """Frame n of the textured episode: gradients and per-pixel noise in every channel (what a lossy or colour
    converting codec cannot return exactly)."""
    rng = np.random.default_rng(n)
    yy, xx = np.mgrid[0:H, 0:W]
    base = np.stack([xx * 4 + n * 7, yy * 5 + n * 3, (xx + yy) * 3 + n * 11], axis=-1)
    return ((base + rng.integers(0, 64, (H, W, 3))) % 256).astype(np.uint8)


@pytest.fixture(scope="module")
def textured_episode(tmp_path_factory) -> Path:
    """A physical episode whose frames are :func:`textured_rgb`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recording_episodes, "frame_rgb", textured_rgb)
        return build_episode(tmp_path_factory.mktemp("textured") / "t", digital=False, seconds=1.0,
                             task="wipe the table")


SMALL = (40, 30)  # --image-size of the resize tests: (width, height) [px], from W x H = 64 x 48


@pytest.fixture(scope="module")
def lossless_small(textured_episode, tmp_path_factory) -> tuple[Path, object]:
    """The textured episode exported losslessly at SMALL."""
    out = tmp_path_factory.mktemp("small") / "ds"
    report = export_lerobot([textured_episode], out, "test/small", fps=FPS, video=VideoOptions.lossless(),
                            image_size=SMALL, workers=1)
    return out, report


# -- reading the bag independently -------------------------------------------------------------


def bag_messages(path: Path, topic: str) -> list[tuple[int, object]]:
    """(header stamp [ns], message) of a topic, in bag order."""
    out = []
    with Reader(path) as reader:
        conns = [c for c in reader.connections if c.topic == topic]
        for conn, _, data in reader.messages(connections=conns):
            msg = TS.deserialize_cdr(data, conn.msgtype)
            out.append((msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec, msg))
    return out


def joints_at(path: Path, topics: list[str], stamp: int) -> np.ndarray:
    """Each canonical joint's newest position stamped at or before ``stamp`` (NaN if none)."""
    best = {n: (-1, np.nan) for n in CANONICAL_JOINT_NAMES}
    for topic in topics:
        for s, msg in bag_messages(path, topic):
            if s <= stamp:
                for name, pos in zip(msg.name, msg.position):
                    if s >= best[name][0]:
                        best[name] = (s, float(pos))
    return np.array([best[n][1] for n in CANONICAL_JOINT_NAMES])


def depth_at(path: Path, topic: str, stamp: int) -> np.ndarray:
    """The (H, W) depth image [mm] of ``topic`` with the newest header stamp at or before ``stamp``."""
    s, msg = max(((s, m) for s, m in bag_messages(path, topic) if s <= stamp), key=lambda sm: sm[0])
    assert msg.encoding == "16UC1"
    return np.frombuffer(bytes(msg.data), "<u2").reshape(msg.height, msg.width)


def bag_frames(path: Path, topic: str = FEED_TOPICS["consumer"]) -> dict[int, np.ndarray]:
    """Header stamp [ns] -> (H, W, 3) uint8 RGB frame of an rgb8 Image topic."""
    return {s: np.frombuffer(bytes(m.data), np.uint8).reshape(m.height, m.width, 3)
            for s, m in bag_messages(path, topic)}


def decoded_frames(out: Path, key: str = "observation.images.consumer", episode: int = 0) -> np.ndarray:
    """(frames, H, W, 3) uint8 RGB of an episode's video, decoded with PyAV."""
    with av.open(str(out / f"videos/{key}/chunk-000/file-{episode:03d}.mp4")) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def read_rows(out: Path) -> dict[str, np.ndarray]:
    tables = [pq.read_table(p) for p in sorted((out / "data").glob("*/*.parquet"))]
    cols = {}
    for name in tables[0].column_names:
        cols[name] = np.concatenate([np.asarray(t.column(name).to_pylist()) for t in tables])
    return cols


# -- format and content ------------------------------------------------------------------------


def test_dataset_files_features_and_rows(exported, episodes):
    out, report = exported
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS
    assert info["total_episodes"] == 2 and info["total_tasks"] == 2
    feats = info["features"]
    assert feats["observation.state"]["shape"] == [54]
    assert feats["observation.state"]["names"] == list(CANONICAL_JOINT_NAMES)
    assert feats["action"]["names"] == list(CANONICAL_JOINT_NAMES)
    assert feats["observation.images.consumer"]["dtype"] == "video"
    assert feats["observation.images.consumer"]["shape"] == [H, W, 3]
    assert [e.frames for e in report.episodes] == [60 - report.episodes[0].dropped_leading_frames,
                                                   45 - report.episodes[1].dropped_leading_frames]
    assert info["total_frames"] == report.total_frames
    rows = read_rows(out)
    assert len(rows["index"]) == report.total_frames
    assert (rows["index"] == np.arange(report.total_frames)).all()
    for e in report.episodes:
        mine = rows["episode_index"] == e.episode_index
        assert (rows["frame_index"][mine] == np.arange(e.frames)).all()
        assert np.allclose(rows["timestamp"][mine], np.arange(e.frames) / FPS)
    stats = json.loads((out / "meta/stats.json").read_text())
    assert set(stats) >= {"observation.state", "action", "observation.images.consumer", "timestamp", "index"}
    assert np.shape(stats["observation.images.consumer"]["mean"]) == (3, 1, 1)
    assert stats["observation.state"]["count"] == [report.total_frames]


def test_state_and_action_are_the_values_in_force_at_each_frame_stamp(exported, episodes):
    out, report = exported
    rows = read_rows(out)
    for e, path in zip(report.episodes, [episodes["digital"], episodes["physical"]]):
        mine = np.nonzero(rows["episode_index"] == e.episode_index)[0]
        for r in mine[[0, len(mine) // 2, -1]]:
            stamp = int(rows["stamp_ns"][r])
            assert np.allclose(rows["observation.state"][r], joints_at(path, ["/joint_states"], stamp), atol=1e-6)
            commanded = joints_at(path, ["/arms/command", "/hands/command"], stamp)
            assert np.allclose(rows["action"][r], commanded, atol=1e-6)


def test_digital_frames_keep_the_exact_action_they_were_generated_from(exported, episodes):
    out, report = exported
    digital = report.episodes[0]
    assert digital.exact_action_frames == digital.frames  # every generated frame's stamp is a command's stamp
    rows = read_rows(out)
    mine = np.nonzero(rows["episode_index"] == digital.episode_index)[0]
    commands = {s: m for s, m in bag_messages(episodes["digital"], "/arms/command")}
    commands.update({s: m for s, m in bag_messages(episodes["digital"], "/hands/command")})
    for r in mine:
        msg = commands[int(rows["stamp_ns"][r])]
        idx = [CANONICAL_JOINT_NAMES.index(n) for n in msg.name]
        assert np.allclose(rows["action"][r][idx], msg.position, atol=1e-6)


def test_every_video_has_one_frame_per_row_at_i_over_fps(exported):
    out, report = exported
    for e in report.episodes:
        path = out / f"videos/observation.images.consumer/chunk-000/file-{e.episode_index:03d}.mp4"
        with av.open(str(path)) as c:
            frames = list(c.decode(video=0))
        assert len(frames) == e.frames
        assert [round(float(f.time) * FPS) for f in frames] == list(range(e.frames))


def test_episode_metadata_keeps_our_id_source_outcome_and_camera_sources(exported, episodes):
    out, _ = exported
    rows = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [r["rynn_teleop/episode"] for r in rows] == ["episode_0001", "episode_0001"]
    sources = [str(episodes["digital"].resolve()), str(episodes["physical"].resolve())]
    assert [r["rynn_teleop/source_dir"] for r in rows] == sources
    assert [r["rynn_teleop/outcome"] for r in rows] == ["success", "failure"]
    assert json.loads(rows[0]["rynn_teleop/camera_source_changes"])[0]["source"] == "generated"
    assert [r["tasks"] for r in rows] == [["pick the cube"], ["place the cube"]]
    assert rows[1]["dataset_from_index"] == rows[0]["dataset_to_index"]


def test_depth_is_off_by_default(exported):
    out, _ = exported
    info = json.loads((out / "meta/info.json").read_text())
    assert not [k for k in info["features"] if "depth" in k]
    assert not (out / "videos/observation.images.consumer_depth").exists()
    rows = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").column_names
    assert "rynn_teleop/depth_max_m" not in rows


def test_the_depth_key_holds_the_newest_depth_at_each_row_as_12_bit_codes(depth_exported, depth_episode):
    out, report = depth_exported
    (ep,) = report.episodes
    key = "observation.images.consumer_depth"
    info = json.loads((out / "meta/info.json").read_text())
    feat = info["features"][key]
    assert feat["dtype"] == "video" and feat["shape"] == [H, W, 3]
    assert feat["info"]["video.codec"] == "hevc" and feat["info"]["video.pix_fmt"] == "gray12le"
    assert feat["info"]["video.depth_min"] == 0.0
    assert feat["info"]["video.depth_max"] == pytest.approx(DEPTH_MAX_M * 4095 / 4080)
    assert feat["info"]["video.use_log"] is False and feat["info"]["video.shift"] == 0.0
    assert feat["info"]["rynn_teleop/depth_scale_m"] == DEPTH_MAX_M
    assert feat["info"]["rynn_teleop/depth_topic"] == DEPTH_TOPICS["consumer"]
    episodes_meta = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert episodes_meta[0]["rynn_teleop/depth_max_m"] == DEPTH_MAX_M
    assert episodes_meta[0]["rynn_teleop/depth_topic"] == DEPTH_TOPICS["consumer"]
    assert episodes_meta[0][f"videos/{key}/to_timestamp"] == pytest.approx(ep.frames / FPS)
    stats = json.loads((out / "meta/stats.json").read_text())
    assert np.shape(stats[key]["mean"]) == (3, 1, 1)
    assert 0.0 == np.min(stats[key]["min"]) and np.max(stats[key]["max"]) == 1.0  # no reading; saturated
    rows = read_rows(out)
    with av.open(str(out / f"videos/{key}/chunk-000/file-000.mp4")) as c:
        codes = [f.to_ndarray(format="gray12le") for f in c.decode(video=0)]
    assert len(codes) == ep.frames
    step_mm = feat["info"]["video.depth_max"] * 1000 / 4095  # LeRobot 0.6's dequantisation: code / 4095 * depth_max
    assert step_mm == pytest.approx(DEPTH_MAX_M * 1000 / 4080)
    for r in (0, ep.frames // 2, ep.frames - 1):
        truth = np.minimum(depth_at(depth_episode, DEPTH_TOPICS["consumer"], int(rows["stamp_ns"][r])), 2000)
        assert np.abs(codes[r] * step_mm - truth).max() <= step_mm / 2 + 1e-6  # lossless stream: only the 12-bit step
    assert (codes[0][:4, :6] == 0).all() and (codes[0][-4:, -6:] == 4080).all()  # no reading stays 0; far saturates


def test_depth_asked_of_an_episode_without_it_names_the_episode_and_topic(episodes, tmp_path, capsys):
    with pytest.raises(ExportError) as err:
        export_lerobot([episodes["physical"]], tmp_path / "ds", "test/x", depth="consumer", workers=1)
    assert err.value.episode == episodes["physical"] and err.value.topic == DEPTH_TOPICS["consumer"]
    assert str(episodes["physical"]) in str(err.value) and DEPTH_TOPICS["consumer"] in str(err.value)
    assert not (tmp_path / "ds").exists()
    assert episodes_main(["export", str(episodes["physical"]), "--out", str(tmp_path / "ds"), "--repo-id", "test/x",
                          "--depth", "physical", "--workers", "1"]) == 1  # the episode's data: exit 1
    assert DEPTH_TOPICS["physical"] in capsys.readouterr().err
    with pytest.raises(ExportError, match="no depth for feed 'generated'"):
        export_lerobot([episodes["digital"]], tmp_path / "ds", "test/x", depth="generated", workers=1)


def test_appending_needs_the_same_depth_key_and_range(depth_episode, episodes, tmp_path):
    out = tmp_path / "ds"
    export_lerobot([depth_episode], out, "test/x", depth="physical", depth_max_m=1.5, workers=1)
    with pytest.raises(ExportError, match="depth-max-m 1.5"):
        export_lerobot([depth_episode], out, "test/x", depth="physical", append=True, workers=1)
    with pytest.raises(ExportError, match="camera keys"):
        export_lerobot([episodes["physical"]], out, "test/x", append=True, workers=1)
    report = export_lerobot([depth_episode], out, "test/x", depth="physical", depth_max_m=1.5, append=True, workers=1)
    assert report.episodes[0].episode_index == 1


def test_a_second_camera_key_takes_the_newest_frame_at_each_row(episodes, tmp_path):
    report = export_lerobot([episodes["digital"]], tmp_path / "two", "test/two", images=["consumer", "generated"],
                            workers=1)
    info = json.loads((tmp_path / "two/meta/info.json").read_text())
    assert {"observation.images.consumer", "observation.images.generated"} <= set(info["features"])
    for key in ("consumer", "generated"):
        with av.open(str(tmp_path / f"two/videos/observation.images.{key}/chunk-000/file-000.mp4")) as c:
            assert sum(1 for _ in c.decode(video=0)) == report.episodes[0].frames


def test_with_other_threads_running_the_workers_start_from_a_fork_server(episodes, tmp_path):
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        report = export_lerobot([episodes["physical"], episodes["digital"]], tmp_path / "ds", "test/fs", workers=2)
    finally:
        stop.set()
        thread.join()
    assert [e.episode_index for e in report.episodes] == [0, 1]
    assert report.episodes[0].frames > 0 and report.episodes[1].frames > 0


# -- bad input ---------------------------------------------------------------------------------


def test_an_episode_that_fails_its_check_is_skipped_unless_problems_are_included(tmp_path, episodes):
    bad = build_episode(tmp_path / "bad", digital=False, seconds=1.5, skip_frames=tuple(range(10, 20)))
    report = export_lerobot([bad, episodes["physical"]], tmp_path / "ds", "test/skip", workers=1)
    assert [s.source for s in report.skipped] == [bad]
    assert any("gap" in p for p in report.skipped[0].problems)
    assert [e.source for e in report.episodes] == [episodes["physical"]]
    report = export_lerobot([bad], tmp_path / "ds2", "test/skip", include_problems=True, workers=1)
    assert report.episodes[0].problems and not report.skipped


def test_the_export_checks_episodes_as_episodes_check_does(tmp_path, episodes):
    from rynn_teleop.recording.export import _Bag, _episode_problems
    from rynn_teleop.recording.inspect import episode_info
    from rynn_teleop.recording.metadata import episode_doc

    bad = build_episode(tmp_path / "bad", digital=True, seconds=1.5, skip_frames=(5, 6, 7, 8, 20))
    for path in (bad, episodes["digital"], episodes["physical"]):
        bag = _Bag.open(path)
        times: dict[str, list[int]] = {t: [] for t in bag.types}
        stamps: dict[str, list[int]] = {t: [] for t in bag.types}
        for topic, t, data in bag.scan(None):
            times[topic].append(t)
            stamps[topic].append(int.from_bytes(bytes(data[4:8]), "little", signed=True) * 10**9
                                 + int.from_bytes(bytes(data[8:12]), "little"))
        assert _episode_problems(path, episode_doc(path), bag, times, stamps) == episode_info(path).problems
    assert episode_info(bad).problems


@settings(max_examples=60, deadline=None)
@given(frame_id=st.text(max_size=9), names=st.lists(st.text(min_size=0, max_size=12), max_size=8),
       data=st.data())
def test_joint_states_are_read_in_place_as_rosbags_reads_them(frame_id, names, data):
    from rynn_teleop.recording.export import _JointStateReader

    positions = np.array(data.draw(st.lists(st.floats(allow_nan=False), min_size=len(names), max_size=len(names))))
    msg = TS.types["sensor_msgs/msg/JointState"](
        header=TS.types["std_msgs/msg/Header"](stamp=TS.types["builtin_interfaces/msg/Time"](sec=5, nanosec=7),
                                               frame_id=frame_id),
        name=names, position=positions, velocity=np.ones(len(names)), effort=np.zeros(0))
    raw = memoryview(bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/JointState")))
    reader = _JointStateReader(TS)
    for _ in range(2):  # parsed, then recognised
        got_names, got_positions = reader.read(raw)
        assert got_names == tuple(names) and np.array_equal(got_positions, positions)


def test_a_missing_camera_topic_names_the_episode_and_topic(episodes, tmp_path):
    with pytest.raises(ExportError) as err:
        export_lerobot([episodes["digital"]], tmp_path / "ds", "test/x", images=["physical"], workers=1)
    assert err.value.episode == episodes["digital"] and err.value.topic == FEED_TOPICS["physical"]
    assert str(episodes["digital"]) in str(err.value) and FEED_TOPICS["physical"] in str(err.value)
    assert not (tmp_path / "ds").exists()


def test_a_missing_command_topic_names_the_episode_and_topic(tmp_path):
    rec = EpisodeRecorder(tmp_path / "eps", {"/joint_states": None, FEED_TOPICS["consumer"]: None})
    path = rec.start(EpisodeMetadata(task="t"), now_ns=T0)
    for k in range(20):
        s = T0 + k * 33 * MS
        rec.submit("/joint_states", "sensor_msgs/msg/JointState",
                   _joint_state(s, list(CANONICAL_JOINT_NAMES), np.zeros(54)), s)
        rec.submit(FEED_TOPICS["consumer"], "sensor_msgs/msg/Image", _image(s, frame_rgb(k)), s)
    rec.stop(now_ns=T0 + 700 * MS)
    with pytest.raises(ExportError) as err:
        export_lerobot([path], tmp_path / "ds", "test/x", workers=1)
    assert err.value.topic == "/arms/command" and err.value.episode == path


def test_a_camera_not_at_the_dataset_fps_is_refused(episodes, tmp_path):
    with pytest.raises(ExportError, match="not the dataset's 15 Hz"):
        export_lerobot([episodes["physical"]], tmp_path / "ds", "test/x", fps=15, workers=1)


def test_an_existing_output_is_refused_unless_append_or_overwrite(episodes, tmp_path):
    out = tmp_path / "ds"
    export_lerobot([episodes["physical"]], out, "test/x", workers=1)
    with pytest.raises(ExportError, match="exists"):
        export_lerobot([episodes["digital"]], out, "test/x", workers=1)
    first = json.loads((out / "meta/info.json").read_text())["total_frames"]
    report = export_lerobot([episodes["digital"]], out, "test/x", append=True, workers=1)
    assert report.episodes[0].episode_index == 1
    info = json.loads((out / "meta/info.json").read_text())
    assert info["total_episodes"] == 2 and info["total_frames"] == first + report.total_frames
    rows = read_rows(out)
    assert (rows["index"] == np.arange(info["total_frames"])).all()
    assert set(rows["task_index"]) == {0, 1}
    stats = json.loads((out / "meta/stats.json").read_text())
    assert stats["index"]["count"] == [info["total_frames"]]
    report = export_lerobot([episodes["digital"]], out, "test/x", overwrite=True, workers=1)
    assert json.loads((out / "meta/info.json").read_text())["total_episodes"] == 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other/keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not a LeRobot dataset"):
        export_lerobot([episodes["digital"]], tmp_path / "other", "test/x", overwrite=True, workers=1)
    assert (tmp_path / "other/keep.txt").read_text() == "mine"


def test_the_cli_exports_and_reports_a_refused_output_with_exit_code_2(episodes, tmp_path, capsys):
    parent = episodes["physical"].parent
    assert episodes_main(["export", str(parent), "--out", str(tmp_path / "ds"), "--repo-id", "test/cli",
                          "--workers", "1"]) == 0
    assert "1 episode(s)" in capsys.readouterr().out
    assert episodes_main(["export", str(parent), "--out", str(tmp_path / "ds"), "--repo-id", "test/cli"]) == 2
    assert "exists" in capsys.readouterr().err


def test_the_export_code_does_not_import_rclpy():
    code = ("import sys, rynn_teleop.recording.export, rynn_teleop.recording.lerobot; "
            "sys.exit(1 if 'rclpy' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.mark.skipif(not encoder_available("libsvtav1"), reason="this PyAV build has no libsvtav1")
def test_other_codecs_are_options(episodes, tmp_path):
    report = export_lerobot([episodes["physical"]], tmp_path / "av1", "test/av1", workers=1,
                            video=VideoOptions(codec="libsvtav1", crf=30, preset="12"))
    info = json.loads((tmp_path / "av1/meta/info.json").read_text())
    assert info["features"]["observation.images.consumer"]["info"]["video.codec"] == "av1"
    with av.open(str(tmp_path / "av1/videos/observation.images.consumer/chunk-000/file-000.mp4")) as c:
        assert sum(1 for _ in c.decode(video=0)) == report.episodes[0].frames


# -- image size and lossless video --------------------------------------------------------------


def test_lossless_video_decodes_to_exactly_the_recorded_pixels(textured_episode, tmp_path):
    out = tmp_path / "ds"
    report = export_lerobot([textured_episode], out, "test/lossless", fps=FPS, video=VideoOptions.lossless(),
                            workers=1)
    info = json.loads((out / "meta/info.json").read_text())["features"]["observation.images.consumer"]
    assert info["shape"] == [H, W, 3]
    assert info["info"]["video.codec"] == "h264" and info["info"]["video.pix_fmt"] == "gbrp"
    truth = bag_frames(textured_episode)
    stamps = read_rows(out)["stamp_ns"]
    frames = decoded_frames(out)
    assert len(frames) == report.episodes[0].frames
    for stamp, frame in zip(stamps, frames):
        assert np.array_equal(frame, truth[int(stamp)])


def test_default_video_is_lossy_on_textured_frames(textured_episode, tmp_path):
    export_lerobot([textured_episode], tmp_path / "ds", "test/lossy", fps=FPS, workers=1)
    truth = bag_frames(textured_episode)
    stamp = int(read_rows(tmp_path / "ds")["stamp_ns"][0])
    assert not np.array_equal(decoded_frames(tmp_path / "ds")[0], truth[stamp])  # why --lossless exists


def test_image_size_resizes_every_colour_key_before_encoding_and_statistics(lossless_small, textured_episode):
    out, report = lossless_small
    width, height = SMALL
    info = json.loads((out / "meta/info.json").read_text())["features"]["observation.images.consumer"]
    assert info["shape"] == [height, width, 3]
    assert (info["info"]["video.height"], info["info"]["video.width"]) == (height, width)
    truth = bag_frames(textured_episode)
    expected = np.stack([resize_rgb(truth[int(s)], height, width) for s in read_rows(out)["stamp_ns"]])
    frames = decoded_frames(out)
    assert frames.shape == (report.episodes[0].frames, height, width, 3)
    assert np.array_equal(frames, expected)  # resize_rgb's pixels, losslessly encoded
    stats = json.loads((out / "meta/stats.json").read_text())["observation.images.consumer"]
    # every frame and pixel is sampled at this size: the statistics are those of the resized frames
    assert np.allclose(np.ravel(stats["mean"]), (expected / 255.0).mean(axis=(0, 1, 2)), atol=1e-12)
    assert np.allclose(np.ravel(stats["max"]), expected.max(axis=(0, 1, 2)) / 255.0)


def test_image_size_is_checked_and_excludes_depth(depth_episode, episodes, tmp_path):
    with pytest.raises(ExportError, match="--image-size and --depth exclude each other"):
        export_lerobot([depth_episode], tmp_path / "d", "test/x", depth="consumer", image_size=(32, 24), workers=1)
    with pytest.raises(ExportError, match="yuv420p needs an even width and height"):
        export_lerobot([episodes["physical"]], tmp_path / "o", "test/x", image_size=(33, 24), workers=1)
    with pytest.raises(ExportError, match="outside"):
        export_lerobot([episodes["physical"]], tmp_path / "z", "test/x", image_size=(0, 24), workers=1)
    assert not any(tmp_path.iterdir())
    # an odd size is fine where the stream is not 4:2:0
    report = export_lerobot([episodes["physical"]], tmp_path / "rgb", "test/x", image_size=(33, 25), workers=1,
                            video=VideoOptions.lossless())
    assert decoded_frames(tmp_path / "rgb").shape[1:] == (25, 33, 3) and report.episodes


def test_parse_image_size():
    assert parse_image_size("96x72") == (96, 72) and parse_image_size("64X48") == (64, 48)
    for bad in ("96", "96x", "x72", "96x72x3", "-4x8", "0x8", "a x b"):
        with pytest.raises(ValueError, match="image size"):
            parse_image_size(bad)


def test_libx264rgb_takes_only_rgb_pixel_formats():
    with pytest.raises(ValueError, match="libx264rgb encodes"):
        VideoOptions(codec="libx264rgb", crf=0, pix_fmt="yuv444p")


def test_the_cli_exports_lossless_at_an_image_size(episodes, tmp_path, capsys):
    out = tmp_path / "ds"
    code = episodes_main(["export", str(episodes["physical"]), "--out", str(out), "--repo-id", "test/cli",
                          "--lossless", "--image-size", "32x24", "--workers", "1"])
    assert code == 0, capsys.readouterr().err
    info = json.loads((out / "meta/info.json").read_text())["features"]["observation.images.consumer"]
    assert info["shape"] == [24, 32, 3] and info["info"]["video.pix_fmt"] == "gbrp"
    assert episodes_main(["export", str(episodes["physical"]), "--out", str(tmp_path / "x"), "--repo-id", "t/x",
                          "--lossless", "--crf", "10"]) == 2
    assert "--lossless sets the codec, CRF and pixel format; drop --crf" in capsys.readouterr().err
    assert episodes_main(["export", str(episodes["physical"]), "--out", str(tmp_path / "y"), "--repo-id", "t/y",
                          "--image-size", "big"]) == 2
    assert "WIDTHxHEIGHT" in capsys.readouterr().err
    assert episodes_main(["export", str(episodes["physical"]), "--out", str(tmp_path / "z"), "--repo-id", "t/z",
                          "--codec", "libx264", "--crf", "0", "--pix-fmt", "yuv444p", "--workers", "1"]) == 0
    info = json.loads((tmp_path / "z/meta/info.json").read_text())["features"]["observation.images.consumer"]
    assert info["info"]["video.pix_fmt"] == "yuv444p"


REST_S = 0.5  # [s] the idle episode's arms hold still this long before they move


def commanded_after_rest(t_ns: int) -> np.ndarray:
    """The idle episode's commands [rad]: arms at rest (hands jittering by 0.2 rad, as a glove's do) for
    REST_S, then every joint moving as :func:`recording_episodes.commanded` does from there."""
    t = (t_ns - T0) * 1e-9
    q = np.zeros(54)
    q[14:] = 0.2 * np.sin(40.0 * t + np.arange(40))
    if t > REST_S:
        q += 0.4 * np.sin(1.3 * (t - REST_S) + np.arange(54) * 0.1) - 0.4 * np.sin(np.arange(54) * 0.1)
    return q


@pytest.fixture(scope="module")
def idle_episode(tmp_path_factory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recording_episodes, "commanded", commanded_after_rest)
        return build_episode(tmp_path_factory.mktemp("idle") / "i", digital=False, seconds=1.5, task="wait, then reach")


def test_idle_start_rows_counts_the_rows_before_the_arms_move_and_keeps_the_last_at_rest():
    action = np.zeros((10, 54))
    action[:, 20] = np.linspace(0, 1.0, 10)  # a hand joint moving does not end the rest
    action[:, 3] = [0, 0.01, -0.02, 0.0, 0.03, 0.2, 0.4, 0.6, 0.8, 1.0]  # an arm joint: 0.2 rad at row 5
    assert idle_start_rows(action, 0.05) == 4  # rows 0-3 left out; row 4 (the last at rest) is kept
    assert idle_start_rows(action, 0.5) == 6
    assert idle_start_rows(np.zeros((5, 54)), 0.05) == 0  # arms never move: nothing left out
    action[:, 3] = np.linspace(0.0, 1.0, 10)
    assert idle_start_rows(action, 0.05) == 0  # moving from the first row


def test_trim_idle_start_leaves_out_the_rows_before_the_arms_move(idle_episode, tmp_path, capsys):
    full = export_lerobot([idle_episode], tmp_path / "full", "test/full", fps=FPS, workers=1,
                          video=VideoOptions.lossless())
    trimmed = export_lerobot([idle_episode], tmp_path / "trim", "test/trim", fps=FPS, workers=1,
                             video=VideoOptions.lossless(), trim_idle_start=IDLE_TOLERANCE_RAD)
    (f,), (e,) = full.episodes, trimmed.episodes
    assert f.trimmed_idle_frames == 0
    # the arms leave 0.05 rad of rest at about REST_S + 0.1 s: some 17 of the 45 frames are left out
    assert REST_S * FPS - 1 <= e.trimmed_idle_frames <= (REST_S + 0.2) * FPS
    assert e.frames == f.frames - e.trimmed_idle_frames
    rows_f, rows_t = read_rows(tmp_path / "full"), read_rows(tmp_path / "trim")
    k = e.trimmed_idle_frames
    for col in ("observation.state", "action", "stamp_ns"):
        assert np.array_equal(rows_t[col], rows_f[col][k:])  # the same rows from k on
    assert np.allclose(rows_t["timestamp"], np.arange(e.frames) / FPS)  # re-based: the video's times
    arms = rows_f["action"][:, :14]
    assert np.abs(arms[k] - arms[0]).max() <= IDLE_TOLERANCE_RAD < np.abs(arms[k + 1] - arms[0]).max()
    assert np.array_equal(decoded_frames(tmp_path / "trim"), decoded_frames(tmp_path / "full")[k:])
    meta = pq.read_table(tmp_path / "trim/meta/episodes/chunk-000/file-000.parquet").to_pylist()[0]
    assert meta["rynn_teleop/trimmed_idle_frames"] == k and meta["length"] == e.frames
    assert trimmed.to_dict()["episodes"][0]["trimmed_idle_frames"] == k
    code = episodes_main(["export", str(idle_episode), "--out", str(tmp_path / "cli"), "--repo-id", "t/cli",
                          "--trim-idle-start", "--workers", "1"])
    assert code == 0 and f"{k} idle frames before the arms moved left out" in capsys.readouterr().out
    with pytest.raises(ExportError, match=r"trim_idle_start 2.0 is outside \(0, 1\] rad"):
        export_lerobot([idle_episode], tmp_path / "bad", "t/bad", trim_idle_start=2.0)


# -- the real client: LeRobot's own reader -----------------------------------------------------


def test_lerobot_loads_the_export_with_the_bag_s_frames_and_actions(exported, episodes, lerobot_python, tmp_path):
    out, report = exported
    digital, physical = report.episodes
    queries = [0, digital.frames // 2, digital.frames - 1, digital.frames, digital.frames + physical.frames - 1]
    dump = tmp_path / "lerobot.npz"
    proc = subprocess.run([lerobot_python, str(ROOT / "tests/lerobot_check.py"), str(out), "test/rynn", str(dump),
                           *map(str, queries)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"LeRobot rejected the export:\n{proc.stderr[-6000:]}"
    got = np.load(dump)
    summary = json.loads(str(got["summary"]))
    assert summary["num_frames"] == report.total_frames and summary["num_episodes"] == 2
    assert summary["episode_lengths"] == [digital.frames, physical.frames]
    assert summary["fps"] == FPS and summary["tasks"] == ["pick the cube", "place the cube"]
    assert summary["features"]["observation.state"]["shape"] == [54]
    assert summary["features"]["action"]["names"] == list(CANONICAL_JOINT_NAMES)
    assert summary["features"]["observation.images.consumer"]["shape"] == [H, W, 3]
    assert summary["policy_features"]["observation.images.consumer"].endswith("VISUAL")
    assert summary["policy_features"]["observation.state"].endswith("STATE")
    assert summary["policy_features"]["action"].endswith("ACTION")
    assert summary["chunk_action_shape"] == [4, 54] and summary["chunk_image_shape"] == [2, 3, H, W]
    rows = read_rows(out)
    for q in queries:
        ep = digital if q < digital.frames else physical
        path = episodes["digital"] if ep is digital else episodes["physical"]
        stamp = int(rows["stamp_ns"][q])
        assert int(got[f"{q}/index"]) == q and int(got[f"{q}/episode_index"]) == ep.episode_index
        assert float(got[f"{q}/timestamp"]) == pytest.approx(int(got[f"{q}/frame_index"]) / FPS, abs=1e-6)
        assert np.allclose(got[f"{q}/state"], joints_at(path, ["/joint_states"], stamp), atol=1e-6)
        assert np.allclose(got[f"{q}/action"], joints_at(path, ["/arms/command", "/hands/command"], stamp), atol=1e-6)
        assert str(got[f"{q}/task"]) == ("pick the cube" if ep is digital else "place the cube")
        frames = {s: m for s, m in bag_messages(path, FEED_TOPICS["consumer"])}
        truth = np.frombuffer(bytes(frames[stamp].data), np.uint8).reshape(H, W, 3).astype(float)
        image = got[f"{q}/image.observation.images.consumer"].astype(float)
        assert np.abs(image - truth).mean() < 6.0  # lossy H.264; neighbouring frames differ by 25+ per channel


def test_lerobot_loads_the_depth_key_within_its_quantisation_step(depth_exported, depth_episode, lerobot_python,
                                                                   tmp_path):
    out, report = depth_exported
    (ep,) = report.episodes
    key = "observation.images.consumer_depth"
    queries = [0, ep.frames // 3, ep.frames - 1]
    dump = tmp_path / "lerobot.npz"
    proc = subprocess.run([lerobot_python, str(ROOT / "tests/lerobot_check.py"), str(out), "test/depth", str(dump),
                           *map(str, queries)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"LeRobot rejected the export:\n{proc.stderr[-6000:]}"
    got = np.load(dump)
    summary = json.loads(str(got["summary"]))
    assert summary["num_frames"] == ep.frames
    assert summary["video_keys"] == ["observation.images.consumer", key]
    assert summary["features"][key]["shape"] == [H, W, 3]
    assert summary["policy_features"][key].endswith("VISUAL")
    assert summary["feature_info"][key]["rynn_teleop/depth_scale_m"] == DEPTH_MAX_M
    assert key in summary["stats_keys"]
    rows = read_rows(out)
    step_mm = DEPTH_MAX_M * 1000 / 255  # what LeRobot decodes (a key not marked as depth): 8-bit RGB
    for q in queries:
        image = got[f"{q}/image.{key}"].astype(float)  # (H, W, 3) 0..255
        assert image.shape == (H, W, 3)
        assert (image[..., 0] == image[..., 1]).all() and (image[..., 1] == image[..., 2]).all()
        metres = image[..., 0] / 255.0 * DEPTH_MAX_M
        truth = np.minimum(depth_at(depth_episode, DEPTH_TOPICS["consumer"], int(rows["stamp_ns"][q])), 2000) / 1000
        err_mm = np.abs(metres - truth) * 1000
        assert err_mm.max() <= 0.55 * step_mm and err_mm.mean() <= 0.3 * step_mm  # 8-bit rounding (+ 12-bit's)


def _lerobot_dump(lerobot_python: str, out: Path, repo_id: str, queries: list[int], dump: Path):
    """LeRobot's items at ``queries`` and its summary (tests/lerobot_check.py in the LeRobot environment)."""
    proc = subprocess.run([lerobot_python, str(ROOT / "tests/lerobot_check.py"), str(out), repo_id, str(dump),
                           *map(str, queries)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"LeRobot rejected the export:\n{proc.stderr[-6000:]}"
    got = np.load(dump)
    return got, json.loads(str(got["summary"]))


def test_lerobot_returns_exactly_the_recorded_pixels_of_a_lossless_export(textured_episode, lerobot_python,
                                                                         tmp_path):
    out = tmp_path / "ds"
    report = export_lerobot([textured_episode], out, "test/lossless", fps=FPS, video=VideoOptions.lossless(),
                            workers=1)
    n = report.episodes[0].frames
    queries = [0, 1, n // 2, n - 1]
    got, summary = _lerobot_dump(lerobot_python, out, "test/lossless", queries, tmp_path / "lerobot.npz")
    assert summary["features"]["observation.images.consumer"]["shape"] == [H, W, 3]
    truth = bag_frames(textured_episode)
    stamps = read_rows(out)["stamp_ns"]
    for q in queries:
        item = got[f"{q}/float.observation.images.consumer"]  # (3, H, W) float32, what a policy is fed
        assert item.dtype == np.float32 and item.shape == (3, H, W)
        frame = truth[int(stamps[q])].transpose(2, 0, 1).astype(np.float32)
        assert np.array_equal(item * np.float32(255), frame)  # element by element, no tolerance


def test_lerobot_reads_an_image_size_export_at_that_size(lossless_small, textured_episode, lerobot_python,
                                                         tmp_path):
    out, report = lossless_small
    width, height = SMALL
    n = report.episodes[0].frames
    queries = [0, n - 1]
    got, summary = _lerobot_dump(lerobot_python, out, "test/small", queries, tmp_path / "lerobot.npz")
    assert summary["features"]["observation.images.consumer"]["shape"] == [height, width, 3]
    assert summary["chunk_image_shape"] == [2, 3, height, width]
    truth = bag_frames(textured_episode)
    stamps = read_rows(out)["stamp_ns"]
    for q in queries:
        expected = resize_rgb(truth[int(stamps[q])], height, width).transpose(2, 0, 1).astype(np.float32)
        assert np.array_equal(got[f"{q}/float.observation.images.consumer"] * np.float32(255), expected)


def test_lerobot_env_script_is_idempotent(lerobot_python):
    if os.environ.get("RYNN_LEROBOT_PYTHON"):
        pytest.skip("RYNN_LEROBOT_PYTHON given: the script is not used")
    proc = subprocess.run([str(ROOT / "scripts/lerobot_env.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == lerobot_python


def _in_thread(fn):
    """fn()'s result, run on a fresh thread (a scheduling change stays on that thread)."""
    import threading

    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.skipif(not encoder_available("libsvtav1"), reason="this PyAV build has no libsvtav1")
@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling calls")
def test_video_writer_leaves_the_thread_scheduling_as_it_was(tmp_path):
    from rynn_teleop.recording.lerobot import VideoWriter

    frame = np.zeros((64, 64, 3), np.uint8)

    def bare_pyav():  # what SVT-AV1 does to the thread that feeds it, without the writer's guard
        container = av.open(str(tmp_path / "bare.mp4"), "w")
        stream = container.add_stream("libsvtav1", rate=30)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        before = (os.sched_getscheduler(0), os.sched_getparam(0))
        for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            container.mux(packet)
        after = (os.sched_getscheduler(0), os.sched_getparam(0))
        for packet in stream.encode(None):
            container.mux(packet)
        container.close()
        return before, after

    def writer():
        before = (os.sched_getscheduler(0), os.sched_getparam(0))
        w = VideoWriter(tmp_path / "w.mp4", width=64, height=64, fps=30,
                        options=VideoOptions(codec="libsvtav1", preset=None))
        for _ in range(3):
            w.write(frame)
        during = (os.sched_getscheduler(0), os.sched_getparam(0))
        w.close()
        return before, during, (os.sched_getscheduler(0), os.sched_getparam(0))

    before, after = _in_thread(bare_pyav)
    if before == after:
        pytest.skip("SVT-AV1 leaves this thread's priority alone here (it changes it only as root)")
    assert after[0] == os.SCHED_FIFO  # the hazard the writer guards against
    before, during, end = _in_thread(writer)
    assert during == before and end == before
