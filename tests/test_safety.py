"""The drivers' safety layer (core.safety) and the simulated joints (hardware.sim)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rynn_teleop.core.motion import JerkLimitedFollower
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


def check_limits(targets: np.ndarray, start: np.ndarray, velocity=None) -> None:
    """Targets within the position limits; finite differences within velocity/acceleration/jerk."""
    x = np.vstack([start, targets])
    assert np.all(x[1:] >= LIMITS.lower - 1e-9) and np.all(x[1:] <= LIMITS.upper + 1e-9)
    v = np.diff(x, axis=0) / DT
    a = np.diff(v, axis=0) / DT
    j = np.diff(a, axis=0) / DT
    vmax = LIMITS.velocity if velocity is None else velocity
    assert np.all(np.abs(v) <= vmax * (1 + 1e-6) + 1e-9)
    assert np.all(np.abs(a) <= LIMITS.acceleration * (1 + 1e-6) + 1e-6)
    assert np.all(np.abs(j) <= LIMITS.jerk * (1 + 1e-6) + 1e-3)


def test_startup_holds_the_measured_position_then_ramps_to_a_far_command():
    ctl = controller(ramp_speed=0.25)
    start = np.array([0.2, -0.5, 1.0])
    held, modes = run(ctl, start, 0.0, 0.1)
    assert set(modes) == {"waiting"}
    np.testing.assert_allclose(held, np.tile(start, (len(held), 1)))
    far = np.array([0.9, 0.5, 0.1])
    targets, modes = run(ctl, start, 0.1, 6.0, command=lambda t: far)
    assert modes[0] == "ramp" and modes[-1] == "track"
    ramping = np.array([m == "ramp" for m in modes])
    v = np.abs(np.diff(np.vstack([start, targets]), axis=0)) / DT
    assert np.all(v[ramping] <= 0.25 * LIMITS.velocity + 1e-9)  # ramp speed while ramping
    check_limits(targets, start)
    np.testing.assert_allclose(targets[-1], far)


def test_a_near_first_command_is_followed_without_ramping():
    ctl = controller()
    start = np.array([0.2, -0.5, 1.0])
    _, modes = run(ctl, start, 0.0, 0.05, command=lambda t: start + 0.01)
    assert modes[0] == "track"


def test_watchdog_stops_smoothly_and_resumes_only_with_fresh_commands():
    ctl = controller(command_timeout=0.05)
    q = np.array([0.0, 0.0, 0.5])
    moving, _ = run(ctl, q, 0.0, 0.3, command=lambda t: np.array([0.8 * np.sin(3 * t), 0.5 * t, 0.5 + 0.3 * t]))
    assert ctl.mode == "track"
    outs = [ctl.step(0.3 + k * DT, moving[-1]).target for k in range(200)]  # commands stop
    assert ctl.mode == "watchdog"
    check_limits(np.array(outs), moving[-1])  # a jerk-limited stop, not a jump to a hold
    np.testing.assert_allclose(outs[-1], outs[-2], atol=1e-12)  # at rest
    ctl.command(np.array([0.1, 0.1, 0.6]), 0.2)  # an OLD command does not re-arm
    assert ctl.step(1.31, outs[-1]).mode == "watchdog"
    ctl.command(outs[-1] + 0.01, 1.32)
    assert ctl.step(1.32, outs[-1]).mode == "track"  # near: followed at once


def test_joints_are_commanded_independently_and_go_stale_independently():
    ctl = controller(command_timeout=0.05)
    q = np.array([0.0, 0.0, 0.5])
    t = 0.0
    for _ in range(400):  # only joint a is commanded (e.g. one hand's glove)
        ctl.command(np.array([0.5, np.nan, np.nan]), t)
        q = ctl.step(t, q).target
        t += DT
    np.testing.assert_allclose(q, [0.5, 0.0, 0.5], atol=1e-9)  # b and c never moved
    with pytest.raises(ValueError):
        ctl.command(np.zeros(2), t)  # a command of the wrong length is refused, not broadcast


def test_estop_latches_and_a_reset_restarts_from_the_measured_position():
    ctl = controller()
    q = np.array([0.0, 0.0, 0.5])
    targets, _ = run(ctl, q, 0.0, 0.5, command=lambda t: np.array([0.9, 1.5, 1.4]))
    assert ctl.estop() and not ctl.estop()  # second call: already latched
    measured = targets[-1] + 0.1  # the robot coasted while its controller stopped it
    for k in range(50):  # commands keep coming: ignored while latched
        ctl.command(np.array([-1.0, -1.0, 0.0]), 0.5 + k * DT)
        assert ctl.step(0.5 + k * DT, measured).mode == "estop"
    ctl.reset()
    first = ctl.step(0.8, measured)
    assert first.mode == "watchdog"  # needs a command after the reset
    np.testing.assert_allclose(first.target, measured, atol=1e-12)  # from where the robot is, no jump back
    ctl.command(np.array([-1.0, -1.0, 0.0]), 0.81)
    out = ctl.step(0.81, measured)
    assert out.mode == "ramp"  # far: ramped, not jumped
    assert np.all(np.abs(out.target - measured) <= ctl.max_step + 1e-12)
    assert ctl.estops == 1


def test_no_target_before_a_finite_measurement_and_out_of_limit_starts_come_in_gently():
    ctl = controller()
    assert ctl.step(0.0, np.array([np.nan, 0.0, 0.5])).target is None
    outside = np.array([1.05, 0.0, 0.5])  # joint a measured 5 cm past its limit
    ctl.command(np.array([0.9, 0.0, 0.5]), 0.0)
    previous = outside
    for k in range(100):
        out = ctl.step(k * DT, previous)
        assert np.all(np.abs(out.target - previous) <= ctl.max_step + 1e-12)
        previous = out.target
    assert previous[0] <= 1.0


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["cmd", "gap", "estop", "reset", "partial"]),
                                 st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=3),
                                 st.integers(1, 40)), min_size=1, max_size=15))
def test_targets_never_leave_the_limits_and_move_within_velocity_acceleration_and_jerk(events):
    ctl = controller(command_timeout=0.05)
    q = np.array([0.0, 0.0, 0.5])
    segment_start, segment = q.copy(), []  # an e-stop is a hard stop by design: check between e-stops
    t = 0.0
    for kind, value, n in events:
        if kind == "estop" and not ctl.estopped:
            ctl.estop()
            if segment:
                check_limits(np.array(segment), segment_start)
            segment = []
        elif kind == "reset" and ctl.estopped:
            ctl.reset()
            segment_start = q.copy()
        for _ in range(n):
            if kind == "cmd":
                ctl.command(np.array(value), t)
            elif kind == "partial":
                ctl.command(np.array([value[0], np.nan, value[2]]), t)
            out = ctl.step(t, q)
            if not ctl.estopped:  # nothing is sent while latched; the plant holds
                q = out.target
                segment.append(q.copy())
            t += DT
    if segment:
        check_limits(np.array(segment), segment_start)


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


# ---------------------------------------------------------------------------------------------- wall-clock periods
def jittery_times(n: int, seed: int, *, late: float = 0.012, p_late: float = 0.05, busy: float = 2e-4) -> np.ndarray:
    """Tick times [s] of a deadline-scheduled DT loop: tick k runs at k * DT plus a small lateness, a few ticks
    ``late`` [s] late; the ticks whose deadlines passed meanwhile run right after (``busy`` [s] apart), early."""
    rng = np.random.default_rng(seed)
    t, previous = [], -np.inf
    for k in range(n):
        lateness = late if rng.random() < p_late else rng.uniform(0.0, 5e-4)
        previous = max(k * DT + lateness, previous + busy)
        t.append(previous)
    return np.array(t)


def wall_clock_rates(t: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Velocity [rad/s] over each interval of ``t`` and acceleration [rad/s^2] over the intervals' midpoints."""
    v = np.diff(x, axis=0) / np.diff(t)[:, None]
    a = np.diff(v, axis=0) / ((t[2:] - t[:-2]) / 2)[:, None]
    return v, a


