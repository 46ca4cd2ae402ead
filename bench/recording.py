"""Recorder under sustained full load on real rclpy: drops per topic, writer throughput, recorder CPU.

    .venv/bin/python bench/recording.py [--seconds 60]     # about 75 s

Two processes, as ``ros2 launch`` would start them: ``rynn-teleop run
recorder`` (``auto_start``, the load's topics and rates, output in a temporary
directory) and a load publisher (this script with a hidden flag) with the
stack's message types and QoS: five trackers ``/operator/trackers/*``
(PoseStamped, 120 Hz, reliable), ``/arms/command`` (JointState, 14 joints,
200 Hz, reliable), ``/hands/command`` (JointState, 20 joints, left and right
hand alternating, 120 Hz, reliable), ``/joint_states`` (JointState with
position, velocity and effort, arms / left hand / right hand in turn, 500 Hz,
reliable), and the head camera's 640x480 ``rgb8`` colour and aligned
``16UC1`` depth with their ``camera_info`` at 30 Hz (SensorDataQoS, best
effort). Messages are built ahead (only header stamps change) and paced by one
loop on absolute deadlines (no drift). The publisher waits until the recorder
has subscribed to every topic, then publishes for ``--seconds`` and counts
what it published; after it stops the recorder gets SIGINT (it stops and keeps
the episode) and the episode's ``episode.yaml`` gives what was recorded.
dropped = published - recorded, per topic (the recorder's own queue drops are
shown separately). The table's gaps are the episode statistics' gaps (a
silence longer than 3 expected periods) inside the load, i.e. receive-time
jitter. Recorder CPU = its utime + stime over the load window, in % of one
core.

The recorder runs with its defaults, MCAP CRCs on (chunk, data-section and
summary CRCs; the recorder's ``crcs`` parameter).

Throughput, measured in this same process after the load: the
``EpisodeWriter`` writes the same message mix (same CDR sizes, same
proportions) as fast as it can for a few seconds, final drain and close
included, with CRCs on (the default) and off, alternately, twice each (best of
two, against other load on the machine) -> ``writer_mb_s`` (CRCs on, goal >=
5x the load's ``needed_mb_s``), ``writer_no_crc_mb_s`` and
``crc_throughput_ratio`` (on / off: the cost of the CRCs). Named baseline, same
run: a plain ``open(f, 'wb').write`` of the same byte sequence (the disk's raw
sequential write here, page cache, no fsync, as the writer) ->
``raw_disk_mb_s`` and the writer's share of it.

The last line is one JSON object with ``dropped`` (per topic), ``needed_mb_s``,
``writer_mb_s``, ``writer_no_crc_mb_s``, ``crc_throughput_ratio``,
``cpu_percent`` (then extras).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACKER_ROLES = ("chest", "left_elbow", "right_elbow", "left_wrist", "right_wrist")
WIDTH, HEIGHT, CAMERA_HZ = 640, 480, 30.0


@dataclass
class Stream:
    """One published topic of the load."""

    topic: str
    type_name: str  # ROS type name, e.g. "sensor_msgs/msg/JointState"
    rate_hz: float
    qos: str  # "pose" | "command" | "hands" | "sensor" (see _qos)
    messages: list = field(default_factory=list)  # built ahead, published in turn (only stamps change)


def load_streams() -> list[Stream]:
    """The full load: message instances built once, with the stack's types and frame ids."""
    import numpy as np
    from builtin_interfaces.msg import Time
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import JointState

    from rynn_teleop.core.camera import default_intrinsics
    from rynn_teleop.core.robot_model import arm_joint_names, hand_joint_names
    from rynn_teleop.nodes.conversions import camera_info_message, image_message

    rng = np.random.default_rng(0)
    streams: list[Stream] = []
    for i, role in enumerate(TRACKER_ROLES):
        msg = PoseStamped()
        msg.header.frame_id = "tracker_world"
        msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = 0.1 * i, -0.2, 1.2
        msg.pose.orientation.w = 1.0
        streams.append(Stream(f"/operator/trackers/{role}", "geometry_msgs/msg/PoseStamped", 120.0, "pose", [msg]))

    def joints(names, *, full: bool) -> JointState:
        n = len(names)
        msg = JointState(name=list(names), position=rng.uniform(-1, 1, n).tolist())
        if full:
            msg.velocity = rng.uniform(-1, 1, n).tolist()
            msg.effort = rng.uniform(-5, 5, n).tolist()
        return msg

    arms = arm_joint_names("left") + arm_joint_names("right")
    streams.append(Stream("/arms/command", "sensor_msgs/msg/JointState", 200.0, "command",
                          [joints(arms, full=False)]))
    streams.append(Stream("/hands/command", "sensor_msgs/msg/JointState", 120.0, "hands",
                          [joints(hand_joint_names(s), full=False) for s in ("left", "right")]))
    measured = [joints(arms, full=True)] + [joints(hand_joint_names(s), full=True) for s in ("left", "right")]
    streams.append(Stream("/joint_states", "sensor_msgs/msg/JointState", 500.0, "command", measured))
    intrinsics = default_intrinsics(WIDTH, HEIGHT)
    color = image_message(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8), "rgb8", Time(),
                          "camera_color_optical_frame")
    depth = image_message(rng.integers(300, 4000, (HEIGHT, WIDTH), dtype=np.uint16), "16UC1", Time(),
                          "camera_color_optical_frame")  # aligned to colour: the colour frame
    ns = "/head_camera"
    for topic, image in (("color", color), ("aligned_depth_to_color", depth)):
        info = camera_info_message(intrinsics, Time(), "camera_color_optical_frame")
        streams.append(Stream(f"{ns}/{topic}/image_raw", "sensor_msgs/msg/Image", CAMERA_HZ, "sensor", [image]))
        streams.append(Stream(f"{ns}/{topic}/camera_info", "sensor_msgs/msg/CameraInfo", CAMERA_HZ, "sensor", [info]))
    return streams


