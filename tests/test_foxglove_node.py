"""foxglove node on real rclpy, checked with Foxglove's own protocol client.

The client (tests/foxglove_client/client.js) is the npm ``@foxglove/ws-protocol`` client over ``ws`` and decodes
``ros2msg``/``cdr`` channels with ``@foxglove/rosmsg`` + ``@foxglove/rosmsg2-serialization``, the parser and
decoder the Foxglove app uses. Like the app, it offers the subprotocols ``foxglove.sdk.v1`` (the only one a
foxglove-sdk server accepts, as foxglove_bridge >= 3 does) and ``foxglove.websocket.v1`` (the same protocol
under its older name). ``npm ci`` installs it into its folder the first time (node_modules is kept);
the tests that need it skip only where ``node``/``npm`` are missing, and a failed install fails them.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from ros_helpers import wait_for
from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.msg import get_types_from_msg
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from rynn_teleop.errors import ParameterError
from rynn_teleop.nodes.camera_switch import LATCHED
from rynn_teleop.nodes.foxglove import DEFAULT_TOPICS, LAYOUT_TOPICS, FoxgloveNode, ros2msg_definition
from rynn_teleop.nodes.parameters import to_ros_parameters
from rynn_teleop.paths import share_dir
from rynn_teleop.recording.cdr import header_stamp_ns
from rynn_teleop.recording.writer import default_typestore
from rynn_teleop.runner import Composition, node_parameters

CLIENT_DIR = Path(__file__).parent / "foxglove_client"
SUBPROTOCOL = "foxglove.sdk.v1"  # the Foxglove WebSocket protocol (ws-protocol spec) as foxglove-sdk names it
JOINTS = ["left_joint_1", "left_joint_2", "right_joint_1"]


# ---------------------------------------------------------------- the protocol client
@pytest.fixture(scope="module")
def protocol_client() -> list[str]:
    """The command that runs the Node.js client (its packages installed with ``npm ci`` when missing)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the Foxglove protocol client (tests/foxglove_client); "
                    "install Node.js >= 20")
    if not _client_installed():
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=CLIENT_DIR,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"npm ci failed in {CLIENT_DIR}:\n{proc.stdout}\n{proc.stderr}"
        assert _client_installed(), f"npm ci in {CLIENT_DIR} did not install {_client_dependencies()}"
    return [node, str(CLIENT_DIR / "client.js")]


def _client_dependencies() -> dict[str, str]:
    return json.loads((CLIENT_DIR / "package.json").read_text())["dependencies"]


def _client_installed() -> bool:
    """Every dependency installed at the version package.json pins."""
    for name, version in _client_dependencies().items():
        manifest = CLIENT_DIR / "node_modules" / name / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return True


