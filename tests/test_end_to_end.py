"""End to end: the digital-teleoperation demo (composed runner processes, real rclpy, about 20 s), then its episode.

The README's first command runs the same thing. Everything asserted here is read back from the recorded
episode, as a lab engineer would check a demonstration.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from rynn_teleop.core.robot_model import RobotModel, arm_joint_names
from rynn_teleop.core.status import ArmIKStatus
from rynn_teleop.demo import DEMO_TOPICS
from rynn_teleop.recording.inspect import episode_info
from rynn_teleop.sources.playback import open_bag

DURATION = 20.0


@pytest.fixture(scope="module")
def demo(module_ros_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "demo", "--duration", str(DURATION),
                           "--out", str(out)], env=module_ros_env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    episode = Path(proc.stdout.strip().splitlines()[-1])  # the episode directory is the last line printed
    assert proc.stdout.strip().splitlines()[-2].startswith("outcome: ")  # the twin's judgement, just before it
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_not_json)  # strict: no NaN
    assert summary["episode"] == str(episode)
    assert summary["arms"] == {"engaged": True, "calibrated": True}
    messages: dict[str, list] = defaultdict(list)
    store = get_typestore(Stores.ROS2_JAZZY)
    reader = open_bag(episode, "end-to-end test")
    try:
        for conn, t, raw in reader.messages():
            messages[conn.topic].append((t, store.deserialize_cdr(raw, conn.msgtype)))
    finally:
        reader.close()
    return {"out": out, "episode": episode, "summary": summary, "messages": messages, "stdout": proc.stdout}


def _not_json(constant: str):
    raise ValueError(f"summary.json holds {constant}, which JSON readers outside Python reject")


def _stamp_ns(msg) -> int:
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


def test_every_expected_topic_flows_at_least_at_half_its_rate(demo):
    """Rates to the 5 % are the bench's (bench/stack.py); here a topic at half its rate means a broken stream."""
    info = episode_info(demo["episode"])
    expected = {t: r for t, r in DEMO_TOPICS.items() if r}
    assert not info.stats.missing and set(expected) <= set(info.stats.topics)
    slow = {t: round(info.stats.topics[t].rate_hz or 0.0, 1) for t, r in expected.items()
            if (info.stats.topics[t].rate_hz or 0.0) < 0.5 * r}
    assert not slow, f"topics below half their rate (measured Hz): {slow}"


def _stamps_s(msgs) -> np.ndarray:
    return np.array([_stamp_ns(m) for m in msgs], dtype=np.int64) * 1e-9


def test_arm_commands_within_the_limits_over_their_own_header_stamps(demo):
    """Each command's position is where the trajectory is at its stamp: differenced over the stamps, the
    commands stay within the position, velocity and acceleration limits (what a policy trained on the episode
    learns), whatever the load was."""
    robot = RobotModel.default()
    names = list(arm_joint_names("left") + arm_joint_names("right"))
    lim = robot.limits[robot.indices(names)]
    commands = [m for _, m in demo["messages"]["/arms/command"]]
    assert len(commands) > 0.5 * 200 * DURATION
    assert all(list(m.name) == names for m in commands)
    q = np.array([m.position for m in commands])
    v_field = np.array([m.velocity for m in commands])
    assert np.all(np.isfinite(q)) and np.all(np.isfinite(v_field))
    assert np.all(q >= lim.lower - 1e-9) and np.all(q <= lim.upper + 1e-9)
    assert np.all(np.abs(v_field) <= lim.velocity + 1e-9)
    t = _stamps_s(commands)
    assert np.all(np.diff(t) > 0), "command stamps must increase"
    v = np.diff(q, axis=0) / np.diff(t)[:, None]
    mid = 0.5 * (t[1:] + t[:-1])
    a = np.diff(v, axis=0) / np.diff(mid)[:, None]
    assert np.max(np.abs(v) / lim.velocity) <= 1.05
    assert np.max(np.abs(a) / lim.acceleration) <= 1.05
    assert np.ptp(q, axis=0).max() > 0.1  # the arms followed the operator's pick-and-place


def test_ik_ran_and_the_operator_was_followed(demo):
    """arm_ik reports itself engaged and solving while the episode ran (its recorded diagnostics)."""
    statuses = [st for _, m in demo["messages"]["/diagnostics"] for st in m.status if st.name == "arm_ik"]
    assert statuses, "no arm_ik diagnostics in the episode"
    values = [{kv.key: kv.value for kv in st.values} for st in statuses]
    typed = [ArmIKStatus.decode(v) for v in values]  # what the console reads
    assert all(s.engaged and s.calibrated for s in typed)
    assert any("ik_time_p50_ms" in v for v in values)
    for side in ("left", "right"):
        assert any(s.following[side] for s in typed), f"the {side} arm never followed"


def test_generated_frames_at_the_rate_with_command_stamps(demo):
    msgs = demo["messages"]
    command_stamps = {_stamp_ns(m) for topic in ("/arms/command", "/hands/command") for _, m in msgs[topic]}
    frames = [m for _, m in msgs["/head_camera/generated/color/image_raw"]]
    assert len(frames) >= 0.5 * 30 * DURATION
    stamps = [_stamp_ns(m) for m in frames]
    # a frame recorded just after the start may show a command from just before it (not in the bag), and one
    # recorded just before the stop a command that reached the recorder after it; between the first and the
    # last recorded command of each topic, every command is in the bag, whichever topic a frame's stamp is from
    spans = [[_stamp_ns(m) for _, m in msgs[topic]] for topic in ("/arms/command", "/hands/command")]
    first, last = max(min(s) for s in spans), min(max(s) for s in spans)
    recorded = [s for s in stamps if first <= s <= last]
    assert len(recorded) >= len(stamps) - 3
    missing = [s for s in recorded if s not in command_stamps]
    assert not missing, f"{len(missing)} of {len(recorded)} frames carry a stamp that is no command's"
    assert len(set(stamps)) == len(stamps)


