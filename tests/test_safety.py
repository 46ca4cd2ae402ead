"""The drivers' safety layer (core.safety) and the simulated joints (hardware.sim)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rynn_teleop.core.robot_model import JointLimits
from rynn_teleop.core.safety import SafetyController, Watchdog, clamp_command
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.hardware.sim import SimBackend

N = 3
DT = 0.005
LIMITS = JointLimits(
    lower=np.array([-1.0, -2.0, 0.0]), upper=np.array([1.0, 2.0, 1.5]),
    velocity=np.array([2.0, 1.0, 4.0]), acceleration=np.full(N, 20.0), jerk=np.full(N, 500.0),
)
NAMES = ("a", "b", "c")


def controller(**kw) -> SafetyController:
    return SafetyController(NAMES, LIMITS, DT, **kw)


# ---------------------------------------------------------------------------------------------- clamp
def test_clamp_returns_what_is_sent_and_why():
    prev = np.array([0.0, 0.0, 0.5])
    step = LIMITS.velocity * DT
    r = clamp_command(np.array([5.0, 0.001, np.nan]), prev, LIMITS.lower, LIMITS.upper, step)
    np.testing.assert_allclose(r.sent, [step[0], 0.001, 0.5])
    assert r.position_clipped.tolist() == [True, False, True]
    assert r.step_clipped.tolist() == [True, False, False]
    assert "a +5.0000 -> +0.0100 rad (position limit)" in r.describe(NAMES, np.array([5.0, 0.001, np.nan]))


@settings(max_examples=200, deadline=None)
@given(asked=st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(np.nan), st.just(np.inf), st.just(-np.inf)),
                     min_size=3, max_size=3),
       prev=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3))
def test_clamp_never_leaves_the_limits_or_the_step(asked, prev):
    prev = LIMITS.lower + np.array(prev) * (LIMITS.upper - LIMITS.lower)
    step = LIMITS.velocity * DT
    r = clamp_command(np.array(asked), prev, LIMITS.lower, LIMITS.upper, step)
    assert np.all(np.isfinite(r.sent))
    assert np.all(r.sent >= LIMITS.lower) and np.all(r.sent <= LIMITS.upper)
    assert np.all(np.abs(r.sent - prev) <= step + 1e-12)


# ---------------------------------------------------------------------------------------------- watchdog
def test_watchdog_trips_and_needs_a_fresh_command_to_rearm():
    w = Watchdog(0.1)
    assert not w.check(0.0)  # nothing received yet
    w.feed(0.0)
    assert w.check(0.05)
    assert not w.check(0.2) and w.tripped and w.trips == 1
    assert not w.check(0.21)  # still tripped without a new command
    w.feed(0.25)
    assert w.check(0.26) and not w.tripped
    with pytest.raises(ConfigurationError):
        Watchdog(0.0)


# ---------------------------------------------------------------------------------------------- controller
def run(ctl: SafetyController, sim_q: np.ndarray, t0: float, t1: float, command=None, every=1):
    """Drive ctl for [t0, t1) with an ideal plant (measured = last target); returns targets and modes."""
    targets, modes = [], []
    q = sim_q.copy()
    for k, t in enumerate(np.arange(t0, t1, DT)):
        if command is not None and k % every == 0:
            ctl.command(command(t), t)
        out = ctl.step(t, q)
        q = out.target.copy()
        targets.append(out.target.copy())
        modes.append(out.mode)
    return np.array(targets), modes


def test_startup_holds_the_measured_position_then_ramps_to_a_far_command():
    ctl = controller(ramp_speed=0.25)
    start = np.array([0.2, -0.5, 1.0])
    held, modes = run(ctl, start, 0.0, 0.1)
    assert set(modes) == {"waiting"}
    np.testing.assert_allclose(held, np.tile(start, (len(held), 1)))
    far = np.array([0.9, 0.5, 0.1])
    targets, modes = run(ctl, start, 0.1, 5.0, command=lambda t: far)
    assert modes[0] == "ramp" and modes[-1] == "track"
    steps = np.abs(np.diff(np.vstack([start, targets]), axis=0))
    assert np.all(steps <= 0.25 * LIMITS.velocity * DT + 1e-9)  # ramp speed while ramping
    np.testing.assert_allclose(targets[-1], far)


def test_a_near_first_command_is_followed_without_ramping():
    ctl = controller()
    start = np.array([0.2, -0.5, 1.0])
    _, modes = run(ctl, start, 0.0, 0.05, command=lambda t: start + 0.01)
    assert modes[0] == "track"


def test_watchdog_holds_the_measured_position_and_resumes_only_with_fresh_commands():
    ctl = controller(command_timeout=0.05)
    q = np.array([0.0, 0.0, 0.5])
    run(ctl, q, 0.0, 1.0, command=lambda t: np.array([0.1, 0.1, 0.6]))
    assert ctl.mode == "track"
    measured = np.array([0.11, 0.09, 0.61])
    outs = [ctl.step(1.0 + k * DT, measured) for k in range(40)]  # commands stop
    assert outs[-1].mode == "watchdog"
    np.testing.assert_allclose(outs[-1].target, measured)
    ctl.command(np.array([0.1, 0.1, 0.6]), 0.5)  # an OLD command does not re-arm
    assert ctl.step(1.21, measured).mode == "watchdog"
    ctl.command(np.array([0.1, 0.1, 0.6]), 1.22)
    assert ctl.step(1.22, measured).mode == "track"  # near: followed at once


def test_estop_latches_within_the_cycle_until_reset():
    ctl = controller()
    q = np.array([0.0, 0.0, 0.5])
    run(ctl, q, 0.0, 0.1, command=lambda t: np.array([0.5, 0.5, 1.0]))
    measured = ctl._sent.copy()
    assert ctl.estop() and not ctl.estop()  # second call: already latched
    out = ctl.step(0.1, measured)
    assert out.mode == "estop"
    np.testing.assert_allclose(out.target, measured)
    for k in range(50):  # commands keep coming: ignored while latched
        ctl.command(np.array([-1.0, -1.0, 0.0]), 0.1 + k * DT)
        assert ctl.step(0.1 + k * DT, measured).mode == "estop"
    ctl.reset()
    assert ctl.step(0.4, measured).mode == "watchdog"  # needs a command after the reset
    ctl.command(np.array([-1.0, -1.0, 0.0]), 0.41)
    assert ctl.step(0.41, measured).mode == "ramp"  # far: ramped, not jumped
    assert ctl.estops == 1


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["cmd", "gap", "estop", "reset"]),
                                 st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=3),
                                 st.integers(1, 40)), min_size=1, max_size=15))
def test_targets_never_leave_the_limits_or_the_step_limit(events):
    ctl = controller(command_timeout=0.05)
    q = np.array([0.0, 0.0, 0.5])
    previous = q.copy()
    t = 0.0
    for kind, value, n in events:
        if kind == "estop":
            ctl.estop()
        elif kind == "reset":
            ctl.reset()
        for _ in range(n):
            if kind == "cmd":
                ctl.command(np.array(value), t)
            out = ctl.step(t, q)
            assert np.all(out.target >= LIMITS.lower) and np.all(out.target <= LIMITS.upper)
            assert np.all(np.abs(out.target - previous) <= LIMITS.velocity * DT + 1e-12)
            previous = out.target
            q = out.target  # an ideal plant
            t += DT


# ---------------------------------------------------------------------------------------------- sim
def test_sim_tracks_with_its_bandwidth_and_latency_within_the_limits():
    limits = JointLimits(LIMITS.lower, LIMITS.upper, np.array([2.0, 1.0, 100.0]), np.array([20.0, 20.0, 1e4]),
                         LIMITS.jerk)
    sim = SimBackend(NAMES, limits, np.zeros(N), bandwidth_hz=5.0, latency_s=0.02)
    sim.enable()
    positions = []
    for k in range(400):
        t = k * DT
        r = sim.read(t)
        positions.append(r.position)
        sim.write(np.array([0.5, 0.5, 0.5]))
    positions = np.array(positions)
    assert np.all(positions[:4] == 0.0)  # nothing happens before the latency has passed
    np.testing.assert_allclose(positions[-1], 0.5, atol=1e-3)
    v = np.diff(positions, axis=0) / DT
    assert np.all(np.abs(v) <= limits.velocity + 1e-9)
    # time constant: about 63 % of the way after latency + 1 / (2 pi bw)
    k63 = int(round((0.02 + 1.0 / (2 * np.pi * 5.0)) / DT))
    assert 0.25 < positions[k63, 2] < 0.4  # joint c is not velocity- or acceleration-limited
    a = np.diff(v, axis=0) / DT
    assert np.all(np.abs(a[:, :2]) <= 20.0 + 1e-6)  # a and b respect their acceleration limit


def test_sim_stop_decelerates_and_refuses_writes():
    sim = SimBackend(NAMES, LIMITS, np.zeros(N), bandwidth_hz=20.0, latency_s=0.0)
    sim.enable()
    for k in range(20):
        sim.read(k * DT)
        sim.write(np.array([1.0, 1.0, 1.0]))
    sim.stop()
    for k in range(20, 200):
        r = sim.read(k * DT)
        sim.write(np.array([-1.0, -1.0, 0.0]))
    assert np.all(np.abs(r.velocity) < 1e-9)
    assert np.all(r.position > 0.0)  # never went towards the later commands
