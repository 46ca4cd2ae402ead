"""The WUJI backend's own holds (start-up and e-stop) stay within the joint limits (hardware.wuji).

A hand resting with a finger past its limit (``left_finger1_joint1`` measured 0.0 rad, lower limit 0.0475 rad)
is held at the limit, not at the raw measurement, and the clip is logged; against the SDK stand-in of
``tests/test_wuji.py``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from test_wuji import FakeSdk

from rynn_teleop.core.robot_model import RobotModel, hand_joint_names
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.hardware.wuji import WujiBackend

NAMES = hand_joint_names("left") + hand_joint_names("right")


def limits() -> tuple[np.ndarray, np.ndarray]:
    robot = RobotModel.default()
    found = robot.limits[robot.indices(list(NAMES))]
    return np.asarray(found.lower, float), np.asarray(found.upper, float)


def test_a_joint_measured_below_its_limit_is_held_at_the_limit_from_the_first_target(caplog):
    sdk = FakeSdk()
    backend = WujiBackend(sdk=sdk, voltage_period_s=60.0)
    backend.connect()
    try:
        left = sdk.hand("left")
        left.actual[0, 0] = 0.0  # finger1_joint1 (thumb, proximal): lower limit 0.0475 rad
        left.actual[4, 3] = 9.0  # far past an upper limit
        lower, upper = limits()
        assert lower[0] == pytest.approx(0.0475)
        with caplog.at_level(logging.WARNING, logger="rynn_teleop.hardware.wuji"):
            backend.enable()
        targets = left.targets()
        assert len(targets) == 2  # before and after switching on: both clamped
        for target in targets:
            assert target[0, 0] == lower[0] and target[4, 3] == upper[19]
            assert (target.reshape(20) >= lower[:20]).all() and (target.reshape(20) <= upper[:20]).all()
            inside = np.ones(20, bool)
            inside[[0, 19]] = False
            np.testing.assert_array_equal(target.reshape(20)[inside], left.actual.reshape(20)[inside])
        assert "left_finger1_joint1 +0.0000 -> +0.0475 rad" in caplog.text
        left.calls.clear()
        backend.stop()  # the e-stop holds the measured position: within the limits too
        (held,) = left.targets()
        assert held[0, 0] == lower[0]
    finally:
        backend.close()


def test_limits_are_taken_from_the_driver_and_checked():
    lower, upper = limits()
    backend = WujiBackend(sdk=FakeSdk(), position_limits=(lower + 0.01, upper))
    np.testing.assert_array_equal(backend._lower, lower + 0.01)
    with pytest.raises(ConfigurationError, match="position_limits"):
        WujiBackend(sdk=FakeSdk(), position_limits=(lower[:3], upper[:3]))
    with pytest.raises(ConfigurationError, match="lower <= upper"):
        WujiBackend(sdk=FakeSdk(), position_limits=(upper, lower))
