"""A LeRobot policy through the stack: a tiny ACT folder (laid out by LeRobot's own ``save_pretrained``, run by the
worker in LeRobot's Python) drives the physical twin through the policy node and the drivers' safety layer, and an
e-stop stops it (twin, drivers, head camera, feed switch and policy in one process, on real rclpy)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
from recording_episodes import build_episode
from ros_helpers import wait_for
from std_msgs.msg import Bool
from test_policy_node import ARMS, Probe

from rynn_teleop.core.status import PolicyStatus
from rynn_teleop.recording.export import export_lerobot
from rynn_teleop.runner import Composition

ROOT = Path(__file__).resolve().parents[1]


def test_a_tiny_lerobot_policy_drives_the_twin_and_an_estop_stops_it(ros_domain_id, lerobot_python,
                                                                      tmp_path):
    episode = build_episode(tmp_path / "ep", digital=False, seconds=1.0, task="pick the cube")
    dataset = tmp_path / "ds"
    export_lerobot([episode], dataset, "test/node", fps=30, image_size=(64, 48), workers=1)
    folder = tmp_path / "act"
    subprocess.run([lerobot_python, str(ROOT / "tests/lerobot_tiny_policy.py"), "write", str(dataset), str(folder),
                    "--repo-id", "test/node"], check=True, capture_output=True, text=True, timeout=600)
    comp = Composition(
        ["twin", "arm_driver", "hand_driver", "head_camera", "camera_switch", "policy"], domain_id=ros_domain_id,
        overrides={"head_camera": {"synthetic.profile": "160x120x30", "synthetic.depth": False},
                   "camera_switch": {"active_source": "physical"},  # the policy takes the consumer feed
                   "policy": {"backend": "lerobot", "path": str(folder), "lerobot.python": lerobot_python,
                              "lerobot.timeout_s": 60.0, "stale_timeout_s": 1.0}})
    try:
        probe = Probe(comp)
        policy = comp.node("policy")
        assert policy.runner.spec.images == {"consumer": (48, 64)} and policy.runner.spec.fps == 30.0
        assert wait_for(lambda: policy.ctl.stale_reason(policy.now_s()) == "", 60.0), \
            policy.ctl.stale_reason(policy.now_s())
        assert wait_for(lambda: not np.isnan(probe.q(ARMS)).any(), 10.0)
        before = probe.q(ARMS)
        started = probe.call("/policy/start")
        assert started.success, started.message
        # the policy acts: its steps count up, the arms are commanded and the twin's arms move
        assert wait_for(lambda: policy.ctl.steps >= 10 and probe.arm_commands > 0, 60.0), policy.ctl.reason
        assert wait_for(lambda: np.abs(probe.q(ARMS) - before).max() > 1e-3, 30.0)
        status = PolicyStatus.decode({k: str(v) for k, v in policy.diagnostic_values().items()})
        assert (status.state, status.backend) == ("running", "lerobot")
        # e-stop: nothing more is commanded, the start is refused
        probe.estop.publish(Bool(data=True))
        assert wait_for(lambda: policy.ctl.state == "estopped", 5.0)
        time.sleep(0.3)
        with probe.lock:
            sent = probe.arm_commands
        time.sleep(0.5)
        assert probe.arm_commands == sent
        assert not probe.call("/policy/start").success
    finally:
        comp.shutdown()
    assert not comp.errors
