"""Digital episodes judged by the twin (world_model.training.judge): episodes built without ROS from the scripted
operator's run of pick_place at seed 0 (its commands, ``/twin/scene``, ``/twin/objects``), whose "generated" feed is
either the twin's own renders of that run (the video shows the cube carried into the goal) or its first frame
repeated (the video shows nothing move). The commands succeed on the twin in both; the judge must say the first
video shows the cube in the goal and the second does not, and write every file it promises."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from recording_episodes import MS, T0, _image, _string, build_episode
from twin_episodes import TwinRun, _pose_array, command_messages, scripted_twin_run

from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, RobotModel
from rynn_teleop.errors import run_command
from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder
from rynn_teleop.recording.errors import DATA_EXIT_CODE, EpisodeDataError
from rynn_teleop.recording.replay import ReplayOptions
from rynn_teleop.sim.scene import load_scene
from rynn_teleop.world_model.training import judge as jg
from rynn_teleop.world_model.training.objects import NotTwinEpisodeError

SCENE, SEED = "pick_place", 0
W, H = 96, 72  # [px] the "generated" frames
FPS = 2.0  # [Hz] of the "generated" feed
OPTIONS = ReplayOptions(settle_s=0.5)  # the plan ends 2.8 s after the release: the cube rests by then


def twin_renders(run: TwinRun, fps: float = FPS) -> list[tuple[float, np.ndarray]]:
    """(plan time [s], frame) of the run drawn by the twin's head camera at ``fps``: the robot at its joint
    targets, the objects at their poses, at every ``1 / fps`` of the run and at its end."""
    camera = jg.twin_camera(W, H, run.scene_json, RobotModel.default())
    step = max(1, round(1.0 / (fps * (run.targets[1][0] - run.targets[0][0]))))
    picks = sorted({*range(0, len(run.targets), step), len(run.targets) - 1})
    try:
        return [(run.targets[k][0], jg.render_state(camera, run.targets[k][1], run.objects[k][1])) for k in picks]
    finally:
        camera.close()


def digital_episode(output_dir: Path, run: TwinRun, frames: list[tuple[float, np.ndarray]], *, scene: bool = True,
                    objects: bool = True, generated: bool = True) -> Path:
    """Record ``run`` as the digital mode records it: the commands (``/arms/command`` at 100 Hz, one hand per
    ``/hands/command``), ``/twin/scene`` (unless ``scene`` is False), ``/twin/objects`` at 50 Hz (unless
    ``objects`` is False), ``frames`` on the generated feed (unless ``generated`` is False) stamped at their plan
    time, and ``extra.twin`` in ``episode.yaml``."""
    topics = {"/arms/command": 100.0, "/hands/command": 200.0, "/twin/objects": None, "/twin/scene": None,
              jg.GENERATED_TOPIC: FPS}
    rec = EpisodeRecorder(output_dir, topics, flush_period_s=10.0)
    meta = EpisodeMetadata(task="scripted", operator="rollout", camera_sources=["generated"],
                           extra={"twin": {"scene": SCENE, "seed": SEED}})
    path = rec.start(meta, now_ns=T0)
    msgs: list[tuple[int, str, str, bytes]] = []
    if scene:
        msgs.append((T0 + 1 * MS, "/twin/scene", "std_msgs/msg/String", _string(run.scene_json)))
    msgs += command_messages(run.targets)
    if objects:
        for t, poses in run.objects[::2]:
            s = T0 + int(round(t * 1e9))
            msgs.append((s + 1 * MS, "/twin/objects", "geometry_msgs/msg/PoseArray", _pose_array(s, poses)))
    if generated:
        for t, frame in frames:
            s = T0 + int(round(t * 1e9))
            msgs.append((s + 4 * MS, jg.GENERATED_TOPIC, "sensor_msgs/msg/Image", _image(s, frame)))
    for receive, topic, type_name, data in sorted(msgs, key=lambda m: m[0]):
        rec.submit(topic, type_name, data, receive)
    rec.stop(now_ns=T0 + int(round((run.targets[-1][0] + 0.05) * 1e9)))
    return path


@pytest.fixture(scope="module")
def run() -> TwinRun:
    run = scripted_twin_run(SCENE, SEED)
    assert run.label == "success"
    return run


@pytest.fixture(scope="module")
def judged(run, tmp_path_factory):
    """Both episodes judged in one run: (report, [faithful episode, frozen episode], the faithful frames)."""
    root = tmp_path_factory.mktemp("judge")
    frames = twin_renders(run)
    frozen = [(t, frames[0][1]) for t, _ in frames]
    episodes = [digital_episode(root / "faithful", run, frames), digital_episode(root / "frozen", run, frozen)]
    report = jg.judge(episodes, root / "report", options=OPTIONS)
    return report, episodes, frames


def test_twin_renders_of_a_successful_run_are_judged_in_the_target_and_agree(judged, run):
    report, episodes, _ = judged
    result = report.results[0]
    assert result.episode == str(episodes[0]) and (result.scene, result.seed) == (SCENE, SEED)
    assert result.twin_success is True and result.twin_outcome == "success"
    assert result.twin_reason == "red_cube rests in goal, released"
    assert (result.task_object, result.target) == ("red_cube", "goal")
    assert result.generated_shows_in_target is True and result.agree is True
    assert result.psnr_in_db > result.psnr_out_db and result.margin_db > 3.0
    assert result.frame_size == (W, H) and result.generated_frames == len(judged[2])
    assert result.arrived and result.commands_sent == 3 * len(run.targets)  # an arm and two hand commands a period
    u0, v0, u1, v1 = result.target_box
    assert 0 <= u0 < u1 <= W and 0 <= v0 < v1 <= H
    assert result.event == "first lift"
    goal = load_scene(SCENE).layout(SEED).targets["goal"]
    assert goal.contains(np.array(result.final_object_poses["red_cube"][:3]))


def test_frozen_frames_of_the_same_commands_are_judged_out_of_the_target_and_disagree(judged):
    report, episodes, _ = judged
    result = report.results[1]
    assert result.episode == str(episodes[1])
    assert result.twin_success is True  # the same commands
    assert result.generated_shows_in_target is False and result.agree is False
    assert result.psnr_out_db > result.psnr_in_db and result.margin_db < -3.0
    assert result.target_box == report.results[0].target_box


def test_the_report_folder_holds_every_promised_file(judged):
    report, episodes, _ = judged
    folder = report.folder
    doc = json.loads((folder / jg.REPORT_FILE).read_text())
    assert doc["format"] == jg.JUDGE_FORMAT and doc["complete"] is True
    assert doc["settings"]["generated_topic"] == jg.GENERATED_TOPIC
    assert doc["settings"]["replay"]["settle_s"] == OPTIONS.settle_s
    assert doc["summary"] == {"episodes": 2, "agreements": 1, "agreement_rate": 0.5,
                              "agreement_interval_95": doc["summary"]["agreement_interval_95"],
                              "twin_successes": 2, "generated_in_target": 1,
                              "confusion": {"both": 1, "twin_only": 1, "generated_only": 0, "neither": 0}}
    low, high = doc["summary"]["agreement_interval_95"]
    assert 0 < low < 0.5 < high < 1
    keys = {"episode", "scene", "seed", "twin_success", "twin_reason", "generated_shows_in_target", "psnr_in_db",
            "psnr_out_db", "margin_db", "agree"}
    strips = []
    for entry, result, episode in zip(doc["episodes"], report.results, episodes):
        assert keys <= set(entry) and entry["episode"] == str(episode)
        assert entry["agree"] == result.agree and entry["psnr_in_db"] == pytest.approx(result.psnr_in_db, abs=1e-3)
        assert set(entry["final_joints"]) == set(CANONICAL_JOINT_NAMES)
        assert entry["replay"]["clipped_cycles"] == {}  # the scripted targets stay within the limits
        strip = folder / entry["strip"]
        image = cv2.imread(str(strip))
        assert image is not None, strip
        assert image.shape[1] == 4 * W * math.ceil(jg.STRIP_MIN_PANEL_HEIGHT / H)  # four panels, scaled up
        assert image.shape[0] > 2 * jg.STRIP_MIN_PANEL_HEIGHT  # a second row: the frames around the first lift
        strips.append(strip.relative_to(folder).as_posix())
    assert strips == [jg.strip_name(0, episodes[0]), jg.strip_name(1, episodes[1])]
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == \
        sorted([jg.REPORT_FILE, *strips])
    assert report.summary.lines()[1].startswith("agreement: 1/2 = 50 %")


def test_an_episode_without_the_twins_scene_or_the_generated_feed_is_refused(run, tmp_path):
    short = run._replace(targets=run.targets[:20], objects=run.objects[:20])
    frames = [(0.0, np.zeros((H, W, 3), np.uint8))]
    no_scene = digital_episode(tmp_path / "a", short, frames, scene=False)
    with pytest.raises(NotTwinEpisodeError, match="no /twin/scene recorded") as err:
        jg.judge([no_scene], tmp_path / "out", options=OPTIONS)
    assert err.value.topic == "/twin/scene" and str(no_scene) in str(err.value)
    assert not (tmp_path / "out").exists()  # refused before anything was written
    no_feed = digital_episode(tmp_path / "b", short, frames, generated=False)
    with pytest.raises(EpisodeDataError, match="no generated frames") as err:
        jg.read_episode(no_feed)
    assert err.value.topic == jg.GENERATED_TOPIC and str(no_feed) in str(err.value)
    plain = build_episode(tmp_path / "c", digital=True, seconds=0.3)  # a digital episode without a twin
    with pytest.raises(NotTwinEpisodeError, match="/twin/scene"):
        jg.read_episode(plain)
    parser = argparse.ArgumentParser()
    jg.add_arguments(parser)
    args = parser.parse_args([str(no_feed), str(no_scene), "--out", str(tmp_path / "cli")])
    assert run_command(jg.run_cli, args) == DATA_EXIT_CODE  # the first refused episode ends the run


def test_first_interaction_and_the_newest_frame_at_an_instant():
    from rynn_teleop.world_model.training.objects import SceneObject, TwinObjects

    cube = SceneObject("cube", "box", (0.05, 0.05, 0.05), False)
    rest = [0.5, 0.0, 0.7, 0.0, 0.0, 0.0, 1.0]
    poses = np.array([[rest], [rest], [[0.51, 0.0, 0.7, 0, 0, 0, 1]], [[0.51, 0.0, 0.73, 0, 0, 0, 1]]])
    objects = TwinObjects("s", 0, (cube,), np.array([10, 20, 30, 40], dtype=np.int64), poses)
    assert jg.first_interaction(objects, "cube") == ("first lift", 40)
    assert jg.first_interaction(objects._replace(poses=poses[:3], stamps_ns=objects.stamps_ns[:3]), "cube") == \
        ("first move", 30)
    assert jg.first_interaction(objects._replace(poses=poses[:2], stamps_ns=objects.stamps_ns[:2]), "cube") is None
    assert jg.first_interaction(objects, "ball") is None
    stamps = np.array([30, 10, 20, 20], dtype=np.int64)
    assert [jg.newest_at_or_before(stamps, t) for t in (5, 10, 20, 25, 99)] == [1, 1, 3, 3, 0]
