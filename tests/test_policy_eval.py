"""``rynn-teleop policy eval``: a policy scored on fresh twins in lockstep simulated time (ROS-free).

The loop is checked with policies whose behaviour is known: a scripted operator's plan replayed through it still
does the task (the camera, the arm smoothing, the safety layer and the physics do not break a policy that works);
the ``replay`` backend on a small dataset written here in the export's layout; runners that hold, look at the image,
or crash. The report folder holds every promised file, a crashing rollout is an entry, not the end, the same seed
gives the same rollout, and the frames a policy gets are the head camera's.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rynn_teleop.core import safety as safety_module
from rynn_teleop.core.image import resize_rgb
from rynn_teleop.core.params import Param
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, GROUPS
from rynn_teleop.errors import ConfigurationError, ParameterError
from rynn_teleop.policies import POLICY_BACKENDS, PolicyRunner, PolicySpec
from rynn_teleop.policies import cli as policy_cli
from rynn_teleop.policies.evaluate import (
    OUTCOME,
    PREVIEW,
    REPORT,
    SAFETY_LOGGER,
    SUMMARY,
    EvalSettings,
    Rig,
    build_runner,
    build_twin,
    evaluate,
    reason_kind,
    run_rollout,
    summarise,
    wilson_interval,
)
from rynn_teleop.policies.replay import DatasetError, ReplayPolicy
from rynn_teleop.recording.lerobot import (
    DEFAULT_FEATURES,
    data_path,
    depth_video_feature,
    info_doc,
    vector_feature,
    video_feature,
    write_frames,
    write_json,
)
from rynn_teleop.sim.monitor import object_poses, scene_description
from rynn_teleop.sim.rollout import CONTROL_PERIOD, home_posture, run_scripted_episode
from rynn_teleop.sim.scene import load_scene
from rynn_teleop.sources.camera.synthetic import SyntheticScene

IMAGE = (72, 96)  # (height, width) [px] the test policies take
FPS = 30
LENGTHS = {0: 12, 1: 5}  # episode -> rows of the hand-written dataset


# ------------------------------------------------------------------------------------------ helpers

def spec(fps: float = FPS, images=None, source: str = "test") -> PolicySpec:
    return PolicySpec(float(fps), CANONICAL_JOINT_NAMES, CANONICAL_JOINT_NAMES,
                      {"physical": IMAGE} if images is None else images, source)


class Hold(PolicyRunner):
    """Holds the home posture; raises in ``act`` of the rollouts (1-based) listed in ``crash_in``."""

    name = "test_hold"

    def __init__(self, crash_in=(), images=None) -> None:
        self.spec = spec(images=images)
        self.q = home_posture()
        self.crash_in = set(crash_in)
        self.rollouts = 0
        self.observations: list[dict] = []

    def reset(self) -> None:
        self.rollouts += 1

    def act(self, observation):
        if self.rollouts in self.crash_in:
            raise RuntimeError("boom")
        self.observations.append(observation)
        return self.q


class Looking(PolicyRunner):
    """Closed loop on the pixels: the arms move by an amount set by the image's mean brightness."""

    name = "test_looking"

    def __init__(self) -> None:
        self.spec = spec()
        self.q = home_posture()

    def reset(self) -> None:
        pass

    def act(self, observation):
        image = observation["observation.images.physical"]
        q = self.q.copy()
        q[GROUPS.arm("right")] += 0.002 * float(image.mean()) * np.linspace(-1.0, 1.0, 7)
        q[GROUPS.hand("right")] += 0.3
        return q


class Plan(PolicyRunner):
    """Plays given (54,) targets at ``fps``, holding the last."""

    name = "test_plan"

    def __init__(self, actions: list[np.ndarray], fps: float) -> None:
        self.spec = spec(fps=fps)
        self.actions = actions
        self.next = 0

    def reset(self) -> None:
        self.next = 0

    def act(self, observation):
        action = self.actions[min(self.next, len(self.actions) - 1)]
        self.next += 1
        return action


