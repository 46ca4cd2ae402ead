"""Teleoperation with an XR headset: XR frame received -> arm and hand commands, and the headset's feed panel.

    .venv/bin/python bench/xr.py [--seconds 20]      # about 2.5 minutes; needs Debian chromium and playwright

Runs the digital stack as the demo does (one process per bringup group: sim drivers, synthetic camera, the world
model's render backend, the feed switch on the generated feed, the console) three times over, measured:

1. **headset** (``tracker_backend: xr``, ``hand_retarget_backend: xr``): a scripted headset streams XR frames to
   the console's WebSocket at 72 Hz, as the ``/xr`` page does (head, both wrists moving 5 cm at 0.5 Hz, the 25
   joints of IWER's hands curling and opening); it calibrates and engages through the console's API first.
   ``arm_p99_ms``: an XR frame -> the ``/arms/command`` that first solved it (arm_ik's ``command`` meter);
   ``hand_p99_ms``: the same frame -> its ``/hands/command`` (hand_retarget's ``command.<side>`` meters). Both
   run from the frame's stamp, which ``core.xr.FrameClock`` puts at its receipt by the console less the
   receipt's jitter (the fastest delivery of the last 10 s sets the offset): the figures are the receipt's or a
   little more. ``console_p99_ms``: the frame's stamp -> the console published it (its ``xr`` meter: how late
   the console took it). Each is the largest p99 of the 5 s windows the nodes report within the run
   (``bench/stack.py``'s rule); goal: ``arm_p99_ms`` and ``hand_p99_ms`` at most 15 ms. ``arm_p50_ms``,
   ``hand_p50_ms``: the median of the windows' p50.
2. **browser**, on the same stack: headless chromium opens ``/xr?scale=0.5`` with IWER (``tests/vendor/iwer``)
   injected, enters XR and streams instead, its hands moving. ``browser_feed_fps``: frames of the consumer feed
   put on the panel per second (what the headset's panel shows); ``browser_xr_fps``: XR frames per second,
   ``browser_frame_gap_p99_ms`` between them; the latencies again (``browser_*_p99_ms``): the emulated headset
   renders in software on this machine's cores beside the stack, and its frames' times are when the page
   started them, so these include the browser's own delays.
3. **baseline**, in the same run: the same stack and path fed by the synthetic sources (``tracker_backend`` and
   ``hand_retarget_backend`` ``synthetic``, calibrated and engaged on their own, as in the demo):
   ``baseline_arm_p99_ms``, ``baseline_hand_p99_ms``; ``arm_over_baseline_p99`` and ``hand_over_baseline_p99``
   are the headset's over them.

``--phases`` runs some of them. ``load_average_before`` / ``_after``: other work on the machine moves every
figure (the stack's processes take real-time priority where permitted; the bench's own do not).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IWER = ROOT / "tests" / "vendor" / "iwer"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]
LEFT_OUT = ("robot_markers", "recorder", "foxglove")
RATE_HZ = 72.0  # [Hz] the scripted headset's frame rate (Quest's default)
WINDOW_S = 5.0  # [s] the nodes' meters report over their last 5 s (core.stats.RateMeter)
GOAL_MS = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- the stack
def start_stack(backend: str, port: int, out: Path) -> list[subprocess.Popen]:
    """The digital stack with the console; the operator input from ``backend`` (xr or synthetic)."""
    from rynn_teleop import bringup

    nodes = tuple(n for n in bringup.mode_nodes(console=True) if n not in LEFT_OUT)
    overrides = bringup.mode_overrides("digital", camera="generated", tracker_backend=backend,
                                       hand_retarget_backend=backend, world_model_backend="render")
    extra = {"console": {"port": port}, "arm_ik": {"calibration_file": str(out / f"{backend}_calibration.yaml")},
             "head_camera": {"synthetic.depth": False, "synthetic.profile": "320x240x30"},
             "world_model": {"profile": "320x240x30"}, "tracker": {"synthetic.hold_s": 5.0}}
    for node, values in extra.items():
        overrides.setdefault(node, {}).update(values)
    procs = []
    for group in bringup.process_groups(nodes):
        cmd = [sys.executable, "-m", "rynn_teleop.cli", "run", *group]
        for node in group:
            for key, value in overrides.get(node, {}).items():
                cmd += ["-p", f"{node}.{key}={json.dumps(value)}"]
        log = (out / f"{backend}-{'+'.join(group)}.log").open("w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)))
    return procs


def stop_stack(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


class Probe:
    """/diagnostics of the stack, kept with their receive times; and the newest arm command."""

    def __init__(self) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.node import Node

        from rynn_teleop.runner import Composition

        self.comp = Composition([])
        self.node = Node("bench_xr_probe", context=self.comp.context)
        self.lock = threading.Lock()
        self.statuses: list[tuple[float, str, dict]] = []  # (monotonic [s], node, values)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.comp.add_node(self.node)

    def _on_diag(self, msg) -> None:
        now = time.monotonic()
        with self.lock:
            for st in msg.status:
                self.statuses.append((now, st.name, {kv.key: kv.value for kv in st.values}))

    def reset(self) -> None:
        """Forget what the previous stack reported."""
        with self.lock:
            self.statuses.clear()

    def newest(self, node: str) -> dict:
        with self.lock:
            for _, name, values in reversed(self.statuses):
                if name == node:
                    return values
        return {}

    def p99(self, node: str, key: str, since: float, until: float, pick=max) -> float | None:
        """The largest (``pick``) ``key`` [ms] of ``node``'s windows that lie wholly in [since, until] (monotonic
        [s])."""
        with self.lock:
            rows = [v[key] for t, name, v in self.statuses
                    if name == node and key in v and since + WINDOW_S <= t <= until]
        values = [float(r) for r in rows if r not in ("nan", "")]
        return pick(values) if values else None

    def close(self) -> None:
        self.comp.shutdown()


def _wait(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------------- the scripted headset
class ScriptedHeadset:
    """What the /xr page sends, as a script: head still at eye height, wrists in the robot's home posture moving
    5 cm at 0.5 Hz, IWER's hand poses (relaxed <-> pinch) carried by the wrists (WebXR reference space)."""

    HOME = {"left": np.array([-0.19, 1.10, -0.18]), "right": np.array([0.19, 1.10, -0.18])}

    def __init__(self) -> None:
        from scipy.spatial.transform import Rotation

        poses = json.loads((IWER / "hand_poses.json").read_text())
        self.rel = {}  # (pose, side) -> the 25 joints in the wrist joint's frame: positions (25, 3), rotations
        for pose in ("relaxed", "pinch"):
            for side in ("left", "right"):
                j = np.array(poses[pose][side])
                R_w = Rotation.from_quat(j[0, 3:])
                self.rel[pose, side] = (R_w.inv().apply(j[:, :3] - j[0, :3]), R_w.inv() * Rotation.from_quat(j[:, 3:]))
        self.wrist_rot = {side: Rotation.from_euler("z", sign * 90, degrees=True)
                          for side, sign in (("left", 1), ("right", -1))}

    def frame(self, seq: int, t: float, moving: bool) -> dict:
        doc = {"type": "xr_frame", "seq": seq, "t_ms": time.time() * 1e3, "head": [0.0, 1.6, 0.0, 0.0, 0.0, 0.0, 1.0]}
        curl = 0.5 - 0.5 * math.cos(2 * math.pi * 0.25 * t) if moving else 0.0
        for k, side in enumerate(("left", "right")):
            wave = 0.05 * math.sin(2 * math.pi * 0.5 * t + k) if moving else 0.0
            p_w = self.HOME[side] + [0.0, wave, -0.5 * wave]
            R_w = self.wrist_rot[side]
            p_rel = (1 - curl) * self.rel["relaxed", side][0] + curl * self.rel["pinch", side][0]
            positions = p_w + R_w.apply(p_rel)
            quats = (R_w * self.rel["relaxed", side][1]).as_quat()
            doc[side] = [[round(float(v), 5) for v in (*p, *q)] for p, q in zip(positions, quats)]
        return doc


