"""recorder node on real rclpy: known messages -> episode bag -> read back with rosbags and mcap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.serialization import deserialize_message, serialize_message
from ros_helpers import wait_for
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger

from rynn_teleop.core.status import Count, RecorderStatus
from rynn_teleop.nodes.base import Taken
from rynn_teleop.nodes.camera_switch import LATCHED
from rynn_teleop.nodes.recorder import EPISODE_QOS, EPISODE_TOPIC
from rynn_teleop.runner import Composition
from rynn_teleop.sources.playback import open_bag

TOPICS = ["/test/joints", "/test/image", "/head_camera/active_source", "/test/never"]
RATES = [100.0, 10.0, 0.0, 50.0]


def call(node: Node, name: str) -> Trigger.Response:
    client = node.create_client(Trigger, name)
    assert client.wait_for_service(timeout_sec=10.0)
    future = client.call_async(Trigger.Request())
    assert wait_for(future.done, 15.0)
    return future.result()


class EpisodeTopic:
    """The recorder's latched ``~/episode`` as a client sees it: the directory each start and stop announces."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.values: list[str] = []
        node.create_subscription(String, EPISODE_TOPIC, lambda m: self.values.append(m.data), EPISODE_QOS)

    def call(self, service: str) -> tuple[Trigger.Response, str | None]:
        """Call the recorder's ``service``; its response and the directory then announced (None: nothing)."""
        assert wait_for(lambda: self.values, 10.0), "the recorder announces no episode directory"
        seen = len(self.values)
        response = call(self.node, service)
        if not response.success:
            return response, None
        assert wait_for(lambda: len(self.values) > seen, 5.0), f"{service}: nothing announced on {EPISODE_TOPIC}"
        return response, self.values[-1]


def status(rec) -> RecorderStatus:
    """The recorder's typed status, read from its diagnostics values as a subscriber gets them."""
    return RecorderStatus.decode({k: str(v) for k, v in rec.diagnostic_values().items()})


def recorder(ros_domain_id, out: Path, **extra) -> Composition:
    return Composition(["recorder"], overrides={"recorder": {"output_dir": str(out), "topics": TOPICS,
                                                             "expected_rates_hz": RATES, "task": "pick cube",
                                                             "operator": "ada", **extra}},
                       domain_id=ros_domain_id)