def write_dataset(root: Path, actions: dict[int, np.ndarray], names=CANONICAL_JOINT_NAMES) -> Path:
    """A minimal exported dataset (the export's layout and helpers): info.json and one data file per episode."""
    height, width = IMAGE
    features = {"observation.images.physical": video_feature(height, width, FPS, "h264", "yuv420p"),
                "observation.images.physical_depth": depth_video_feature(height, width, FPS, 2.0, "/depth"),
                "observation.state": vector_feature(names), "action": vector_feature(names)}
    everything = {**features, **DEFAULT_FEATURES}
    index = 0
    for episode, rows in actions.items():
        n = len(rows)
        write_frames(root / data_path(episode), {
            "observation.state": rows, "action": rows, "timestamp": np.arange(n) / FPS,
            "frame_index": np.arange(n), "episode_index": np.full(n, episode), "index": index + np.arange(n),
            "task_index": np.zeros(n)}, everything)
        index += n
    write_json(root / "meta/info.json", info_doc(fps=FPS, features=features, total_episodes=len(actions),
                                                 total_frames=index, total_tasks=1, robot_type="rynn"))
    return root


def episode_actions(episode: int) -> np.ndarray:
    """The hand-written dataset's actions: home, the right arm's first joint moving by 0.01 rad per row."""
    rows = np.tile(home_posture(), (LENGTHS[episode], 1))
    rows[:, 7] += 0.01 * np.arange(LENGTHS[episode]) * (1 if episode == 0 else -1)
    return rows.astype(np.float32).astype(float)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("dataset"), {e: episode_actions(e) for e in LENGTHS})


@pytest.fixture
def registered():
    """Registers test runner classes as policy backends for one test, and removes them after."""
    names = []

    def register(cls):
        POLICY_BACKENDS.register(cls)
        names.append(cls.name)
        return cls

    yield register
    for name in names:
        POLICY_BACKENDS.unregister(name)


def video_frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


# ------------------------------------------------------------------------------------------ the replay backend

def test_replay_spec_comes_from_the_datasets_info(dataset):
    runner = build_runner("replay", {"dataset": str(dataset), "episode": 1})
    assert isinstance(runner, ReplayPolicy)
    assert runner.spec.fps == FPS
    assert runner.spec.state_names == runner.spec.action_names == CANONICAL_JOINT_NAMES
    assert dict(runner.spec.images) == {"physical": IMAGE}  # the depth key is not a camera of the policy
    assert str(dataset) in runner.spec.source and "episode 1" in runner.spec.source
    runner.spec.check()


def test_replay_returns_the_recorded_actions_in_order_then_holds_the_last(dataset):
    runner = ReplayPolicy(str(dataset), 0)
    expected = episode_actions(0)
    got = [runner.act({}) for _ in range(LENGTHS[0] + 3)]
    np.testing.assert_array_equal(np.array(got[:LENGTHS[0]]), expected)
    for extra in got[LENGTHS[0]:]:
        np.testing.assert_array_equal(extra, expected[-1])
    runner.reset()
    np.testing.assert_array_equal(runner.act({}), expected[0])
    got[0][:] = 99.0  # a caller changing an action does not change the recording
    runner.reset()
    np.testing.assert_array_equal(runner.act({}), expected[0])


def test_replay_refuses_what_it_cannot_play(dataset, tmp_path):
    with pytest.raises(DatasetError, match=r"no episode 7 \(episodes: 0, 1\)"):
        ReplayPolicy(str(dataset), 7)
    with pytest.raises(DatasetError, match="no meta/info.json"):
        ReplayPolicy(str(tmp_path), 0)
    with pytest.raises(ParameterError, match="replay.dataset"):
        build_runner("replay", {"episode": 0})
    with pytest.raises(ParameterError, match="replay backend: parameter 'episode' = -1 is out of range"):
        build_runner("replay", {"dataset": str(dataset), "episode": -1})
    other = write_dataset(tmp_path / "other", {0: episode_actions(1)}, names=tuple(reversed(CANONICAL_JOINT_NAMES)))
    with pytest.raises(ConfigurationError, match="joint order differs"):
        ReplayPolicy(str(other), 0).spec.check()


