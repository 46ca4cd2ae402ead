"""``rynn-teleop demo``: digital teleoperation end to end, no hardware, on real rclpy.

The bringup's ``digital`` mode (``bringup.py``) with synthetic operator input:
a synthetic operator wears five trackers (``tracker``) and a glove pair
(``hand_retarget``): it holds the calibration posture, then does the
physical twin's task (``synthetic.task: twin``: the pick-and-place of
``config/sim/pick_place.yaml``, planned from the twin's layout);
``arm_ik`` calibrates itself on that posture, engages and drives the arms
(IK + Ruckig, 200 Hz) through the drivers' safety layer onto the twin
(``twin``, ``arm_driver``, ``hand_driver``: MuJoCo physics, where the grasp
moves the cube); the world model (render backend) draws the commanded robot
over the synthetic tabletop as the generated head camera; the feed switch
shows the generated stream, is toggled to the physical one (the synthetic
camera, ``head_camera``, which draws the twin's robot and objects) at 40 %
of the run and back at 60 %; the recorder records the episode.

The nodes run as the composed runner (``rynn-teleop run``), one process per
group of the bringup table (:data:`DEMO_GROUPS`), so no node's rate depends
on the others' share of one interpreter lock.
The episode starts once the arms are engaged and every recorded topic flows, just after a reset of the twin
(its next layout, the robot at home; the operator starts the task :data:`TASK_DELAY_S` later), and lasts
``duration`` seconds.

Output, in the output folder: the episode directory (rosbag2 MCAP +
``episode.yaml``), ``joints.png`` (commanded vs measured joints) and
``preview.mp4`` (the consumer camera stream: mostly the world model's frames, which move no object) and
``twin.mp4`` (the twin's robot and objects as recorded, drawn after the episode: the cube carried into its
target) beside it, ``summary.json`` (strict JSON: a value that is not a
number, such as the latency of a meter without latencies, is ``null``). A table of per-node rates and
latencies is printed, then the episode's outcome as the physical twin judged it (``episode.yaml``: success, or
failure with the reason); the last line printed is the episode directory.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from std_msgs.msg import String

from . import bringup
from .core.status import ArmIKStatus, ConsoleStatus, RecorderStatus, Status, decode_meters
from .errors import RynnTeleopError
from .host_stalls import REALTIME_POLICY, HostProbes, Stall, overlaps, rows, within
from .nodes.camera_switch import LATCHED
from .nodes.operator import OperatorClient, Result
from .nodes.process import terminate_with_parent, use_transport_profile
from .nodes.recorder import DEFAULT_TOPICS
from .recording.inspect import episode_info, plot_joints, video_preview
from .recording.metadata import episode_doc
from .runner import Composition
from .sources.camera.twin_video import twin_video
from .supervisor import LATE_GROUPS, child_arguments

#: the bringup's nodes the demo leaves out: robot_markers only feeds RViz, and its 300 Hz /joint_states input
#: costs a 2-core machine the other nodes' rates
LEFT_OUT = ("robot_markers",)
DEMO_NODES = tuple(n for n in bringup.mode_nodes(record=True) if n not in LEFT_OUT)
#: one composed-runner process per group of the bringup table (``bringup.NodeSpec.group``)
DEMO_GROUPS: tuple[tuple[str, ...], ...] = bringup.process_groups(DEMO_NODES)
S = TypeVar("S", bound=Status)
#: the operator actions the demo performs (``nodes.operator.ACTIONS``), whose services it waits for up front
PROBE_ACTIONS = ("twin reset", "episode start", "episode stop", "feed physical", "feed generated")
#: [s] the synthetic operator (tracker and glove, ``synthetic.task: twin``) starts the twin's task this long after
#: the twin laid its objects out; the demo resets the twin just before each episode, so the episode shows the
#: operator holding still this long, then the task's plan (12.4 s for both scenes)
TASK_DELAY_S = 2.0
#: [s] the recorder's stop answers once the file is closed and the episode measured; a loaded 2-core machine
#: (a busy core beside the demo) took over 30 s
STOP_TIMEOUT_S = 120.0
SETTLE_S = 2.0  # between "every topic flows" and the episode start: the processes' start-up transients pass
TOGGLE_AT = (0.4, 0.6)  # fractions of the episode: to the physical feed, back to the generated one
#: what the demo records and the rate each topic must have [Hz] (0: no rate; the camera colour only: depth is off)
DEMO_TOPICS = {
    **{t: r for t, r in DEFAULT_TOPICS.items() if "aligned_depth" not in t},
    "/head_camera/generated/color/image_raw": 30.0,  # the world model's own stream (stamps = command stamps)
}


def demo_overrides(out: Path) -> dict:
    """Per-node parameters of the demo: the digital mode with synthetic input, then demo settings."""
    overrides = bringup.mode_overrides("digital", camera="generated", tracker_backend="synthetic",
                                       hand_retarget_backend="synthetic", world_model_backend="render")
    demo = {
        # time to calibrate: a loaded machine may take a DDS announcement period (about 3 s) to connect arm_ik;
        # the operator does the twin's task (TASK_DELAY_S after each twin reset: the demo resets it at each episode)
        "tracker": {"synthetic.hold_s": 5.0, "synthetic.task": "twin", "synthetic.task_delay_s": TASK_DELAY_S},
        "hand_retarget": {"synthetic.task": "twin", "synthetic.task_delay_s": TASK_DELAY_S},
        "arm_ik": {
            "auto_calibrate": True, "auto_engage": True,  # starts from the sim arm driver's measured joints
            "calibration_file": str(out / "arm_calibration.yaml"),  # never the lab's own calibration
        },
        # 320x240 colour: the three image streams (physical, generated, switched) and their recording at 640x480
        # cost the 2-core CI machine the other nodes' rates
        "head_camera": {"synthetic.depth": False, "synthetic.profile": "320x240x30"},
        "world_model": {"profile": "320x240x30"},
        "robot_markers": {"rate_hz": 10.0},  # plenty to watch
        "recorder": {"output_dir": str(out), "task": "demo: pick-and-place (twin scene pick_place)",
                     "operator": "synthetic operator",
                     "topics": list(DEMO_TOPICS), "expected_rates_hz": list(DEMO_TOPICS.values())},
    }
    for node, values in demo.items():
        overrides.setdefault(node, {}).update(values)
    return overrides


def _spawn(nodes: tuple[str, ...], overrides: dict, log: Path) -> subprocess.Popen:
    """One composed-runner process (``rynn-teleop run NODES -p ...``) with this process's ROS environment."""
    # each process sets its own priority (runner)
    cmd = [sys.executable, "-m", "rynn_teleop.cli",
           *child_arguments(nodes, overrides, lifecycle="active", duration=None, config_dir=None)]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=dict(os.environ),
                            preexec_fn=terminate_with_parent)


