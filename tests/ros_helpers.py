"""Helpers shared by the tests that run nodes on real rclpy."""

from __future__ import annotations

import time


def wait_for(pred, timeout: float, period: float = 0.02) -> bool:
    """Poll ``pred()`` every ``period`` [s] until it is true (True) or ``timeout`` [s] passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(period)
    return False