# ------------------------------------------------------------------------------------------ the report

def test_an_evaluation_over_seeds_writes_a_complete_report(dataset, tmp_path):
    runner = ReplayPolicy(str(dataset), 0)
    settings = EvalSettings("pick_place", episodes=2, seed=5, max_seconds=0.5)
    seen = []
    report = evaluate(runner, settings, tmp_path / "report", policy={"backend": "replay"}, progress=seen.append)

    folder = tmp_path / "report"
    assert report.folder == folder and report.complete
    assert [r.seed for r in seen] == [5, 6] == [r.seed for r in report.rollouts]
    doc = json.loads((folder / REPORT).read_text())
    assert set(doc) >= {"complete", "settings", "task", "policy", "summary", "rollouts", "wall_s"}
    assert doc["complete"] is True
    assert doc["settings"] == {"task": "pick_place", "scene": "pick_place", "episodes": 2, "seed": 5, "seeds": [5, 6],
                               "max_seconds": 0.5, "video": True}
    assert doc["task"] == "place red_cube in goal"
    assert doc["policy"]["backend"] == "replay" and doc["policy"]["fps"] == FPS
    assert doc["policy"]["cameras"] == {"physical": list(IMAGE)}
    assert set(doc["summary"]) == {"episodes", "successes", "failures", "errors", "success_rate", "interval_95",
                                   "time_to_success_mean_s", "time_to_success_median_s", "failure_reasons"}
    assert doc["summary"]["episodes"] == 2 and doc["summary"]["errors"] == 0
    steps = round(0.5 * FPS)  # act() at 0 .. 14/30 s; the tick at 0.5 s is judged, not acted on
    for entry in doc["rollouts"]:
        assert set(entry) == {"index", "seed", "outcome", "reason", "time_to_success_s", "sim_time_s", "steps",
                              "wall_s", "error", "folder", "clipped_cycles"}
        assert entry["outcome"] == "failure" and "red_cube is outside goal" in entry["reason"]  # it never grasps
        assert entry["steps"] == steps and entry["sim_time_s"] == pytest.approx(0.5, abs=0.002)
        assert entry["time_to_success_s"] is None and entry["error"] is None
        rollout = folder / entry["folder"]
        assert entry["folder"] == f"seed-{entry['seed']}"
        outcome = yaml.safe_load((rollout / OUTCOME).read_text())
        assert outcome["seed"] == entry["seed"] and outcome["outcome"] == "failure"
        assert list(outcome["final_joints"]) == list(CANONICAL_JOINT_NAMES)
        frames = video_frames(rollout / PREVIEW)
        assert len(frames) == steps + 1 and frames[0].shape == (*IMAGE, 3)  # every frame the policy was shown
    summary = (folder / SUMMARY).read_text().splitlines()
    assert summary == report.lines()
    assert summary[2].startswith("success: 0/2 = 0 % (95 % interval 0-66 %")
    assert any(line == "failed 2 x: red_cube is outside goal" for line in summary)


def test_no_video_writes_no_preview(tmp_path):
    report = evaluate(Hold(), EvalSettings("pick_place", 1, 0, 0.1, video=False), tmp_path / "r")
    assert (tmp_path / "r/seed-0" / OUTCOME).exists() and not (tmp_path / "r/seed-0" / PREVIEW).exists()
    assert report.rollouts[0].outcome == "failure"


def test_a_crash_in_one_rollout_is_reported_and_the_others_run(tmp_path):
    runner = Hold(crash_in={2})
    report = evaluate(runner, EvalSettings("pick_place", 3, 0, 0.2), tmp_path / "r")

    assert [r.outcome for r in report.rollouts] == ["failure", "error", "failure"]
    crashed = report.rollouts[1]
    assert crashed.seed == 1 and crashed.error == "RuntimeError: boom" and crashed.reason == "RuntimeError: boom"
    assert crashed.steps == 0 and crashed.time_to_success is None
    assert report.rollouts[2].steps == report.rollouts[0].steps > 0
    assert report.summary.errors == 1 and report.summary.failures == 2 and report.summary.successes == 0
    assert report.summary.failure_reasons["error: RuntimeError"] == 1
    doc = json.loads((tmp_path / "r" / REPORT).read_text())
    assert doc["complete"] is True and doc["rollouts"][1]["error"] == "RuntimeError: boom"
    outcome = yaml.safe_load((tmp_path / "r/seed-1" / OUTCOME).read_text())
    assert outcome["outcome"] == "error" and "RuntimeError: boom" in outcome["traceback"]
    assert (tmp_path / "r/seed-1" / PREVIEW).exists()  # the frame it was shown before it crashed
    assert "error in seed 1: RuntimeError: boom" in report.lines()


