"""recorder node: demonstrations as rosbag2 (MCAP) episodes, with drop and gap accounting.

Subscribes raw to ``topics`` once each appears in the graph (type and publishers' QoS discovered) and hands
the CDR bytes unchanged to :class:`~rynn_teleop.recording.EpisodeRecorder`, whose writer thread writes them
(bag timestamp = receive time; header stamps stay in the messages): the executor never waits for the disk.
Subscriptions are drained every ``poll_period_s`` (cheaper than one executor callback per message); skipped
publisher sequence numbers are counted as drops. An episode holds what was received between its start and
stop instants (node clock); each latched topic's newest message is written again at every start, so an
episode holds the active camera source it started with.

Services (std_srvs/Trigger; their messages are for people, e.g. ``ros2 service call``):
    ~/start_episode    a new numbered episode under ``output_dir`` (task, operator, notes from parameters)
    ~/stop_episode     stop and keep it; the response lists missing topics, gaps and drops
    ~/discard_episode  stop and delete it
Topic ~/episode (std_msgs/String, reliable, transient local): the directory of the newest episode, recording or
kept ('' before the first and after a discard); published at every start, stop and discard, so a client
reads the directory from it (``nodes.operator.OperatorClient``) and can wait for the message its call caused.

``optional_topics`` (default: the physical twin's ``/twin/objects``, ``/twin/scene``, ``/twin/outcome``) are
recorded when they have a publisher, with no rate expectation and never reported missing (a real-robot session
has no twin). When the twin runs, an episode stopped without an operator's outcome gets the twin's: the newest
``/twin/outcome`` at the stop (success; failure with the task's reason, also when still undecided), written
with its reason (``outcome``, ``outcome_reason`` in episode.yaml); the scene and seed at the start go into
``extra.twin``.
Status in /diagnostics: :class:`~rynn_teleop.core.status.RecorderStatus`.
An unwritable or full output directory fails the episode (service response, log, ERROR in /diagnostics);
the node keeps running.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from std_msgs.msg import String

from ..core import node_io
from ..core.node_io import ANY_TYPE, Each, NodeIO, Service, Topic
from ..core.params import FLOAT_LIST, STR_LIST, Param, ParamSchema
from ..core.status import Count, RecorderStatus
from ..errors import ParameterError
from ..recording import (
    OPERATOR_INPUT_TOPICS,
    OUTCOMES,
    EpisodeMetadata,
    EpisodeRecorder,
    RecordingError,
    TopicQos,
    description_hash,
    software_version,
    split_at_window,
)
from ..recording.stats import SequenceGaps, parse_topic_rates
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .graph import message_class, subscription_qos

DEFAULT_TOPICS = {  # topic -> expected rate [Hz] (0: no rate expectation)
    # the operator input: one PoseArray per tracker frame (all five trackers) at 120 Hz, a skeleton per glove frame
    **dict(zip(OPERATOR_INPUT_TOPICS, (120.0, 90.0, 90.0))),
    "/arms/command": 200.0,
    "/hands/command": 180.0,
    "/joint_states": 300.0,
    "/head_camera/color/image_raw": 30.0,
    "/head_camera/color/camera_info": 30.0,
    "/head_camera/aligned_depth_to_color/image_raw": 0.0,
    "/head_camera/aligned_depth_to_color/camera_info": 0.0,
    "/head_camera/active_source": 0.0,
    "/diagnostics": 0.0,
}
DEFAULT_GAP_RATES = {  # topic several publishers share -> its fastest publisher's rate [Hz]
    "/joint_states": 200.0,  # arm driver 200 Hz + hand driver 100 Hz
    "/hands/command": 90.0,  # one message per hand and glove frame: left 90 Hz + right 90 Hz
}
ACTIVE_SOURCE_TOPIC = "/head_camera/active_source"
TWIN_SCENE_TOPIC, TWIN_OUTCOME_TOPIC = "/twin/scene", "/twin/outcome"  # the twin node's latched JSON (nodes.twin)
#: recorded when present (the physical twin's, digital mode), never reported missing
DEFAULT_OPTIONAL_TOPICS = ("/twin/objects", TWIN_SCENE_TOPIC, TWIN_OUTCOME_TOPIC)
QUEUE_S = 1.0  # [s] of messages a recorded topic's subscription queue holds
EPISODE_TOPIC = "/recorder/episode"  # the node's ~/episode under its default name
#: ~/episode: every late subscriber gets the newest directory
EPISODE_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class RecorderNode(TeleopNode):
    PRIORITY = "record"
    SCHEMA = ParamSchema(
        "recorder",
        [
            DESCRIPTION_OVERLAY,
            Param("output_dir", str, "~/rynn_episodes", "directory of the numbered episode bags (~ expanded)"),
            Param("topics", STR_LIST, list(DEFAULT_TOPICS), "topics to record (types discovered from the graph)"),
            Param("expected_rates_hz", FLOAT_LIST, list(DEFAULT_TOPICS.values()),
                  "expected rate of each topic, same order (0 = no expectation: no gap detection)", "Hz",
                  min=0.0, max=10000.0),
            Param("gap_rates", STR_LIST, [f"{t}={r:g}" for t, r in DEFAULT_GAP_RATES.items()],
                  "TOPIC=HZ entries: the rate of a topic's fastest publisher where several publishers share it "
                  "(/joint_states: arm driver 200 Hz + hand driver 100 Hz); its gaps are measured in periods of "
                  "that rate instead of the expected rate (entries for topics not recorded are ignored)"),
            Param("exclude_topics", STR_LIST, [],
                  "topics of 'topics' this bringup does not record (never reported missing): with a policy driving, "
                  "the launch sets the operator input's (" + ", ".join(OPERATOR_INPUT_TOPICS) + "), which no node "
                  "publishes then"),
            Param("optional_topics", STR_LIST, list(DEFAULT_OPTIONAL_TOPICS),
                  "topics recorded when they have a publisher, with no rate expectation and never reported missing "
                  "(the physical twin's: its objects, scene and outcome, which fills an unlabelled episode's outcome)"),
            Param("task", str, "", "task name stored with the next/current episode", dynamic=True),
            Param("operator", str, "", "operator stored with the next/current episode", dynamic=True),
            Param("notes", str, "", "free-text notes stored with the next/current episode", dynamic=True),
            Param("outcome", str, "", "outcome label stored with the current episode at its stop ('': none; in "
                  "the digital mode the twin's judgement then)", choices=OUTCOMES, dynamic=True),
            Param("calibration_file", str, "", "operator calibration stored with each episode (arm_ik's file)"),
            Param("auto_start", bool, False, "start an episode as soon as the node runs"),
            Param("discovery_period_s", float, 0.5, "how often the graph is searched for configured topics", "s",
                  min=0.05, max=10.0),
            Param("queue_max_mb", float, 256.0, "writer queue bound; beyond it messages are dropped and counted",
                  "MB", min=1.0, max=16384.0),
            Param("flush_period_s", float, 0.5, "written data reaches the file at least this often", "s",
                  min=0.05, max=1.0),
            Param("poll_period_s", float, 0.05,
                  "subscriptions are drained this often (each holds 1 s of its expected rate, at least 100 "
                  "messages; bag times are receive times whatever the period)", "s", min=0.001, max=0.1),
            Param("crcs", bool, True,
                  "write MCAP chunk, data-section and summary CRCs, so `rynn-teleop episodes check` proves an "
                  "episode intact (false: two passes less over each byte written; such episodes are checked by "
                  "decoding only)"),
        ],
    )
    IO = NodeIO(
        publishers=(Topic("~/episode", "std_msgs/msg/String", node_io.LATCHED,
                          "the newest episode's directory, recording or kept ('' before the first and after a "
                          "discard), at every start, stop and discard"),),
        subscriptions=(Topic("{topic}", ANY_TYPE, None, "recorded as CDR bytes, unchanged; type and QoS from its "
                             "publishers, queue 1 s of its expected rate (at least 100)",
                             each=Each("topic", param="topics"), dynamic="once the topic has a publisher"),
                       Topic("{optional_topic}", ANY_TYPE, None, "recorded as CDR bytes when it has a publisher (no "
                             "rate, never missing)", each=Each("optional_topic", param="optional_topics"),
                             dynamic="once the topic has a publisher"),),
        services=(
            Service("~/start_episode", "std_srvs/srv/Trigger", "a new numbered episode under output_dir (task, "
                    "operator, notes from parameters)"),
            Service("~/stop_episode", "std_srvs/srv/Trigger", "stop and keep it; the response lists missing topics, "
                    "gaps and drops"),
            Service("~/discard_episode", "std_srvs/srv/Trigger", "stop and delete it"),
        ),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        if len(p["expected_rates_hz"]) != len(p["topics"]):
            raise ParameterError("expected_rates_hz", f"expected_rates_hz has {len(p['expected_rates_hz'])} values "
                                 f"for {len(p['topics'])} topics: give one per topic (0 = no expectation)")
        self.topics = {t: (r or None) for t, r in zip(p["topics"], p["expected_rates_hz"])
                       if t not in p["exclude_topics"]}
        self.optional_topics = tuple(t for t in dict.fromkeys(p["optional_topics"]) if t not in self.topics)
        gap_rates = {t: r for t, r in _gap_rates(p["gap_rates"]).items() if self.topics.get(t)}
        self.output_dir = Path(p["output_dir"]).expanduser()
        self.recorder = EpisodeRecorder(
            self.output_dir, self.topics, gap_rates=gap_rates, queue_max_bytes=int(p["queue_max_mb"] * 1e6),
            flush_period_s=p["flush_period_s"], on_error=self._on_writer_error,
            clock=lambda: self.get_clock().now().nanoseconds, crcs=p["crcs"],
        )
        self._urdf_hash = _description_hash(p["description_overlay"])
        self._types: dict[str, str] = {}  # subscribed topic -> type name
        self._qos: dict[str, list[TopicQos]] = {}
        self._subs: list[tuple] = []  # (polled subscription, topic, type name, latched)
        self._last_received: dict[str, int] = {}  # topic -> newest receive time [ns]
        self._sequence = SequenceGaps()  # messages lost between those taken
        self._latched: dict[str, tuple[str, bytes]] = {}  # transient-local topic -> its newest (type, CDR)
        self.failure = ""  # the last episode failure, for diagnostics
        self.last_summary = None
        for name in ("start_episode", "stop_episode", "discard_episode"):
            self.io_service(f"~/{name}", getattr(self, f"_srv_{name}"))
        self._episode_pub = self.io_publisher("~/episode")
        self._episode_pub.publish(String(data=""))  # no episode yet: a client always finds a latched value
        self._discover()
        self.create_timer(p["discovery_period_s"], self._discover)
        self._loop = self.create_loop(1.0 / p["poll_period_s"], self._drain, "drain")
        if p["auto_start"]:
            self.start_episode()

    # ------------------------------------------------------------------ graph
    def _discover(self) -> None:
        """Subscribe to every configured topic that has appeared (type and QoS from its publishers)."""
        pending = [t for t in (*self.topics, *self.optional_topics) if t not in self._types]
        if not pending:
            return
        graph = dict(self.get_topic_names_and_types())
        for topic in pending:
            types = graph.get(topic)
            if not types:
                continue
            infos = self.get_publishers_info_by_topic(topic)
            if not infos:  # only subscribers so far: wait for a publisher, whose QoS the subscription must match
                continue
            type_name = types[0]
            try:
                msg_type = message_class(type_name)
            except (ImportError, AttributeError, ValueError):
                self.get_logger().error(f"{topic}: type {type_name} cannot be imported; not recorded",
                                        throttle_duration_sec=30.0)
                continue
            qos, offered = subscription_qos(infos, self.topics.get(topic), QUEUE_S)  # optional: no rate
            self._qos[topic] = offered
            self._types[topic] = type_name
            latched = qos.durability == DurabilityPolicy.TRANSIENT_LOCAL
            sub = self.create_polled_subscription(msg_type, topic, qos, raw=True)
            self._subs.append((sub, topic, type_name, latched))
            self.get_logger().info(f"recording {topic} ({type_name}, {qos.reliability.name.lower()})")

    def _drain(self, since_ns: int | None = None, until_ns: int | None = None) -> None:
        """Hand everything the subscriptions received since the last drain to the episode, in receive order.

        ``since_ns`` [ns, node clock]: the episode starts there: what was received before is not part of it
        (the latched topics' newest values are, written at ``since_ns``). ``until_ns``: the episode stops there:
        what was received after is not part of it. One cut time for every topic: the subscriptions are taken
        one after the other, so a cut at the take would start and end each topic at a different instant.
        """
        batch = []
        for sub, topic, type_name, latched in self._subs:
            bag_ns = self._last_received.get(topic, 0)
            for taken in self.take_all(sub):
                # bag time = receive time, never before the topic's previous message: the take order (publisher
                # sequence order) stays the bag order even when a repaired message arrived after a later one
                bag_ns = max(bag_ns, taken.received_ns)
                lost = self._sequence.observe(topic, taken.publisher, taken.sequence)
                batch.append((bag_ns, topic, type_name, taken.message, latched, lost))
        batch.sort(key=lambda item: item[0])  # stable: each topic keeps its order
        for received_ns, topic, *_ in batch:
            self._last_received[topic] = received_ns
        inside, outside = split_at_window(batch, since_ns, until_ns)
        for _, topic, type_name, raw, latched, _ in outside:  # not part of the episode; the newest state is kept
            if latched:
                self._latched[topic] = (type_name, raw)
        if since_ns is not None:  # every episode starts with the latched topics' values
            for topic, (type_name, raw) in list(self._latched.items()):
                self._on_message(topic, type_name, raw, since_ns, latched=True)
        writer = self.recorder.writer
        for received_ns, topic, type_name, raw, latched, lost in inside:
            if lost and writer is not None:
                writer.note_dropped(topic, lost)
            self._on_message(topic, type_name, raw, received_ns, latched)

    def _on_message(self, topic: str, type_name: str, raw: bytes, received_ns: int, latched: bool = False) -> None:
        if latched:  # state topics (e.g. the active camera source): every episode starts with their value
            self._latched[topic] = (type_name, raw)
        self.recorder.submit(topic, type_name, raw, received_ns)
        if topic == ACTIVE_SOURCE_TOPIC and self.recorder.active:
            self.recorder.add_camera_source(deserialize_message(raw, String).data)

    # ------------------------------------------------------------------ episodes
    def metadata(self) -> EpisodeMetadata:
        calibration = {}
        path = self.params["calibration_file"].strip()
        if path and Path(path).expanduser().is_file():
            try:
                calibration = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError) as exc:
                calibration = {"error": f"{path}: {exc}"}
        twin = self._latched_json(TWIN_SCENE_TOPIC)
        extra = {"twin": {k: twin.get(k) for k in ("scene", "seed", "task")}} if twin else {}
        return EpisodeMetadata(
            task=self.get_parameter("task").value, operator=self.get_parameter("operator").value,
            notes=self.get_parameter("notes").value, outcome=self.get_parameter("outcome").value,
            robot_description_hash=self._urdf_hash,
            calibration=calibration, software_version=software_version(), extra=extra,
        )

    def _latched_json(self, topic: str) -> dict:
        """The newest message of a latched std_msgs/String topic holding a JSON object ({} if none or unreadable)."""
        latest = self._latched.get(topic)
        if latest is None:
            return {}
        try:
            doc = json.loads(deserialize_message(latest[1], String).data)
        except (ValueError, TypeError) as exc:
            self.get_logger().warning(f"{topic}: not a JSON document ({exc})", throttle_duration_sec=10.0)
            return {}
        return doc if isinstance(doc, dict) else {}

    def twin_outcome(self) -> tuple[str, str] | None:
        """The twin's judgement of the task now, as (outcome label, reason), from the newest ``/twin/outcome``;
        None when no twin reported one. Undecided at the stop of an episode is a failure: the task was not done."""
        doc = self._latched_json(TWIN_OUTCOME_TOPIC)
        if not doc:
            return None
        reason = str(doc.get("reason", ""))
        if doc.get("success") is True:
            return "success", reason
        if doc.get("success") is False:
            return "failure", reason
        return "failure", f"not achieved when the episode stopped: {reason}"

    def start_episode(self) -> Path:
        """Start the next episode (raises RecordingError): every topic from the same instant (receive time)."""
        start_ns = self.get_clock().now().nanoseconds
        path = self.recorder.start(self.metadata(), topic_qos=self._qos, now_ns=start_ns)
        self._drain(since_ns=start_ns)  # what arrived before the start is not part of the episode (latched values are)
        self.failure = ""
        self._episode_pub.publish(String(data=str(path)))
        self.get_logger().info(f"episode started: {path}")
        return path

    def stop_episode(self):
        """Stop and keep the current episode; its summary (raises RecordingError)."""
        stop_ns = self.get_clock().now().nanoseconds
        self._drain(until_ns=stop_ns)  # what arrived before the stop is, for every topic
        outcome, reason = self.get_parameter("outcome").value, ""
        if not outcome and (twin := self.twin_outcome()) is not None:  # no operator's label: the twin's judgement
            outcome, reason = twin
        self.recorder.describe(task=self.get_parameter("task").value, operator=self.get_parameter("operator").value,
                               notes=self.get_parameter("notes").value, outcome=outcome, outcome_reason=reason)
        summary = self.recorder.stop(now_ns=stop_ns)
        self._clear_outcome()
        self.last_summary = summary
        for problem in summary.problems:
            self.get_logger().warning(f"{summary.path.name}: {problem}")
        self.get_logger().info(f"episode kept: {summary.path} ({summary.stats.message_count} messages, "
                               f"{summary.stats.duration_s:.1f} s)")
        return summary

    def _srv_start_episode(self, request, response):
        return _answer(response, lambda: str(self.start_episode()), self._fail)

    def _srv_stop_episode(self, request, response):
        def stop() -> str:
            summary = self.stop_episode()
            self._episode_pub.publish(String(data=str(summary.path)))  # kept: the same directory, announced again
            return str(summary.path) + ("" if not summary.problems else " | problems: " + "; ".join(summary.problems))

        # stopping with no episode is only a refused request; failing to close a recorded one is a failure
        return _answer(response, stop, self._fail if self.recorder.active else None)

    def _srv_discard_episode(self, request, response):
        def discard() -> str:
            path = self.recorder.discard()
            self._clear_outcome()
            self._episode_pub.publish(String(data=""))
            return f"discarded {path}"

        return _answer(response, discard)

    def _clear_outcome(self) -> None:
        """An outcome labels one episode: the next starts unlabelled."""
        if self.get_parameter("outcome").value:
            self.set_parameters([Parameter("outcome", Parameter.Type.STRING, "")])

    def _on_writer_error(self, error: RecordingError) -> None:  # writer thread
        self._fail(str(error))

    def _fail(self, message: str) -> None:
        self.failure = message
        self.get_logger().error(f"recording failed: {message}")

    # ------------------------------------------------------------------ diagnostics
    def recorder_status(self) -> RecorderStatus:
        """The recorder's typed status (the episode the console, ``rynn-teleop call status`` and the demo show)."""
        progress = self.recorder.progress(self.get_clock().now().nanoseconds)
        return RecorderStatus(
            recording=self.recorder.active, episode=str(self.recorder.current or ""),
            output_dir=str(self.recorder.output_dir),
            elapsed_s=progress.elapsed_s if progress is not None else 0.0,
            messages=progress.messages if progress is not None else 0,
            problems=tuple(progress.problems) if progress is not None else (),
            topics_subscribed=Count(sum(1 for t in self._types if t in self.topics), len(self.topics)),
            topics_flowing=Count(len(self.flowing()), sum(1 for r in self.topics.values() if r)),
            failure=self.failure,
        )

    def diagnostic_values(self):
        values = {}
        writer = self.recorder.writer
        if writer is not None:
            values["queued_mb"] = f"{writer.queued_bytes / 1e6:.1f}"
            values["written_mb"] = f"{writer.written_bytes / 1e6:.1f}"
            values["dropped"] = sum(writer.dropped().values())
        return self.recorder_status().values(values)

    def flowing(self, within_s: float = 1.0) -> list[str]:
        """The topics with an expected rate that delivered a message within the last ``within_s`` [s]."""
        now = self.get_clock().now().nanoseconds
        return [t for t, r in self.topics.items() if r and now - self._last_received.get(t, 0) <= within_s * 1e9]

    def diagnostic_level(self):
        if self.failure:
            return DiagnosticStatus.ERROR, f"recording failed: {self.failure}"
        missing = [t for t in self.topics if t not in self._types]
        if self.recorder.active and missing:
            return DiagnosticStatus.WARN, f"recording; not yet seen: {', '.join(missing[:4])}" + (
                "..." if len(missing) > 4 else "")
        return DiagnosticStatus.OK, "recording" if self.recorder.active else "idle"

    def destroy_node(self) -> None:
        self.stop_loops()  # no tick may use what is closed below
        recorder = getattr(self, "recorder", None)
        if recorder is not None and recorder.active:
            try:
                self.stop_episode()  # shutting down keeps what was recorded
            except RecordingError as exc:
                self.get_logger().error(f"episode could not be closed: {exc}")
        super().destroy_node()


def _answer(response, action, on_error=None):
    """Fill a Trigger response with ``action()``'s message, or the RecordingError it raised (passed to ``on_error``)."""
    try:
        response.message, response.success = action(), True
    except RecordingError as exc:
        response.success, response.message = False, str(exc)
        if on_error is not None:
            on_error(str(exc))
    return response


def _gap_rates(entries: list[str]) -> dict[str, float]:
    """The ``gap_rates`` parameter -> {topic: rate [Hz]}; a malformed entry refuses the start."""
    try:
        return parse_topic_rates(entries)
    except ValueError as exc:
        raise ParameterError("gap_rates", f"gap_rates entry {exc}") from exc


def _description_hash(overlay: str) -> str:
    return description_hash(robot_from_overlay(overlay).urdf)


def main(args=None) -> int:
    return run_single(RecorderNode, args)