#: the group whose synthetic operator holds the calibration posture for its first ``synthetic.hold_s`` seconds:
#: started once the node that calibrates on that posture (arm_ik) reports, so a slow start cannot miss it
(OPERATOR_GROUP,) = LATE_GROUPS  # the group ``rynn-teleop run --mode`` also starts last (supervisor)
CALIBRATING_NODE = "arm_ik"


def spawn_groups(groups: tuple[tuple[str, ...], ...], overrides: dict, out: Path, probe: _Probe,
                 procs: list[subprocess.Popen], timeout: float = 60.0) -> None:
    """Start one process per group (logs ``out/<group>.log``), appending each to ``procs`` as it starts (so
    that a caller's ``finally`` stops what started) and leaving ``procs`` in ``groups`` order: every group but
    :data:`OPERATOR_GROUP` first, then that one once ``probe`` has seen :data:`CALIBRATING_NODE`'s
    diagnostics (at most ``timeout`` [s]).

    Raises:
        RynnTeleopError: the calibrating node did not report within ``timeout``.
    """
    started: dict[tuple[str, ...], subprocess.Popen] = {}
    for group in groups:
        if group != OPERATOR_GROUP:
            started[group] = _spawn(group, overrides, out / f"{'+'.join(group)}.log")
            procs.append(started[group])
    if OPERATOR_GROUP in groups:
        if not _wait(lambda: CALIBRATING_NODE in probe.diagnostics, timeout):
            dead = ["+".join(g) for g, p in started.items() if p.poll() is not None]
            raise RynnTeleopError(f"demo: {CALIBRATING_NODE} did not come up within {timeout:g} s "
                                  f"(exited: {dead}); logs in {out}")
        started[OPERATOR_GROUP] = _spawn(OPERATOR_GROUP, overrides, out / f"{'+'.join(OPERATOR_GROUP)}.log")
        procs.append(started[OPERATOR_GROUP])
    procs[:] = [started[g] for g in groups]