def _qos(kind: str):
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

    return {  # as the stack's publishers: tracker POSE_QOS, driver/arm_ik COMMAND_QOS, hand_retarget RELIABLE, cameras
        "pose": QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
        "command": QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
        "hands": QoSProfile(depth=20, reliability=ReliabilityPolicy.RELIABLE),
        "sensor": qos_profile_sensor_data,
    }[kind]


def publish_load(duration: float, counts_file: str) -> None:
    """The load process: wait for the recorder's subscriptions, publish for ``duration`` s, write the counts."""
    from rynn_teleop.nodes.process import use_transport_profile

    use_transport_profile()
    import rclpy
    from builtin_interfaces.msg import Time
    from geometry_msgs.msg import PoseStamped
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import CameraInfo, Image, JointState

    classes = {"geometry_msgs/msg/PoseStamped": PoseStamped, "sensor_msgs/msg/JointState": JointState,
               "sensor_msgs/msg/Image": Image, "sensor_msgs/msg/CameraInfo": CameraInfo}
    streams = load_streams()
    stop = threading.Event()
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    node = rclpy.create_node("recording_bench_load")
    pubs = [node.create_publisher(classes[s.type_name], s.topic, _qos(s.qos)) for s in streams]
    result: dict = {"published": {s.topic: 0 for s in streams}}
    try:
        deadline = time.monotonic() + 60.0
        while not stop.is_set() and not all(p.get_subscription_count() > 0 for p in pubs):
            if time.monotonic() > deadline:
                result["error"] = "recorder did not subscribe within 60 s to: " + ", ".join(
                    s.topic for s, p in zip(streams, pubs, strict=True) if p.get_subscription_count() == 0)
                return
            time.sleep(0.05)
        time.sleep(1.0)  # matched on our side; let the recorder's side of each match settle (best effort)
        print("START", flush=True)
        n = len(streams)
        periods = [1.0 / s.rate_hz for s in streams]
        k = [0] * n
        sent = [0] * n
        sizes = [len(s.messages) for s in streams]
        late: list[float] = []
        t0 = time.monotonic()
        t_end = t0 + duration
        due = [t0] * n
        stamp = Time()
        while not stop.is_set():
            soonest = min(due)
            if soonest >= t_end:
                break
            now = time.monotonic()
            if soonest > now:
                time.sleep(soonest - now)
                continue
            late.append(now - soonest)
            wall = time.time_ns()
            stamp.sec, stamp.nanosec = wall // 1_000_000_000, wall % 1_000_000_000
            for i in range(n):
                if due[i] <= now and due[i] < t_end:
                    msg = streams[i].messages[k[i] % sizes[i]]
                    msg.header.stamp = stamp
                    pubs[i].publish(msg)
                    sent[i] += 1
                    k[i] += 1
                    due[i] = t0 + k[i] * periods[i]  # absolute deadlines: no drift
        span = time.monotonic() - t0
        print("DONE", flush=True)
        late.sort()
        result.update(
            published={s.topic: c for s, c in zip(streams, sent, strict=True)}, seconds=span,
            late_p50_ms=1e3 * late[len(late) // 2] if late else 0.0,
            late_p99_ms=1e3 * late[int(len(late) * 0.99)] if late else 0.0,
            late_max_ms=1e3 * late[-1] if late else 0.0, interrupted=stop.is_set(),
        )
    finally:
        Path(counts_file).write_text(json.dumps(result), encoding="utf-8")
        node.destroy_node()
        rclpy.try_shutdown()


# ---------------------------------------------------------------------------------------- helpers


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` so far [s] (all its threads)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()  # fields from 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def serialized(streams: list[Stream]) -> dict[str, list[bytes]]:
    """Topic -> the CDR bytes of each of its messages (what the recorder receives and writes)."""
    from rclpy.serialization import serialize_message

    return {s.topic: [serialize_message(m) for m in s.messages] for s in streams}


def one_second_of_load(streams: list[Stream], cdr: dict[str, list[bytes]]) -> list[tuple[int, str, str, bytes]]:
    """One second of the load in publishing order: (offset [ns], topic, type name, CDR bytes)."""
    items = []
    for s in streams:
        for k in range(round(s.rate_hz)):
            items.append((round(k * 1e9 / s.rate_hz), s.topic, s.type_name, cdr[s.topic][k % len(cdr[s.topic])]))
    items.sort(key=lambda it: it[0])
    return items


def writer_throughput(schedule, out_dir: Path, seconds: float, *, crcs: bool = True) -> tuple[float, int, int, float]:
    """The EpisodeWriter (with or without MCAP CRCs) fed the load's mix as fast as it takes it for ``seconds``
    s, then drained and closed.

    Returns (MB/s incl. close, bytes written, load-seconds written, time [s]).
    """
    from rynn_teleop.recording import EpisodeWriter

    bag = out_dir / "writer_bench"
    # items share the same bytes
    writer = EpisodeWriter(bag, queue_max_bytes=1 << 40, queue_max_messages=10**8, crcs=crcs)
    writer.open()
    backlog = 256e6  # keep about this much queued so the writer thread never waits for us
    base = time.time_ns()
    rounds = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if writer.queued_bytes > backlog:
            time.sleep(0.002)
            continue
        offset = base + rounds * 1_000_000_000
        for dt, topic, type_name, data in schedule:
            if not writer.submit(topic, type_name, data, offset + dt):
                raise SystemExit(f"writer bench: the writer dropped a message ({writer.dropped()})")
        rounds += 1
    writer.close({"bench": "recording"})
    span = time.perf_counter() - t0
    written = writer.written_bytes
    shutil.rmtree(bag, ignore_errors=True)
    return written / span / 1e6, written, rounds, span


def raw_write_throughput(schedule, out_dir: Path, rounds: int) -> float:
    """Baseline: the same byte sequence with plain ``open(f, 'wb').write`` (closed at the end, no fsync)."""
    path = out_dir / "raw_write.bin"
    total = 0
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(rounds):
            for _, _, _, data in schedule:
                total += f.write(data)
    span = time.perf_counter() - t0
    path.unlink()
    return total / span / 1e6


def _lines(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line.strip())
    out.put(None)


def _wait_line(lines: queue.Queue, want: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise SystemExit(f"load publisher: no {want!r} within {timeout:.0f} s") from None
        if line == want:
            return
        if line is None:
            raise SystemExit(f"load publisher ended before {want!r} (exit code {proc.wait()})")


def _stop(proc: subprocess.Popen, timeout: float) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


# ---------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration [s]")
    parser.add_argument("--writer-seconds", type=float, default=4.0, help="writer throughput test duration [s]")
    parser.add_argument("--keep", action="store_true", help="keep the recorded episode (path printed)")
    parser.add_argument("--publisher", type=float, default=None, help=argparse.SUPPRESS)  # internal: load process
    parser.add_argument("--counts", default=None, help=argparse.SUPPRESS)  # internal: where it writes its counts
    args = parser.parse_args()
    if args.publisher is not None:
        publish_load(args.publisher, args.counts)
        return
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(100, 199)))
    from rynn_teleop.nodes.process import use_transport_profile

    profile = use_transport_profile()  # the stack's Fast DDS profile, inherited by both child processes

    streams = load_streams()
    cdr = serialized(streams)
    sizes = {s.topic: sum(map(len, cdr[s.topic])) / len(cdr[s.topic]) for s in streams}
    needed = sum(s.rate_hz * sizes[s.topic] for s in streams) / 1e6  # [MB/s] of CDR payload
    msgs_per_s = sum(s.rate_hz for s in streams)

    work = Path(tempfile.mkdtemp(prefix="rynn_recording_bench_"))
    episodes = work / "episodes"
    counts_file = work / "published.json"
    recorder_log = work / "recorder.log"
    topics = [s.topic for s in streams]
    rates = [s.rate_hz for s in streams]
    recorder_cmd = [
        sys.executable, "-m", "rynn_teleop.cli", "run", "recorder",
        "-p", f"recorder.output_dir={episodes}",
        "-p", f"recorder.topics={json.dumps(topics)}",
        "-p", f"recorder.expected_rates_hz={json.dumps(rates)}",
        "-p", "recorder.auto_start=true",
    ]
    env = dict(os.environ)
    with open(recorder_log, "w", encoding="utf-8") as log:
        recorder = subprocess.Popen(recorder_cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    publisher = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--publisher", str(args.seconds), "--counts", str(counts_file)],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(publisher.stdout, lines), daemon=True).start()
    try:
        _wait_line(lines, "START", 90.0, publisher)
        cpu0, w0 = cpu_seconds(recorder.pid), time.monotonic()
        pub_cpu0 = cpu_seconds(publisher.pid)
        _wait_line(lines, "DONE", args.seconds + 60.0, publisher)
        cpu1, w1 = cpu_seconds(recorder.pid), time.monotonic()
        pub_cpu1 = cpu_seconds(publisher.pid)
        publisher.wait(timeout=30)
        time.sleep(1.0)  # the last messages reach the recorder
        rss = peak_rss_mb(recorder.pid)
        cpu2 = cpu_seconds(recorder.pid)
        t_stop = time.monotonic()
        code = _stop(recorder, 120.0)  # SIGINT: destroy_node stops and keeps the episode
        stop_s = time.monotonic() - t_stop
    finally:
        _stop(publisher, 10.0)
        _stop(recorder, 120.0)
    if code != 0:
        print(recorder_log.read_text(encoding="utf-8")[-3000:], file=sys.stderr)
        raise SystemExit(f"recorder exited with {code}")
    pub = json.loads(counts_file.read_text(encoding="utf-8"))
    if "error" in pub:
        raise SystemExit(pub["error"])
    import yaml

    bags = sorted(episodes.glob("episode_*"))
    if len(bags) != 1:
        raise SystemExit(f"expected one episode in {episodes}, found {[b.name for b in bags]}")
    doc = yaml.safe_load((bags[0] / "episode.yaml").read_text(encoding="utf-8"))
    if doc.get("state") != "complete":
        raise SystemExit(f"episode state {doc.get('state')}: {doc.get('error')}")
    stats = doc["stats"]
    start_ns, stop_ns = stats["start_ns"], stats["stop_ns"]

    rows = {}
    for s in streams:
        t = stats["topics"].get(s.topic, {})
        published = int(pub["published"][s.topic])
        recorded = int(t.get("received", 0))
        # gaps inside the load (the silences before the first and after the last message are the
        # episode starting before the load and stopping after it)
        # (a gap is [start_ns, end_ns], or [start_ns, end_ns, clock, at_ns] for header-stamp gaps)
        inner = [(g[0], g[1]) for g in t.get("gaps", []) if g[0] != start_ns and g[1] != stop_ns]
        rows[s.topic] = {
            "target_hz": s.rate_hz, "published": published, "published_hz": published / pub["seconds"],
            "recorded": recorded, "dropped": published - recorded, "queue_dropped": int(t.get("dropped", 0)),
            "recorded_hz": t.get("rate_hz"), "gaps": len(inner),
            "longest_gap_ms": max(((b - a) * 1e-6 for a, b in inner), default=0.0),
        }
    dropped = {topic: r["dropped"] for topic, r in rows.items()}
    dropped_total = sum(dropped.values())
    cpu_percent = 100.0 * (cpu1 - cpu0) / (w1 - w0)
    pub_cpu_percent = 100.0 * (pub_cpu1 - pub_cpu0) / (w1 - w0)
    bag_mb = sum(f.stat().st_size for f in bags[0].iterdir()) / 1e6
    if args.keep:
        print(f"episode kept: {bags[0]}")
    else:
        shutil.rmtree(episodes, ignore_errors=True)

    # writer throughput on the same mix, CRCs on and off alternately (best of two each), then the raw-write
    # baseline on the same bytes
    schedule = one_second_of_load(streams, cdr)
    runs: dict[bool, list[tuple[float, int, int, float]]] = {True: [], False: []}
    for crcs in (True, False, True, False):
        runs[crcs].append(writer_throughput(schedule, work, args.writer_seconds, crcs=crcs))
    writer_mb_s, writer_bytes, rounds, writer_span = max(runs[True])
    no_crc_mb_s = max(runs[False])[0]
    crc_ratio = writer_mb_s / no_crc_mb_s
    raw_mb_s = raw_write_throughput(schedule, work, rounds)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.seconds:.0f} s full load, {msgs_per_s:.0f} msg/s, {needed:.2f} MB/s of CDR payload; "
          f"Fast DDS profile {profile or '(default)'}; ROS_DOMAIN_ID {os.environ['ROS_DOMAIN_ID']}")
    print(f"load publisher: {pub['seconds']:.2f} s, lateness p50 {pub['late_p50_ms']:.2f} ms, "
          f"p99 {pub['late_p99_ms']:.2f} ms, max {pub['late_max_ms']:.2f} ms, CPU {pub_cpu_percent:.1f} %")
    print(f"{'topic':48s} {'target':>7s} {'publ.':>7s} {'recorded':>8s} {'dropped':>7s} {'queue':>5s} "
          f"{'pub Hz':>7s} {'rec Hz':>7s} {'gaps':>4s} {'longest ms':>10s}")
    for topic, r in rows.items():
        rec_hz = "-" if r["recorded_hz"] is None else f"{r['recorded_hz']:.1f}"
        print(f"{topic:48s} {r['target_hz']:7.0f} {r['published']:7d} {r['recorded']:8d} {r['dropped']:7d} "
              f"{r['queue_dropped']:5d} {r['published_hz']:7.1f} {rec_hz:>7s} {r['gaps']:4d} "
              f"{r['longest_gap_ms']:10.1f}")
    ratio = writer_mb_s / needed
    print(f"recorder: CPU {cpu_percent:.1f} % of one core over the load (incl. the 1 s after it: "
          f"{100.0 * (cpu2 - cpu0) / (t_stop - w0):.1f} %), peak RSS {rss:.0f} MB, stop+close {stop_s:.2f} s, "
          f"bag {bag_mb:.0f} MB")
    print(f"writer: {writer_mb_s:.1f} MB/s with CRCs ({writer_bytes / 1e6:.0f} MB = {rounds} s of load in "
          f"{writer_span:.2f} s, close included) = {ratio:.1f}x the needed {needed:.2f} MB/s; without CRCs "
          f"{no_crc_mb_s:.1f} MB/s (CRCs keep {crc_ratio:.0%} of it); baseline raw open().write of the same "
          f"bytes: {raw_mb_s:.1f} MB/s, writer = {writer_mb_s / raw_mb_s:.0%} of it")
    print(f"goal 0 drops: {'met' if dropped_total == 0 else f'NOT met ({dropped_total} dropped)'}; "
          f"goal writer >= 5x needed: {'met' if ratio >= 5.0 else 'NOT met'} ({ratio:.1f}x)")
    print(json.dumps({
        "dropped": dropped,
        "needed_mb_s": round(needed, 3),
        "writer_mb_s": round(writer_mb_s, 1),
        "writer_no_crc_mb_s": round(no_crc_mb_s, 1),
        "crc_throughput_ratio": round(crc_ratio, 3),
        "cpu_percent": round(cpu_percent, 1),
        "dropped_total": dropped_total,
        "queue_dropped_total": sum(r["queue_dropped"] for r in rows.values()),
        "writer_over_needed": round(ratio, 2),
        "raw_disk_mb_s": round(raw_mb_s, 1),
        "writer_over_raw_disk": round(writer_mb_s / raw_mb_s, 3),
        "published_total": sum(r["published"] for r in rows.values()),
        "msgs_per_s": msgs_per_s,
        "publisher_cpu_percent": round(pub_cpu_percent, 1),
        "publisher_late_p99_ms": round(pub["late_p99_ms"], 3),
        "recorder_peak_rss_mb": round(rss, 1),
        "gaps": sum(r["gaps"] for r in rows.values()),
        "seconds": args.seconds,
    }))


if __name__ == "__main__":
    main()
