"""``rynn-teleop call``: the operator's command line against running nodes (real rclpy, separate processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ros_helpers import wait_for

from rynn_teleop.runner import Composition


def call(env: dict, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "call", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_absent_nodes_are_named_with_exit_code_3(ros_env):
    out = call(ros_env, "--timeout", "0.5", "estop")
    assert out.returncode == 3
    assert "arm_driver" in out.stderr and "hand_driver" in out.stderr and "start" in out.stderr
    out = call(ros_env, "--timeout", "0.5", "episode", "start", "--task", "x")
    assert out.returncode == 3 and "recorder" in out.stderr
    out = call(ros_env, "--timeout", "0.5", "feed", "toggle")
    assert out.returncode == 3 and "camera_switch" in out.stderr
    out = call(ros_env, "--timeout", "0.5", "twin", "reset")  # the real mode has no twin
    assert out.returncode == 3 and "twin" in out.stderr


def test_bad_arguments_exit_2_before_any_ros():
    out = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "call", "feed", "sideways"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice" in out.stderr
    out = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "call", "episode", "stop", "--outcome", "meh"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2


@pytest.fixture
def stack(ros_domain_id, tmp_path):
    comp = Composition(["arm_driver", "camera_switch", "recorder"], domain_id=ros_domain_id, overrides={
        "camera_switch": {"active_source": "generated"},
        "recorder": {"output_dir": str(tmp_path), "topics": ["/joint_states"], "expected_rates_hz": [0.0]},
    })
    yield comp, tmp_path
    comp.shutdown()


def test_each_command_reaches_its_node(stack, ros_env):
    comp, out_dir = stack
    driver, switch, recorder = comp.node("arm_driver"), comp.node("camera_switch"), comp.node("recorder")

    assert call(ros_env, "feed", "toggle").returncode == 0
    assert switch.active == "physical"
    assert call(ros_env, "feed", "generated").returncode == 0 and switch.active == "generated"

    done = call(ros_env, "estop")  # the hand driver is not running: the arm driver's answer is enough
    assert done.returncode == 0, done.stderr
    assert driver.safety.estopped
    assert call(ros_env, "reset").returncode == 0
    assert not driver.safety.estopped

    started = call(ros_env, "episode", "start", "--task", "pick the red cube", "--operator", "ada")
    assert started.returncode == 0, started.stderr
    assert recorder.recorder.active
    episode = out_dir / "episode_0001"
    assert started.stdout.splitlines()[-1] == str(episode)  # the typed directory, last (from /recorder/episode)
    status = call(ros_env, "status")
    assert status.returncode == 0
    assert "recording episode_0001" in status.stdout and "camera feed: generated" in status.stdout
    assert "arm_driver released" in status.stdout and "hand_driver not running" in status.stdout
    stopped = call(ros_env, "episode", "stop", "--outcome", "success", "--notes", "clean grasp")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines()[-1] == str(episode)  # the episode kept
    doc = yaml.safe_load((episode / "episode.yaml").read_text())
    assert (doc["task"], doc["operator"], doc["outcome"], doc["notes"]) == ("pick the red cube", "ada", "success",
                                                                          "clean grasp")
    assert recorder.get_parameter("outcome").value == ""  # the label was this episode's only

    refused = call(ros_env, "episode", "stop")  # nothing recording: the recorder says no
    assert refused.returncode == 1 and "no episode" in refused.stderr
    assert call(ros_env, "episode", "start").returncode == 0
    assert wait_for(lambda: recorder.recorder.active, 5.0)
    assert call(ros_env, "episode", "discard").returncode == 0
    assert not (Path(out_dir) / "episode_0002").exists()
    assert not comp.errors


def test_policy_start_and_stop_reach_the_policy_node(ros_domain_id, ros_env):
    out = call(ros_env, "--timeout", "0.5", "policy", "start")  # no policy node
    assert out.returncode == 3 and "/policy/start is not available" in out.stderr and "--policy PATH" in out.stderr
    comp = Composition(["policy"], domain_id=ros_domain_id, overrides={"policy": {
        "backend": "constant", "constant.image_height": 48, "constant.image_width": 64, "record_episodes": False}})
    try:
        policy = comp.node("policy")
        refused = call(ros_env, "policy", "start")  # no camera, no drivers: nothing fresh to act on
        assert refused.returncode == 1 and "no fresh observation: no physical camera frame yet" in refused.stderr
        assert policy.ctl.state == "idle"
        stopped = call(ros_env, "policy", "stop")
        assert stopped.returncode == 0 and "not running" in stopped.stdout
        for _ in range(4):  # diagnostics come once a second: a loaded machine may need a second look
            status = call(ros_env, "--timeout", "2.5", "status")
            if "policy: idle" in status.stdout:
                break
        assert status.returncode == 0 and "policy: idle" in status.stdout and "constant action" in status.stdout, \
            f"call status, 4 looks; the last printed:\n{status.stdout}\nstderr:\n{status.stderr}"
    finally:
        comp.shutdown()
    bad = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "call", "policy", "go"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
