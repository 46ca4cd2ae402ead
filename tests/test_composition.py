"""Nodes on real rclpy: composed in one process, as console scripts, clean shutdown."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
import rclpy
from rclpy.node import Node
from rclpy.time import Time
from sensor_msgs.msg import JointState
from visualization_msgs.msg import MarkerArray

from rynn_teleop.errors import ParameterError
from rynn_teleop.runner import Composition


def _wait(pred, timeout: float, spin) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spin()
        if pred():
            return True
    return False


def test_two_composed_nodes_exchange_messages_and_shut_down(ros_domain_id):
    threads_before = threading.active_count()
    comp = Composition(
        ["joint_sweep", "robot_markers"],
        overrides={"joint_sweep": {"groups": ["left_arm"], "rate_hz": 50.0}},
        domain_id=ros_domain_id,
    )
    published: set[int] = set()  # stamps of the joint states the sweep published from here on
    sweep_pub = comp.node("joint_sweep")._pub
    publish = sweep_pub.publish

    def recording_publish(msg) -> None:
        published.add(Time.from_msg(msg.header.stamp).nanoseconds)
        publish(msg)

    sweep_pub.publish = recording_publish
    joint_states: list[int] = []
    marker_stamps: list[int] = []
    probe = Node("probe", context=comp.context)
    probe.create_subscription(JointState, "/joint_states", lambda m: joint_states.append(1), 50)
    probe.create_subscription(
        MarkerArray,
        "/robot_markers",
        lambda m: marker_stamps.append(Time.from_msg(m.markers[0].header.stamp).nanoseconds),
        10,
    )
    comp.add_node(probe)
    try:
        assert _wait(lambda: len(marker_stamps) >= 5, 20.0, lambda: comp.spin(0.1)), "no markers arrived"
        assert joint_states, "no joint states reached another node"
        # markers are built from joint states the sweep really published (compared from the first published
        # after the wrapper was in place; the stamps of one publisher increase)
        since = min(published)
        later = [s for s in marker_stamps if s >= since]
        assert later and set(later) <= published
        assert len(set(marker_stamps)) >= 2, "markers do not follow the moving joint states"
        assert comp.node("robot_markers").state.latest_stamp > 0
    finally:
        comp.remove_node(probe)
        comp.shutdown()
    assert not comp.context.ok()
    deadline = time.monotonic() + 5
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads_before


def test_bad_parameter_stops_composition_before_any_node(ros_domain_id, tmp_path):
    (tmp_path / "joint_sweep.yaml").write_text("joint_sweep:\n  ros__parameters:\n    rate_hz: 5000.0\n")
    with pytest.raises(ParameterError, match="rate_hz") as err:
        Composition(["joint_sweep"], config_dir=tmp_path, domain_id=ros_domain_id)
    assert "1000" in str(err.value)


def _console(name: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; from rynn_teleop.nodes.{name} import main; sys.exit(main())"]


def test_console_node_refuses_unknown_key(ros_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("robot_markers:\n  ros__parameters:\n    rate_hz: 10.0\n    frame_idd: base_link\n")
    out = subprocess.run(
        _console("robot_markers") + ["--ros-args", "--params-file", str(bad)],
        env=ros_env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2
    assert "frame_idd" in out.stderr and "frame_id" in out.stderr


def test_runner_process_stops_cleanly_on_ctrl_c(ros_env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rynn_teleop.cli", "run", "robot_description", "joint_sweep", "robot_markers"],
        env=ros_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    # an external subscriber (its own process context) sees the composed nodes' output
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=int(ros_env["ROS_DOMAIN_ID"]))
    node = Node("external_probe", context=ctx)
    got: list[int] = []
    node.create_subscription(MarkerArray, "/robot_markers", lambda m: got.append(len(m.markers)), 10)
    try:
        ok = _wait(lambda: len(got) >= 3, 40.0, lambda: _spin(node, ctx))
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)
    try:
        assert ok, "no markers from the runner process"
        assert got[0] > 50
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out


def _spin(node: Node, ctx) -> None:
    executor = rclpy.executors.SingleThreadedExecutor(context=ctx)
    executor.add_node(node)
    executor.spin_once(timeout_sec=0.1)
    executor.remove_node(node)


def test_a_callback_error_is_recorded_but_one_raised_while_shutting_down_is_not(ros_domain_id):
    comp = Composition([], domain_id=ros_domain_id)
    failing = Node("failing", context=comp.context)
    failing.create_timer(0.01, lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    comp.add_node(failing)
    assert _wait(lambda: comp.errors, 5.0, lambda: time.sleep(0.02))
    assert isinstance(comp.errors[0], RuntimeError)

    # a callback still running when shutdown() gives up waiting and destroys its node
    slow = Node("slow", context=comp.context)
    pub = slow.create_publisher(JointState, "/slow", 1)
    destroyed = threading.Event()
    real_destroy = slow.destroy_node
    raised = threading.Event()

    def destroy() -> None:  # other nodes' teardown keeps the context alive a while longer
        real_destroy()
        destroyed.set()
        raised.wait(5.0)

    slow.destroy_node = destroy
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        destroyed.wait(15.0)
        try:
            pub.publish(JointState())  # InvalidHandle: the node is gone
        finally:
            raised.set()

    slow.create_timer(0.01, stuck)
    comp.add_node(slow)
    assert entered.wait(5.0)
    recorded = list(comp.errors)
    comp.shutdown()
    assert destroyed.is_set() and raised.is_set()
    assert comp.errors == recorded


def test_the_runner_freezes_its_start_up_objects(ros_env):
    """``rynn-teleop run`` moves what start-up left alive out of the collector's reach once its nodes exist
    (a full collection then does not scan it with the GIL held), and gives it back once they are destroyed (so
    that native objects in its cycles are freed before the interpreter ends, not reported leaked)."""
    script = ("import gc, sys\n"
              "import rynn_teleop.nodes.process as process\n"
              "seen = []\n"
              "release = process.release_startup_objects\n"
              "process.release_startup_objects = lambda: (seen.append(gc.get_freeze_count()), release())\n"
              "from rynn_teleop.cli import main\n"
              "code = main(['run', 'robot_description', '--duration', '0.2'])\n"
              "print(code, seen[0], gc.get_freeze_count())\n")
    out = subprocess.run([sys.executable, "-c", script], env=ros_env, capture_output=True, text=True, timeout=120)
    code, frozen, after = out.stdout.split()[-3:]
    assert code == "0" and int(frozen) > 10_000 and int(after) == 0, out.stderr
    assert "leaked" not in out.stderr