async def _act(session, base: str, secret: str, action: str) -> dict:
    async with session.post(base + "/api/action", json={"action": action},
                            headers={"X-Rynn-Session": secret}) as r:
        return await r.json()


async def stream_headset(base: str, seconds: float, on_moving) -> dict:
    """Calibrate, engage, then stream a moving operator for ``seconds``; returns what the console said."""
    import aiohttp

    headset = ScriptedHeadset()
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/xr") as r:
            secret = re.search(r'name="rynn-session" content="([^"]+)"', await r.text()).group(1)
        async with session.ws_connect(base + "/ws") as ws:
            await ws.send_str(json.dumps({"type": "hello", "session": secret}))
            refused = []

            async def read():
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "xr_refused":
                        refused.append(json.loads(msg.data))

            reader = asyncio.ensure_future(read())
            seq, period = 0, 1.0 / RATE_HZ
            start = next_t = time.monotonic()
            phase = "home"  # home (calibrate, engage) -> moving
            actions = {}
            next_calibration = start + 4.0  # [s, monotonic] DDS discovery (console -> tracker -> arm_ik) first
            while True:
                now = time.monotonic()
                done = "calibrate" in actions and actions["calibrate"].done()
                calibrated = done and actions["calibrate"].result()["ok"]
                if phase == "home" and not calibrated and now >= next_calibration and (
                        "calibrate" not in actions or actions["calibrate"].done()):
                    actions["calibrate"] = asyncio.ensure_future(_act(session, base, secret, "calibrate"))
                    next_calibration = now + 2.0  # a refusal (poses not fresh yet): again
                if calibrated and "engage" not in actions:
                    actions["engage"] = asyncio.ensure_future(_act(session, base, secret, "engage"))
                if phase == "home" and "engage" in actions and actions["engage"].done():
                    phase, moving_since = "moving", now
                    on_moving()
                if phase == "moving" and now - moving_since > seconds:
                    break
                if now - start > seconds + 60:
                    raise RuntimeError(f"the headset could not calibrate and engage: {actions}")
                doc = headset.frame(seq, now - start, phase == "moving")
                doc["t_ms"] = time.time() * 1e3  # as the page does: the frame's time, then it is sent
                await ws.send_str(json.dumps(doc))
                seq += 1
                next_t += period
                await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            reader.cancel()
    return {"frames": seq, "refused": refused,
            "calibrate": actions["calibrate"].result(), "engage": actions["engage"].result()}


