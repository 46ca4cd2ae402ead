"""How the demo starts its processes: the synthetic operator, which holds the calibration posture only for its
first seconds, starts once the node that calibrates on that posture runs (processes are stand-ins here)."""

from __future__ import annotations

import threading
import time

import pytest

from rynn_teleop import demo
from rynn_teleop.errors import RynnTeleopError


class FakeProc:
    def __init__(self, group):
        self.group = group
        self.started_at = time.monotonic()

    def poll(self):
        return None


class FakeProbe:
    def __init__(self):
        self.diagnostics: dict = {}


GROUPS = (("tracker",), ("arm_ik",), ("hand_retarget",), ("recorder",))


def test_the_operator_starts_after_the_calibrating_node_reports(monkeypatch, tmp_path):
    spawned = []
    monkeypatch.setattr(demo, "_spawn", lambda group, overrides, log: spawned.append(FakeProc(group)) or spawned[-1])
    probe = FakeProbe()
    reported = []

    def report():
        reported.append(time.monotonic())
        probe.diagnostics["arm_ik"] = {"engaged": "False"}

    threading.Timer(0.3, report).start()
    procs: list = []
    demo.spawn_groups(GROUPS, {}, tmp_path, probe, procs, timeout=10.0)
    assert [p.group for p in spawned][-1] == ("tracker",) and spawned[-1].started_at >= reported[0]
    assert all(p.started_at < reported[0] for p in spawned[:-1])
    assert [p.group for p in procs] == list(GROUPS)  # the caller's list in the groups' order


def test_a_calibrating_node_that_never_reports_stops_the_start_with_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "_spawn", lambda group, overrides, log: FakeProc(group))
    procs: list = []
    with pytest.raises(RynnTeleopError, match=r"arm_ik did not come up within 0\.2 s .*logs in"):
        demo.spawn_groups(GROUPS, {}, tmp_path, FakeProbe(), procs, timeout=0.2)
    assert [p.group for p in procs] == [g for g in GROUPS if g != ("tracker",)]  # what started, to be stopped


def test_the_demo_reports_the_gaps_that_overlap_a_stall_of_the_machine():
    from types import SimpleNamespace

    from rynn_teleop.host_stalls import Stall
    from rynn_teleop.recording.stats import EpisodeStats, Gap, TopicStats

    s = 1_000_000_000
    stats = EpisodeStats(100 * s, 120 * s, {
        "/arms/command": TopicStats("/arms/command", "sensor_msgs/msg/JointState", 4000, expected_rate_hz=200.0,
                                    gaps=(Gap(103 * s, 103 * s + 40_000_000, "header", 103 * s),
                                          Gap(110 * s, 110 * s + 30_000_000, "header", 110 * s))),
        "/tf": TopicStats("/tf", "tf2_msgs/msg/TFMessage", 10),
    })
    info = SimpleNamespace(stats=stats)
    stalls = [Stall(99.0, 0.05, 0), Stall(103.005, 0.030, 0), Stall(103.006, 0.028, 1),  # the first: before it
              Stall(110.010, 0.012, 0, "memory")]
    report = demo.host_stall_report("SCHED_FIFO 99", stalls, info)
    assert report["measured"] and report["gaps"] == 2
    assert report["gaps_overlapping_stalls"] == {"/arms/command": 2}  # one CPU stall, one memory stall
    assert [row[:2] for row in report["stalls"]] == [[0, 3.005], [1, 3.006], [0, 10.01]]
    assert report["longest_ms"] == 30.0
    line = demo.host_stall_line(report)
    assert "2 of >= 10 ms on 2 CPU(s) and 1 memory stall(s)" in line
    assert "2 of the episode's 2 gap(s) overlap one" in line
    # a probe that could not run at real-time priority proves nothing: not reported as measured
    refused = demo.host_stall_report("normal (real-time refused)", stalls, info)
    assert not refused["measured"] and "not measured" in demo.host_stall_line(refused)
    mixed = demo.host_stall_report("SCHED_FIFO 99, normal (real-time refused)", stalls, info)  # one CPU refused
    assert not mixed["measured"]
