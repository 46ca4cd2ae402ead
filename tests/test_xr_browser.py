"""Teleoperation with an XR headset (issue 30), in a real browser: headless Debian chromium (Playwright) opens the
console's ``/xr`` page with IWER (Meta's WebXR emulation runtime, ``tests/vendor/iwer``) injected, against a
running digital stack whose tracker and hand_retarget nodes take the ``xr`` backends. Scripted head and hand
poses: calibrating and engaging from the in-headset panel, the arms following the emulated wrists (the commands
arrive at the IK solution of the emulated pose), the hands following the emulated finger curl, a lost hand
holding its arm and hand (and no jump when it is back), a second headset refused, and the in-headset e-stop
latching the drivers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseArray
from rclpy.node import Node
from ros_helpers import wait_for
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import JointState
from test_console_browser import BROWSER_ARGS, CHROMIUM, playwright

from rynn_teleop import bringup
from rynn_teleop.core.arm_ik import ArmIK
from rynn_teleop.core.calibration import Calibration
from rynn_teleop.core.robot_model import RobotModel, arm_joint_names, hand_joint_names
from rynn_teleop.core.xr import XR_TO_WORLD
from rynn_teleop.runner import Composition

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install chromium")
IWER = Path(__file__).parent / "vendor" / "iwer" / "iwer.min.js"
SCREENSHOT = Path(os.environ.get("RYNN_XR_SCREENSHOT", "/tmp/notes/30-xr.png"))
LEFT_OUT = ("robot_markers", "recorder", "foxglove")  # not needed here: CPU for the rest
#: [s] freshness of an operator pose (arm_ik, tracker): the emulated headset renders in software (chromium's
#: SwiftShader) beside the stack on a shared 2-core machine and streams 10-30 frames per second, with gaps; a real
#: headset streams 72-120 (the defaults, 0.1 s and 0.05 s, are for those)
SLOW_BROWSER_TIMEOUT_S = 1.0
XR_PAGE_QUERY = "?scale=0.5"  # the headset's views at half resolution: cheaper software rendering
HEAD = np.array([0.0, 1.6, 0.0])  # [m] the emulated head, WebXR reference space (y up, -z forward)
# the operator's home posture, WebXR: shoulders 0.19 m out, 0.20 m below and 0.09 m behind the eyes (core.xr's
# body model), wrists 0.27 m in front of and 0.30 m below them, palms facing each other, fingers forward
HOME_WRIST = {"left": np.array([-0.19, 1.10, -0.18]), "right": np.array([0.19, 1.10, -0.18])}
HOME_ROTATION = {side: Rotation.from_euler("z", sign * 90, degrees=True) for side, sign in (("left", 1), ("right", -1))}
ARM = {s: list(arm_joint_names(s)) for s in ("left", "right")}
HAND = {s: list(hand_joint_names(s)) for s in ("left", "right")}
INSTALL_IWER = """
  const device = new IWER.XRDevice(IWER.metaQuest3, { stereoEnabled: false });
  device.installRuntime({ forceInstall: true });  // over chromium's own (empty) WebXR
  device.primaryInputMode = "hand";
  device.position.set(0, 1.6, 0);
  window.xrDevice = device;
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack_overrides(port: int, out: Path) -> dict:
    """The digital mode with the headset as the operator input (what ``run --mode digital --console
    --tracker-backend xr --hand-retarget-backend xr`` sets), images at 320x240 like the demo's."""
    overrides = bringup.mode_overrides("digital", camera="generated", tracker_backend="xr", hand_retarget_backend="xr",
                                       world_model_backend="render")
    extra = {"console": {"port": port},
             "arm_ik": {"calibration_file": str(out / "arm_calibration.yaml"),  # never the lab's own
                        "stale_timeout_s": SLOW_BROWSER_TIMEOUT_S},
             "tracker": {"dropout_timeout_s": SLOW_BROWSER_TIMEOUT_S, "max_lag_s": SLOW_BROWSER_TIMEOUT_S},
             "head_camera": {"synthetic.depth": False, "synthetic.profile": "320x240x30"},
             "world_model": {"profile": "320x240x30"}}
    for node, values in extra.items():
        overrides.setdefault(node, {}).update(values)
    return overrides