def run_headset(base: str, seconds: float, on_moving) -> dict:
    """:func:`stream_headset` in a process of its own (this one's threads would delay its frames); ``on_moving``
    is called when its operator starts moving."""
    child = subprocess.Popen([sys.executable, __file__, "--headset-child", base, str(seconds)], stdout=subprocess.PIPE,
                             text=True)
    said = None
    for line in child.stdout:
        if line.strip() == "moving":
            on_moving()
        elif line.startswith("{"):
            said = json.loads(line)
    if child.wait() != 0 or said is None:
        raise RuntimeError("the scripted headset failed")
    return said


# ---------------------------------------------------------------------- the browser
SCRIPT_HANDS = """
(() => { const t = performance.now() / 1000;
  for (const [side, sign] of [["left", -1], ["right", 1]]) {
    const h = xrDevice.hands[side];
    h.position.set(sign * 0.2, 1.25 + 0.05 * Math.sin(3.1 * t + sign), -0.3);
    h.updatePinchValue(0.5 - 0.5 * Math.cos(1.6 * t));
  } })()
"""


def browser_phase(base: str, seconds: float, on_start) -> dict:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        page.add_init_script(path=str(IWER / "iwer.min.js"))
        page.add_init_script(script="""
          const device = new IWER.XRDevice(IWER.metaQuest3, { stereoEnabled: false });
          device.installRuntime({ forceInstall: true });
          device.primaryInputMode = "hand";
          device.position.set(0, 1.6, 0);
          window.xrDevice = device;""")
        page.goto(base + "/xr?scale=0.5")
        page.wait_for_function("!document.getElementById('enter').disabled && rynnXR.state !== null", timeout=60_000)
        page.click("#enter")
        page.wait_for_function("rynnXR.inXR && rynnXR.sent > 10 && rynnXR.feed.frames > 2", timeout=60_000)
        on_start()
        first = page.evaluate("[rynnXR.xrFrames, rynnXR.feed.frames, rynnXR.sent, rynnXR.skipped, performance.now()]")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            page.evaluate(SCRIPT_HANDS)
            time.sleep(0.05)
        last = page.evaluate("[rynnXR.xrFrames, rynnXR.feed.frames, rynnXR.sent, rynnXR.skipped, performance.now()]")
        gaps = page.evaluate("rynnXR.gaps")
        browser.close()
    dt = (last[4] - first[4]) / 1000.0
    return {"browser_xr_fps": round((last[0] - first[0]) / dt, 1),
            "browser_feed_fps": round((last[1] - first[1]) / dt, 1), "browser_frames_skipped": last[3] - first[3],
            "browser_frame_gap_p99_ms": round(float(np.percentile(gaps, 99)), 1) if gaps else None}


