"""The operator console in a real browser (headless Debian chromium driven by Playwright) against a running
digital stack (``rynn-teleop demo --interactive``): video moves, e-stop and reset by click and by key reach the
drivers, the feed toggles, an episode is recorded with its task and outcome label."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from ros_helpers import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from rynn_teleop.core.robot_model import arm_joint_names
from rynn_teleop.core.session import DRIVERS
from rynn_teleop.core.status import DriverStatus
from rynn_teleop.runner import Composition

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements/dev.txt)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install chromium "
                                "(scripts/bootstrap.sh does it when run as root)")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]
ARM = list(arm_joint_names("left"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Watcher(Node):
    """What the stack does, seen from ROS: drivers' e-stop, measured arm joints, the active feed."""

    def __init__(self, context) -> None:
        super().__init__("console_test_watcher", context=context)
        self.lock = threading.Lock()
        self.estop: dict[str, bool] = {}  # driver -> e-stop latched (its typed status)
        self.values: dict[str, dict[str, str]] = {}  # node -> its newest diagnostics values
        self.arm: list[tuple[float, np.ndarray]] = []
        self.sources: list[str] = []
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.create_subscription(JointState, "/joint_states", self._on_joints, 100)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.create_subscription(String, "/head_camera/active_source", lambda m: self.sources.append(m.data), latched)

    def _on_diag(self, msg) -> None:
        with self.lock:
            for st in msg.status:
                values = {kv.key: kv.value for kv in st.values}
                self.values[st.name] = values
                if st.name in DRIVERS:
                    self.estop[st.name] = DriverStatus.decode(values).estop

    def _on_joints(self, msg) -> None:
        if list(msg.name[:7]) == ARM:
            with self.lock:
                self.arm.append((time.monotonic(), np.array(msg.position[:7])))
                del self.arm[:-400]

    def values_of(self, node: str) -> dict[str, str]:
        """``node``'s newest diagnostics values (empty before its first report)."""
        with self.lock:
            return dict(self.values.get(node, {}))

    def latched(self) -> bool:
        with self.lock:
            return self.estop.get("arm_driver") is True and self.estop.get("hand_driver") is True

    def released(self) -> bool:
        with self.lock:
            return self.estop.get("arm_driver") is False and self.estop.get("hand_driver") is False

    def arm_motion(self, seconds: float) -> float:
        """Largest change of a measured arm joint over the last ``seconds`` [rad]."""
        with self.lock:
            recent = [q for t, q in self.arm if t >= time.monotonic() - seconds]
        return float(np.ptp(np.array(recent), axis=0).max()) if len(recent) > 1 else float("nan")


@pytest.fixture(scope="module")
def console(module_ros_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("console")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rynn_teleop.cli", "demo", "--interactive", "--port", str(port),
                             "--out", str(out), "--duration", "600"], env=module_ros_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = None
    deadline = time.monotonic() + 120.0
    lines = []
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("console: "):
            url = line.split()[1]
            break
    if url is None:
        proc.kill()
        pytest.fail("the interactive demo did not print the console's address:\n" + "".join(lines[-40:]))
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its output
    comp = Composition([], domain_id=int(module_ros_env["ROS_DOMAIN_ID"]))
    watcher = Watcher(comp.context)
    comp.add_node(watcher)
    try:
        yield url, out, watcher
    finally:
        comp.shutdown()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def page(console):
    url, _, _ = console
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(url)
        yield page
        browser.close()


def _shown(page) -> str:
    """What the page shows of the session (for failure messages)."""
    return " | ".join(f"{i}: {page.inner_text('#' + i)!r}" for i in ("connection", "estop-state", "episode-state",
                                                                       "message", "browser-stats"))


def _seq(page) -> int:
    return int(page.get_attribute("#view-consumer", "data-seq") or 0)


def test_the_page_shows_moving_frames(page):
    assert wait_for(lambda: _seq(page) > 0, 60.0), "no frame drawn"
    canvas = page.locator("#view-consumer")
    first = canvas.screenshot()
    seq = _seq(page)
    assert wait_for(lambda: _seq(page) > seq + 10, 30.0)
    second = canvas.screenshot()
    assert first != second  # the robot moved (the synthetic operator never stops)


def test_estop_by_click_and_by_space_and_reset(page, console):
    _, _, watcher = console
    assert wait_for(watcher.released, 60.0)
    assert wait_for(lambda: watcher.arm_motion(1.0) > 1e-3, 60.0), "the arms never moved"
    page.click("#estop")
    assert wait_for(watcher.latched, 20.0)
    assert wait_for(lambda: page.get_attribute("#estop-state", "data-latched") == "true", 20.0), _shown(page)
    time.sleep(0.5)
    assert watcher.arm_motion(0.5) < 1e-6  # no more motion
    page.click("#reset")
    assert wait_for(watcher.released, 20.0)
    page.click("body", position={"x": 1500, "y": 950})  # focus outside the text fields
    page.keyboard.press("Space")
    assert wait_for(watcher.latched, 20.0)
    page.keyboard.press("r")
    assert wait_for(watcher.released, 20.0)


def test_the_toggle_changes_the_active_source(page, console):
    _, _, watcher = console
    assert wait_for(lambda: watcher.sources, 30.0)
    before = watcher.sources[-1]
    page.click("[data-action='feed toggle']")
    assert wait_for(lambda: watcher.sources[-1] != before, 20.0)
    page.keyboard.press("t")
    assert wait_for(lambda: watcher.sources[-1] == before, 20.0)


def test_an_episode_keeps_its_task_and_outcome(page, console):
    _, out, _ = console
    page.fill("#task", "pick the red cube")
    page.fill("#operator", "ada")
    page.click("#start")
    assert wait_for(lambda: page.inner_text("#episode-state") == "recording", 30.0), _shown(page)
    time.sleep(2.0)
    page.select_option("#outcome", "failure")
    page.fill("#notes", "dropped it")
    page.click("#stop")
    assert wait_for(lambda: page.inner_text("#episode-state") == "idle", 30.0), _shown(page)
    episodes = sorted(Path(out).glob("episode_*/episode.yaml"))
    assert episodes, f"no episode under {out}"
    doc = yaml.safe_load(episodes[-1].read_text())
    assert (doc["state"], doc["task"], doc["operator"], doc["outcome"], doc["notes"]) == (
        "complete", "pick the red cube", "ada", "failure", "dropped it")
    assert os.path.isfile(episodes[-1].parent / "metadata.yaml")
