"""The whole demo stack on this machine: CPU, rates, latencies, wall-clock truth of the arm commands.

    .venv/bin/python bench/stack.py [--seconds 30] [--floor-seconds 15]     # about 2 minutes

Runs the demo's node set (``rynn_teleop.demo``: the bringup's digital mode with a synthetic operator, the
same process groups and priorities; the physical twin in the drivers' process) and records an episode of
``--seconds`` with the feed switch on the physical camera (so the consumer stream's header stamps are capture
times), the twin reset just before it so that the operator does the twin's pick-and-place in it (grasp, carry,
place: the physics with contacts). Measured over the episode:

* ``cpu_cores`` per process group and ``cpu_cores_total`` (utime + stime from /proc over the episode, in
  cores: 1.0 = one core busy);
* ``rates``: delivered Hz per topic (the episode's statistics), with ``rates_nominal``;
* ``arm_latency_p99_ms`` (tracker sample -> the ``/arms/command`` that first solved it; ``arm_ik``'s own meter),
  ``hand_latency_p99_ms`` (glove frame -> ``/hands/command``; ``hand_retarget``'s meter): the largest p99
  of the 5 s windows the nodes report in ``/diagnostics`` that lie wholly inside the episode;
  ``camera_latency_p99_ms``: capture stamp -> the middleware's receive time at the recorder, a consumer of
  ``/head_camera/color/image_raw`` behind the switch, p99 over every frame;
* ``arm_stamp_speed_max_ratio`` / ``arm_stamp_accel_max_ratio``: ``/arms/command`` differenced over its
  header stamps (speed over each interval, acceleration between interval midpoints), largest value over
  every joint and sample divided by ``arm_ik``'s configured limits;
* ``stale_fraction``: share of ``arm_ik`` cycles in which an engaged side had no fresh operator pose;
* ``twin_physics_rate_hz``: the twin's physics loop, lowest 5 s window (nominal 500 Hz); ``twin_outcome``;
* ``floor_cpu_cores``: the baseline, measured right after in the same run: bare rclpy processes (one per
  group) publishing the stack's recorded messages (their CDR bytes) on the same topics at their recorded
  times and taking (polled raw takes at 100 Hz) every topic each group subscribes to, with the stack's QoS:
  what DDS and rclpy cost for the same traffic with no work done on it.
* the host's own stalls over the episode, a second baseline: one process per CPU, pinned to it, outside the
  stack, at the highest real-time priority (``SCHED_FIFO`` 99 where permitted), that sleeps to 200 Hz
  deadlines and does nothing else. Its lateness is what the machine (hypervisor, kernel) takes from that
  CPU whatever the stack does; the lowest CPU's probe also times a walk over the pages of a buffer of its
  own (``rynn_teleop.host_stalls``: memory stalls): ``host_stall_max_ms``, ``host_stalls`` (each stall over
  10 ms and each memory stall: the CPU, seconds into the episode, its length and kind, to compare with the
  episode problems' times) and
  ``host_steal_fraction`` (/proc/stat steal time over the episode, share of all CPUs' time).
* the cost of a short burst of work here, a third baseline: ``bench/control_loop.py --reference`` beside the
  stack (normal priority, 100 Hz) times one fixed unit of Python and numpy work per tick and back to back
  after: ``host_cold_factor`` (per tick / back to back; 1.0 = warm caches at every tick) and
  ``reference_work_hot_us``. Every loop of the stack pays that factor on its own work, so on a shared
  virtual machine ``cpu_cores_total`` moves with it while the floor (little work per message) moves less.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
IGNORED_TOPICS = ("/rosout", "/parameter_events", "/diagnostics")
#: topics recorded besides the demo's, so that the floor can publish their messages
EXTRA_TOPICS = {
    "/head_camera/physical/color/image_raw": 30.0,
    "/head_camera/physical/color/camera_info": 30.0,
    "/head_camera/generated/color/camera_info": 30.0,
    "/twin/objects": 60.0,  # the physical twin's object poses (its objects_rate_hz)
}


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` [s]."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _qos_for(topic: str, type_name: str, latched: bool):
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

    if latched:
        return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    if type_name in ("sensor_msgs/msg/Image", "sensor_msgs/msg/CameraInfo"):
        return qos_profile_sensor_data
    return QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)


def message_class(type_name: str):
    """The rclpy message class of 'pkg/msg/Name'."""
    package, _, name = type_name.split("/")
    return getattr(importlib.import_module(f"{package}.msg"), name)


# ---------------------------------------------------------------------- the floor's processes
def floor_child(spec_path: str) -> None:
    """One bare process of the floor: publish the given recorded messages on schedule, take every
    subscribed topic at 100 Hz, for ``seconds``. No executor."""
    import rclpy

    from rynn_teleop.nodes.process import use_transport_profile
    from rynn_teleop.nodes.rmw import take_waiting

    spec = pickle.loads(Path(spec_path).read_bytes())
    use_transport_profile()
    rclpy.init()
    node = rclpy.create_node(spec["name"])
    pubs = {t: node.create_publisher(message_class(ty), t, _qos_for(t, ty, latched))
            for t, (ty, latched) in spec["publish"].items()}
    subs = [node.create_subscription(message_class(ty), t, lambda *_: None, _qos_for(t, ty, latched), raw=True)
            for t, (ty, latched) in spec["subscribe"].items()]
    schedule = sorted((offset, topic, raw) for topic, msgs in spec["messages"].items() for offset, raw in msgs)
    time.sleep(2.0)  # discovery
    start = time.monotonic()
    next_take = start
    i, seconds, taken = 0, spec["seconds"], 0
    while True:
        now = time.monotonic() - start
        if now >= seconds:
            break
        while i < len(schedule) and schedule[i][0] * 1e-9 <= now:
            pubs[schedule[i][1]].publish(schedule[i][2])
            i += 1
        if time.monotonic() >= next_take:
            next_take += 0.01
            for sub in subs:
                taken += sum(1 for _ in take_waiting(sub, 1_000_000))
        due = min(schedule[i][0] * 1e-9 if i < len(schedule) else seconds, next_take - start)
        time.sleep(max(0.0, due - (time.monotonic() - start)))
    print(json.dumps({"published": i, "taken": taken}), flush=True)
    node.destroy_node()
    rclpy.shutdown()


def run_floor(groups, graph: dict[str, tuple[set, set]], types: dict[str, str], latched: set[str],
              recorded: dict[str, list[tuple[int, bytes]]], seconds: float, work: Path) -> tuple[float, dict]:
    """Start one bare process per group with its publications and subscriptions; their summed CPU [cores]."""
    procs = []
    for group in groups:
        pubs = {t for n in group for t in graph.get(n, (set(), set()))[0]}
        subs = {t for n in group for t in graph.get(n, (set(), set()))[1]}
        pubs = {t for t in pubs if t in recorded and t in types}
        subs = {t for t in subs if t in types}
        messages = {}
        for t in pubs:
            msgs = recorded[t]
            t0 = msgs[0][0]
            messages[t] = [(bag_ns - t0, raw) for bag_ns, raw in msgs if bag_ns - t0 < seconds * 1e9]
        spec = {"name": "floor_" + "_".join(group), "seconds": seconds, "messages": messages,
                "publish": {t: (types[t], t in latched) for t in pubs},
                "subscribe": {t: (types[t], t in latched) for t in subs}}
        path = work / f"floor_{'_'.join(group)}.pickle"
        path.write_bytes(pickle.dumps(spec))
        procs.append(subprocess.Popen([sys.executable, __file__, "--floor-child", str(path)],
                                      stdout=subprocess.PIPE, text=True))
    time.sleep(2.5)  # past their discovery sleep
    before = {p.pid: cpu_seconds(p.pid) for p in procs}
    t0 = time.monotonic()
    time.sleep(max(0.0, seconds - 1.0))
    used = {p.pid: cpu_seconds(p.pid) - before[p.pid] for p in procs}
    elapsed = time.monotonic() - t0
    results = {}
    for group, p in zip(groups, procs):
        out, _ = p.communicate(timeout=seconds + 30)
        results["+".join(group)] = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    return sum(used.values()) / elapsed, results


# ---------------------------------------------------------------------- the host's stalls
def _steal_ticks() -> int:
    """Steal time of all CPUs so far [clock ticks] (/proc/stat, 8th value of the 'cpu' line)."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def host_stall_summary(probes, episode_start_s: float, seconds: float, steal: float) -> dict:
    """The JSON fields of the host probes (``rynn_teleop.host_stalls.HostProbes``): the stalls within the
    episode (``seconds`` from ``episode_start_s``, wall clock [s]; times relative to its start), and
    ``steal`` (the episode's steal fraction)."""
    from rynn_teleop import host_stalls

    policy, stalls = probes.finish()
    if policy is None:
        return {"host_stall_max_ms": None, "host_stalls": None, "host_steal_fraction": None}
    stalls = host_stalls.within(stalls, episode_start_s, episode_start_s + seconds)
    return {
        "host_stall_max_ms": round(1e3 * max((s.length_s for s in stalls), default=0.0), 1),
        "host_stalls": host_stalls.rows(stalls, episode_start_s),
        "host_steal_fraction": round(steal, 4),
        "host_probe": policy,
    }


