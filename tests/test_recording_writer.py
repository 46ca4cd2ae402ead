"""Episode writing (recording.writer, recording.episodes): round trip, episodes, drops, failures.

No rclpy: CDR bytes come from rosbags' typestore serializer, exactly what a raw
subscription hands the recorder.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from mcap.reader import make_reader
from mcap.writer import Writer as McapWriter
from mcap_ros2.decoder import DecoderFactory
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from rynn_teleop.errors import RynnTeleopError
from rynn_teleop.recording import (
    EpisodeMetadata,
    EpisodeRecorder,
    EpisodeWriter,
    RecordingError,
    TopicQos,
    description_hash,
    split_at_window,
)
from rynn_teleop.recording.mcapfile import scan

TS = get_typestore(Stores.ROS2_KILTED)
MS = 1_000_000  # [ns]
T0 = 1_700_000_000 * 1_000_000_000  # an epoch time [ns]


def header(stamp_ns: int, frame: str = "") -> object:
    Time = TS.types["builtin_interfaces/msg/Time"]
    return TS.types["std_msgs/msg/Header"](stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id=frame)


def joint_state(stamp_ns: int, names: list[str], positions: list[float]) -> bytes:
    msg = TS.types["sensor_msgs/msg/JointState"](
        header=header(stamp_ns),
        name=names,
        position=np.asarray(positions, float),
        velocity=np.zeros(0),
        effort=np.zeros(0),
    )
    return bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/JointState"))


def image(stamp_ns: int, width: int, height: int, value: int) -> bytes:
    data = np.full((height, width, 3), value % 256, np.uint8)
    data[:, :, 0] = np.arange(width, dtype=np.uint8)[None, :]
    msg = TS.types["sensor_msgs/msg/Image"](
        header=header(stamp_ns, "camera_color_optical_frame"),
        height=height,
        width=width,
        encoding="rgb8",
        is_bigendian=0,
        step=width * 3,
        data=data.reshape(-1),
    )
    return bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/Image"))


def string(text: str) -> bytes:
    return bytes(TS.serialize_cdr(TS.types["std_msgs/msg/String"](data=text), "std_msgs/msg/String"))


JS = "sensor_msgs/msg/JointState"
IMG = "sensor_msgs/msg/Image"
STR = "std_msgs/msg/String"


def stream(n_js: int = 200, n_img: int = 30) -> list[tuple[str, str, bytes, int]]:
    """1 s of known messages in receive order: joints 200 Hz, commands 200 Hz, images 30 Hz, one latched string.

    Header stamps are 3 ms before the receive time (capture -> receive), so the two can be told apart.
    """
    out = []
    for i in range(n_js):
        t = T0 + 2_500_000 + i * 5 * MS
        out.append(("/joint_states", JS, joint_state(t - 3 * MS, ["a1", "a2"], [0.01 * i, -0.02 * i]), t))
        out.append(("/arms/command", JS, joint_state(t - 3 * MS, ["a1", "a2"], [0.01 * i + 0.1, -0.02 * i]), t + MS))
    for i in range(n_img):
        t = T0 + 10 * MS + round(i * 1e9 / 30)
        out.append(("/head_camera/color/image_raw", IMG, image(t - 3 * MS, 64, 48, i), t))
    out.append(("/head_camera/active_source", STR, string("physical"), T0 + MS))
    return sorted(out, key=lambda m: m[3])


RATES = {"/joint_states": 200.0, "/arms/command": 200.0, "/head_camera/color/image_raw": 30.0,
         "/head_camera/active_source": None}


def record(out_dir: Path, messages, *, rates=RATES, stop_ns: int = T0 + 1_000 * MS,
           **kwargs) -> tuple[EpisodeRecorder, object]:
    rec = EpisodeRecorder(out_dir, rates, **kwargs)
    meta = EpisodeMetadata(
        task="pick cube",
        operator="ann",
        notes="first try",
        camera_sources=["physical"],
        robot_description_hash=description_hash("<robot name='r'/>"),
        calibration={"chest_offset": [0.0, 0.1, 0.2]},
    )
    latched = [TopicQos(durability="transient_local", depth=1)]
    rec.start(meta, now_ns=T0, topic_qos={"/head_camera/active_source": latched})
    for topic, type_name, data, t in messages:
        assert rec.submit(topic, type_name, data, t)
    return rec, rec.stop(now_ns=stop_ns)


def test_round_trip_keeps_bytes_receive_times_and_counts_readable_by_rosbags_and_mcap(tmp_path):
    messages = stream()
    _, summary = record(tmp_path, messages)
    bag = tmp_path / "episode_0001"
    assert summary.path == bag and summary.problems == []
    assert summary.bytes_written == sum(len(m[2]) for m in messages)

    with Reader(bag) as reader:  # rosbags, through metadata.yaml
        got = [(c.topic, c.msgtype, bytes(d), t) for c, t, d in reader.messages()]
        assert reader.message_count == len(messages)
    assert sorted(got, key=lambda m: (m[3], m[0])) == sorted(messages, key=lambda m: (m[3], m[0]))

    with (bag / "episode_0001.mcap").open("rb") as f:  # the MCAP reader, decoding with the stored definitions
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        decoded = [(ch.topic, m.log_time, bytes(m.data), ros) for _, ch, m, ros in reader.iter_decoded_messages()]
    assert sorted((t, lt, d) for t, lt, d, _ in decoded) == sorted((m[0], m[3], m[2]) for m in messages)
    js = [ros for topic, lt, _, ros in decoded if topic == "/joint_states"]
    assert len(js) == 200 and list(js[7].name) == ["a1", "a2"] and js[7].position[0] == pytest.approx(0.07)
    first_js = min(lt for topic, lt, _, _ in decoded if topic == "/joint_states")
    stamp = js[0].header.stamp
    assert stamp.sec * 10**9 + stamp.nanosec == first_js - 3 * MS  # header stamp preserved, bag time = receive time
    frames = [ros for topic, _, _, ros in decoded if topic == "/head_camera/color/image_raw"]
    assert frames[0].width == 64 and frames[0].encoding == "rgb8"


def test_metadata_yaml_and_sidecar_carry_description_and_per_topic_counts(tmp_path):
    _, summary = record(tmp_path, stream())
    bag = summary.path
    info = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert info["storage_identifier"] == "mcap" and info["version"] >= 6
    custom = info["custom_data"]
    assert custom["rynn_teleop.operator"] == "ann" and custom["rynn_teleop.state"] == "complete"
    assert custom["rynn_teleop.robot_description_hash"].startswith("sha256:")
    assert yaml.safe_load(custom["rynn_teleop.camera_sources"]) == ["physical"]
    stats = yaml.safe_load(custom["rynn_teleop.stats"])
    js = stats["topics"]["/joint_states"]
    assert (js["received"], js["expected"], js["dropped"]) == (200, 200, 0)
    assert stats["topics"]["/head_camera/color/image_raw"]["expected"] == 30
    qos = {t["topic_metadata"]["name"]: t["topic_metadata"]["offered_qos_profiles"]
           for t in info["topics_with_message_count"]}
    assert qos["/head_camera/active_source"][0]["durability"] == "transient_local" and qos["/joint_states"] == []
    side = yaml.safe_load((bag / "episode.yaml").read_text())
    assert side["state"] == "complete" and side["task"] == "pick cube" and side["calibration"]["chest_offset"][2] == 0.2
    assert side["stats"]["topics"]["/arms/command"]["received"] == 200
    assert side["software_version"].startswith("rynn_teleop ")


def test_episodes_are_numbered_and_discard_removes_the_directory(tmp_path):
    rec = EpisodeRecorder(tmp_path / "out", {"/x": None})
    assert not rec.submit("/x", STR, string("before"), T0)  # no episode: ignored
    with pytest.raises(RecordingError):
        rec.stop()
    first = rec.start(EpisodeMetadata(task="a"), now_ns=T0)
    with pytest.raises(RecordingError, match="already being recorded"):
        rec.start(EpisodeMetadata())
    assert yaml.safe_load((first / "episode.yaml").read_text())["state"] == "recording"
    rec.submit("/x", STR, string("one"), T0 + MS)
    rec.stop(now_ns=T0 + 2 * MS)
    second = rec.start(EpisodeMetadata(task="b"))
    assert rec.active and rec.current == second
    rec.submit("/x", STR, string("two"), T0 + MS)
    assert rec.discard() == second and not second.exists() and not rec.active
    third = rec.start(EpisodeMetadata(task="c"))
    rec.stop()
    assert [first.name, second.name, third.name] == ["episode_0001", "episode_0002", "episode_0002"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["episode_0001", "episode_0002"]


def test_the_typestore_is_built_with_the_recorder_not_at_the_first_start(tmp_path, monkeypatch):
    """Starting an episode must be quick (it runs while the process's loops wait): the standard typestore,
    about 0.1 s to build, is built when the recorder is made."""
    from rynn_teleop.recording import episodes, writer

    built = []
    monkeypatch.setattr(writer, "default_typestore", lambda: built.append(1) or TS)
    monkeypatch.setattr(episodes, "default_typestore", writer.default_typestore)
    rec = EpisodeRecorder(tmp_path, {"/x": None})
    assert built == [1]
    rec.start(EpisodeMetadata(), now_ns=T0)
    rec.submit("/x", STR, string("one"), T0 + MS)
    rec.stop(now_ns=T0 + 2 * MS)
    assert built == [1]


def test_progress_of_the_episode_being_recorded(tmp_path):
    """What the console shows while recording: name, elapsed time, messages so far, problems so far."""
    rec = EpisodeRecorder(tmp_path, {"/x": 10.0, "/y": 10.0})
    assert rec.progress(T0) is None  # between episodes
    rec.start(EpisodeMetadata(), now_ns=T0)
    for k in range(3):
        assert rec.submit("/x", STR, string(f"m{k}"), T0 + k * MS)
    rec.writer.drain()
    early = rec.progress(T0 + 1_000 * MS)
    assert (early.name, early.elapsed_s, early.messages, early.problems) == ("episode_0001", 1.0, 3, [])
    rec.writer.note_dropped("/x", 2)
    later = rec.progress(T0 + 3_000 * MS)  # past 2 s: a silent configured topic is a problem
    assert later.problems == ["/x: 2 dropped", "/y: nothing received"]
    summary = rec.stop(now_ns=T0 + 3_000 * MS)
    assert yaml.safe_load((summary.path / "episode.yaml").read_text())["outcome"] == ""  # not labelled
    assert rec.progress() is None


def test_a_configured_topic_that_never_appears_is_reported_at_stop(tmp_path):
    rates = {"/joint_states": 200.0, "/hands/command": 100.0}
    _, summary = record(tmp_path, [m for m in stream() if m[0] == "/joint_states"], rates=rates)
    assert summary.stats.missing == ("/hands/command",)
    assert summary.problems == ["/hands/command: configured but never received"]


def test_a_full_queue_drops_and_counts_per_topic_without_blocking(tmp_path, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    original = EpisodeWriter._write

    def slow_write(self, item):  # the disk stalls on the first message
        entered.set()
        release.wait(10)
        original(self, item)

    monkeypatch.setattr(EpisodeWriter, "_write", slow_write)
    rec = EpisodeRecorder(tmp_path, {"/a": None, "/b": None}, queue_max_messages=5, queue_max_bytes=10**9)
    rec.start(EpisodeMetadata(), now_ns=T0)
    assert rec.submit("/a", STR, string("0"), T0)
    assert entered.wait(10)  # the writer holds message 0 (it still counts against the bound)
    # The writer is stalled: a blocking submit would hang here; this one drops beyond the bound.
    accepted = [rec.submit("/a" if i % 2 else "/b", STR, string(str(i)), T0 + i) for i in range(1, 11)]
    assert accepted == [True] * 4 + [False] * 6
    assert rec.writer.dropped() == {"/a": 3, "/b": 3}
    release.set()
    summary = rec.stop(now_ns=T0 + MS)
    assert {t: (s.received, s.dropped) for t, s in summary.stats.topics.items()} == {"/a": (3, 3), "/b": (2, 3)}
    assert "/a: 3 message(s) published but not recorded (dropped)" in summary.problems


def test_byte_bound_of_the_queue(tmp_path, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    original = EpisodeWriter._write

    def slow_write(self, item):
        entered.set()
        release.wait(10)
        original(self, item)

    monkeypatch.setattr(EpisodeWriter, "_write", slow_write)
    w = EpisodeWriter(tmp_path / "bag", queue_max_bytes=1000)
    w.open()
    assert w.submit("/img", STR, b"\0" * 600, T0)
    assert entered.wait(10)
    assert w.submit("/img", STR, b"\0" * 400, T0 + 1)  # exactly at the bound
    assert not w.submit("/img", STR, b"\0" * 1, T0 + 2)
    assert w.queued_bytes == 1000 and w.dropped() == {"/img": 1}
    release.set()
    w.close()
    assert w.state == "closed"


def test_unwritable_output_directory_fails_start_with_a_clear_error(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the output directory should be")
    rec = EpisodeRecorder(blocker / "episodes", {"/x": None})
    with pytest.raises(RecordingError, match="cannot create output directory .*not_a_dir") as err:
        rec.start(EpisodeMetadata())
    assert isinstance(err.value, RynnTeleopError) and not rec.active
    with pytest.raises(RecordingError, match="exists already"):
        EpisodeWriter(blocker).open()
    with pytest.raises(RecordingError, match="Not a directory"):
        EpisodeWriter(blocker / "bag").open()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_output_directory_fails_start_with_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        denied = "cannot create episode directory .*ro/episode_0001: Permission denied"
        with pytest.raises(RecordingError, match=denied):
            EpisodeRecorder(ro, {"/x": None}).start(EpisodeMetadata())
    finally:
        ro.chmod(0o755)


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    """Poll ``condition`` until it holds (a functional wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_disk_full_mid_episode_fails_the_episode_and_reports_it(tmp_path, monkeypatch):
    errors = []
    rec = EpisodeRecorder(tmp_path, {"/a": 100.0}, flush_period_s=0.01, on_error=errors.append)
    bag = rec.start(EpisodeMetadata(task="doomed"), now_ns=T0)

    def no_space(self):  # the disk fills up: the periodic flush's write fails
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(McapWriter, "flush", no_space)
    assert rec.submit("/a", STR, string("x"), T0 + MS)
    assert wait_for(lambda: rec.writer.failed)
    assert len(errors) == 1 and isinstance(errors[0], RecordingError) and "disk full" in str(errors[0])
    assert rec.writer.error is errors[0]
    assert not rec.submit("/a", STR, string("y"), T0 + 2 * MS)  # refused, counted as lost
    assert rec.writer.dropped() == {"/a": 1}
    with pytest.raises(RecordingError, match="disk full"):
        rec.stop(now_ns=T0 + 3 * MS)
    side = yaml.safe_load((bag / "episode.yaml").read_text())
    assert side["state"] == "failed" and "disk full" in side["error"]
    assert not rec.active
    monkeypatch.undo()  # space again: the next episode records normally
    rec.start(EpisodeMetadata(), now_ns=T0)
    rec.submit("/a", STR, string("z"), T0 + MS)
    assert rec.stop(now_ns=T0 + 10 * MS).stats.topics["/a"].received == 1


def test_data_reaches_the_file_while_recording_within_the_flush_period(tmp_path):
    w = EpisodeWriter(tmp_path / "bag", flush_period_s=0.05)
    w.open()
    for i in range(50):
        w.submit("/a", STR, string(f"m{i}"), T0 + i * MS)
    assert wait_for(lambda: scan(w.mcap_path).message_count == 50)  # complete chunk on disk, bag still open
    assert w.state == "open" and not scan(w.mcap_path).complete
    w.submit("/a", STR, string("late"), T0 + 60 * MS)
    w.close()
    with Reader(tmp_path / "bag") as reader:
        assert reader.message_count == 51


def test_the_mcap_file_carries_what_rosbag2_reads_from_it(tmp_path):
    """ros2 profile, ros2msg schemas, offered QoS in the channel metadata, and a rosbag2 metadata record holding
    metadata.yaml's content."""
    _, summary = record(tmp_path, stream())
    bag = summary.path
    info = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    with (bag / "episode_0001.mcap").open("rb") as f:
        reader = make_reader(f)
        assert reader.get_header().profile == "ros2"
        found = reader.get_summary()
        [rosbag2] = [m.metadata for m in reader.iter_metadata() if m.name == "rosbag2"]
        assert len(list(reader.iter_messages())) == info["message_count"]
    assert yaml.safe_load(rosbag2["serialized_metadata"]) == info
    assert {s.name: s.encoding for s in found.schemas.values()} == {JS: "ros2msg", IMG: "ros2msg", STR: "ros2msg"}
    assert b"std_msgs/Header header" in next(s.data for s in found.schemas.values() if s.name == JS)
    qos = {c.topic: yaml.safe_load(c.metadata["offered_qos_profiles"]) for c in found.channels.values()}
    assert qos["/head_camera/active_source"][0]["durability"] == "transient_local" and qos["/joint_states"] == []
    assert {c.message_encoding for c in found.channels.values()} == {"cdr"}
    counts = {t["topic_metadata"]["name"]: t["message_count"] for t in info["topics_with_message_count"]}
    assert found.statistics.channel_message_counts == {c.id: counts[c.topic] for c in found.channels.values()}


def test_fsync_syncs_the_file_at_each_periodic_flush(tmp_path, monkeypatch):
    from rynn_teleop.recording import writer

    synced = []
    monkeypatch.setattr(writer.os, "fsync", synced.append)
    w = EpisodeWriter(tmp_path / "bag", flush_period_s=0.01, fsync=True)
    w.open()
    assert w.submit("/a", STR, string("x"), T0)
    assert wait_for(lambda: synced)
    assert scan(w.mcap_path).message_count == 1  # flushed to the file before the sync
    w.close()
    assert all(isinstance(fd, int) for fd in synced)


def test_custom_data_must_be_strings(tmp_path):
    errors = []
    w = EpisodeWriter(tmp_path / "bag", on_error=errors.append)
    w.open()
    w.submit("/a", STR, string("x"), T0)
    with pytest.raises(RecordingError, match="must be strings"):
        w.close({"rynn_teleop.count": 3})
    assert w.failed and errors == [w.error] and not (tmp_path / "bag" / "metadata.yaml").exists()


def test_unknown_types_are_recorded_with_an_empty_definition(tmp_path):
    w = EpisodeWriter(tmp_path / "bag")
    w.open()
    payload = b"\x00\x01\x00\x00custom"
    assert w.submit("/vendor", "vendor_msgs/msg/Thing", payload, T0)
    w.close()
    with Reader(tmp_path / "bag") as reader:
        [(conn, t, data)] = list(reader.messages())
    assert (conn.msgtype, t, bytes(data)) == ("vendor_msgs/msg/Thing", T0, payload)


def test_description_can_change_while_recording(tmp_path):
    rec = EpisodeRecorder(tmp_path, {"/x": None})
    bag = rec.start(EpisodeMetadata(task="pour", notes="", camera_sources=["physical"]), now_ns=T0)
    rec.describe(notes="spilled at the end")
    rec.add_camera_source("generated")  # the feed switched mid-episode
    rec.add_camera_source("physical")
    with pytest.raises(RecordingError, match="unknown episode description field"):
        rec.describe(mood="good")
    rec.stop(now_ns=T0 + MS)
    side = yaml.safe_load((bag / "episode.yaml").read_text())
    assert (side["task"], side["notes"]) == ("pour", "spilled at the end")
    assert side["camera_sources"] == ["physical", "generated"]
    custom = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]["custom_data"]
    assert custom["rynn_teleop.notes"] == "spilled at the end"
    with pytest.raises(RecordingError, match="no episode"):
        rec.describe(notes="too late")


def test_an_episode_window_cuts_every_topic_at_the_same_receive_times():
    items = [(90, "a"), (100, "b"), (150, "a"), (200, "b"), (201, "a")]
    assert split_at_window(items) == (items, [])
    assert split_at_window(items, since_ns=100) == ([(100, "b"), (150, "a"), (200, "b"), (201, "a")], [(90, "a")])
    assert split_at_window(items, until_ns=200) == ([(90, "a"), (100, "b"), (150, "a"), (200, "b")], [(201, "a")])
    assert split_at_window(items, 100, 150) == ([(100, "b"), (150, "a")], [(90, "a"), (200, "b"), (201, "a")])