class ClientRun:
    """One run of the protocol client, its JSON lines written to ``out``."""

    def __init__(self, command: list[str], port: int, want: dict[str, int], out: Path, *extra: str,
                 timeout: float = 30.0) -> None:
        self.out = out
        self.timeout = timeout
        wants = [arg for topic, n in want.items() for arg in ("--want", f"{topic}={n}")]
        self._stdout = out.open("w")
        self.proc = subprocess.Popen([*command, "--url", f"ws://127.0.0.1:{port}", *wants, "--timeout", str(timeout),
                                      *extra], stdout=self._stdout, stderr=subprocess.PIPE, text=True)

    def events(self, kind: str | None = None) -> list[dict]:
        events = []
        for line in self.out.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:  # the line being written
                continue
        return [e for e in events if kind is None or e["event"] == kind]

    def wait(self) -> list[dict]:
        try:
            _, stderr = self.proc.communicate(timeout=self.timeout + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._stdout.close()
        events = self.events()
        assert not [e for e in events if e["event"] == "error"], (events[-5:], stderr)
        return events

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stdout.close()


def start_foxglove(comp: Composition, **overrides) -> FoxgloveNode:
    """The foxglove node (YAML defaults, ``overrides``, any free port) spinning in ``comp``."""
    values = node_parameters("foxglove", FoxgloveNode.SCHEMA, overrides={"port": 0, **overrides})
    node = FoxgloveNode(context=comp.context, parameter_overrides=to_ros_parameters(FoxgloveNode.SCHEMA, values))
    comp.add_node(node)
    return node


def joint_state(k: int) -> JointState:
    msg = JointState(name=JOINTS, position=[0.001 * k, -0.5, 1.25], velocity=[0.0, 0.1 * k, 0.0])
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1000 + k, 250_000_000
    msg.header.frame_id = "base_link"
    return msg


def camera_frame(k: int, width: int = 640, height: int = 480) -> Image:
    """An rgb8 frame whose pixels depend on ``k`` (0.9 MB at 640x480, like the head camera)."""
    row = bytes((k + i) % 251 for i in range(width * 3))
    msg = Image(height=height, width=width, encoding="rgb8", step=width * 3, data=row * height)
    msg.header.stamp.sec, msg.header.frame_id = k, "head_camera_color_optical_frame"
    return msg


def channel_typestore(channel: dict):
    """A rosbags typestore that knows only what the advertised schema defines."""
    store = get_typestore(Stores.EMPTY)
    store.register(get_types_from_msg(channel["schema"], channel["schemaName"]))
    return store


# ---------------------------------------------------------------- tests
def test_protocol_client_gets_ros2_channels_and_the_published_cdr_unchanged(ros_domain_id, protocol_client,
                                                                             tmp_path):
    comp = Composition([], domain_id=ros_domain_id)
    stop = threading.Event()
    publisher_thread = None
    client = None
    try:
        pub = Node("foxglove_test_publisher", context=comp.context)
        comp.add_node(pub)
        active = pub.create_publisher(String, "/head_camera/active_source", LATCHED)
        active.publish(String(data="generated"))  # latched, before the foxglove node exists
        joints = pub.create_publisher(JointState, "/joint_states", 100)
        image = pub.create_publisher(Image, "/head_camera/color/image_raw", qos_profile_sensor_data)
        fox = start_foxglove(comp)  # the default topics
        want = {"/joint_states": 30, "/head_camera/color/image_raw": 3, "/head_camera/active_source": 1}
        assert wait_for(lambda: set(want) <= set(fox.served), 15.0), (fox.served, fox.unservable)
        assert all(s.sub is None for s in fox.served.values())  # no client yet: no ROS subscription

        # what a raw subscriber receives (the CDR on the wire: its padding bytes are not those of a fresh
        # serialize_message), by header.stamp.sec
        wire: dict[str, dict[int, bytes]] = {"/joint_states": {}, "/head_camera/color/image_raw": {}}
        for topic, kind, qos in (("/joint_states", JointState, 100),
                                 ("/head_camera/color/image_raw", Image, qos_profile_sensor_data)):
            pub.create_subscription(kind, topic, lambda raw, t=topic: wire[t].setdefault(
                header_stamp_ns(raw) // 1_000_000_000, raw), qos, raw=True)

        def publish() -> None:
            k = 0
            while not stop.is_set():
                joints.publish(joint_state(k))
                if k % 10 == 0:
                    image.publish(camera_frame(k))
                k += 1
                time.sleep(0.01)

        publisher_thread = threading.Thread(target=publish, daemon=True)
        publisher_thread.start()
        client = ClientRun(protocol_client, fox.port, want, tmp_path / "client.jsonl", timeout=40.0)
        events = client.wait()
        assert client.proc.returncode == 0, events[-3:]
        stop.set()

        assert events[0] == {"event": "open", "protocol": SUBPROTOCOL}
        assert [e["name"] for e in events if e["event"] == "serverInfo"] == ["rynn_teleop"]
        channels = {c["topic"]: c for e in events if e["event"] == "advertise" for c in e["channels"]}
        types = {"/joint_states": "sensor_msgs/msg/JointState", "/head_camera/color/image_raw": "sensor_msgs/msg/Image",
                 "/head_camera/active_source": "std_msgs/msg/String"}
        for topic, type_name in types.items():
            assert channels[topic]["encoding"] == "cdr"
            assert channels[topic]["schemaEncoding"] == "ros2msg"
            assert channels[topic]["schemaName"] == type_name
        assert "MSG: std_msgs/Header" in channels["/joint_states"]["schema"]
        stores = {topic: channel_typestore(channels[topic]) for topic in types}  # decode with what was advertised

        messages = [e for e in events if e["event"] == "message"]
        for m in messages:
            data = base64.b64decode(m["data_b64"])
            assert len(data) == m["length"] and data[:16].hex() == m["head_hex"]
            assert "decode_error" not in m and m["trailing"] is False  # Foxglove's decoder read every byte
            assert abs(int(m["timestamp"]) - time.time_ns()) < 120e9  # the receive time [ns]
            m["data"], m["ros"] = data, stores[m["topic"]].deserialize_cdr(data, types[m["topic"]])

        got_joints = [m for m in messages if m["topic"] == "/joint_states"]
        assert len(got_joints) >= 30  # the client stops once every wanted topic has its count
        stamps = [m["ros"].header.stamp.sec for m in got_joints]
        assert stamps == list(range(stamps[0], stamps[0] + len(stamps)))  # every message, in order
        for m in got_joints:
            k = m["ros"].header.stamp.sec - 1000
            assert m["data"] == wire["/joint_states"][1000 + k]  # the CDR bytes as published, unchanged
            assert m["ros"].name == JOINTS and m["ros"].header.frame_id == "base_link"
            assert m["ros"].position.tolist() == [0.001 * k, -0.5, 1.25]
            assert m["ros"].header.stamp.nanosec == 250_000_000
            assert m["decoded"]["position"] == [0.001 * k, -0.5, 1.25]  # Foxglove's decoder agrees
            assert m["decoded"]["header"]["stamp"] == {"sec": 1000 + k, "nanosec": 250_000_000}

        got_images = [m for m in messages if m["topic"] == "/head_camera/color/image_raw"]
        assert len(got_images) >= 3
        for m in got_images:
            k = m["ros"].header.stamp.sec
            assert m["data"] == wire["/head_camera/color/image_raw"].get(k, m["data"])  # (best effort: if seen)
            assert (m["ros"].width, m["ros"].height, m["ros"].encoding) == (640, 480, "rgb8")
            assert bytes(m["ros"].data) == bytes(camera_frame(k).data)
            assert m["decoded"]["data"]["length"] == 640 * 480 * 3 and m["decoded"]["encoding"] == "rgb8"

        (latched,) = [m for m in messages if m["topic"] == "/head_camera/active_source"]
        assert latched["ros"].data == "generated" and latched["decoded"] == {"data": "generated"}

        for _ in range(2):  # the CPU share is measured between two reports
            time.sleep(0.2)
            with fox.lock:
                values = fox.diagnostic_values()
        assert values["/joint_states.forwarded"] >= 30 and values["/joint_states.dropped"] == 0
        assert values["/head_camera/color/image_raw.forwarded"] >= 3
        assert float(values["cpu_percent"]) >= 0.0
        assert values["url"] == f"ws://127.0.0.1:{fox.port}"
        # the client has gone: its subscriptions are dropped on the ROS side too
        assert wait_for(lambda: all(s.sub is None for s in fox.served.values()), 10.0)
    finally:
        stop.set()
        if publisher_thread is not None:
            publisher_thread.join(5.0)
        if client is not None:
            client.kill()
        comp.shutdown()
    assert not comp.errors


def test_a_stalled_client_loses_the_oldest_messages_while_the_node_and_other_clients_keep_up(
        ros_domain_id, protocol_client, tmp_path):
    """Frames of 0.9 MB at 20 Hz; one client stops reading for 8 s: its queue (client_backlog) drops the oldest
    frames, the node forwards every frame as it arrives and the other client receives them all."""
    n_frames, topic = 60, "/test/camera"
    comp = Composition([], domain_id=ros_domain_id)
    stalled = steady = None
    try:
        pub = Node("foxglove_test_camera", context=comp.context)
        comp.add_node(pub)
        camera = pub.create_publisher(Image, topic, QoSProfile(depth=30, reliability=ReliabilityPolicy.RELIABLE))
        fox = start_foxglove(comp, topics=[], client_backlog=16)  # every topic of the graph
        assert wait_for(lambda: topic in fox.served, 15.0), (fox.served, fox.unservable)
        stalled = ClientRun(protocol_client, fox.port, {topic: 100_000}, tmp_path / "stalled.jsonl",
                            "--pause", "8", "--quiet", "2", "--no-data", timeout=60.0)
        steady = ClientRun(protocol_client, fox.port, {topic: n_frames}, tmp_path / "steady.jsonl",
                           "--quiet", "4", "--no-data", timeout=60.0)
        assert wait_for(lambda: stalled.events("paused") and steady.events("subscribed"), 20.0)
        assert wait_for(lambda: fox.served[topic].sub is not None and camera.get_subscription_count() > 0, 10.0)
        time.sleep(0.5)  # the new reader matched

        start = time.monotonic()
        for k in range(n_frames):
            camera.publish(camera_frame(k))
            time.sleep(max(0.0, start + (k + 1) / 20.0 - time.monotonic()))
        # the ROS side kept up while one client was stalled: every frame handed to the server, none lost
        assert wait_for(lambda: fox.served[topic].forwarded == n_frames, 2.0), fox.served[topic].forwarded
        assert fox.served[topic].dropped == 0
        assert not stalled.events("resumed")  # all of this happened while the stalled client did not read

        steady_events, stalled_events = steady.wait(), stalled.wait()
        got_steady = [e for e in steady_events if e["event"] == "message"]
        got_stalled = [e for e in stalled_events if e["event"] == "message"]
        assert len(got_steady) >= n_frames - 3, len(got_steady)  # the other client: (nearly) every frame
        assert len(got_stalled) < n_frames - 10, len(got_stalled)  # the stalled one lost frames ...
        stamps = [e["decoded"]["header"]["stamp"]["sec"] for e in got_stalled]
        assert stamps == sorted(stamps) and stamps[-1] == n_frames - 1  # ... the oldest ones: it got the newest
    finally:
        for run in (stalled, steady):
            if run is not None:
                run.kill()
        comp.shutdown()
    assert not comp.errors


def test_a_client_offering_only_the_old_subprotocol_name_is_refused(ros_domain_id, protocol_client, tmp_path):
    """foxglove-sdk accepts ``foxglove.sdk.v1`` only: Foxglove app versions (and Lichtblick) that offer only
    ``foxglove.websocket.v1`` cannot connect (HTTP 400), as with foxglove_bridge >= 3."""
    comp = Composition([], domain_id=ros_domain_id)
    try:
        fox = start_foxglove(comp)
        client = ClientRun(protocol_client, fox.port, {"/diagnostics": 1}, tmp_path / "old.jsonl",
                           "--subprotocol", "foxglove.websocket.v1", timeout=10.0)
        client.proc.communicate(timeout=40)
        client.kill()
        events = client.events()
        assert client.proc.returncode == 1
        assert {"event": "error", "message": "Unexpected server response: 400"} in events
    finally:
        comp.shutdown()


@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_a_port_out_of_range_is_refused_naming_the_key(port):
    with pytest.raises(ParameterError) as info:
        node_parameters("foxglove", FoxgloveNode.SCHEMA, overrides={"port": port})
    assert info.value.key == "port"
    assert "'port'" in str(info.value) and "[0, 65535]" in str(info.value)


def test_the_node_executable_refuses_a_bad_port(ros_env):
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from rynn_teleop.nodes.foxglove import main; sys.exit(main())",
         "--ros-args", "-p", "port:=70000"],
        env=ros_env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "refusing to start" in proc.stderr and "'port'" in proc.stderr


def test_a_port_in_use_is_refused_naming_the_port(ros_domain_id):
    comp = Composition([], domain_id=ros_domain_id)
    try:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            with pytest.raises(ParameterError) as info:
                start_foxglove(comp, port=port)
        assert info.value.key == "port" and f"127.0.0.1:{port}" in str(info.value)
    finally:
        comp.shutdown()


def test_default_topics_are_the_shipped_layouts_and_the_state_topics():
    layout = json.loads((share_dir() / "config" / "rynn_teleop.foxglove.json").read_text())

    def topics(node) -> set[str]:  # every string (or key) naming a topic; message paths cut at the first "."
        if isinstance(node, dict):
            return set().union(*(topics(k) | topics(v) for k, v in node.items())) if node else set()
        if isinstance(node, list):
            return set().union(*(topics(v) for v in node)) if node else set()
        return {node.split(".", 1)[0]} if isinstance(node, str) and node.startswith("/") else set()

    assert topics(layout["configById"]) == set(LAYOUT_TOPICS)
    assert set(DEFAULT_TOPICS) == set(LAYOUT_TOPICS) | {"/joint_states", "/robot_description", "/tf", "/tf_static"}
    assert FoxgloveNode.SCHEMA.params["topics"].default == list(DEFAULT_TOPICS)
    assert FoxgloveNode.SCHEMA.params["host"].default == "127.0.0.1"
    assert FoxgloveNode.SCHEMA.params["port"].default == 8765


def test_ros2msg_definition_is_rosbag2s_text_and_parses_back_to_the_same_types():
    text = ros2msg_definition("sensor_msgs/msg/JointState")
    assert text.startswith("std_msgs/Header header\n")
    assert f"{'=' * 80}\nMSG: std_msgs/Header\n" in text and "MSG: builtin_interfaces/Time" in text
    parsed = get_types_from_msg(text, "sensor_msgs/msg/JointState")
    known = default_typestore().fielddefs
    assert set(parsed) == {"sensor_msgs/msg/JointState", "std_msgs/msg/Header", "builtin_interfaces/msg/Time"}
    assert all(parsed[name] == known[name] for name in parsed)
    assert ros2msg_definition("no_such_msgs/msg/Thing") is None