def start_stack(env: dict, port: int, out: Path) -> list[subprocess.Popen]:
    """One composed-runner process per group of the bringup (as the demo runs it), logs in ``out``."""
    nodes = tuple(n for n in bringup.mode_nodes(console=True) if n not in LEFT_OUT)
    overrides = stack_overrides(port, out)
    procs = []
    for group in bringup.process_groups(nodes):
        cmd = [sys.executable, "-m", "rynn_teleop.cli", "run", *group]
        for node in group:
            for key, value in overrides.get(node, {}).items():
                cmd += ["-p", f"{node}.{key}={json.dumps(value)}"]
        log = (out / f"{'+'.join(group)}.log").open("w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def stop_stack(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


class Watcher(Node):
    """The stack seen from ROS: arm and hand commands, the drivers' e-stop."""

    def __init__(self, context) -> None:
        super().__init__("xr_test_watcher", context=context)
        self.lock = threading.Lock()
        self.arms: list[tuple[float, np.ndarray]] = []  # (receive time [s, monotonic], 14 positions)
        self.hands: dict[str, list[tuple[float, np.ndarray]]] = {"left": [], "right": []}
        self.values: dict[str, dict[str, str]] = {}
        self.measured: list[tuple[float, np.ndarray]] = []  # (receive time, 14 measured arm positions)
        self.create_subscription(JointState, "/arms/command", self._on_arms, 100)
        self.create_subscription(JointState, "/joint_states", self._on_joint_states, 100)
        self.create_subscription(JointState, "/hands/command", self._on_hands, 100)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.heads: list[tuple[float, np.ndarray]] = []  # (receive time, head position in xr_world) of /xr/poses
        self.create_subscription(PoseArray, "/xr/poses", self._on_xr_poses, 100)

    def _on_xr_poses(self, msg) -> None:
        p = msg.poses[0].position
        with self.lock:
            self.heads.append((time.monotonic(), np.array([p.x, p.y, p.z])))
            del self.heads[:-2000]

    def heads_since(self, t: float) -> np.ndarray:
        with self.lock:
            return np.array([h for s, h in self.heads if s >= t]).reshape(-1, 3)

    def _on_arms(self, msg) -> None:
        with self.lock:
            self.arms.append((time.monotonic(), np.array(msg.position)))
            del self.arms[:-2000]

    def _on_joint_states(self, msg) -> None:
        index = {n: i for i, n in enumerate(msg.name)}
        if all(n in index for n in ARM["left"] + ARM["right"]):
            q = np.array([msg.position[index[n]] for n in ARM["left"] + ARM["right"]])
            with self.lock:
                self.measured.append((time.monotonic(), q))
                del self.measured[:-2000]

    def measured_since(self, t: float) -> np.ndarray:
        with self.lock:
            return np.array([q for s, q in self.measured if s >= t])

    def _on_hands(self, msg) -> None:
        side = "left" if msg.name[0].startswith("left") else "right"
        with self.lock:
            self.hands[side].append((time.monotonic(), np.array(msg.position)))
            del self.hands[side][:-2000]

    def _on_diag(self, msg) -> None:
        with self.lock:
            for st in msg.status:
                self.values[st.name] = {kv.key: kv.value for kv in st.values}

    def arm(self, side: str) -> np.ndarray | None:
        """The newest commanded positions of one arm (7) [rad]."""
        with self.lock:
            if not self.arms:
                return None
            q = self.arms[-1][1]
        return q[:7] if side == "left" else q[7:]

    def arm_since(self, t: float) -> np.ndarray:
        with self.lock:
            return np.array([q for s, q in self.arms if s >= t])

    def hand_since(self, side: str, t: float) -> np.ndarray:
        with self.lock:
            return np.array([q for s, q in self.hands[side] if s >= t])

    def latched(self) -> bool:
        with self.lock:
            return all(self.values.get(d, {}).get("estop") == "True" for d in ("arm_driver", "hand_driver"))


@pytest.fixture(scope="module")
def stack(module_ros_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("xr_stack")
    port = _free_port()
    procs = start_stack(module_ros_env, port, out)
    comp = Composition([], domain_id=int(module_ros_env["ROS_DOMAIN_ID"]))
    watcher = Watcher(comp.context)
    comp.add_node(watcher)
    try:
        ready = wait_for(lambda: watcher.arm("left") is not None and "console" in watcher.values, 120.0)
        if not ready:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(out.glob("*.log")))
            pytest.fail(f"the stack did not come up (arm commands, console):\n{logs}")
        yield f"http://127.0.0.1:{port}/xr{XR_PAGE_QUERY}", out, watcher
    finally:
        comp.shutdown()
        stop_stack(procs)


class Headset:
    """The emulated headset in the page: IWER's device, its hands placed by their wrist joints."""

    def __init__(self, page) -> None:
        self.page = page
        self.offset: dict[str, tuple[Rotation, np.ndarray]] = {}  # side -> wrist joint in the hand input's frame

    def hand_pose(self, side: str) -> tuple[Rotation, np.ndarray]:
        h = self.page.evaluate(f"""(() => {{ const h = xrDevice.hands.{side};
            return [h.position.x, h.position.y, h.position.z, h.quaternion.x, h.quaternion.y, h.quaternion.z,
                    h.quaternion.w]; }})()""")
        return Rotation.from_quat(h[3:]), np.array(h[:3])

    def set_hand(self, side: str, rotation: Rotation, position: np.ndarray) -> None:
        q, p = rotation.as_quat(), position
        self.page.evaluate(f"""(() => {{ const h = xrDevice.hands.{side};
            h.position.set({p[0]}, {p[1]}, {p[2]}); h.quaternion.set({q[0]}, {q[1]}, {q[2]}, {q[3]}); }})()""")

    def wrist(self, side: str) -> tuple[Rotation, np.ndarray]:
        """The wrist joint as the page last saw it."""
        j = self.page.evaluate(f"rynnXR.wrists.{side}")
        return Rotation.from_quat(j[3:]), np.array(j[:3])

    def learn_offsets(self) -> None:
        """The wrist joint's pose in each hand input's frame (IWER's hand model), from one seen frame."""
        for side in ("left", "right"):
            R_h, p_h = self.hand_pose(side)
            R_w, p_w = self.wrist(side)
            self.offset[side] = (R_h.inv() * R_w, R_h.inv().apply(p_w - p_h))

    def place_wrist(self, side: str, position: np.ndarray, rotation: Rotation | None = None) -> None:
        """Move the hand so that its wrist joint is at ``position`` [m] with ``rotation`` (WebXR space)."""
        R_o, p_o = self.offset[side]
        rotation = HOME_ROTATION[side] if rotation is None else rotation
        R_h = rotation * R_o.inv()
        self.set_hand(side, R_h, np.asarray(position) - R_h.apply(p_o))

    def glide_wrist(self, side: str, position: np.ndarray, seconds: float = 0.8) -> None:
        """Move the wrist to ``position`` along a straight line in ``seconds`` (a hand's motion, not a jump)."""
        _, start = self.wrist(side)
        for s in np.linspace(0.0, 1.0, 11)[1:]:
            self.place_wrist(side, start + s * (np.asarray(position) - start))
            time.sleep(seconds / 10)

    def tip(self, side: str) -> np.ndarray:
        return np.array(self.page.evaluate(f"rynnXR.tips.{side}"))

    def poke(self, side: str, action: str) -> None:
        """Touch a button of the panel with ``side``'s index fingertip: from 3 cm in front, then onto it."""
        button = self.page.evaluate(f"rynnXR.buttons[{json.dumps(action)}]")
        center, normal = np.array(button["center"]), np.array(button["normal"])
        R_h, p_h = self.hand_pose(side)
        tip_offset = self.tip(side) - p_h  # at this orientation
        pressed = len(self.page.evaluate("rynnXR.pressed"))
        for target in (center + 0.03 * normal, center - 0.002 * normal):
            self.set_hand(side, R_h, target - tip_offset)
            time.sleep(0.4)
        assert wait_for(lambda: len(self.page.evaluate("rynnXR.pressed")) > pressed, 5.0), f"{action} not pressed"
        self.set_hand(side, R_h, center + 0.05 * normal - tip_offset)  # off the button

    def home(self) -> None:
        for side in ("left", "right"):
            self.place_wrist(side, HOME_WRIST[side])


@pytest.fixture(scope="module")
def headset(stack):
    url, _, _ = stack
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.add_init_script(path=str(IWER))
        page.add_init_script(script=INSTALL_IWER)
        page.goto(url)
        page.wait_for_function("!document.getElementById('enter').disabled && window.rynnXR.state !== null",
                               timeout=60_000)
        page.click("#enter")
        page.wait_for_function("rynnXR.inXR && rynnXR.sent > 10 && rynnXR.wrists.left && rynnXR.wrists.right",
                               timeout=30_000)
        device = Headset(page)
        device.learn_offsets()
        device.home()
        yield device
        browser.close()


def _state(page) -> dict:
    return page.evaluate("rynnXR.state")


def test_calibrate_and_engage_from_the_headset(headset, stack):
    page = headset.page
    _, out, watcher = stack
    assert wait_for(lambda: (_state(page).get("xr") or {}).get("streaming"), 20.0), _state(page).get("xr")
    headset.poke("right", "calibrate")  # a countdown: the hand goes back to the posture meanwhile
    headset.home()
    assert wait_for(lambda: all(a["calibrated"] for a in _state(page)["arms"].values()), 30.0), _state(page)["arms"]
    assert (out / "arm_calibration.yaml").exists()
    headset.poke("left", "engage")
    headset.home()
    assert wait_for(lambda: all(a["engaged"] for a in _state(page)["arms"].values()), 30.0), page.evaluate(
        "document.getElementById('message').textContent")


def _stale_events(watcher: Watcher, side: str) -> int:
    with watcher.lock:
        return int(watcher.values.get("arm_ik", {}).get(f"{side}.stale_events", -1))


def test_the_arms_follow_the_emulated_wrists_to_the_ik_solution(headset, stack):
    _, out, watcher = stack
    robot = RobotModel.default()
    ik = ArmIK(robot, "right")
    calibration = Calibration.load(out / "arm_calibration.yaml")
    delta_xr = np.array([0.06, 0.08, -0.05])  # right, up, forward [m] (WebXR)
    # the clutch: the target moves as the mapped wrist does, s R (C delta), its orientation unchanged
    delta = calibration.scale * calibration.rotation @ (XR_TO_WORLD @ delta_xr)
    tries = []
    for _ in range(4):  # a browser stall longer than the freshness timeout re-anchors the arm: try again
        headset.glide_wrist("right", HOME_WRIST["right"])
        time.sleep(2.5)  # settled at the anchor (and the diagnostics published)
        stale_before = _stale_events(watcher, "right")
        q0 = watcher.arm("right")
        T0 = ik.forward(q0)
        target = T0.copy()
        target[:3, 3] += delta
        t_move = time.monotonic()
        headset.glide_wrist("right", HOME_WRIST["right"] + delta_xr)
        errors = []
        for _ in range(8):
            time.sleep(0.5)
            errors.append(np.linalg.norm(ik.forward(watcher.arm("right"))[:3, 3] - target[:3, 3]))
        time.sleep(1.2)  # the diagnostics of the motion
        gaps = headset.page.evaluate("rynnXR.gaps.slice(-100)")
        tries.append((errors[-1], _stale_events(watcher, "right") - stale_before, max(gaps)))
        if _stale_events(watcher, "right") == stale_before:
            break
    else:
        pytest.skip(f"the emulated headset stalled longer than {SLOW_BROWSER_TIMEOUT_S} s in every try (a loaded "
                    f"machine): (error [m], stale events, largest frame gap [ms]) {tries}")
    q1 = watcher.arm("right")
    final = ik.forward(q1)
    assert errors[-1] < 0.01, tries  # the hand arrived at the emulated wrist's target [m]
    assert errors[0] > errors[-1] and np.linalg.norm(delta) > 0.05
    angle = np.arccos(np.clip((np.trace(final[:3, :3].T @ target[:3, :3]) - 1) / 2, -1, 1))
    assert angle < 0.05, angle  # [rad]
    solution = ik.solve(target, q1)  # the IK solution of the emulated pose nearest to where the command went
    assert solution.position_error < 1e-3
    assert np.abs(q1 - solution.q).max() < 0.03 and np.abs(q0 - solution.q).max() > 0.05
    assert len(watcher.arm_since(t_move)) > 100  # commands kept flowing at the control rate
    headset.glide_wrist("right", HOME_WRIST["right"])


def test_the_hands_follow_the_emulated_finger_curl(headset, stack):
    _, _, watcher = stack
    page = headset.page
    curl = [HAND["left"].index(f"left_finger{f}_joint{j}") for f in (3, 4, 5) for j in (1, 3, 4)]
    time.sleep(1.0)
    t = time.monotonic()
    time.sleep(1.0)
    open_hand = watcher.hand_since("left", t)[:, curl].mean(axis=0)
    page.evaluate("xrDevice.hands.left.poseId = 'point'")  # middle, ring and pinky curl into the palm

    def latest(t: float) -> np.ndarray | None:
        """The mean of the newest five commands [rad] of the nine joints received since ``t`` (None: fewer)."""
        q = watcher.hand_since("left", t)
        return q[-5:, curl].mean(axis=0) if len(q) >= 5 else None

    # functional waits: the curl reaches the hand at its limited speed, later on a loaded machine
    t = time.monotonic()
    assert wait_for(lambda: (q := latest(t)) is not None and (q - open_hand).sum() > 1.0, 10.0), (
        open_hand, latest(t))  # flexed [rad], over the nine joints
    page.evaluate("xrDevice.hands.left.poseId = 'default'")
    t = time.monotonic()
    assert wait_for(lambda: (q := latest(t)) is not None and np.abs(q - open_hand).max() < 0.1, 10.0), (
        open_hand, latest(t))  # open again


def test_lost_tracking_holds_the_arm_and_the_hand_and_resumes_without_a_jump(headset, stack):
    _, _, watcher = stack
    page = headset.page
    ik = ArmIK(RobotModel.default(), "right")
    time.sleep(2.0)
    page.evaluate("xrDevice.hands.right.connected = false")  # the headset loses the right hand
    assert wait_for(lambda: page.evaluate("rynnXR.tips.right") is None, 5.0)
    time.sleep(SLOW_BROWSER_TIMEOUT_S + 1.0)  # stale, then braked to a stop
    held = watcher.arm("right")
    t = time.monotonic()
    headset.place_wrist("right", HOME_WRIST["right"] + [0.0, 0.12, 0.0])  # moves while unseen
    time.sleep(1.5)
    still = watcher.arm_since(t)[:, 7:]
    assert np.abs(still - held).max() < 1e-4  # held
    hand_commands = watcher.hand_since("right", t)
    assert len(hand_commands) == 0 or np.ptp(hand_commands, axis=0).max() < 1e-6  # the hand holds too
    assert len(watcher.hand_since("left", t)) > 5  # the other hand goes on
    page.evaluate("xrDevice.hands.right.connected = true")  # back, 12 cm higher
    assert wait_for(lambda: page.evaluate("rynnXR.tips.right") is not None, 5.0)
    time.sleep(1.5)
    # re-anchored where it is seen again: the hand stays where it held (only the elbow's swivel may settle)
    assert np.linalg.norm(ik.forward(watcher.arm("right"))[:3, 3] - ik.forward(held)[:3, 3]) < 0.01
    # the next motion (12 cm) is followed again, relative to it; a functional wait: the arm gets there at its
    # limited speed, later on a loaded machine. A browser stall longer than the freshness timeout mid-glide
    # re-anchors the arm (the rest of that glide is not followed, by design): then glide back and try again.
    tries = []
    for k in range(4):
        stale_before, before = _stale_events(watcher, "right"), ik.forward(watcher.arm("right"))[:3, 3]
        headset.glide_wrist("right", HOME_WRIST["right"] + ([0.0, 0.0, 0.0], [0.0, 0.12, 0.0])[k % 2])
        if wait_for(lambda b=before: np.linalg.norm(ik.forward(watcher.arm("right"))[:3, 3] - b) > 0.05, 10.0):
            break
        time.sleep(1.2)  # the diagnostics of the motion
        tries.append(_stale_events(watcher, "right") - stale_before)
        assert tries[-1] > 0, tries  # not followed, and no stall to explain it
    else:
        pytest.skip(f"the emulated headset stalled longer than {SLOW_BROWSER_TIMEOUT_S} s in every try (a loaded "
                    f"machine): stale events per try {tries}")


def test_a_second_headset_is_refused_and_disturbs_nothing(headset, stack):
    import aiohttp

    url, _, watcher = stack
    page = headset.page
    base = url.rsplit("/", 1)[0]
    secret = page.evaluate("document.querySelector('meta[name=\"rynn-session\"]').content")
    frames_before = _state(page)["xr"]["frames"]

    async def second_headset():
        async with aiohttp.ClientSession() as session, session.ws_connect(base + "/ws") as ws:
            await ws.send_str(json.dumps({"type": "hello", "session": secret}))
            t = time.time() * 1e3
            hand = [[0.3, 1.0, -0.4, 0.0, 0.0, 0.0, 1.0]] * 25
            for k in range(30):
                await ws.send_str(json.dumps({"type": "xr_frame", "seq": k, "t_ms": t + 14 * k,
                                              "head": [0.5, 1.7, 0.3, 0, 0, 0, 1], "left": hand, "right": hand}))
                await asyncio.sleep(0.014)
            while True:
                msg = await asyncio.wait_for(ws.receive(), 5.0)
                if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "xr_refused":
                    return json.loads(msg.data)

    t = time.monotonic()
    result: list = []  # run on a thread of its own: Playwright's sync API runs an event loop on this one
    thread = threading.Thread(target=lambda: result.append(asyncio.run(second_headset())))
    thread.start()
    thread.join(30.0)
    refused = result[0]
    assert refused["reason"] == "busy" and "another headset" in refused["message"]
    time.sleep(1.0)
    state = _state(page)
    assert state["xr"]["refused"]["busy"] >= 30 and state["xr"]["frames"] > frames_before  # the first goes on
    assert all(a["engaged"] for a in state["arms"].values())  # still engaged, still this headset's
    heads = watcher.heads_since(t)  # what reached ROS meanwhile: only the first headset's head (0, 0, 1.6)
    assert len(heads) > 0 and np.abs(heads - XR_TO_WORLD @ HEAD).max() < 1e-4, heads


def test_the_screenshot_of_the_emulated_headset_view(headset, stack):
    page = headset.page
    headset.glide_wrist("left", HOME_WRIST["left"] + [0.04, 0.10, -0.08])
    headset.glide_wrist("right", HOME_WRIST["right"] + [-0.04, 0.06, -0.10])
    q = Rotation.from_euler("x", -12, degrees=True).as_quat()  # the operator looks a little down at the hands
    page.evaluate(f"xrDevice.quaternion.set({q[0]}, {q[1]}, {q[2]}, {q[3]})")
    time.sleep(2.0)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.locator("#view").screenshot(path=str(SCREENSHOT))  # the page's XR canvas: what the headset shows
    page.evaluate("xrDevice.quaternion.set(0, 0, 0, 1)")
    assert SCREENSHOT.stat().st_size > 10_000
    assert page.evaluate("rynnXR.feed.frames") > 10  # the feed panel showed the stack's frames
    headset.glide_wrist("left", HOME_WRIST["left"])
    headset.glide_wrist("right", HOME_WRIST["right"])


def test_the_in_headset_estop_latches_the_drivers(headset, stack):
    _, _, watcher = stack
    page = headset.page
    assert not watcher.latched()
    headset.poke("left", "estop")
    assert wait_for(watcher.latched, 20.0), watcher.values.get("arm_driver")
    assert wait_for(lambda: _state(page)["estop_latched"] is True, 10.0)
    time.sleep(0.5)
    t = time.monotonic()
    headset.place_wrist("right", HOME_WRIST["right"] + [0.0, 0.1, -0.1])
    time.sleep(1.0)
    assert wait_for(lambda: len(watcher.measured_since(t)) > 10, 20.0)  # a loaded machine delivers late
    measured = watcher.measured_since(t)
    # the robot does not follow while latched (the wrist moved 14 cm; a physics twin's settling is micro-radians)
    assert len(measured) > 10 and np.ptp(measured, axis=0).max() < 1e-3
