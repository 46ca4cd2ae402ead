"""The README's demo command runs the arm teleop slice end to end (real rclpy, subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_drives_the_arms_from_the_synthetic_operator(ros_env, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rynn_teleop.cli", "demo", "--duration", "6", "--out", str(out)],
        env=ros_env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)  # the folder is the last line
    summary = json.loads((out / "summary.json").read_text())
    streams = {row["stream"].split(" (")[0]: row for row in summary["streams"]}
    assert streams["/joint_states arms"]["rate_hz"] > 100  # 200 Hz nominal; a loaded 2-core box gives less
    assert streams["/operator/wrist_in_chest/left"]["rate_hz"] > 30  # 120 Hz nominal; the one interpreter is shared
    assert streams["/robot_markers"]["messages"] > 10
    assert streams["/joint_states hands"]["rate_hz"] > 60  # 100 Hz nominal
    arms = summary["arms"]
    assert arms["calibrated"] and arms["engaged"]
    assert arms["arm_joint_range_rad"] > 0.05  # the arms followed the operator's pick-and-place
    assert arms["unreachable"] == {"left": 0, "right": 0}
    assert (out / "robot.urdf").exists()
    assert not (out / "arm_calibration.yaml").exists()  # automatic calibrations are not saved
