"""WujiBackend against a stand-in of ``wujihandpy`` (never the real ``Hand``: it checks firmware over the network).

The stand-in mirrors the installed SDK's surface (``Hand(side=...)`` /
``Hand(serial_number=...)``, ``disable_thread_safe_check``,
``write_joint_enabled``, ``read_input_voltage``, ``realtime_controller(
enable_upstream, filter)`` returning a context manager with
``get_joint_actual_position``, ``get_joint_actual_effort`` and
``set_joint_target_position``, ``filter.LowPass(cutoff_freq)``) and records
every call, so the tests assert on what reaches the hand and in which units
and shapes.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rynn_teleop.core.robot_model import hand_joint_names
from rynn_teleop.errors import ConfigurationError, HardwareUnavailableError
from rynn_teleop.hardware.wuji import WujiBackend, from_sdk, to_sdk


# ---------------------------------------------------------------------- the stand-in SDK
class FakeLowPass:
    def __init__(self, cutoff_freq: float = 10.0) -> None:
        self.cutoff_freq = cutoff_freq


class FakeController:
    def __init__(self, hand: FakeHand, enable_upstream: bool, filter: FakeLowPass) -> None:
        self.hand = hand
        self.enable_upstream = enable_upstream
        self.filter = filter

    def __enter__(self) -> FakeController:
        self.hand.calls.append(("enter",))
        return self

    def __exit__(self, *exc) -> None:
        self.hand.calls.append(("exit",))
        self.hand.controller = None

    def get_joint_actual_position(self) -> np.ndarray:
        return self.hand.actual.copy()

    def get_joint_actual_effort(self) -> np.ndarray:
        if self.hand.effort_error is not None:
            raise self.hand.effort_error
        return self.hand.effort.copy()

    def set_joint_target_position(self, value_array: np.ndarray) -> None:
        assert isinstance(value_array, np.ndarray) and value_array.shape == (5, 4)
        assert value_array.dtype == np.float64
        self.hand.calls.append(("set", value_array.copy()))


class FakeHand:
    """Records calls; ``actual``, ``effort``, ``voltage`` and the ``*_error`` fields steer it."""

    def __init__(self, sdk: FakeSdk, serial_number: str | None = None, *, side: str | None = None) -> None:
        if sdk.open_error is not None:
            raise sdk.open_error
        self.sdk = sdk
        self.serial_number = serial_number
        self.side = side
        base = 0.0 if side == "left" else 1.0
        self.actual = base + 0.01 * np.arange(20, dtype=float).reshape(5, 4)
        self.effort = -0.05 * np.arange(20, dtype=float).reshape(5, 4) - base
        self.voltage = 24.0
        self.calls: list[tuple] = []
        self.probes = 0
        self.thread_check_disabled = False
        self.probe_error: Exception | None = None
        self.enable_error: Exception | None = None
        self.effort_error: Exception | None = None
        self.controller: FakeController | None = None
        sdk.hands.append(self)

    def disable_thread_safe_check(self) -> None:
        self.thread_check_disabled = True

    def write_joint_enabled(self, value: bool, timeout: float = 0.5) -> None:
        self.calls.append(("enabled", value))
        if self.enable_error is not None:
            raise self.enable_error

    def read_input_voltage(self, timeout: float = 0.5) -> np.float32:
        self.probes += 1
        if self.probe_error is not None:
            raise self.probe_error
        return np.float32(self.voltage)

    def realtime_controller(self, enable_upstream: bool, filter: FakeLowPass) -> FakeController:
        if self.sdk.controller_error is not None:
            raise self.sdk.controller_error
        self.controller = FakeController(self, enable_upstream, filter)
        return self.controller

    # helpers for the assertions
    def targets(self) -> list[np.ndarray]:
        return [c[1] for c in self.calls if c[0] == "set"]

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeSdk:
    """Module-like: ``Hand``, ``filter.LowPass``; every hand it opened is in ``hands``."""

    def __init__(self) -> None:
        self.hands: list[FakeHand] = []
        self.open_error: Exception | None = None
        self.controller_error: Exception | None = None
        self.filter = SimpleNamespace(LowPass=FakeLowPass)

    def Hand(self, serial_number: str | None = None, *, side: str | None = None) -> FakeHand:
        return FakeHand(self, serial_number, side=side)

    def hand(self, side: str) -> FakeHand:
        return next(h for h in self.hands if h.side == side)


@pytest.fixture
def sdk() -> FakeSdk:
    return FakeSdk()


@pytest.fixture
def backend(sdk: FakeSdk):
    b = WujiBackend(sdk=sdk, voltage_period_s=60.0)  # the probe thread stays idle: tests call probe_connection()
    b.connect()
    yield b
    b.close()


def _wait_for(predicate, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


# ---------------------------------------------------------------------- layout
def test_index_convention_flat_to_finger_joint():
    for f in range(1, 6):
        for j in range(1, 5):
            flat = (f - 1) * 4 + (j - 1)
            x = np.zeros(20)
            x[flat] = 1.0
            a = to_sdk(x)
            assert a.shape == (5, 4) and a[f - 1, j - 1] == 1.0 and a.sum() == 1.0
            assert from_sdk(a)[flat] == 1.0
            assert hand_joint_names("left")[flat] == f"left_finger{f}_joint{j}"


finite = st.floats(-10.0, 10.0, allow_nan=False)


@given(arrays(np.float64, 20, elements=finite))
def test_to_sdk_from_sdk_round_trip(x):
    a = to_sdk(x)
    assert a.shape == (5, 4) and a.dtype == np.float64 and a.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(from_sdk(a), x)


@given(arrays(np.float64, (5, 4), elements=finite))
def test_from_sdk_to_sdk_round_trip(a):
    np.testing.assert_array_equal(to_sdk(from_sdk(a)), a)


def test_layout_functions_copy_and_reject_bad_shapes():
    x = np.arange(20, dtype=float)
    a = to_sdk(x)
    a[0, 0] = 99.0
    assert x[0] == 0.0
    with pytest.raises(ConfigurationError, match="20"):
        to_sdk(np.zeros(19))
    with pytest.raises(ConfigurationError, match=r"\(5, 4\)"):
        from_sdk(np.zeros((4, 5)))


# ---------------------------------------------------------------------- construction
def test_joint_names_are_canonical_per_side_in_order(sdk):
    assert WujiBackend(sdk=sdk).joint_names == hand_joint_names("left") + hand_joint_names("right")
    assert WujiBackend(sides=("right", "left"), sdk=sdk).joint_names == hand_joint_names("right") + hand_joint_names(
        "left"
    )
    assert WujiBackend(sides=["right"], sdk=sdk).joint_names == hand_joint_names("right")
    assert WujiBackend.name == "wuji"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sides": ()},
        {"sides": ("left", "left")},
        {"sides": ("up",)},
        {"sides": ("left",), "serial_numbers": {"right": "SN"}},
        {"serial_numbers": {"left": 7}},
        {"filter_cutoff_hz": 0.0},
        {"filter_cutoff_hz": float("nan")},
        {"voltage_period_s": -1.0},
        {"voltage_period_s": float("inf")},
    ],
)
def test_bad_arguments_fail_at_construction(sdk, kwargs):
    with pytest.raises(ConfigurationError):
        WujiBackend(sdk=sdk, **kwargs)


# ---------------------------------------------------------------------- connect
def test_connect_opens_by_side_or_serial_and_enters_the_filtered_realtime_controller(sdk):
    b = WujiBackend(serial_numbers={"left": "", "right": "3A0F"}, filter_cutoff_hz=7.5, sdk=sdk, voltage_period_s=60)
    b.connect()
    try:
        left, right = sdk.hands
        assert (left.side, left.serial_number) == ("left", None)
        assert (right.side, right.serial_number) == (None, "3A0F")
        for hand in (left, right):
            assert hand.thread_check_disabled  # the probe thread calls the SDK too
            assert hand.controller is not None and hand.controller.enable_upstream is True
            assert isinstance(hand.controller.filter, FakeLowPass)
            assert hand.controller.filter.cutoff_freq == 7.5
            assert hand.names() == ["enter"]  # nothing enabled or moved by connect()
        assert b.connected and b.probing
        b.connect()  # already connected: no second hand
        assert len(sdk.hands) == 2
    finally:
        b.close()


def test_import_failure_names_wujihandpy(monkeypatch):
    monkeypatch.setitem(sys.modules, "wujihandpy", None)  # import raises ImportError
    b = WujiBackend()
    with pytest.raises(HardwareUnavailableError, match="wujihandpy") as info:
        b.connect()
    assert "pip install wujihandpy" in str(info.value)
    assert not b.connected and not b.probing


def test_hand_that_cannot_be_opened_is_named_with_the_cause_and_the_udev_hint(sdk):
    sdk.open_error = ConnectionError("No device found with VID 0x0483 PID 0x2000")
    with pytest.raises(HardwareUnavailableError) as info:
        WujiBackend(sdk=sdk).connect()
    msg = str(info.value)
    assert "left hand" in msg and "side='left'" in msg
    assert "ConnectionError: No device found" in msg
    assert "udev" in msg and "0483" in msg
    assert isinstance(info.value.__cause__, ConnectionError)

    with pytest.raises(HardwareUnavailableError, match=r"right hand \(serial SN9\).*serial_number='SN9'"):
        WujiBackend(sides=("right",), serial_numbers={"right": "SN9"}, sdk=sdk).connect()


def test_second_hand_failing_releases_the_first(sdk):
    b = WujiBackend(sdk=sdk)
    real_hand = sdk.Hand

    def hand(serial_number=None, *, side=None):
        if side == "right":
            raise ConnectionError("side reversed")
        return real_hand(serial_number, side=side)

    sdk.Hand = hand
    with pytest.raises(HardwareUnavailableError, match="right hand.*side reversed"):
        b.connect()
    (left,) = sdk.hands
    assert left.names() == ["enter", "exit"]
    assert not b.connected and not b.probing


def test_realtime_controller_failure_is_hardware_unavailable(sdk):
    sdk.controller_error = TimeoutError("SDO timeout")
    with pytest.raises(HardwareUnavailableError, match="left hand.*realtime controller.*SDO timeout"):
        WujiBackend(sdk=sdk).connect()


def test_calls_before_connect_are_refused_clearly(sdk):
    b = WujiBackend(sdk=sdk)
    with pytest.raises(HardwareUnavailableError, match="connect"):
        b.read(0.0)
    with pytest.raises(HardwareUnavailableError, match="connect"):
        b.write(np.zeros(40))
    with pytest.raises(HardwareUnavailableError, match="connect"):
        b.enable()
    b.stop()
    b.disable()
    b.close()
    assert b.faults() == [] and b.status()["left.connected"] is False


# ---------------------------------------------------------------------- read
def test_read_flattens_each_hand_in_canonical_order(backend, sdk):
    left, right = sdk.hand("left"), sdk.hand("right")
    left.actual[1, 2] = 0.777  # index finger (finger2), joint3
    reading = backend.read(12.5)
    names = backend.joint_names
    assert reading.position.shape == (40,)
    assert reading.position[names.index("left_finger2_joint3")] == 0.777
    np.testing.assert_array_equal(reading.position[:20], left.actual.reshape(20))
    np.testing.assert_array_equal(reading.position[20:], right.actual.reshape(20))
    np.testing.assert_array_equal(reading.effort[:20], left.effort.reshape(20))  # [A]
    np.testing.assert_array_equal(reading.effort[20:], right.effort.reshape(20))
    assert reading.velocity is None
    assert reading.stamp == 12.5
    status = backend.status()
    assert status["left.max_abs_effort_a"] == pytest.approx(0.95)
    assert status["right.max_abs_effort_a"] == pytest.approx(1.95)


def test_effort_missing_on_old_firmware_is_nan_for_that_hand_and_none_for_all(backend, sdk):
    sdk.hand("left").effort_error = RuntimeError("Effort feedback requires firmware version >= 1.2.0")
    reading = backend.read(0.0)
    assert np.all(np.isnan(reading.effort[:20])) and np.all(np.isfinite(reading.effort[20:]))
    assert "firmware" in backend.status()["left.effort"]
    sdk.hand("right").effort_error = RuntimeError("Effort feedback requires firmware version >= 1.2.0")
    assert backend.read(0.0).effort is None
    assert backend.read(0.0).position.shape == (40,)


# ---------------------------------------------------------------------- enable / write
def test_enable_holds_the_measured_position(backend, sdk):
    backend.enable()
    for k, hand in enumerate(sdk.hands):
        names = hand.names()
        assert names == ["enter", "set", "enabled", "set"]  # target at the measurement, on, again
        assert ("enabled", True) in hand.calls
        lower, upper = (v[20 * k:20 * (k + 1)].reshape(5, 4) for v in (backend._lower, backend._upper))
        for target in hand.targets():  # within the limits (tests/test_wuji_hold.py: a joint measured outside)
            np.testing.assert_array_equal(target, np.clip(hand.actual, lower, upper))
    assert backend.status()["accepting_writes"] is True


def test_write_sends_each_hand_a_5x4_array(backend, sdk):
    backend.enable()
    q = np.linspace(-0.3, 1.2, 40)
    backend.write(q)
    left, right = sdk.hand("left"), sdk.hand("right")
    np.testing.assert_array_equal(left.targets()[-1], q[:20].reshape(5, 4))
    np.testing.assert_array_equal(right.targets()[-1], q[20:].reshape(5, 4))
    assert left.targets()[-1][1, 2] == q[backend.joint_names.index("left_finger2_joint3")]
    with pytest.raises(ConfigurationError, match="40"):
        backend.write(np.zeros(20))
    bad = q.copy()
    bad[3] = np.nan
    with pytest.raises(ConfigurationError):
        backend.write(bad)


def test_write_before_enable_is_refused_and_counted(backend, sdk):
    backend.write(np.zeros(40))
    assert all(h.targets() == [] for h in sdk.hands)
    assert backend.status()["refused_writes"] == 1


def test_one_hand_only(sdk):
    b = WujiBackend(sides=("right",), sdk=sdk, voltage_period_s=60)
    b.connect()
    try:
        b.enable()
        b.write(np.full(20, 0.1))
        (hand,) = sdk.hands
        assert hand.side == "right"
        np.testing.assert_array_equal(hand.targets()[-1], np.full((5, 4), 0.1))
        assert b.read(0.0).position.shape == (20,)
    finally:
        b.close()


def test_enable_failure_raises_names_the_hand_and_keeps_writes_refused(backend, sdk):
    sdk.hand("right").enable_error = ConnectionError("USB transfer failed")
    with pytest.raises(HardwareUnavailableError, match="right hand.*USB transfer failed"):
        backend.enable()
    assert backend.faults() == ["right hand disconnected: ConnectionError: USB transfer failed"]
    backend.write(np.zeros(40))
    assert backend.status()["refused_writes"] == 1


# ---------------------------------------------------------------------- stop / disable / close
def test_stop_holds_the_measured_position_and_refuses_writes_until_enable(backend, sdk):
    backend.enable()
    backend.write(np.full(40, 0.5))
    left = sdk.hand("left")
    left.actual = np.full((5, 4), 0.3)  # where the fingers are when the stop comes
    backend.stop()
    np.testing.assert_array_equal(left.targets()[-1], left.actual)
    assert ("enabled", False) not in left.calls  # held, not dropped
    n = len(left.targets())
    backend.write(np.full(40, 0.9))
    backend.stop()  # repeatedly: fine, holds again
    assert len(left.targets()) == n + 1
    np.testing.assert_array_equal(left.targets()[-1], left.actual)
    assert backend.status()["refused_writes"] == 1 and backend.status()["accepting_writes"] is False
    backend.enable()
    backend.write(np.full(40, 0.9))
    np.testing.assert_array_equal(left.targets()[-1], np.full((5, 4), 0.9))


def test_disable_switches_the_joints_off_and_refuses_writes(backend, sdk):
    backend.enable()
    backend.disable()
    for hand in sdk.hands:
        assert hand.calls[-1] == ("enabled", False)
    backend.write(np.zeros(40))
    assert backend.status()["refused_writes"] == 1
    sdk.hand("left").enable_error = ConnectionError("gone")
    with pytest.raises(HardwareUnavailableError, match="left hand.*gone"):
        backend.disable()
    assert sdk.hand("right").calls[-1] == ("enabled", False)  # the other hand was still tried


def test_close_disables_before_leaving_the_realtime_controller_and_is_idempotent(sdk):
    b = WujiBackend(sdk=sdk, voltage_period_s=0.01)
    b.connect()
    b.enable()
    assert _wait_for(lambda: all(h.probes >= 2 for h in sdk.hands))
    thread = b._probe_thread
    b.close()
    assert not b.probing and not thread.is_alive() and not b.connected
    for hand in sdk.hands:
        assert hand.names()[-2:] == ["enabled", "exit"] and hand.calls[-2] == ("enabled", False)
    calls = [list(h.calls) for h in sdk.hands]
    probes = [h.probes for h in sdk.hands]
    b.close()
    time.sleep(0.05)
    assert [h.calls for h in sdk.hands] == calls and [h.probes for h in sdk.hands] == probes
    with pytest.raises(HardwareUnavailableError):
        b.read(0.0)


def test_close_with_an_unplugged_hand_still_releases_everything(backend, sdk):
    sdk.hand("left").enable_error = ConnectionError("gone")
    backend.close()  # logs, never raises
    for hand in sdk.hands:
        assert hand.names()[-1] == "exit"
    assert not backend.connected


def test_context_manager_closes(sdk):
    with WujiBackend(sdk=sdk, voltage_period_s=60) as b:
        b.connect()
    assert not b.connected and all(h.names()[-1] == "exit" for h in sdk.hands)


# ---------------------------------------------------------------------- disconnect detection
def test_probe_reports_a_disconnect_and_the_recovery(backend, sdk):
    health = backend.probe_connection()
    assert health["left"].connected and health["left"].input_voltage == pytest.approx(24.0)
    assert backend.faults() == []

    sdk.hand("left").probe_error = ConnectionError("USB device disconnected")
    health = backend.probe_connection()
    assert not health["left"].connected and health["right"].connected
    assert backend.faults() == ["left hand disconnected: ConnectionError: USB device disconnected"]
    status = backend.status()
    assert status["left.connected"] is False and status["right.connected"] is True
    assert status["left.input_voltage_v"] == pytest.approx(24.0)  # last good probe

    sdk.hand("left").probe_error = TimeoutError("SDO timeout")  # any exception counts
    backend.probe_connection()
    assert backend.faults() == ["left hand disconnected: TimeoutError: SDO timeout"]

    sdk.hand("left").probe_error = None
    sdk.hand("left").voltage = 23.5
    health = backend.probe_connection()
    assert health["left"].connected and health["left"].error is None
    assert backend.faults() == []
    assert backend.status()["left.input_voltage_v"] == pytest.approx(23.5)


def test_probe_thread_detects_a_disconnect_without_blocking_read(sdk):
    b = WujiBackend(sdk=sdk, voltage_period_s=0.01)
    b.connect()
    try:
        sdk.hand("right").probe_error = ConnectionError("USB device disconnected")
        assert _wait_for(lambda: b.faults() == ["right hand disconnected: ConnectionError: USB device disconnected"])
        assert b.read(0.0).position.shape == (40,)  # the realtime cache still answers
        sdk.hand("right").probe_error = None
        assert _wait_for(lambda: b.faults() == [])
    finally:
        b.close()
    assert not b.probing
