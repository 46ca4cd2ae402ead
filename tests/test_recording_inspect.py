"""Episode integrity and inspection (recording.stats, recording.inspect): gaps, check, list, info, plot, preview."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from rynn_teleop.recording import (
    EpisodeMetadata,
    EpisodeRecorder,
    Gap,
    episode_stats,
    topic_stats,
)
from rynn_teleop.recording.inspect import (
    episode_info,
    episodes_main,
    image_to_bgr,
    list_episodes,
)

TS = get_typestore(Stores.ROS2_KILTED)
MS = 1_000_000  # [ns]
T0 = 1_700_000_000 * 1_000_000_000  # [ns]
JS = "sensor_msgs/msg/JointState"
IMG = "sensor_msgs/msg/Image"


def header(stamp_ns: int) -> object:
    Time = TS.types["builtin_interfaces/msg/Time"]
    return TS.types["std_msgs/msg/Header"](stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id="")


def joint_state(stamp_ns: int, names: list[str], positions) -> bytes:
    msg = TS.types["sensor_msgs/msg/JointState"](
        header=header(stamp_ns),
        name=names,
        position=np.asarray(positions, float),
        velocity=np.zeros(0),
        effort=np.zeros(0),
    )
    return bytes(TS.serialize_cdr(msg, JS))


def rgb_image(stamp_ns: int, frame: np.ndarray, encoding: str = "rgb8") -> bytes:
    h, w = frame.shape[:2]
    channels = 1 if frame.ndim == 2 else frame.shape[2]
    msg = TS.types["sensor_msgs/msg/Image"](
        header=header(stamp_ns), height=h, width=w, encoding=encoding, is_bigendian=0,
        step=w * channels * frame.itemsize, data=np.frombuffer(frame.tobytes(), np.uint8),
    )
    return bytes(TS.serialize_cdr(msg, IMG))


# -- statistics ---------------------------------------------------------------------------------


def test_gap_detection_on_a_stream_with_an_injected_pause():
    times = [T0 + i * 10 * MS for i in range(100)]  # 100 Hz for 1 s ...
    times += [T0 + 1_300 * MS + i * 10 * MS for i in range(70)]  # ... a 0.31 s pause, then 0.7 s more
    s = topic_stats("/a", JS, times, start_ns=T0, stop_ns=T0 + 2_000 * MS, expected_rate_hz=100.0)
    assert s.gaps == (Gap(T0 + 990 * MS, T0 + 1_300 * MS),)
    assert s.gaps[0].duration_s == pytest.approx(0.31)
    assert (s.received, s.expected) == (170, 200)


def test_a_silence_of_up_to_three_periods_is_not_a_gap_and_a_silent_tail_is():
    times = [T0 + i * 10 * MS for i in range(50)] + [T0 + 520 * MS]  # 30 ms: exactly 3 periods
    s = topic_stats("/a", JS, times, start_ns=T0, stop_ns=T0 + 550 * MS, expected_rate_hz=100.0)
    assert s.gaps == ()
    tail = topic_stats("/a", JS, times, start_ns=T0, stop_ns=T0 + 600 * MS, expected_rate_hz=100.0)
    assert tail.gaps == (Gap(T0 + 520 * MS, T0 + 600 * MS),)  # the stream died before the stop
    late = topic_stats("/a", JS, times, start_ns=T0 - 50 * MS, stop_ns=T0 + 550 * MS, expected_rate_hz=100.0)
    assert late.gaps == (Gap(T0 - 50 * MS, T0),)  # it started late


def test_topics_without_a_configured_rate_get_counts_and_rate_but_no_gaps():
    times = [T0, T0 + 10 * MS, T0 + 5_000 * MS]
    s = topic_stats("/event", "std_msgs/msg/String", times, start_ns=T0, stop_ns=T0 + 9_000 * MS)
    assert s.gaps == () and s.expected is None and s.rate_hz == pytest.approx(2 / 5.0)
    e = episode_stats({"/event": ("std_msgs/msg/String", times)}, start_ns=T0, stop_ns=T0 + 9_000 * MS,
                      expected_rates={"/event": None, "/never": 30.0}, dropped={"/event": 2})
    assert e.missing == ("/never",)
    assert e.problems() == [
        "/never: configured but never received",
        "/event: 2 message(s) published but not recorded (dropped)",
    ]
    assert type(e).from_dict(e.to_dict()) == e


def test_gaps_between_messages_use_header_stamps_not_receive_jitter():
    # 200 Hz, regular capture stamps, receive times jittered by up to 25 ms (5 periods): no sample lost.
    rng = np.random.default_rng(0)
    stamps = [T0 + i * 5 * MS for i in range(400)]
    times = sorted(t + int(rng.integers(0, 25 * MS)) for t in stamps)  # delivered in order, late by 0-25 ms
    stamps = sorted(stamps)
    window = {"start_ns": T0 + 25 * MS, "stop_ns": T0 + 1_995 * MS, "expected_rate_hz": 200.0}  # mid-stream
    assert topic_stats("/arms/command", JS, times, stamps_ns=stamps, **window).gaps == ()
    assert topic_stats("/arms/command", JS, times, **window).gaps != ()  # receive times alone report "gaps"
    # String topics (no header, no stamps) still use receive times.
    e = episode_stats({"/s": ("std_msgs/msg/String", times)}, expected_rates={"/s": 200.0},
                      start_ns=window["start_ns"], stop_ns=window["stop_ns"])
    assert e.topics["/s"].gaps and all(g.clock == "receive" for g in e.topics["/s"].gaps)


def test_a_pause_in_the_header_stamps_is_a_gap_even_with_regular_receive_times():
    times = [T0 + i * 10 * MS for i in range(100)]  # 100 Hz receive times, steady
    stamps = [T0 - 20 * MS + i * 10 * MS + (300 * MS if i >= 50 else 0) for i in range(100)]  # capture paused 0.3 s
    s = topic_stats("/a", JS, times, start_ns=T0, stop_ns=T0 + 1_000 * MS, expected_rate_hz=100.0, stamps_ns=stamps)
    assert s.gaps == (Gap(stamps[49], stamps[50], "header", times[49]),)
    assert s.gaps[0].duration_s == pytest.approx(0.31) and (s.first_ns, s.last_ns) == (times[0], times[-1])
    e = episode_stats({"/a": (JS, times)}, start_ns=T0, stop_ns=T0 + 1_000 * MS, expected_rates={"/a": 100.0},
                      stamps={"/a": stamps})
    assert e.problems() == ["/a: 1 gap(s) longer than 3 periods of 100 Hz, longest 0.310 s at +0.490 s (header stamps)"]
    assert type(e).from_dict(e.to_dict()).topics["/a"].gaps == s.gaps  # the clock survives episode.yaml
    # One unset (0) stamp: receive times for the whole topic (regular here, so no gap).
    unset = topic_stats("/a", JS, times, start_ns=T0, stop_ns=T0 + 1_000 * MS, expected_rate_hz=100.0,
                        stamps_ns=[0] + stamps[1:])
    assert unset.gaps == ()


def test_interleaved_publishers_are_merged_on_sorted_stamps_and_head_tail_use_receive_times():
    # Two drivers at 50 Hz each on one 100 Hz topic, offset by 10 ms; received in bursts, out of stamp order.
    arm = [T0 + 20 * MS * i for i in range(50)]
    hand = [t + 10 * MS for t in arm]
    stamps = [s for pair in zip(hand, arm) for s in pair]
    times = [T0 + 40 * MS * (k // 4) + k for k in range(100)]  # 4 messages every 40 ms
    s = topic_stats("/joint_states", JS, times, start_ns=T0, stop_ns=T0 + 980 * MS, expected_rate_hz=100.0,
                    stamps_ns=stamps)
    assert s.gaps == ()
    # The stream starts late and stops early on the receive clock: head and tail silences.
    late = topic_stats("/joint_states", JS, times, start_ns=T0 - 100 * MS, stop_ns=T0 + 1_200 * MS,
                       expected_rate_hz=100.0, stamps_ns=stamps)
    assert late.gaps == (Gap(T0 - 100 * MS, times[0]), Gap(times[-1], T0 + 1_200 * MS))


def test_a_shared_topic_measures_gaps_in_periods_of_its_fastest_publisher(tmp_path):
    """/joint_states: an arm driver at 200 Hz and a hand driver at 100 Hz (300 Hz together). A 12 ms pause of
    both is no gap for either (3 periods of 200 Hz = 15 ms) though it is 3.6 periods of the 300 Hz sum; a
    20 ms pause is one. The gap rate is stored with the episode and used offline and by recover."""
    from rynn_teleop.recording.metadata import read_sidecar, write_sidecar
    from rynn_teleop.recording.recover import recover_bag

    def stream(pause_ms: int) -> list[tuple[int, bytes]]:
        out = []
        for i in range(200):  # 1 s of the arm driver, the hand driver every other tick
            t = T0 + 5 * MS * i + (pause_ms * MS if i >= 100 else 0)
            out.append((t, joint_state(t, ARMS, np.zeros(3))))
            if i % 2 == 0:
                out.append((t + MS, joint_state(t + MS, HANDS, np.zeros(2))))
        return out

    merged = [t for t, _ in stream(7)]  # a 12 ms silence at i = 100
    sum_rate = topic_stats("/joint_states", JS, merged, start_ns=T0, stop_ns=merged[-1], expected_rate_hz=300.0,
                           stamps_ns=merged)
    assert len(sum_rate.gaps) == 1  # judged by the 300 Hz sum: a false gap
    fastest = topic_stats("/joint_states", JS, merged, start_ns=T0, stop_ns=merged[-1], expected_rate_hz=300.0,
                          stamps_ns=merged, gap_rate_hz=200.0)
    assert fastest.gaps == () and fastest.gap_rate_hz == 200.0 and fastest.expected_rate_hz == 300.0

    # the arm driver stops half-way: the hand driver's 100 Hz keeps the stream free of 15 ms gaps, the rate shows it
    half = [t for t, _ in stream(0) if t < T0 + 500 * MS or (t - T0) % (5 * MS) == MS]
    dead = episode_stats({"/joint_states": (JS, half)}, start_ns=T0, stop_ns=half[-1],
                         expected_rates={"/joint_states": 300.0}, stamps={"/joint_states": half},
                         gap_rates={"/joint_states": 200.0})
    assert dead.topics["/joint_states"].gaps == ()
    assert dead.problems() == [f"/joint_states: {dead.topics['/joint_states'].rate_hz:.1f} Hz, more than 10% below "
                               "the expected 300 Hz"]

    for pause_ms, gaps in ((7, 0), (15, 1)):
        rec = EpisodeRecorder(tmp_path / str(pause_ms), {"/joint_states": 300.0}, gap_rates={"/joint_states": 200.0})
        rec.start(EpisodeMetadata(task="shared"), now_ns=T0)
        msgs = stream(pause_ms)
        for t, data in msgs:
            rec.submit("/joint_states", JS, data, t)
        summary = rec.stop(now_ns=msgs[-1][0])
        assert len(summary.stats.topics["/joint_states"].gaps) == gaps
        assert len(episode_info(summary.path).stats.topics["/joint_states"].gaps) == gaps
        if gaps:
            assert "periods of 200 Hz" in summary.problems[0]
            doc = read_sidecar(summary.path)
            doc.update(state="recording")
            doc.pop("stats")
            write_sidecar(summary.path, doc)
            (summary.path / "metadata.yaml").unlink()
            assert len(recover_bag(summary.path, force=True).stats.topics["/joint_states"].gaps) == 1


def test_live_offline_and_recovered_stats_use_header_stamps(tmp_path):
    from rynn_teleop.recording.metadata import read_sidecar, write_sidecar
    from rynn_teleop.recording.recover import recover_bag

    rates = {"/arms/command": 200.0, "/event": 200.0}
    rng = np.random.default_rng(1)

    def record(pause: bool):
        rec = EpisodeRecorder(tmp_path, rates)
        rec.start(EpisodeMetadata(task="jitter"), now_ns=T0)
        msgs = []
        for i in range(200):
            stamp = T0 + 2 * MS + i * 5 * MS + (100 * MS if pause and i >= 100 else 0)
            t = T0 + 2 * MS + i * 5 * MS + (0 if pause else int(rng.integers(0, 20 * MS)))  # jitter, or steady
            msgs.append(("/arms/command", JS, joint_state(stamp, ARMS, np.zeros(3)), t))
            msgs.append(("/event", "std_msgs/msg/String", b"\x00\x01\x00\x00\x02\x00\x00\x00x\x00", t))
        for topic, type_name, data, t in sorted(msgs, key=lambda m: m[3]):
            rec.submit(topic, type_name, data, t)
        return rec.stop(now_ns=T0 + 1_000 * MS)

    jitter, paused = record(False), record(True)
    # Jitter only: the JointState topic is clean; the String topic (receive times) reports gaps.
    for stats in (jitter.stats, episode_info(jitter.path).stats):
        assert stats.topics["/arms/command"].gaps == ()
        assert stats.topics["/event"].gaps != ()
    # A real pause in the capture stamps with steady receive times: one header gap; /event clean.
    def check(stats):
        (gap,) = stats.topics["/arms/command"].gaps
        assert gap.clock == "header" and gap.duration_s == pytest.approx(0.105)
        assert stats.topics["/event"].gaps == ()

    check(paused.stats)
    check(episode_info(paused.path).stats)
    doc = read_sidecar(paused.path)
    doc.update(state="recording")
    doc.pop("stats")
    write_sidecar(paused.path, doc)
    (paused.path / "metadata.yaml").unlink()
    check(recover_bag(paused.path, force=True).stats)


# -- episodes on disk ---------------------------------------------------------------------------

ARMS = [f"arm_{i}" for i in range(3)]
HANDS = [f"hand_{i}" for i in range(2)]
RATES = {"/arms/command": 100.0, "/hands/command": 50.0, "/joint_states": 100.0, "/head_camera/color/image_raw": 20.0}


def record_episode(out_dir, *, pause: bool = False, task: str = "wave") -> None:
    """1 s of commands, joint states (the arms lag their commands) and 20 Hz 64x48 frames; optionally a 0.3 s pause."""
    rec = EpisodeRecorder(out_dir, RATES)
    rec.start(EpisodeMetadata(task=task, operator="bob"), now_ns=T0)
    msgs = []
    for i in range(100):
        t = T0 + 5 * MS + i * 10 * MS
        if pause and 40 <= i < 70:
            continue  # the arm driver stalls for 0.3 s
        q = np.sin(np.arange(3) + i * 0.05)
        msgs.append(("/arms/command", JS, joint_state(t, ARMS, q), t))
        msgs.append(("/joint_states", JS, joint_state(t, ARMS, np.sin(np.arange(3) + (i - 5) * 0.05)), t + MS))
        if i % 2 == 0:
            msgs.append(("/hands/command", JS, joint_state(t, HANDS, [0.01 * i, -0.01 * i]), t + 2 * MS))
            msgs.append(("/joint_states", JS, joint_state(t, HANDS, [0.01 * i - 0.05, -0.01 * i]), t + 3 * MS))
    for k in range(20):
        frame = np.zeros((48, 64, 3), np.uint8)
        frame[:, : 3 * k + 1, 0] = 255  # a red bar growing to the right
        t = T0 + 10 * MS + k * 50 * MS
        msgs.append(("/head_camera/color/image_raw", IMG, rgb_image(t, frame), t))
    for topic, type_name, data, t in sorted(msgs, key=lambda m: m[3]):
        rec.submit(topic, type_name, data, t)
    rec.stop(now_ns=T0 + 1_000 * MS)


def test_check_passes_a_clean_episode_and_fails_one_with_a_pause(tmp_path, capsys):
    record_episode(tmp_path / "out")
    record_episode(tmp_path / "out", pause=True)
    clean, paused = tmp_path / "out" / "episode_0001", tmp_path / "out" / "episode_0002"
    assert episodes_main(["check", str(clean)]) == 0
    assert episodes_main(["check", str(paused)]) == 1
    out = capsys.readouterr().out
    assert "/arms/command: 1 gap(s)" in out and "/joint_states: 1 gap(s)" in out
    assert episodes_main(["check", str(tmp_path / "out")]) == 1  # an output directory: every episode
    info = episode_info(paused)
    assert not info.ok and info.stats.topics["/arms/command"].gaps[0].duration_s == pytest.approx(0.31)
    # A rate given on the command line adds gap detection to a topic recorded without one.
    assert episodes_main(["check", str(clean), "--rate", "/head_camera/color/image_raw=100"]) == 1


def test_list_and_info(tmp_path, capsys):
    record_episode(tmp_path, task="wave")
    record_episode(tmp_path, pause=True, task="stall")
    rows = list_episodes(tmp_path)
    assert [(r.path.name, r.state, r.task, r.problem_count) for r in rows] == [
        ("episode_0001", "complete", "wave", 0),
        ("episode_0002", "complete", "stall", 5),  # 3 paused topics; arms and hands short of their rates
    ]
    assert rows[0].duration_s == pytest.approx(1.0) and rows[0].message_count == 320
    assert episodes_main(["list", str(tmp_path)]) == 0
    assert "episode_0002" in capsys.readouterr().out
    assert episodes_main(["info", str(tmp_path / "episode_0001"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    js = info["stats"]["topics"]["/joint_states"]
    assert (info["task"], js["received"], js["expected"], js["rate_hz"] > 0) == ("wave", 150, 100, True)
    assert info["stats"]["duration_s"] == pytest.approx(1.0) and info["problems"] == []
    assert episodes_main(["info", str(tmp_path / "episode_0002")]) == 0
    text = capsys.readouterr().out
    assert "/head_camera/color/image_raw" in text and "longest gap s" in text and "gap(s)" in text


def test_info_writes_a_joint_plot_and_a_camera_preview(tmp_path):
    record_episode(tmp_path)
    png, mp4 = tmp_path / "joints.png", tmp_path / "camera.mp4"
    assert episodes_main(["info", str(tmp_path / "episode_0001"), "--plot", str(png), "--video", str(mp4)]) == 0
    plot = cv2.imread(str(png))
    assert plot is not None and plot.shape[0] > 100 and plot.shape[1] >= 6 * 300
    red = (plot[:, :, 2] > 150) & (plot[:, :, 0] < 100)
    blue = (plot[:, :, 0] > 150) & (plot[:, :, 2] < 100)
    assert red.sum() > 100 and blue.sum() > 100  # both curves drawn
    video = cv2.VideoCapture(str(mp4))
    frames = []
    while True:
        ok, frame = video.read()
        if not ok:
            break
        frames.append(frame)
    assert len(frames) == 20 and frames[0].shape == (48, 64, 3)
    assert video.get(cv2.CAP_PROP_FPS) == pytest.approx(20.0, rel=0.01)
    bottom = frames[-1][40:, :, :]  # below the printed time: the red bar grew to 58 px
    assert bottom[:, :50, 2].mean() > 150 and bottom[:, 62:, 2].mean() < 60


def test_image_conversion_for_the_preview():
    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[..., 0] = 200
    msg = TS.deserialize_cdr(rgb_image(T0, rgb), IMG)
    assert image_to_bgr(msg)[0, 0].tolist() == [0, 0, 200]
    depth = np.array([[0, 1000], [2000, 4000]], np.uint16)
    msg = TS.deserialize_cdr(rgb_image(T0, depth, "16UC1"), IMG)
    assert image_to_bgr(msg)[:, :, 0].tolist() == [[0, 63], [127, 255]]


def test_unclosed_episode_needs_recover_and_errors_exit_2(tmp_path, capsys):
    record_episode(tmp_path)
    bag = tmp_path / "episode_0001"
    (bag / "metadata.yaml").unlink()
    assert episodes_main(["check", str(bag)]) == 1
    assert "episodes recover" in capsys.readouterr().out
    assert episodes_main(["recover", str(bag)]) == 0
    assert episodes_main(["check", str(bag)]) == 0
    assert episodes_main(["info", str(tmp_path / "nowhere")]) == 2
    assert "error:" in capsys.readouterr().err
    assert episodes_main(["check", str(bag), "--rate", "bad"]) == 2
    assert episodes_main(["info", str(tmp_path), "--plot", str(tmp_path / "x.png")]) == 0  # one episode in it
    record_episode(tmp_path)
    assert episodes_main(["info", str(tmp_path), "--plot", str(tmp_path / "x.png")]) == 2  # two: which one?