def test_a_bad_action_is_an_error_naming_it(tmp_path):
    class Short(Hold):
        name = "test_short"

        def act(self, observation):
            return np.zeros(14)

    report = evaluate(Short(), EvalSettings("pick_place", 1, 0, 0.1, video=False), tmp_path / "r")
    assert report.rollouts[0].outcome == "error"
    assert "not 54 finite joint positions" in report.rollouts[0].error


def test_clipping_by_the_safety_layers_is_counted_per_rollout_not_logged(tmp_path, caplog):
    class Beyond(Hold):
        name = "test_beyond"

        def act(self, observation):
            q = self.q.copy()
            q[CANONICAL_JOINT_NAMES.index("right_finger2_joint3")] = 3.0  # [rad] beyond the finger's limit
            return q

    with caplog.at_level(logging.WARNING):
        report = evaluate(Beyond(), EvalSettings("pick_place", 2, 0, 3.0, video=False), tmp_path / "r")
    assert [dict(r.clipped).get("hand/position", 0) > 0 for r in report.rollouts] == [True, True]
    assert "arm/position" not in dict(report.rollouts[0].clipped)
    assert not [r for r in caplog.records if "clipped" in r.getMessage()]  # 3 s at once a second would log 3
    assert logging.getLogger(SAFETY_LOGGER).level == logging.NOTSET  # as it was
    assert SAFETY_LOGGER == safety_module._log.name
    doc = json.loads((tmp_path / "r" / REPORT).read_text())
    assert doc["rollouts"][0]["clipped_cycles"]["hand/position"] == dict(report.rollouts[0].clipped)["hand/position"]
    assert any(line.startswith("safety layers clipped the commands in 2 of 2 rollouts") for line in report.lines())
    assert not any("clipped" in line for line in evaluate(Hold(), EvalSettings("pick_place", 1, 0, 0.2, video=False),
                                                          tmp_path / "h").lines())


def test_an_evaluation_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(ConfigurationError, match="no_such_scene"):
        evaluate(Hold(), EvalSettings("no_such_scene", 1), tmp_path / "a")
    with pytest.raises(ConfigurationError, match="camera 'generated', which the twin cannot draw"):
        evaluate(Hold(images={"generated": IMAGE}), EvalSettings("pick_place", 1), tmp_path / "b")
    (tmp_path / "used").mkdir()
    (tmp_path / "used/report.json").write_text("{}")
    with pytest.raises(ConfigurationError, match="not an empty folder"):
        evaluate(Hold(), EvalSettings("pick_place", 1), tmp_path / "used")
    for bad in ({"episodes": 0}, {"max_seconds": 0.0}, {"max_seconds": math.inf}, {"seed": -1}):
        with pytest.raises(ConfigurationError):
            EvalSettings("pick_place", **bad)


# ------------------------------------------------------------------------------------------ the summary

