"""The operator console in a browser: frames per second and latency of 640x480 feeds, and the console's CPU.

    .venv/bin/python bench/console.py [--seconds 20]      # about 40 s; needs Debian chromium and playwright

Runs, each in its own process as a launch file would: ``head_camera`` (synthetic scene, 640x480 at 30 Hz,
colour only) with ``camera_switch`` on the physical source (so the consumer feed is 640x480 at 30 Hz too),
a bare publisher of 640x480 frames at 30 Hz on the generated topic, and the ``console`` node; then a headless
chromium (Playwright) opens the page and shows all three feeds for ``--seconds``. Measured:

* ``browser_fps``: frames drawn per second in the page, per feed (goal: at least 25 for 640x480);
* ``added_latency_p50_ms`` / ``added_latency_p99_ms``: the console node receiving a ROS message -> the page
  has decoded and drawn it, consumer feed (goal: at most 50 ms);
* ``end_to_end_p99_ms``: capture stamp -> drawn, consumer feed;
* the baseline, in the same run: ``transport_p50_ms`` / ``transport_p99_ms``, capture stamp -> a bare rclpy
  subscriber receiving the same consumer messages, and ``end_to_end_over_transport_p99``;
* ``console_cpu_cores``: the console process's CPU over the window (utime + stime, in cores).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def generated_publisher(seconds: float) -> None:
    """A bare publisher of 640x480 rgb8 frames on the generated topic at 30 Hz, stamped at publish."""
    import array

    import numpy as np
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from rynn_teleop.nodes.process import use_transport_profile

    use_transport_profile()
    rclpy.init()
    node = rclpy.create_node("bench_generated")
    pub = node.create_publisher(Image, "/head_camera/generated/color/image_raw", qos_profile_sensor_data)
    rng = np.random.default_rng(0)
    frames = [array.array("B", rng.integers(0, 255, (480, 640, 3), dtype=np.uint8).tobytes()) for _ in range(4)]
    msg = Image(height=480, width=640, encoding="rgb8", step=640 * 3)
    msg.header.frame_id = "camera_color_optical_frame"
    end, k = time.monotonic() + seconds, 0
    next_t = time.monotonic()
    while time.monotonic() < end:
        next_t += 1.0 / 30.0
        time.sleep(max(0.0, next_t - time.monotonic()))
        msg.data = frames[k % len(frames)]
        msg.header.stamp = node.get_clock().now().to_msg()
        pub.publish(msg)
        k += 1
    node.destroy_node()
    rclpy.try_shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="measurement window [s]")
    parser.add_argument("--generated-publisher", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if args.generated_publisher is not None:
        generated_publisher(args.generated_publisher)
        return
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(150, 199)))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    import numpy as np
    import rclpy
    from playwright.sync_api import sync_playwright
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from rynn_teleop.demo import stop_groups
    from rynn_teleop.nodes.process import use_transport_profile

    use_transport_profile()
    port = _free_port()
    run = [sys.executable, "-m", "rynn_teleop.cli", "run"]
    procs = {
        "camera": subprocess.Popen(run + ["head_camera", "camera_switch", "-p", "head_camera.synthetic.depth=false",
                                          "-p", "camera_switch.active_source=physical"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL),
        "generated": subprocess.Popen([sys.executable, __file__, "--generated-publisher", str(args.seconds + 60.0)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "console": subprocess.Popen(run + ["console", "-p", f"console.port={port}"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL),
    }
    rclpy.init()
    node = rclpy.create_node("console_bench")
    transport: list[float] = []

    def on_image(msg: Image) -> None:
        transport.append(time.time() - (msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec))

    node.create_subscription(Image, "/head_camera/color/image_raw", on_image, qos_profile_sensor_data)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            deadline = time.monotonic() + 60.0
            while True:
                try:
                    page.goto(f"http://127.0.0.1:{port}/")
                    break
                except Exception:  # the console is still starting
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            drawn = "() => Object.fromEntries(Object.entries(window.consoleStats).map(([k, v]) => [k, v.length]))"
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline and not all(page.evaluate(drawn).values()):
                time.sleep(0.5)
            time.sleep(3.0)  # warm-up
            page.evaluate("() => { for (const k in window.consoleStats) window.consoleStats[k].length = 0; }")
            transport.clear()
            cpu0, t0 = cpu_seconds(procs["console"].pid), time.monotonic()
            time.sleep(args.seconds)
            cpu1, span = cpu_seconds(procs["console"].pid), time.monotonic() - t0
            stats = page.evaluate("() => window.consoleStats")
            shots = Path(tempfile.gettempdir()) / "rynn_console_bench.png"
            page.screenshot(path=str(shots))
            browser.close()
    finally:
        executor.shutdown(timeout_sec=2.0)
        stop_groups(list(procs.values()))
        node.destroy_node()
        rclpy.try_shutdown()

    def pct(values, q):
        return round(float(np.percentile(values, q)), 2) if len(values) else None

    consumer = stats["consumer"]
    added = [f["drawn_ms"] - f["received_ms"] for f in consumer]
    end_to_end = [f["drawn_ms"] - f["stamp_ns"] * 1e-6 for f in consumer]
    transport_ms = [1e3 * t for t in transport]
    fps = {k: round(len(v) / span, 1) for k, v in stats.items()}
    result = {
        "browser_fps": fps,
        "added_latency_p50_ms": pct(added, 50), "added_latency_p99_ms": pct(added, 99),
        "end_to_end_p50_ms": pct(end_to_end, 50), "end_to_end_p99_ms": pct(end_to_end, 99),
        "transport_p50_ms": pct(transport_ms, 50), "transport_p99_ms": pct(transport_ms, 99),
        "end_to_end_over_transport_p99": round(pct(end_to_end, 99) / pct(transport_ms, 99), 2)
        if transport_ms and end_to_end else None,
        "console_cpu_cores": round((cpu1 - cpu0) / span, 3),
        "goals_met": bool(min(fps.values()) >= 25.0 and (pct(added, 99) or 1e9) <= 50.0),
        "frame_size": "640x480", "seconds": args.seconds, "screenshot": str(shots),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
