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