@pytest.mark.parametrize("successes, n, low, high", [
    (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (5, 10, 0.2366, 0.7634), (1, 20, 0.0089, 0.2361),
    (35, 35, 0.9011, 1.0), (32, 35, 0.7763, 0.9704),
])
def test_wilson_interval_of_known_counts(successes, n, low, high):
    interval = wilson_interval(successes, n)
    assert interval.low == pytest.approx(low, abs=1e-4) and interval.high == pytest.approx(high, abs=1e-4)


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_holds_the_rate_and_narrows_with_more_trials(counts):
    successes, n = counts
    interval = wilson_interval(successes, n)
    assert 0.0 <= interval.low <= successes / n <= interval.high <= 1.0
    four_times = wilson_interval(4 * successes, 4 * n)
    assert four_times.high - four_times.low < interval.high - interval.low


def test_summary_counts_reasons_by_kind_and_times_successes_only():
    from rynn_teleop.policies.evaluate import RolloutResult

    def result(outcome, reason, t=None, error=None):
        return RolloutResult(0, 0, outcome, reason, t, 1.0, 1, 0.1, error=error)

    summary = summarise([result("success", "ok", 4.0), result("success", "ok", 6.0), result("success", "ok", 11.0),
                         result("failure", "red_cube is outside goal (0.153 m from its centre)"),
                         result("failure", "red_cube is outside goal (0.020 m from its centre)"),
                         result("failure", "red_cube fell off the table"),
                         result("error", "ValueError: x", error="ValueError: x")])
    assert (summary.episodes, summary.successes, summary.failures, summary.errors) == (7, 3, 3, 1)
    assert summary.success_rate == pytest.approx(3 / 7)
    assert summary.time_to_success_mean == pytest.approx(7.0) and summary.time_to_success_median == 6.0
    assert summary.failure_reasons == {"red_cube is outside goal": 2, "red_cube fell off the table": 1,
                                       "error: ValueError": 1}
    assert reason_kind("red_cube is over goal but not resting on it (bottom +0.020 m from its surface, touching "
                       "table)") == "red_cube is over goal but not resting on it"


# ------------------------------------------------------------------------------------------ the loop

def test_the_same_seed_gives_the_same_rollout():
    """Lockstep simulated time: the same seed and policy give the same outcome and the same final joints, to the
    bit, with a fresh head camera or one that drew another layout before."""
    scene, rig, runner = load_scene("pick_place"), Rig.from_config(), Looking()
    first = build_twin(scene, 3, runner.spec, rig)
    a = run_rollout(first, runner, 1.0)
    other = build_twin(scene, 4, runner.spec, rig, camera=first.camera)
    run_rollout(other, runner, 0.2)
    again = build_twin(scene, 3, runner.spec, rig, camera=other.camera)
    b = run_rollout(again, runner, 1.0)
    assert a == b
    np.testing.assert_array_equal(first.measured(), again.measured())
    assert np.abs(first.measured() - home_posture())[GROUPS.arm("right")].max() > 0.05  # the policy moved the arm


def test_the_policy_sees_the_head_cameras_frames(tmp_path):
    """The frames given to the policy are the stack's physical feed: a head camera fed the twin's /twin/scene and
    /twin/objects messages as the head camera node is, drawing the measured joints, resized as the export does."""
    scene, rig, runner = load_scene("pick_place"), Rig.from_config(), Looking()
    twin = build_twin(scene, 2, runner.spec, rig)
    twin.keep_frames = True
    end = run_rollout(twin, runner, 0.4).sim_time
    width, height = rig.camera_size
    camera = SyntheticScene(width, height, FPS, draw_robot=True, twin_scene_topic="/twin/scene",
                            twin_in_background=False)
    camera.start(0.0)
    camera.feed("/twin/scene", SimpleNamespace(data=json.dumps(scene_description(twin.world))))
    poses = [SimpleNamespace(position=SimpleNamespace(x=p.position[0], y=p.position[1], z=p.position[2]),
                             orientation=SimpleNamespace(x=p.quaternion[0], y=p.quaternion[1], z=p.quaternion[2],
                                                         w=p.quaternion[3]))
             for p in object_poses(twin.world)]
    camera.feed("/twin/objects", SimpleNamespace(poses=poses))
    camera.set_joint_positions(twin.measured())
    frame = camera.read(end)[-1]
    assert frame.stamp == pytest.approx(end)
    assert len(twin.frames) == round(0.4 * FPS) + 1
    np.testing.assert_array_equal(twin.frames[-1], resize_rgb(frame.color, *IMAGE))


def test_the_scripted_operators_plan_succeeds_through_the_loop(tmp_path):
    """The scripted operator's targets (sim.rollout, which succeeds on this seed) fed back as a policy at 25 Hz
    still do the task through the camera, the arm smoothing, the safety layer and the physics."""
    seed = 2
    targets: list[np.ndarray] = []
    scripted = run_scripted_episode("pick_place", seed, on_period=lambda world, t: targets.append(world.targets()))
    assert scripted.outcome.success
    every = 4  # [periods] 25 Hz
    runner = Plan(targets[every - 1::every], 1.0 / (every * CONTROL_PERIOD))
    report = evaluate(runner, EvalSettings("pick_place", 1, seed, 20.0, video=False), tmp_path / "r")
    result = report.rollouts[0]
    assert result.outcome == "success", result.reason
    assert result.reason == "red_cube rests in goal, released"
    assert 0 < result.time_to_success <= scripted.sim_time
    assert report.summary.success_rate == 1.0


# ------------------------------------------------------------------------------------------ the command line

def test_cli_evaluates_a_replay_and_prints_the_folder_last(dataset, tmp_path, capsys):
    out = tmp_path / "cli"
    code = policy_cli.main(["eval", str(dataset), "--backend", "replay", "-p", "episode=1", "--task", "pick_place",
                            "--episodes", "2", "--seed", "3", "--max-seconds", "0.2", "--no-video", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.out.splitlines()
    assert lines[-1] == str(out)
    assert lines[:-1] == (out / SUMMARY).read_text().splitlines()
    assert "seed 3: failure" in captured.err and "seed 4: failure" in captured.err
    doc = json.loads((out / REPORT).read_text())
    assert doc["policy"]["backend"] == "replay"
    assert doc["policy"]["settings"] == {"episode": 1, "dataset": str(dataset)}
    assert [r["seed"] for r in doc["rollouts"]] == [3, 4]


def test_cli_runs_a_registered_backend_with_its_settings(registered, tmp_path, capsys):
    @registered
    class Configured(Hold):
        name = "test_configured"
        SETTINGS = (Param("path", str, "", "a path"),
                    Param("gain", float, 1.0, "a gain"))

        def __init__(self, path: str = "", gain: float = 1.0) -> None:
            super().__init__()
            self.path, self.gain = path, gain

    code = policy_cli.main(["eval", "some/policy", "--backend", "test_configured", "-p", "test_configured.gain=2.5",
                            "--task", "pick_place", "--episodes", "1", "--max-seconds", "0.1", "--no-video",
                            "--out", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "r" / REPORT).read_text())
    assert doc["policy"]["settings"] == {"gain": 2.5, "path": "some/policy"}


@pytest.mark.parametrize("extra, message", [
    (["--task", "no_such_scene"], "no_such_scene"),
    (["--task", "pick_place", "--backend", "no_such_backend"], "unknown policy backend"),
    (["--task", "pick_place", "-p", "nope=1"], "unknown parameter 'nope'"),
    (["--task", "pick_place", "-p", "episode=-2"], "replay backend: parameter 'episode' = -2"),
    (["--task", "pick_place", "-p", "dataset=x"], "PATH gives"),
    (["--task", "pick_place", "--episodes", "0"], "episodes must be >= 1"),
])
def test_cli_refuses_a_bad_request_with_exit_code_2(dataset, tmp_path, capsys, extra, message):
    base = ["eval", str(dataset), "--backend", "replay", "--no-video", "--max-seconds", "0.1",
            "--out", str(tmp_path / "r")]
    assert policy_cli.main(base + extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r" / REPORT).exists()


def test_cli_refuses_a_policy_the_twin_cannot_feed(registered, tmp_path, capsys):
    @registered
    class Generated(Hold):
        name = "test_generated"
        SETTINGS = (Param("path", str, "", "a path"),)

        def __init__(self, path: str = "") -> None:
            super().__init__(images={"generated": IMAGE})

    code = policy_cli.main(["eval", "p", "--backend", "test_generated", "--task", "pick_place", "--out",
                            str(tmp_path / "r")])
    assert code == 2 and "which the twin cannot draw" in capsys.readouterr().err
