"""``rynn-teleop run --mode``: one child process per process group of the bringup table (``supervisor``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from rynn_teleop import bringup
from rynn_teleop.supervisor import LATE_GROUPS, child_arguments


def run(env: dict, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "run", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_childs_arguments_carry_its_nodes_parameters_only():
    args = child_arguments(("head_camera", "camera_switch"),
                           {"head_camera": {"backend": "synthetic", "synthetic.profile": "320x240x30"},
                            "camera_switch": {"active_source": "generated"}, "arm_ik": {"auto_engage": True}},
                           lifecycle="active", duration=3.5, config_dir=None)
    assert args[:6] == ["run", "head_camera", "camera_switch", "--lifecycle", "active", "--duration"]
    params = [args[i + 1] for i, a in enumerate(args) if a == "-p"]
    assert params == ['head_camera.backend="synthetic"', 'head_camera.synthetic.profile="320x240x30"',
                      'camera_switch.active_source="generated"']  # JSON values: read back as they were
    assert json.loads(params[0].partition("=")[2]) == "synthetic"
    assert all(g in bringup.process_groups([n for grp in LATE_GROUPS for n in grp]) for g in LATE_GROUPS)


def test_run_mode_runs_each_process_group_as_a_process_of_its_own(ros_env):
    out = run(ros_env, "--mode", "digital", "--duration", "6")
    assert out.returncode == 0, out.stderr[-3000:]
    logs = out.stdout + out.stderr
    groups = bringup.process_groups(bringup.mode_nodes(mode="digital"))
    assert f"run: {len(groups)} processes: {'; '.join('+'.join(g) for g in groups)}" in logs
    started = set(re.findall(r"\[(\w+)\]: started", logs))
    assert started == set(bringup.mode_nodes(mode="digital")), started
    # each child process set its own scheduling (one line per process; this parent runs no node)
    assert len(re.findall(r"\[rynn_teleop\.runner\]: scheduling: ", logs)) == len(groups)


def test_a_child_that_fails_stops_the_run_with_its_exit_code(ros_env):
    """The real mode without the vendor SDKs: the drivers' process refuses to start; the run ends with its code
    and says which process it was, instead of running on without the arms."""
    out = run(ros_env, "--mode", "real", "--duration", "60", timeout=180)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "sdk_path" in out.stderr and "exited with 2: stopping the others" in out.stdout + out.stderr


def test_one_process_keeps_every_node_in_the_calling_process(ros_env):
    out = run(ros_env, "--mode", "digital", "--one-process", "--duration", "4", "robot_description", "arm_ik")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "processes:" not in out.stdout + out.stderr