def moving_command(t: float) -> np.ndarray:
    """A fast sine (a), a square wave of steps (b) and a faster sine (c), all faster than the limits allow [rad]."""
    return np.array([0.9 * np.sin(2 * np.pi * 1.5 * t), 1.5 * np.sign(np.sin(2 * np.pi * 0.4 * t + 0.3)),
                     0.75 + 0.7 * np.sin(2 * np.pi * 3.0 * t)])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_targets_move_within_the_limits_over_the_jittery_times_they_are_computed_at(seed):
    t = jittery_times(1600, seed)
    intervals = np.diff(t)
    assert intervals.max() > 2.5 * DT and intervals.min() < 0.1 * DT  # really late ticks, then early ones
    commands = [moving_command(max(now - 2.0, 0.0)) for now in t[:1200]]  # still for 2 s, then moving
    ctl = controller(command_timeout=0.05, ramp_speed=0.5)
    q = np.array([-0.3, 1.0, 0.4])  # far from the first command: ramped to it
    targets, modes = [], []
    for k, now in enumerate(t):
        if k < len(commands):  # then the commands stop: a watchdog stop under the same jitter
            ctl.command(commands[k], now)
        out = ctl.step(now, q)
        q = out.target
        targets.append(q.copy())
        modes.append(out.mode)
    assert {"ramp", "track", "watchdog"} <= set(modes)
    assert ctl.clamp_counts["step"] == 0  # the follower's targets already kept the wall-clock step
    x = np.array(targets)
    v, a = wall_clock_rates(t, x)
    assert np.all(np.abs(v) <= LIMITS.velocity * (1 + 1e-6))
    assert np.all(np.abs(a) <= LIMITS.acceleration * 1.05)
    ramping = np.array([m == "ramp" for m in modes[1:]])
    assert np.all(np.abs(v[ramping]) <= 0.5 * LIMITS.velocity * (1 + 1e-6))
    np.testing.assert_allclose(np.abs(v).max(axis=0)[:2], LIMITS.velocity[:2], rtol=1e-6)  # a, b at their limit
    np.testing.assert_allclose(x[-1], x[-2], atol=1e-12)  # come to rest

    # the same time sequence and commands with the follower advanced by the nominal DT each step: the targets
    # run ahead of the clock in the early ticks and exceed the limits over the real times
    fixed = JerkLimitedFollower(LIMITS, DT, target_margin=0.0)
    fixed.reset(commands[0])
    old = np.array([fixed.step(command).position for command in commands])
    v_old, a_old = wall_clock_rates(t[:len(commands)], old)
    assert np.any(np.abs(v_old) > 2 * LIMITS.velocity)
    assert np.any(np.abs(a_old) > 2 * LIMITS.acceleration)