def stop_groups(procs: list[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGINT every group process, then wait for each (at most ``timeout`` [s]; then SIGKILL)."""
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


class _Probe(Node):
    """Records, toggles the feed and watches the robot like an external client would: the operator's actions
    through :class:`~.nodes.operator.OperatorClient` (the console's and ``rynn-teleop call``'s), the nodes'
    state as their typed status (``core.status``)."""

    def __init__(self, context) -> None:
        super().__init__("demo_probe", context=context)
        self.description: str | None = None
        self.active_sources: list[str] = []
        self.diagnostics: dict[str, dict[str, str]] = {}  # node -> its last diagnostic values
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)
        self.create_subscription(String, "/robot_description", self._on_desc, LATCHED)
        self.create_subscription(String, "/head_camera/active_source", self._on_active, LATCHED)
        # its clients are made up front: a client created mid-episode sends discovery traffic to every process
        self.operator = OperatorClient(self)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            self.diagnostics[status.name] = {kv.key: kv.value for kv in status.values}

    def _on_desc(self, msg: String) -> None:
        self.description = msg.data

    def _on_active(self, msg: String) -> None:
        self.active_sources.append(msg.data)

    def status(self, node: str, kind: type[S]) -> S | None:
        """``node``'s typed status from its newest diagnostics (None before its first report).

        Raises:
            StatusError: its diagnostics do not hold that status (the node and this demo disagree).
        """
        values = self.diagnostics.get(node)
        return None if values is None else kind.decode(values)

    def act(self, action: str, timeout: float = 5.0) -> Result:
        """Perform an operator action (this node is spun by the composition)."""
        return self.operator.perform(action, timeout=timeout)

    def episode(self, action: str, timeout: float = 5.0) -> Path:
        """``episode start`` or ``episode stop``: the episode's directory (the recorder's typed answer).

        Raises:
            RynnTeleopError: the recorder refused, or named no directory.
        """
        result = self.act(action, timeout)
        if not result.ok or not result.episode:
            raise RynnTeleopError(f"demo: {action} failed: {result.message}")
        return Path(result.episode)

    def next_layout(self) -> None:
        """Reset the twin to its next layout (the robot at home); the synthetic operator starts the task
        :data:`TASK_DELAY_S` later.

        Raises:
            RynnTeleopError: the twin refused or is not running.
        """
        result = self.act("twin reset")
        if not result.ok:
            raise RynnTeleopError(f"demo: twin reset failed: {result.message}")

    def wait_for_services(self, timeout: float) -> None:
        """Wait (at most ``timeout`` [s] each) for the services of :data:`PROBE_ACTIONS`."""
        for action in PROBE_ACTIONS:
            self.operator.wait_for_action(action, timeout)


def node_rows(diagnostics: dict[str, dict[str, str]]) -> list[dict]:
    """Rate [Hz] and latency percentiles [ms] of every meter the nodes report in /diagnostics (their last 5 s)."""
    return [{"node": node, "meter": m.name, "rate_hz": m.rate_hz, "latency_p50_ms": m.latency_p50_ms,
             "latency_p99_ms": m.latency_p99_ms}
            for node, values in sorted(diagnostics.items()) for m in decode_meters(values)]


def _wait(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _wait_for_recording(probe: _Probe, procs: list[subprocess.Popen], out: Path, who: str,
                        timeout: float = 60.0) -> None:
    """Wait until the arms are engaged and every recorded topic reaches the recorder (not only subscribed: a
    new subscription may match its publisher a moment later).

    Raises:
        RynnTeleopError: not within ``timeout`` [s]; names the group processes that exited.
    """
    rated = sum(1 for r in DEMO_TOPICS.values() if r)

    def ready() -> bool:
        arm, rec = probe.status("arm_ik", ArmIKStatus), probe.status("recorder", RecorderStatus)
        return (arm is not None and arm.engaged and rec is not None
                and rec.topics_subscribed == (len(DEMO_TOPICS), len(DEMO_TOPICS))
                and rec.topics_flowing == (rated, rated))

    if not _wait(ready, timeout):
        dead = ["+".join(g) for g, p in zip(DEMO_GROUPS, procs) if p.poll() is not None]
        raise RynnTeleopError(f"{who}: the nodes did not come up within {timeout:g} s (exited: {dead}); logs in {out}")


def run_interactive(out_dir: str | Path | None = None, port: int = 8080, duration: float | None = None) -> Path:
    """The demo's stack with the operator console, until Ctrl-C (or ``duration`` [s]); returns the output folder.

    Nothing is automatic but the synthetic operator's calibration and clutch: the operator records episodes
    (into the output folder), toggles the feed and e-stops from the console page.
    """
    out = Path(out_dir) if out_dir else Path("demo_runs") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    use_transport_profile()
    overrides = demo_overrides(out)
    overrides[bringup.CONSOLE] = {"port": int(port)}
    groups = bringup.process_groups((*DEMO_NODES, bringup.CONSOLE))
    procs: list[subprocess.Popen] = []
    try:
        with Composition([]) as comp:
            probe = _Probe(comp.context)
            comp.add_node(probe)
            spawn_groups(groups, overrides, out, probe, procs)
            if not _wait(lambda: probe.status(bringup.CONSOLE, ConsoleStatus) is not None, 60.0):
                dead = ["+".join(g) for g, p in zip(groups, procs) if p.poll() is not None]
                raise RynnTeleopError(f"demo: the console did not come up within 60 s (exited: {dead}); logs in {out}")
            print(f"console: {probe.status(bringup.CONSOLE, ConsoleStatus).url}  (episodes go to {out}; Ctrl-C stops)",
                  flush=True)
            comp.spin(duration)
    finally:
        stop_groups(procs)
    return out


def run_demo(duration: float = 20.0, out_dir: str | Path | None = None) -> Path:
    """Run the digital teleoperation demo with an episode of ``duration`` [s]; returns the episode directory."""
    out = Path(out_dir) if out_dir else Path("demo_runs") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    use_transport_profile()
    overrides = demo_overrides(out)
    procs: list[subprocess.Popen] = []
    host: HostProbes | None = None
    try:
        with Composition([]) as comp:
            probe = _Probe(comp.context)
            comp.add_node(probe)
            spawn_groups(DEMO_GROUPS, overrides, out, probe, procs)
            _wait_for_recording(probe, procs, out, "demo")
            probe.wait_for_services(10.0)
            host = HostProbes(SETTLE_S + duration + 120.0)  # before the settle time: its start-up is not the episode's
            time.sleep(SETTLE_S)
            probe.next_layout()
            probe.episode("episode start")
            t0 = time.monotonic()
            toggles = []
            for fraction, action in zip(TOGGLE_AT, ("feed physical", "feed generated")):
                time.sleep(max(0.0, t0 + fraction * duration - time.monotonic()))
                toggles.append({"at_s": round(time.monotonic() - t0, 2), "action": action,
                                "response": probe.act(action).message})
            time.sleep(max(0.0, t0 + duration - time.monotonic()))
            rows = node_rows(probe.diagnostics)
            episode = probe.episode("episode stop", timeout=STOP_TIMEOUT_S)
            description, active_sources = probe.description, list(probe.active_sources)
            arm_ik = probe.status("arm_ik", ArmIKStatus)
            host_policy, stalls = host.finish()
    finally:
        stop_groups(procs)
        if host is not None:
            host.stop()
    if not (episode / "metadata.yaml").is_file():
        raise RynnTeleopError(f"demo: the episode was not stopped cleanly: {episode} has no metadata.yaml")
    info = episode_info(episode)
    host_report = host_stall_report(host_policy, stalls, info)
    plot_joints(episode, out / "joints.png")
    video_preview(episode, out / "preview.mp4", topic="/head_camera/color/image_raw")
    twin_video(episode, out / "twin.mp4")  # what physics did: the robot and objects as recorded, drawn after
    arms = {"engaged": arm_ik.engaged if arm_ik else None, "calibrated": arm_ik.calibrated if arm_ik else None}
    outcome = episode_outcome(episode)
    summary = {"duration_s": duration, "groups": [list(g) for g in DEMO_GROUPS], "meters": rows, "arms": arms,
               "toggles": toggles, "active_sources_seen": active_sources, "episode": str(episode),
               "episode_problems": info.problems, "host_stalls": host_report, "outcome": outcome,
               "robot_description_received": description is not None}
    write_json(out / "summary.json", summary)
    header = f"{'node':<18} {'meter':<22} {'rate Hz':>8} {'p50 ms':>8} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['node']:<18} {r['meter']:<22} {r['rate_hz']:>8} {r['latency_p50_ms']:>8} {r['latency_p99_ms']:>8}")
    print(f"arms calibrated: {arms['calibrated']}, engaged: {arms['engaged']}; "
          f"feed: {' -> '.join(active_sources)}")
    print(f"episode: {info.stats.message_count if info.stats else '?'} messages, "
          f"{len(info.problems)} problem(s); joints.png, preview.mp4 (the feed) and twin.mp4 (the twin) in {out}")
    for problem in info.problems:
        print(f"  {problem}")
    print(host_stall_line(host_report))
    print(outcome_line(outcome))
    return episode  # printed last by the CLI


def episode_outcome(episode: Path) -> dict:
    """The episode's outcome as ``episode.yaml`` holds it: ``outcome`` (success, failure or '' when nobody judged
    it: no twin ran and no operator labelled it) and ``reason``."""
    doc = episode_doc(episode)
    return {"outcome": str(doc.get("outcome") or ""), "reason": str(doc.get("outcome_reason") or ""),
            "twin": (doc.get("extra") or {}).get("twin")}


def outcome_line(outcome: dict) -> str:
    """One line for the operator: the task's outcome as the physical twin judged it."""
    if not outcome["outcome"]:
        return "outcome: not judged (no twin reported one)"
    reason = f" ({outcome['reason']})" if outcome["reason"] else ""
    return f"outcome: {outcome['outcome']}{reason}"