# ---------------------------------------------------------------------- the stack
def _p99_windows(statuses: list[dict], key: str) -> float | None:
    """The largest ``key`` over the reported windows that lie inside the episode (``statuses``: already
    filtered by :func:`_inside`)."""
    values = [float(v[key]) for v in statuses if key in v and v[key] not in ("nan", "")]
    return max(values) if values else None


def _rate_windows(statuses: list[dict], key: str) -> float | None:
    """The lowest rate [Hz] of ``key`` over the 5 s windows a node reported (None if it reported none)."""
    values = [float(s[key]) for s in statuses if key in s and s[key] not in ("", "nan")]
    return round(min(values), 1) if values else None


def _reference_result(proc: subprocess.Popen) -> dict:
    """The JSON line of ``bench/control_loop.py --reference`` (empty if it failed or hung)."""
    try:
        out, _ = proc.communicate(timeout=30.0)
        return json.loads(out.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        proc.kill()
        proc.wait()
        return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="episode length [s]")
    parser.add_argument("--floor-seconds", type=float, default=15.0, help="length of the floor's run [s]")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work folder after a complete run too (episode, logs, floor recordings; "
                             "printed as work_dir)")
    parser.add_argument("--floor-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_child:
        floor_child(args.floor_child)
        return
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] != "LOCALHOST":
        sys.exit("bench/stack.py: set ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST")
    os.environ.setdefault("ROS_DOMAIN_ID", str(70 + os.getpid() % 20))

    from rosbags.typesys import Stores, get_typestore

    from rynn_teleop import demo, host_stalls
    from rynn_teleop.core.stats import RateMeter
    from rynn_teleop.core.status import ArmIKStatus, RecorderStatus
    from rynn_teleop.nodes import node_class
    from rynn_teleop.nodes.process import use_transport_profile
    from rynn_teleop.recording.inspect import episode_info
    from rynn_teleop.runner import Composition, node_parameters
    from rynn_teleop.sources.playback import open_bag

    work = Path(tempfile.mkdtemp(prefix="bench_stack_"))  # removed after a complete run (1-2 GB) unless --keep
    use_transport_profile()
    topics = {**demo.DEMO_TOPICS, **EXTRA_TOPICS}
    overrides = demo.demo_overrides(work)
    overrides["camera_switch"]["active_source"] = "physical"
    overrides["recorder"].update(topics=list(topics), expected_rates_hz=list(topics.values()))
    procs: list = []
    graph: dict[str, tuple[set, set]] = {}
    try:
        with Composition([]) as comp:
            probe = demo._Probe(comp.context)
            comp.add_node(probe)
            demo.spawn_groups(demo.DEMO_GROUPS, overrides, work, probe, procs)
            rated = sum(1 for r in topics.values() if r)

            def flowing() -> bool:  # the arms engaged and every recorded topic flowing
                arm, rec = probe.status("arm_ik", ArmIKStatus), probe.status("recorder", RecorderStatus)
                return arm is not None and arm.engaged and rec is not None and rec.topics_flowing == (rated, rated)

            ready = demo._wait(flowing, 90.0)
            if not ready:
                sys.exit(f"bench/stack.py: the stack did not come up within 90 s; logs in {work}")
            # the host probes start before the settle time: their own start-up (a Python process each) must
            # not take the stack's CPU at the episode's start
            host = host_stalls.HostProbes(demo.SETTLE_S + args.seconds + 5.0)
            reference = subprocess.Popen(  # this interpreter, this repository's script
                [sys.executable, str(ROOT / "bench" / "control_loop.py"), "--reference", str(args.seconds + 3.0)],
                stdout=subprocess.PIPE, text=True)
            time.sleep(demo.SETTLE_S)
            for name, ns in probe.get_node_names_and_namespaces():
                if name.startswith(("demo_probe", "_")):
                    continue
                pubs = {t for t, _ in probe.get_publisher_names_and_types_by_node(name, ns)} - set(IGNORED_TOPICS)
                subs = {t for t, _ in probe.get_subscriber_names_and_types_by_node(name, ns)} - set(IGNORED_TOPICS)
                graph[name] = (pubs, subs)
            probe.next_layout()  # the twin's next layout: the operator does its task (grasps, contacts) in the episode
            probe.episode("episode start")
            before = {p.pid: cpu_seconds(p.pid) for p in procs}
            steal_before = _steal_ticks()
            t0 = time.monotonic()
            time.sleep(args.seconds)
            used = {p.pid: cpu_seconds(p.pid) - before[p.pid] for p in procs}
            elapsed = time.monotonic() - t0
            steal = (_steal_ticks() - steal_before) / CLK_TCK / (elapsed * os.cpu_count())
            episode = probe.episode("episode stop", timeout=60.0)
    finally:
        demo.stop_groups(procs)
    reference_result = _reference_result(reference)
    info = episode_info(episode)
    episode_start_s = yaml.safe_load((episode / "episode.yaml").read_text())["start_ns"] * 1e-9
    store = get_typestore(Stores.ROS2_JAZZY)
    recorded: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    types: dict[str, str] = {}
    commands, camera_lat, statuses = [], [], defaultdict(list)
    reader = open_bag(episode, "bench")
    try:
        for conn, t, raw in reader.messages():
            types[conn.topic] = conn.msgtype
            recorded[conn.topic].append((t, bytes(raw)))
            if conn.topic == "/arms/command":
                commands.append(store.deserialize_cdr(raw, conn.msgtype))
            elif conn.topic == "/head_camera/color/image_raw":
                m = store.deserialize_cdr(raw, conn.msgtype)
                camera_lat.append(t - (m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec))
            elif conn.topic == "/diagnostics":
                for st in store.deserialize_cdr(raw, conn.msgtype).status:
                    statuses[st.name].append((t, {kv.key: kv.value for kv in st.values}))
    finally:
        reader.close()
    latched = {"/head_camera/active_source", "/robot_description", "/arm_ik/engaged"}

    # wall-clock truth of /arms/command, against arm_ik's configured limits
    arm = node_parameters("arm_ik", node_class("arm_ik").SCHEMA, None, overrides.get("arm_ik"))
    vmax = np.tile(np.asarray(arm["max_velocity"], float), 2)
    amax = np.tile(np.asarray(arm["max_acceleration"], float), 2)
    q = np.array([m.position for m in commands])
    ts = np.array([m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec for m in commands], np.int64) * 1e-9
    dts = np.diff(ts)
    ok = dts > 0
    v = np.diff(q, axis=0)[ok] / dts[ok, None]
    mid = (0.5 * (ts[1:] + ts[:-1]))[ok]
    a = np.diff(v, axis=0) / np.diff(mid)[:, None]
    # a node's meters report over their last window (RateMeter's default): windows that began before the
    # episode (start-up, the settle time) are not the episode's; the cycle counters are read from the same
    first_ns = min(msgs[0][0] for msgs in recorded.values() if msgs)
    window_ns = RateMeter().window * 1e9
    inside = {name: [v for t, v in rows if t >= first_ns + window_ns] for name, rows in statuses.items()}
    ik_stat = inside.get("arm_ik", [])
    cycles = [(int(s["cycles"]), int(s["stale_cycles"])) for s in ik_stat if "cycles" in s and "stale_cycles" in s]
    stale_fraction = None
    if len(cycles) >= 2 and cycles[-1][0] > cycles[0][0]:
        stale_fraction = (cycles[-1][1] - cycles[0][1]) / (cycles[-1][0] - cycles[0][0])
    hand_stat = inside.get("hand_retarget", [])
    hand_p99 = [x for x in (_p99_windows(hand_stat, f"command.{s}.latency_p99_ms") for s in ("left", "right"))
                if x is not None]

    floor_cores, floor_detail = run_floor(demo.DEMO_GROUPS, graph, types, latched, recorded, args.floor_seconds, work)
    cores = {"+".join(g): round(used[p.pid] / elapsed, 3) for g, p in zip(demo.DEMO_GROUPS, procs)}
    rated_topics = {t: r for t, r in topics.items() if r}
    result = {
        "cpu_cores_total": round(sum(cores.values()), 3),
        "cpu_cores": cores,
        "floor_cpu_cores": round(floor_cores, 3),
        "total_over_floor": round(sum(cores.values()) / floor_cores, 2) if floor_cores > 0 else None,
        "rates": {t: round(info.stats.topics[t].rate_hz or 0.0, 1) if t in info.stats.topics else 0.0
                  for t in rated_topics},
        "rates_nominal": rated_topics,
        "rates_within_5pct": all(t in info.stats.topics and abs((info.stats.topics[t].rate_hz or 0) - r) <= 0.05 * r
                                 for t, r in rated_topics.items()),
        "arm_latency_p99_ms": _p99_windows(ik_stat, "command.latency_p99_ms"),
        "hand_latency_p99_ms": max(hand_p99) if hand_p99 else None,
        "camera_latency_p99_ms": round(float(np.percentile(camera_lat, 99)) * 1e-6, 2) if camera_lat else None,
        "arm_stamp_speed_max_ratio": round(float(np.max(np.abs(v) / vmax)), 4) if v.size else None,
        "arm_stamp_accel_max_ratio": round(float(np.max(np.abs(a) / amax)), 4) if a.size else None,
        "stale_fraction": None if stale_fraction is None else round(stale_fraction, 4),
        "twin_physics_rate_hz": _rate_windows(inside.get("twin", []), "physics.rate_hz"),
        "twin_outcome": demo.episode_outcome(episode)["outcome"] or None,
        "episode_problems": len(info.problems),
        "dropped": {t: s.dropped for t, s in info.stats.topics.items() if s.dropped},
        **host_stall_summary(host, episode_start_s, elapsed, steal),
        "host_cold_factor": reference_result.get("cold_factor"),
        "reference_work_hot_us": reference_result.get("work_hot_us"),
        "seconds": args.seconds,
        "floor_seconds": args.floor_seconds,
        "floor_detail": floor_detail,
        "work_dir": str(work) if args.keep else None,
    }
    for problem in info.problems:
        print(f"episode problem: {problem}")
    print(json.dumps(result))
    if not args.keep:  # a failed run keeps its folder: its logs say why
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