def test_the_feed_toggle_shows_on_the_active_source_topic_and_in_the_camera_stream(demo):
    msgs = demo["messages"]
    sources = [m.data for _, m in msgs["/head_camera/active_source"]]
    assert sources == ["generated", "physical", "generated"]
    generated = {_stamp_ns(m) for _, m in msgs["/head_camera/generated/color/image_raw"]}
    out_stamps = [_stamp_ns(m) for _, m in msgs["/head_camera/color/image_raw"]]
    # the first output frame(s) may forward a generated frame received just before the episode started, and the
    # last ones one whose original came in just after it stopped (neither in the bag): those precede (follow)
    # every recorded generated frame and say nothing about the switch
    assert generated and out_stamps
    first, last = min(generated), max(generated)
    lead = next((i for i, s in enumerate(out_stamps) if s >= first), len(out_stamps))
    end = len(out_stamps) - next((i for i, s in enumerate(reversed(out_stamps)) if s <= last), len(out_stamps))
    assert lead <= 3 and len(out_stamps) - end <= 3, (lead, len(out_stamps) - end)
    shown = ["generated" if s in generated else "physical" for s in out_stamps[lead:end]]
    runs = [shown[0]] + [b for a, b in zip(shown, shown[1:]) if a != b]
    assert runs == ["generated", "physical", "generated"]  # switched immediately, no stale frame after a switch
    # the physical feed was shown through the middle fifth of the run: its frames span most of it (a span, not a
    # count: a loaded machine delivers fewer frames, over the same time)
    physical = [s for s, which in zip(out_stamps[lead:end], shown) if which == "physical"]
    assert len(physical) >= 10 and (max(physical) - min(physical)) / 1e9 >= 0.5 * DURATION * 0.2


def test_nothing_dropped_no_nan_and_the_plot_and_preview_exist(demo):
    """No topic missing, nothing dropped (publisher sequence numbers), no NaN in a command or joint state. Gaps
    and rates to the 10 % (``episodes check``) depend on the machine's load: the bench and the demo report them."""
    info = episode_info(demo["episode"])
    assert not info.stats.missing
    assert {t: s.dropped for t, s in info.stats.topics.items() if s.dropped} == {}
    for topic in ("/arms/command", "/hands/command", "/joint_states"):
        values = np.concatenate([np.asarray(m.position, dtype=float) for _, m in demo["messages"][topic]])
        assert values.size and np.all(np.isfinite(values)), topic
    assert (demo["out"] / "joints.png").stat().st_size > 10_000
    assert (demo["out"] / "preview.mp4").stat().st_size > 10_000


def test_the_grasp_moves_the_cube_on_the_twin_and_the_twin_judges_the_episode(demo):
    """The demo resets the twin just before the episode and the synthetic operator picks the red cube: the
    recorded object poses show it lifted and carried; episode.yaml holds the twin's judgement."""
    import yaml

    scenes = [json.loads(m.data) for _, m in demo["messages"]["/twin/scene"]]
    assert scenes and scenes[-1]["scene"] == "pick_place" and scenes[-1]["resets"] >= 1  # a reset's layout
    cube = [o["name"] for o in scenes[-1]["objects"]].index("red_cube")
    positions = np.array([[p.position.x, p.position.y, p.position.z]
                          for _, m in demo["messages"]["/twin/objects"] for p in [m.poses[cube]]])
    assert len(positions) > 100
    lifted = positions[:, 2].max() - positions[0, 2]
    carried = np.linalg.norm(positions[-1, :2] - positions[0, :2])
    assert lifted > 0.05 and carried > 0.05, (lifted, carried)  # [m] the grasp moved it (not a kinematic picture)
    doc = yaml.safe_load((demo["episode"] / "episode.yaml").read_text())
    assert doc["outcome"] in ("success", "failure") and doc["outcome_reason"]
    assert demo["stdout"].strip().splitlines()[-2] == (f"outcome: {doc['outcome']} ({doc['outcome_reason']})")


def test_the_twin_video_shows_what_physics_did(demo, tmp_path):
    """twin.mp4: the recorded robot and objects drawn after the episode, a frame per 1/30 s of it; an episode
    without a twin has none to draw (a named error)."""
    import cv2

    from rynn_teleop.recording.errors import RecordingError
    from rynn_teleop.sources.camera.twin_video import twin_video

    cap = cv2.VideoCapture(str(demo["out"] / "twin.mp4"))
    frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    ok, first = cap.read()
    cap.set(cv2.CAP_PROP_POS_FRAMES, frames - 1)
    ok_last, last = cap.read()
    cap.release()
    assert ok and ok_last and abs(frames - 30 * DURATION) <= 60, frames
    changed = (np.abs(first.astype(int) - last.astype(int)).max(axis=2) > 40).mean()
    assert changed > 0.01, changed  # more than the time stamp's text: the cube moved (4.5 % of the pixels here)
    from recording_episodes import build_episode

    plain = build_episode(tmp_path, digital=True)  # recorded without a twin
    with pytest.raises(RecordingError, match="no twin"):
        twin_video(plain, tmp_path / "x.mp4")