def strict_json(value):
    """``value`` with every float that is not a number (NaN, infinity) replaced by None, so that any JSON reader
    accepts it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def write_json(path: Path, value) -> None:
    """``value`` as strict JSON (:func:`strict_json`; never ``NaN``) to ``path``."""
    path.write_text(json.dumps(strict_json(value), indent=2, allow_nan=False) + "\n")


def record_episodes(count: int, duration: float, out_dir: str | Path, *, gap: float = 1.0,
                    task: str = "world-model data: bimanual pick-and-place") -> list[Path]:
    """Record ``count`` episodes of ``duration`` [s] back to back (``gap`` [s] apart) with the demo's stack.

    The training data of the world model: the digital mode's synthetic operator, the feed on the physical
    (synthetic) head camera, which draws the simulated robot at the measured joints, the whole time (no
    toggles), and the recorder's default topics (head camera colour, commands, joint states, ...). The
    operator keeps moving between episodes, so each episode shows another stretch of the task.

    Returns:
        The episode directories, in recording order.

    Raises:
        RynnTeleopError: the stack did not come up, or an episode was not stopped cleanly.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    use_transport_profile()
    overrides = demo_overrides(out)
    overrides["recorder"]["task"] = task
    overrides.setdefault("camera_switch", {})["active_source"] = "physical"
    procs: list[subprocess.Popen] = []
    episodes: list[Path] = []
    try:
        with Composition([]) as comp:
            probe = _Probe(comp.context)
            comp.add_node(probe)
            spawn_groups(DEMO_GROUPS, overrides, out, probe, procs)
            _wait_for_recording(probe, procs, out, "record")
            probe.wait_for_services(10.0)
            time.sleep(SETTLE_S)
            for _ in range(count):
                probe.next_layout()
                probe.episode("episode start")
                time.sleep(duration)
                episode = probe.episode("episode stop", timeout=STOP_TIMEOUT_S)
                if not (episode / "metadata.yaml").is_file():
                    raise RynnTeleopError(f"record: the episode was not stopped cleanly: {episode} has no "
                                          f"metadata.yaml")
                episodes.append(episode)
                time.sleep(gap)
    finally:
        stop_groups(procs)
    return episodes