# ---------------------------------------------------------------------- main
def measure_latency(probe: Probe, since: float, until: float) -> dict:
    hands = [probe.p99("hand_retarget", f"command.{s}.latency_p99_ms", since, until) for s in ("left", "right")]
    hands = [h for h in hands if h is not None]
    median = statistics.median
    hands50 = [probe.p99("hand_retarget", f"command.{s}.latency_p50_ms", since, until, median)
               for s in ("left", "right")]
    hands50 = [h for h in hands50 if h is not None]
    return {"arm_p99_ms": probe.p99("arm_ik", "command.latency_p99_ms", since, until),
            "hand_p99_ms": max(hands) if hands else None,
            "console_p99_ms": probe.p99("console", "xr.latency_p99_ms", since, until),
            # the median over the windows of each window's p50
            "arm_p50_ms": probe.p99("arm_ik", "command.latency_p50_ms", since, until, median),
            "hand_p50_ms": max(hands50) if hands50 else None}


class _Skip(Exception):
    """A phase not asked for."""


def _round(value):
    return None if value is None else round(value, 2)


def headset_child(base: str, seconds: float) -> int:
    """The scripted headset's process: says "moving" when it starts moving, then its result as one JSON line."""
    said = asyncio.run(stream_headset(base, seconds, lambda: print("moving", flush=True)))
    print(json.dumps(said), flush=True)
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--headset-child":
        return headset_child(sys.argv[2], float(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time of each phase [s]")
    parser.add_argument("--phases", default="headset,browser,baseline",
                        help="which of headset, browser, baseline to run (comma-separated)")
    args = parser.parse_args()
    phases = set(args.phases.split(","))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    out = Path(tempfile.mkdtemp(prefix="bench_xr_"))
    result: dict = {"seconds": args.seconds, "goal_ms": GOAL_MS, "headset_rate_hz": RATE_HZ}
    probe = Probe()
    try:
        # 1. the scripted headset, then 2. the browser, on one stack
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        load_before = os.getloadavg()[0]
        procs = start_stack("xr", port, out)
        try:
            if not _wait(lambda: probe.newest("console") and probe.newest("arm_ik").get("started") == "True", 120.0):
                raise RuntimeError(f"the xr stack did not come up; logs in {out}")
            marks: dict[str, float] = {}
            said = run_headset(base, args.seconds, lambda: marks.setdefault("moving", time.monotonic()))
            headset_end = time.monotonic()
            result |= {k: _round(v) for k, v in measure_latency(probe, marks["moving"], headset_end).items()}
            result["headset_frames"] = said["frames"]
            result["headset_refused"] = [m["reason"] for m in said["refused"]]
            result["calibration"] = said["calibrate"]["message"]
            if "browser" in phases and (shutil.which("chromium") or shutil.which("chromium-browser")):
                browser = browser_phase(base, args.seconds, lambda: marks.setdefault("browser", time.monotonic()))
                latency = measure_latency(probe, marks["browser"], time.monotonic())
                result |= browser | {f"browser_{k}": _round(v) for k, v in latency.items()}
        finally:
            stop_stack(procs)
        # 3. the baseline: the same path fed by the synthetic sources
        time.sleep(3.0)  # the last diagnostics of the stack before
        probe.reset()
        port = _free_port()
        procs = start_stack("synthetic", port, out) if "baseline" in phases else []
        try:
            if not procs:
                raise _Skip
            if not _wait(lambda: probe.newest("arm_ik").get("engaged") == "True", 120.0):
                raise RuntimeError(f"the synthetic stack did not engage; logs in {out}")
            start = time.monotonic()
            time.sleep(args.seconds + WINDOW_S)
            baseline = measure_latency(probe, start, time.monotonic())
            result |= {f"baseline_{k}": _round(v) for k, v in baseline.items()}
        except _Skip:
            pass
        finally:
            stop_stack(procs)
    finally:
        probe.close()
    for key in ("arm", "hand"):
        xr, base_ = result.get(f"{key}_p99_ms"), result.get(f"baseline_{key}_p99_ms")
        result[f"{key}_over_baseline_p99"] = round(xr / base_, 2) if xr and base_ else None
    result["within_goal"] = all((result.get(k) or math.inf) <= GOAL_MS for k in ("arm_p99_ms", "hand_p99_ms"))
    result["load_average_before"] = round(load_before, 2)  # other work on this machine skews every figure
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    result["logs"] = str(out)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