def test_each_step_advances_by_the_measured_period_and_clamps_to_velocity_times_it():
    ctl = controller()
    q = np.array([0.0, 0.0, 0.5])
    ctl.command(q + 0.01, 0.0)
    ctl.step(10.0, q)
    assert ctl.last_dt == DT  # first step: nominal
    for now, expected in ((10.012, 0.012), (10.0122, 2e-4), (10.0122, DT), (10.0, DT), (10.004, 0.004),
                          (11.0, ctl.follower.max_dt), (np.nan, DT), (11.003, 0.003)):
        ctl.command(q + 0.01, now if np.isfinite(now) else 11.0)
        out = ctl.step(now, q)
        assert ctl.last_dt == pytest.approx(expected, abs=1e-12), now
        np.testing.assert_allclose(ctl.max_step, LIMITS.velocity * expected, rtol=1e-9)
        assert np.all(np.abs(out.clamp.sent - q) <= ctl.max_step + 1e-12)
        q = out.target
    ctl.estop()
    ctl.reset()
    ctl.command(q, 20.0)
    ctl.step(20.0, q)
    assert ctl.last_dt == DT  # re-seeded: nominal again


def test_clamp_step_is_velocity_times_the_measured_period():
    """A command far away moves by at most velocity * (now - previous now) per step, whatever the period."""
    ctl = controller(ramp_threshold=10.0)  # no ramp: full speed
    q = np.array([0.0, 0.0, 0.5])
    ctl.command(np.array([0.9, 1.9, 1.4]), 0.0)
    out = ctl.step(0.0, q)
    previous, now = out.target, 0.0
    for dt in [0.001, 0.02, 0.0005, 0.012, 0.005] * 20:
        now += dt
        ctl.command(np.array([0.9, 1.9, 1.4]), now)
        out = ctl.step(now, previous)
        assert np.all(np.abs(out.target - previous) <= LIMITS.velocity * dt * (1 + 1e-9))
        previous = out.target


def test_a_state_ruckig_refuses_brakes_the_joint_instead_of_raising():
    """Seen in a CI run: a hand joint at 0.57 rad/s accelerating at 89.5 rad/s^2 (limits 2.5726 rad/s,
    100 rad/s^2, 2000 rad/s^3) cannot stay under its velocity limit (0.57 + 89.5^2 / (2 * 2000) = 2.573), and
    Ruckig's binding raises RuckigError. The follower brakes instead, as for a failed result (it used to let
    the exception through, and the driver latched its e-stop)."""
    limits = JointLimits(lower=np.array([-3.0]), upper=np.array([3.0]), velocity=np.array([2.5726]),
                         acceleration=np.array([100.0]), jerk=np.array([2000.0]))
    f = JerkLimitedFollower(limits, 0.01)
    f.reset(np.array([-0.1168926221726632]))
    f._in.current_velocity = [0.5698124671986224]  # the state Ruckig had reached there
    f._in.current_acceleration = [89.50502852468966]
    state = f.step(np.array([0.1136894777009392]))
    assert f.errors == 1
    assert np.isfinite(state.position).all() and state.acceleration[0] < 89.50502852468966  # braking
    for _ in range(200):  # and it comes back to following the target
        state = f.step(np.array([0.1136894777009392]))
    assert state.position[0] == pytest.approx(0.1136894777009392, abs=1e-6)
    assert abs(state.velocity[0]) <= 2.5726 * 1.001