def host_stall_report(policy: str | None, stalls: list[Stall], info) -> dict:
    """The machine's own stalls during the episode (``host_stalls.HostProbes``) and, per topic, how many of
    the episode's gaps overlap one. ``measured`` is False when the probes failed or could not run at
    real-time priority on every CPU (their lateness then proves nothing)."""
    if policy != REALTIME_POLICY or info.stats is None:
        return {"measured": False, "probe": policy}
    start_s = info.stats.start_ns * 1e-9
    inside = within(stalls, start_s, info.stats.stop_ns * 1e-9)
    gaps = {topic: t.gaps for topic, t in info.stats.topics.items() if t.gaps}
    return {
        "measured": True, "probe": policy,
        "stalls": rows(inside, start_s),
        "longest_ms": round(1e3 * max((s.length_s for s in inside), default=0.0), 1),
        "gaps": sum(map(len, gaps.values())),
        "gaps_overlapping_stalls": {topic: sum(overlaps(inside, g.start_ns, g.end_ns) for g in gs)
                                    for topic, gs in gaps.items()},
    }


def host_stall_line(report: dict) -> str:
    """One line for the operator: the machine's stalls and the gaps that overlap them."""
    if not report.get("measured"):
        return f"host stalls: not measured (probe: {report.get('probe') or 'failed'})"
    probe = "a SCHED_FIFO 99 probe per CPU; memory: a page walk of >= 5 ms"
    if not report["stalls"]:
        line = f"host stalls: none of >= 10 ms during the episode, no memory stall ({probe})"
    else:
        cpu_rows = [row for row in report["stalls"] if row[3] == "cpu"]
        cpus = len({row[0] for row in cpu_rows})
        cpu_part = f"{len(cpu_rows)} of >= 10 ms on {cpus} CPU(s)" if cpu_rows else "none of >= 10 ms"
        line = (f"host stalls: {cpu_part} and {len(report['stalls']) - len(cpu_rows)} memory stall(s) during the "
                f"episode (longest {report['longest_ms']} ms; {probe})")
    if report["gaps"]:
        overlapping = sum(report["gaps_overlapping_stalls"].values())
        line += f"; {overlapping} of the episode's {report['gaps']} gap(s) overlap one"
    return line
