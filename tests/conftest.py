"""Test-session hygiene for every test that starts rclpy.

* DDS discovery stays on loopback (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST);
  a run without it refuses to start rather than multicast on the network.
* Each test that needs ROS gets its own ROS_DOMAIN_ID (fixture
  ``ros_domain_id``), so contexts of different tests never see each other.
* ROS logs go to a temporary folder, removed when the session ends.
* Processes keep the scheduling they were started with (RYNN_TELEOP_REALTIME=off): a test never raises
  its own or its children's priority; tests/test_priority.py sets it on in child processes it checks.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile

import pytest

if os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "LOCALHOST":
    raise pytest.UsageError(
        "set ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST (and a ROS_DOMAIN_ID) before running the tests; "
        "scripts/test.sh does this"
    )
if "ROS_LOG_DIR" not in os.environ:
    os.environ["ROS_LOG_DIR"] = tempfile.mkdtemp(prefix="rynn_teleop_roslog_")
    atexit.register(shutil.rmtree, os.environ["ROS_LOG_DIR"], True)
os.environ["RYNN_TELEOP_REALTIME"] = "off"

_BASE_DOMAIN = int(os.environ.get("ROS_DOMAIN_ID", "42"))
_domains = itertools.count(1)


def _new_domain() -> int:
    return (_BASE_DOMAIN + next(_domains)) % 200 + 1


def _env(domain: int) -> dict[str, str]:
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(domain)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    return env


@pytest.fixture
def ros_domain_id() -> int:
    """A ROS domain id no other test of this session uses (Fast DDS allows 0-232)."""
    return _new_domain()


@pytest.fixture
def ros_env(ros_domain_id: int) -> dict[str, str]:
    """Environment for a subprocess that starts rclpy, on its own domain."""
    return _env(ros_domain_id)


@pytest.fixture(scope="module")
def module_ros_env() -> dict[str, str]:
    """Like ``ros_env``, shared by a module's tests (one expensive run checked by several tests)."""
    return _env(_new_domain())


@pytest.fixture(scope="session")
def lerobot_python() -> str:
    """The python of the LeRobot environment (scripts/lerobot_env.sh creates it on first use; $RYNN_LEROBOT_PYTHON
    overrides it): skips when the package registry cannot be reached to create it, fails when creating it fails."""
    import subprocess
    from pathlib import Path

    given = os.environ.get("RYNN_LEROBOT_PYTHON")
    if given:
        return given
    script = Path(__file__).resolve().parents[1] / "scripts/lerobot_env.sh"
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=3600)
    if proc.returncode == 3:
        pytest.skip(f"LeRobot environment cannot be created here: {proc.stderr.strip().splitlines()[-1]}")
    if proc.returncode != 0:
        pytest.fail(f"scripts/lerobot_env.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]
