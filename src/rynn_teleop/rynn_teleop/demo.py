"""``rynn-teleop demo``: the most complete end-to-end slice that runs without hardware.

Until the remaining nodes land (retargeting, drivers, camera, world model,
recorder), the slice is, all on real rclpy in one process: the generated
description is published (``robot_description``); a synthetic operator wears
five trackers (``tracker``, source ``synthetic``: it holds the calibration
posture for 2 s, then does bimanual pick-and-place); ``arm_ik`` calibrates
itself on that posture, engages, and drives the 14 arm joints at 200 Hz (its
commands go to the simulated arms (``arm_driver``, backend ``sim``, through
the safety layer), which publish ``/joint_states``; a synthetic glove pair
makes open/fist/pinch/grasp gestures, ``hand_retarget`` turns them into hand
commands and the simulated hands follow (``hand_driver``); the robot's
geometry follows the measured joints as RViz markers (``robot_markers``). A probe node measures rates and latencies.
Output: a table on stdout, ``summary.json`` and the ``robot.urdf`` used, in
the output folder, whose path is the last line printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from rclpy.time import Time
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from visualization_msgs.msg import MarkerArray

from .core.stats import RateMeter
from .nodes.robot_description import LATCHED
from .runner import Composition

DEMO_NODES = ("robot_description", "tracker", "arm_ik", "arm_driver", "hand_retarget", "hand_driver", "robot_markers")


def demo_overrides(out: Path) -> dict:
    """Per-node parameters of the demo (everything else from config/)."""
    return {
        "tracker": {"source": "synthetic", "synthetic.hold_s": 3.0},  # time to calibrate on a loaded machine
        "arm_ik": {
            "auto_calibrate": True, "auto_engage": True,  # starts from the sim arm driver's measured joints
            "calibration_file": str(out / "arm_calibration.yaml"),  # never the lab's own calibration
        },
        "arm_driver": {"backend": "sim"},
        "hand_retarget": {"source": "synthetic"},
        "hand_driver": {"backend": "sim"},
        # 10 Hz is plenty to watch; at 30 Hz its MarkerArray work starves the others of the one
        # Python interpreter they share on a 2-core machine
        "robot_markers": {"rate_hz": 10.0},
    }


class _Probe(Node):
    """Subscribes to the demo's outputs like an external consumer would."""

    def __init__(self, context) -> None:
        super().__init__("demo_probe", context=context)
        self.arm_states = RateMeter(window=1e9)
        self.hand_states = RateMeter(window=1e9)
        self.wrists = RateMeter(window=1e9)
        self.markers = RateMeter(window=1e9)
        self.arm_min: list[float] | None = None
        self.arm_max: list[float] | None = None
        self.description: str | None = None
        self.max_marker_count = 0
        self.create_subscription(JointState, "/joint_states", self._on_js, 50)
        self.create_subscription(PoseStamped, "/operator/wrist_in_chest/left", self._on_wrist, 50)
        self.create_subscription(MarkerArray, "/robot_markers", self._on_markers, 10)
        self.create_subscription(String, "/robot_description", self._on_desc, LATCHED)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_js(self, msg: JointState) -> None:
        now = self._now()
        latency = now - Time.from_msg(msg.header.stamp).nanoseconds * 1e-9
        if len(msg.name) == 14:  # the arm driver's 14 joints (the hand driver's has 40)
            self.arm_states.tick(now, latency)
            q = list(msg.position)
            self.arm_min = q if self.arm_min is None else [min(a, b) for a, b in zip(self.arm_min, q)]
            self.arm_max = q if self.arm_max is None else [max(a, b) for a, b in zip(self.arm_max, q)]
        else:
            self.hand_states.tick(now, latency)

    def _on_wrist(self, msg: PoseStamped) -> None:
        now = self._now()
        self.wrists.tick(now, now - Time.from_msg(msg.header.stamp).nanoseconds * 1e-9)

    def _on_markers(self, msg: MarkerArray) -> None:
        now = self._now()
        self.max_marker_count = max(self.max_marker_count, len(msg.markers))
        if msg.markers:
            self.markers.tick(now, now - Time.from_msg(msg.markers[0].header.stamp).nanoseconds * 1e-9)

    def _on_desc(self, msg: String) -> None:
        self.description = msg.data


def _row(name: str, meter: RateMeter, now: float) -> dict:
    p50, p99 = meter.latency_percentiles(50, 99)
    return {"stream": name, "messages": meter.count, "rate_hz": round(meter.rate(now), 1),
            "latency_p50_ms": round(1e3 * p50, 2), "latency_p99_ms": round(1e3 * p99, 2)}


def run_demo(duration: float = 20.0, out_dir: str | Path | None = None) -> Path:
    """Run the slice for ``duration`` [s]; returns the output folder."""
    out = Path(out_dir) if out_dir else Path("demo_runs") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    with Composition(DEMO_NODES, overrides=demo_overrides(out)) as comp:
        probe = _Probe(comp.context)
        comp.add_node(probe)
        comp.spin(duration)
        now = probe._now()
        rows = [_row("/operator/wrist_in_chest/left (sample -> probe)", probe.wrists, now),
                _row("/joint_states arms (arm_driver -> probe)", probe.arm_states, now),
                _row("/joint_states hands (hand_driver -> probe)", probe.hand_states, now),
                _row("/robot_markers (joint state stamp -> probe)", probe.markers, now)]
        arm_ik = comp.node("arm_ik")
        command = arm_ik.meters.get("command")
        tracker_to_command = command.latency_percentiles(50, 99) if command else (float("nan"),) * 2
        arm = {
            "calibrated": not arm_ik.ctl.calibration.is_default,
            "engaged": arm_ik.ctl.clutch.engaged,
            "arm_scale": round(arm_ik.ctl.calibration.scale, 3),
            "tracker_to_command_p50_ms": round(1e3 * tracker_to_command[0], 2),
            "tracker_to_command_p99_ms": round(1e3 * tracker_to_command[1], 2),
            "arm_joint_range_rad": None if probe.arm_min is None else round(
                max(b - a for a, b in zip(probe.arm_min, probe.arm_max)), 3),
            "unreachable": {s: st.unreachable_count for s, st in arm_ik.ctl.sides.items()},
        }
        description = probe.description
        markers = probe.max_marker_count
        comp.remove_node(probe)
    summary = {"duration_s": duration, "nodes": list(DEMO_NODES), "streams": rows, "arms": arm,
               "robot_description_received": description is not None, "markers_per_message": markers}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if description is not None:
        (out / "robot.urdf").write_text(description)
    header = f"{'stream':<48} {'msgs':>6} {'rate Hz':>8} {'p50 ms':>8} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['stream']:<48} {r['messages']:>6} {r['rate_hz']:>8} {r['latency_p50_ms']:>8} {r['latency_p99_ms']:>8}")
    print(f"robot description received: {'yes' if description else 'NO'}; markers per message: {markers}")
    print(f"arms: calibrated {arm['calibrated']}, engaged {arm['engaged']}, arm-length scale {arm['arm_scale']}, "
          f"largest joint excursion {arm['arm_joint_range_rad']} rad, tracker sample -> command "
          f"p50 {arm['tracker_to_command_p50_ms']} / p99 {arm['tracker_to_command_p99_ms']} ms")
    return out
