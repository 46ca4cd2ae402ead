"""``rynn-teleop demo``: the most complete end-to-end slice that runs without hardware.

Until the teleoperation nodes land (trackers, IK, retargeting, drivers, world
model, recorder), the slice is: the generated description is published
(``robot_description``), a limit-respecting joint test pattern drives
``/joint_states`` (``joint_sweep``), and the robot's geometry follows it as
RViz markers (``robot_markers``), all on real rclpy in one process. A probe
node measures rates and end-to-end latency (joint-state stamp -> markers
received). Output: a table on stdout, ``summary.json`` and the ``robot.urdf``
used, in the output folder, whose path is the last line printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rclpy.node import Node
from rclpy.time import Time
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from visualization_msgs.msg import MarkerArray

from .core.stats import RateMeter
from .nodes.robot_description import LATCHED
from .runner import Composition

DEMO_NODES = ("robot_description", "joint_sweep", "robot_markers")


class _Probe(Node):
    """Subscribes to the demo's outputs like an external consumer would."""

    def __init__(self, context) -> None:
        super().__init__("demo_probe", context=context)
        self.joint_states = RateMeter(window=1e9)
        self.markers = RateMeter(window=1e9)
        self.description: str | None = None
        self.max_marker_count = 0
        self.create_subscription(JointState, "/joint_states", self._on_js, 10)
        self.create_subscription(MarkerArray, "/robot_markers", self._on_markers, 10)
        self.create_subscription(String, "/robot_description", self._on_desc, LATCHED)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_js(self, msg: JointState) -> None:
        now = self._now()
        self.joint_states.tick(now, now - Time.from_msg(msg.header.stamp).nanoseconds * 1e-9)

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
    with Composition(DEMO_NODES) as comp:
        probe = _Probe(comp.context)
        comp.add_node(probe)
        comp.spin(duration)
        now = probe._now()
        rows = [_row("/joint_states (joint_sweep -> probe)", probe.joint_states, now),
                _row("/robot_markers (joint state stamp -> probe)", probe.markers, now)]
        description = probe.description
        markers = probe.max_marker_count
        comp.remove_node(probe)
    summary = {"duration_s": duration, "nodes": list(DEMO_NODES), "streams": rows,
               "robot_description_received": description is not None, "markers_per_message": markers}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if description is not None:
        (out / "robot.urdf").write_text(description)
    header = f"{'stream':<46} {'msgs':>6} {'rate Hz':>8} {'p50 ms':>8} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['stream']:<46} {r['messages']:>6} {r['rate_hz']:>8} {r['latency_p50_ms']:>8} {r['latency_p99_ms']:>8}")
    print(f"robot description received: {'yes' if description else 'NO'}; markers per message: {markers}")
    return out