def assert_rosbag2_metadata(episode: Path) -> dict:
    """What rosbag2's own reader (rosbag2_storage/yaml.hpp, metadata version 9) requires of metadata.yaml.

    ``ros2 bag info/play`` is not available here; this checks every field its YAML decoder reads, with its type.
    """
    meta = yaml.safe_load((episode / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9 and meta["storage_identifier"] == "mcap"
    assert isinstance(meta["duration"]["nanoseconds"], int)
    assert isinstance(meta["starting_time"]["nanoseconds_since_epoch"], int)
    assert isinstance(meta["message_count"], int)
    assert isinstance(meta["compression_format"], str) and isinstance(meta["compression_mode"], str)
    assert isinstance(meta["ros_distro"], str)  # version >= 8
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta["custom_data"].items())  # map<str, str>
    assert meta["relative_file_paths"] and all((episode / p).is_file() for p in meta["relative_file_paths"])
    for f in meta["files"]:
        assert isinstance(f["path"], str) and isinstance(f["message_count"], int)
        assert isinstance(f["duration"]["nanoseconds"], int)
        assert isinstance(f["starting_time"]["nanoseconds_since_epoch"], int)
    for t in meta["topics_with_message_count"]:
        tm = t["topic_metadata"]
        assert isinstance(t["message_count"], int)
        assert all(isinstance(tm[k], str) for k in ("name", "type", "serialization_format", "type_description_hash"))
        assert isinstance(tm["offered_qos_profiles"], list)  # version 9: a YAML sequence, not a string
        for q in tm["offered_qos_profiles"]:
            assert {"history", "depth", "reliability", "durability", "deadline", "lifespan", "liveliness",
                    "liveliness_lease_duration", "avoid_ros_namespace_conventions"} <= set(q)
    assert sum(t["message_count"] for t in meta["topics_with_message_count"]) == meta["message_count"]
    return meta


def test_round_trip_bytes_and_counts_identical_in_rosbags_and_mcap(ros_domain_id, tmp_path):
    comp = recorder(ros_domain_id, tmp_path)
    try:
        rec = comp.node("recorder")
        pub_node = Node("publisher", context=comp.context)
        comp.add_node(pub_node)
        wire: dict[str, list[bytes]] = {"/test/joints": [], "/test/image": []}  # what a raw subscriber receives
        pub_node.create_subscription(JointState, "/test/joints", wire["/test/joints"].append, 100, raw=True)
        pub_node.create_subscription(Image, "/test/image", wire["/test/image"].append, qos_profile_sensor_data,
                                     raw=True)
        time.sleep(1.5)  # topics with subscribers only: the recorder waits for a publisher to match its QoS
        joints = pub_node.create_publisher(JointState, "/test/joints", 100)
        image = pub_node.create_publisher(Image, "/test/image", qos_profile_sensor_data)
        active = pub_node.create_publisher(String, "/head_camera/active_source", LATCHED)
        active.publish(String(data="generated"))
        assert wait_for(lambda: {"/test/joints", "/test/image", "/head_camera/active_source"} <= set(rec._types), 10.0)
        assert wait_for(lambda: joints.get_subscription_count() > 0 and image.get_subscription_count() > 0, 5.0)
        # until the recorder receives the topic (its reader may match the publisher a moment after the publisher
        # sees it): warm-up messages, before the episode, so not recorded
        assert wait_for(lambda: joints.publish(JointState(name=["warm-up"])) or "/test/joints" in rec.flowing(), 10.0)
        time.sleep(0.1)
        announced = EpisodeTopic(pub_node)
        response, directory = announced.call("/recorder/start_episode")
        assert response.success, response.message
        episode = Path(directory)
        st = status(rec)
        assert st.recording and st.episode == directory and st.name == "episode_0001"
        assert st.topics_subscribed == Count(3, 4) and st.output_dir == str(tmp_path)
        sent: dict[str, list] = {"/test/joints": [], "/test/image": []}
        for k in range(100):
            msg = JointState(name=["a", "b"], position=[0.01 * k, -0.01 * k])
            msg.header.stamp.sec, msg.header.stamp.nanosec = 1000 + k, 7  # header stamps kept inside the messages
            joints.publish(msg)
            sent["/test/joints"].append(msg)
            if k % 10 == 0:
                img = Image(height=2, width=3, encoding="rgb8", step=9, data=bytes(range(k, k + 18)))
                image.publish(img)
                sent["/test/image"].append(img)
            time.sleep(0.01)
        time.sleep(0.3)
        response, kept = announced.call("/recorder/stop_episode")
        assert response.success and "/test/never" in response.message  # never appeared: reported at stop (for people)
        assert kept == directory
        st = status(rec)
        assert not st.recording and st.episode == "" and st.messages == 0

        reader = open_bag(episode, "test")
        got: dict[str, list[bytes]] = {}
        try:
            for conn, _, raw in reader.messages():
                got.setdefault(conn.topic, []).append(bytes(raw))
        finally:
            reader.close()
        wire["/test/joints"] = [b for b in wire["/test/joints"]
                                if deserialize_message(b, JointState).name != ["warm-up"]]
        for topic, kind in (("/test/joints", JointState), ("/test/image", Image)):
            assert got[topic] == wire[topic]  # the CDR bytes as received, unchanged
            assert [deserialize_message(b, kind) for b in got[topic]] == sent[topic]  # every message, in order
        mcap_file = next(episode.glob("*.mcap"))
        with mcap_file.open("rb") as f:
            decoded = {}
            reader = make_reader(f, decoder_factories=[DecoderFactory()])
            for _, channel, message, ros in reader.iter_decoded_messages():
                decoded.setdefault(channel.topic, []).append((bytes(message.data), ros))
        assert [d for d, _ in decoded["/test/joints"]] == wire["/test/joints"]
        assert decoded["/test/joints"][5][1].header.stamp.sec == 1005
        assert decoded["/head_camera/active_source"][0][1].data == "generated"

        doc = yaml.safe_load((episode / "episode.yaml").read_text())
        assert doc["task"] == "pick cube" and doc["operator"] == "ada"
        assert "generated" in doc["camera_sources"]
        assert doc["robot_description_hash"].startswith("sha256:")
        meta = assert_rosbag2_metadata(episode)
        qos = {t["topic_metadata"]["name"]: t["topic_metadata"]["offered_qos_profiles"]
               for t in meta["topics_with_message_count"]}
        assert qos["/test/image"] and qos["/test/image"][0]["reliability"] in (2, "best_effort")  # replayed as offered
        counts = {t["topic_metadata"]["name"]: t["message_count"] for t in meta["topics_with_message_count"]}
        assert counts["/test/joints"] == 100 and counts["/test/image"] == 10
    finally:
        comp.shutdown()


def test_unwritable_output_directory_fails_the_episode_and_the_node_keeps_running(ros_domain_id, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the output directory should be")
    comp = recorder(ros_domain_id, blocker / "episodes")
    try:
        rec = comp.node("recorder")
        probe = Node("probe", context=comp.context)
        comp.add_node(probe)
        from rynn_teleop.nodes.joint_sweep import JointSweepNode  # another node beside it

        comp.add_node(JointSweepNode(context=comp.context))
        states: list[JointState] = []
        probe.create_subscription(JointState, "/joint_states", states.append, 10)
        response = call(probe, "/recorder/start_episode")
        assert not response.success and "not_a_dir" in response.message
        assert rec.diagnostic_level()[0] == DiagnosticStatus.ERROR
        assert call(probe, "/recorder/stop_episode").success is False  # nothing to stop, still answering
        assert "not_a_dir" in rec.diagnostic_level()[1]  # the refused stop does not hide the failure
        n = len(states)
        assert wait_for(lambda: len(states) > n + 5, 5.0)  # the other node keeps publishing
        assert not rec.recorder.active
    finally:
        comp.shutdown()


def test_excluded_topics_are_not_recorded_nor_reported_missing(ros_domain_id, tmp_path):
    comp = recorder(ros_domain_id, tmp_path, exclude_topics=["/test/never"])
    try:
        assert "/test/never" not in comp.node("recorder").topics and "/test/joints" in comp.node("recorder").topics
        probe = Node("probe", context=comp.context)
        comp.add_node(probe)
        announced = EpisodeTopic(probe)
        episode = Path(announced.call("/recorder/start_episode")[1])
        response, _ = announced.call("/recorder/stop_episode")
        assert response.success and "/test/never" not in response.message and "/test/joints" in response.message
        assert "/test/never" not in (episode / "metadata.yaml").read_text()
    finally:
        comp.shutdown()


def test_discard_removes_the_episode_and_the_next_one_is_numbered_again(ros_domain_id, tmp_path):
    comp = recorder(ros_domain_id, tmp_path)
    try:
        probe = Node("probe", context=comp.context)
        comp.add_node(probe)
        announced = EpisodeTopic(probe)
        first = Path(announced.call("/recorder/start_episode")[1])
        assert call(probe, "/recorder/discard_episode").success
        assert not first.exists()
        assert wait_for(lambda: announced.values[-1] == "", 5.0)  # no episode any more
        second = Path(announced.call("/recorder/start_episode")[1])
        assert second.name == first.name == "episode_0001"
        assert announced.call("/recorder/stop_episode")[1] == str(second)
        assert (second / "metadata.yaml").is_file()
    finally:
        comp.shutdown()


def test_sigkill_mid_episode_keeps_all_but_the_last_second_after_recover(ros_domain_id, tmp_path):
    env = {**os.environ, "ROS_DOMAIN_ID": str(ros_domain_id), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rynn_teleop.cli", "run", "recorder", "-p", f"recorder.output_dir={tmp_path}",
         "-p", "recorder.topics=[/test/joints]", "-p", "recorder.expected_rates_hz=[100.0]",
         "-p", "recorder.auto_start=true"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    comp = Composition([], domain_id=ros_domain_id)
    try:
        node = Node("publisher", context=comp.context)
        comp.add_node(node)
        pub = node.create_publisher(JointState, "/test/joints", 100)
        flowing = []
        node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: flowing.extend(
            RecorderStatus.decode({kv.key: kv.value for kv in st.values}).topics_flowing
            for st in m.status if st.name == "recorder"), 10)
        assert wait_for(lambda: pub.get_subscription_count() > 0, 20.0), "the recorder never subscribed"
        # The publisher may see the subscription before the recorder's reader has matched it (then the first
        # messages never arrive: DDS, not the recorder). Warm up until the recorder says the topic flows.
        deadline = time.monotonic() + 20.0
        while Count(1, 1) not in flowing and time.monotonic() < deadline:
            pub.publish(JointState(name=["a"], position=[-1.0]))
            time.sleep(0.01)
        assert Count(1, 1) in flowing, "the recorder never received the topic"
        sent: list[tuple[float, JointState]] = []
        t_end = time.monotonic() + 3.0
        k = 0
        while time.monotonic() < t_end:
            msg = JointState(name=["a"], position=[float(k)])
            msg.header.stamp = node.get_clock().now().to_msg()
            pub.publish(msg)
            sent.append((time.monotonic(), msg))
            k += 1
            time.sleep(0.01)
        t_kill = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        comp.shutdown()
        if proc.poll() is None:
            proc.kill()
    episode = tmp_path / "episode_0001"
    result = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "episodes", "recover", str(episode)],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_rosbag2_metadata(episode)
    reader = open_bag(episode, "test")
    try:
        got = [deserialize_message(bytes(raw), JointState) for _, _, raw in reader.messages()]
    finally:
        reader.close()
    positions = {m.position[0] for m in got}
    must_have = [m.position[0] for t, m in sent if t <= t_kill - 1.0]
    assert len(must_have) > 150
    missing = [p for p in must_have if p not in positions]
    assert not missing, f"{len(missing)} messages older than 1 s before the kill were lost"
    with next(episode.glob("*.mcap")).open("rb") as f:  # the recovered file is a valid MCAP for other readers too
        n_mcap = sum(1 for _ in make_reader(f, decoder_factories=[DecoderFactory()]).iter_decoded_messages())
    assert n_mcap == len(got)


def test_messages_published_but_never_received_count_as_dropped(ros_domain_id, tmp_path):
    """The recorder drains its subscriptions every poll_period_s; a burst larger than a subscription's queue
    (100) between two drains loses the oldest messages. They are counted from the publisher's sequence numbers:
    received + dropped = published, and ``stop`` reports them."""
    comp = recorder(ros_domain_id, tmp_path, poll_period_s=0.1)
    try:
        rec = comp.node("recorder")
        pub_node = Node("publisher", context=comp.context)
        comp.add_node(pub_node)
        joints = pub_node.create_publisher(JointState, "/test/joints", 1000)
        assert wait_for(lambda: "/test/joints" in rec._types, 10.0)
        assert wait_for(lambda: joints.get_subscription_count() > 0, 5.0)
        for _ in range(3):  # the recorder knows the publisher's sequence from here on (several in its first drain)
            joints.publish(JointState(name=["warm-up"]))
        assert wait_for(lambda: rec._sequence, 5.0)
        announced = EpisodeTopic(pub_node)
        response, _ = announced.call("/recorder/start_episode")
        assert response.success, response.message
        # 400 messages in a few ms: whatever the drain timer's phase, at most one drain falls inside the burst,
        # and the 100-message queue overflows either way
        published = 400
        for k in range(published):
            joints.publish(JointState(name=["a"], position=[float(k)]))
        time.sleep(0.5)
        response, kept = announced.call("/recorder/stop_episode")
        summary_text = response.message  # for people: the problems
        stats = rec.last_summary.stats.topics["/test/joints"]
        assert stats.dropped > 0, "a 400-message burst into a 100-message queue lost nothing?"
        assert stats.received + stats.dropped == published
        assert "/test/joints" in summary_text and "not recorded (dropped)" in summary_text
        reader = open_bag(Path(kept), "test")
        try:
            positions = [deserialize_message(raw, JointState).position[0] for conn, _, raw in reader.messages()
                         if conn.topic == "/test/joints"]
        finally:
            reader.close()
        assert positions == sorted(positions) and positions[-1] == published - 1  # the newest are kept, in order
    finally:
        comp.shutdown()


def test_a_malformed_gap_rate_entry_refuses_the_start(ros_domain_id, tmp_path):
    import pytest

    from rynn_teleop.errors import ParameterError

    for entry in ("joint_states=200", "/joint_states=fast", "/joint_states=0", "/joint_states"):
        with pytest.raises(ParameterError, match="gap_rates") as err:
            recorder(ros_domain_id, tmp_path, gap_rates=[entry])
        assert "TOPIC=HZ" in str(err.value) and "(0, 10000]" in str(err.value)


def test_every_topic_starts_and_stops_at_the_same_instant(ros_domain_id, tmp_path):
    """The subscriptions are taken one after the other; the episode still holds, of every topic, exactly what
    was received between one start and one stop instant: a message received while another topic was being
    taken is in the episode if and only if its receive time is (here the takes are stubbed to make that race
    certain: a joints message arrives while the image subscription is taken)."""
    comp = recorder(ros_domain_id, tmp_path)
    try:
        rec = comp.node("recorder")
        rec.stop_loops()  # the drains below are the only ones

        def clock() -> int:
            return rec.get_clock().now().nanoseconds

        received: dict[str, int] = {}  # message id -> receive time [ns]
        pending: dict[str, list] = {"joints": [], "image": []}
        seq = iter(range(1, 1000))

        def arrive(sub: str, name: str) -> None:
            received[name] = clock()
            msg = JointState() if sub == "joints" else Image()
            msg.header.frame_id = name
            pending[sub].append(Taken(serialize_message(msg), received[name], b"pub-" + sub.encode(), next(seq)))

        def take_all(sub: str) -> list:
            if sub == "image" and "race" in script:  # while the images are taken, a joints message arrives first
                arrive("joints", script.pop("race"))
                arrive("image", script.pop("race_image"))
            out, pending[sub] = pending[sub], []
            return out

        rec.take_all = take_all
        rec._subs = [("joints", "/test/joints", "sensor_msgs/msg/JointState", False),
                     ("image", "/test/image", "sensor_msgs/msg/Image", False)]
        arrive("joints", "j-before")
        arrive("image", "i-before")
        script = {"race": "j-start", "race_image": "i-start"}
        metadata = rec.metadata

        def metadata_while_arriving():  # a message arrives while the episode is being started
            arrive("joints", "j-starting")
            return metadata()

        rec.metadata = metadata_while_arriving
        rec.start_episode()
        arrive("joints", "j-mid")
        arrive("image", "i-mid")
        rec._drain()
        time.sleep(0.01)
        script = {"race": "j-stop", "race_image": "i-stop"}
        summary = rec.stop_episode()
    finally:
        comp.shutdown()
    reader = open_bag(summary.path, "test")
    try:
        recorded = {}
        for conn, t, raw in reader.messages():
            msg_type = JointState if conn.topic == "/test/joints" else Image
            recorded[deserialize_message(raw, msg_type).header.frame_id] = t
    finally:
        reader.close()
    assert {"j-mid", "i-mid", "j-starting"} <= set(recorded) and not {"j-before", "i-before"} & set(recorded)
    first, last = min(recorded.values()), max(recorded.values())
    left_out = {n: t for n, t in received.items() if n not in recorded}
    assert all(t < first or t > last for t in left_out.values()), (recorded, left_out)
    # the episode's own start and stop instants (episode.yaml) are that window's
    doc = yaml.safe_load((summary.path / "episode.yaml").read_text())
    assert doc["start_ns"] <= first and last <= doc["stop_ns"], (doc["start_ns"], doc["stop_ns"], recorded)
    assert all(t < doc["start_ns"] or t > doc["stop_ns"] for t in left_out.values()), (doc, left_out)
