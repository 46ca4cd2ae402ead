"""Head camera through the feed switch: end-to-end latency and delivered rate on real rclpy.

    .venv/bin/python bench/camera.py [--seconds 20]

Two processes (``rynn-teleop run head_camera`` and ``rynn-teleop run
camera_switch``, as ``ros2 launch`` would start them) publish the synthetic
640x480 RGB scene at 30 Hz and switch it to the consumer topic; this process
subscribes like a consumer (SensorDataQoS) to the output
``/head_camera/color/image_raw`` and, as the named baseline measured in the
same run, to the camera's own ``/head_camera/physical/color/image_raw``
(latency = receive time - capture stamp, both on this machine's clock). The
Fast DDS profile of ``config/fastdds_profile.xml`` (shared memory +
loopback UDP) and the allocator settings of ``nodes.process.tune_allocator`` are
used, as in every process of the stack. Goal: output p99 <= 10 ms.
The last line is one JSON object with ``latency_p50_ms``, ``latency_p99_ms``,
``delivered_hz`` (then extras).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def publish_frames(duration: float) -> None:
    """The camera process: the synthetic scene's frames (rendered ahead) published at 30 Hz,
    each stamped when it is published, on the physical camera topic, SensorDataQoS."""
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from rynn_teleop.nodes.conversions import image_message
    from rynn_teleop.nodes.process import use_transport_profile
    from rynn_teleop.sources.camera import make_camera_source

    use_transport_profile()

    scene = make_camera_source("synthetic", depth=False)
    scene.start(0.0)
    frames = [f.color for f in scene.read(2.0)][:30]  # one second of the scene, looped
    rclpy.init()
    node = rclpy.create_node("camera_bench_publisher")
    pub = node.create_publisher(Image, "/head_camera/physical/color/image_raw", qos_profile_sensor_data)
    start = time.monotonic()
    k = 0
    while rclpy.ok() and time.monotonic() - start < duration:
        target = start + k / 30.0
        time.sleep(max(0.0, target - time.monotonic()))
        msg = image_message(frames[k % len(frames)], "rgb8", node.get_clock().now().to_msg(),
                            "camera_color_optical_frame")
        pub.publish(msg)
        k += 1
    node.destroy_node()
    rclpy.try_shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measurement time [s]")
    parser.add_argument("--publisher", type=float, default=None, help=argparse.SUPPRESS)  # internal: camera process
    parser.add_argument("--transport-only", action="store_true",
                        help="replace head_camera by a publisher of pre-rendered frames stamped at publish time")
    args = parser.parse_args()
    if args.publisher is not None:
        publish_frames(args.publisher)
        return
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(100, 199)))
    from rynn_teleop.nodes.process import use_transport_profile

    use_transport_profile()  # the stack's Fast DDS profile and allocator settings, as in every node process

    import numpy as np
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    # the camera stream and the switch in their own processes, as `ros2 launch` would run them
    if args.transport_only:  # frames rendered ahead and stamped at publish: the transport path alone
        cmd = [sys.executable, str(Path(__file__).resolve()), "--publisher", str(args.seconds + 40.0)]
    else:  # the real camera node (synthetic scene, colour only), stamps = capture times
        cmd = [sys.executable, "-m", "rynn_teleop.cli", "run", "head_camera", "-p", "head_camera.synthetic.depth=false"]
    camera = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    switch = subprocess.Popen(
        [sys.executable, "-m", "rynn_teleop.cli", "run", "camera_switch"],
        env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    rclpy.init()
    node = rclpy.create_node("camera_bench")
    received: dict[str, list[tuple[float, float]]] = {"output": [], "physical": []}

    def keep(name: str):
        def cb(msg: Image) -> None:
            now = time.time()
            received[name].append((now, now - (msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec)))
        return cb

    stages: dict[str, dict[str, str]] = {}  # node -> last diagnostic values (their own latency meters)

    def keep_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            stages[status.name] = {kv.key: kv.value for kv in status.values}

    node.create_subscription(DiagnosticArray, "/diagnostics", keep_diagnostics, 10)
    node.create_subscription(Image, "/head_camera/color/image_raw", keep("output"), qos_profile_sensor_data)
    node.create_subscription(Image, "/head_camera/physical/color/image_raw", keep("physical"), qos_profile_sensor_data)
    from rclpy.executors import SingleThreadedExecutor

    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        # warm-up: both streams flowing (discovery can match one subscription seconds after the other,
        # and a switch whose reader matches late stalled once for ~0.35 s here), then 2 s more
        deadline = time.monotonic() + 30.0
        while not all(received.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not received["output"]:
            raise SystemExit("no frame arrived through the switch")
        time.sleep(2.0)
        for v in received.values():
            v.clear()
        t0 = time.time()
        time.sleep(args.seconds)
        span = time.time() - t0
        executor.shutdown(timeout_sec=2.0)
    finally:
        for proc in (camera, switch):
            proc.send_signal(signal.SIGINT)
        for proc in (camera, switch):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        node.destroy_node()
        rclpy.try_shutdown()

    def stats(name: str) -> dict:
        lat = np.array([latency for _, latency in received[name]]) * 1e3
        return {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                "hz": len(lat) / span, "frames": len(lat)}

    out, phys = stats("output"), stats("physical")
    print(f"{args.seconds:.0f} s, 640x480 rgb8 at 30 Hz, SensorDataQoS, {os.environ['FASTDDS_DEFAULT_PROFILES_FILE']}")
    print(f"{'':36s} {'p50 ms':>8s} {'p99 ms':>8s} {'rate Hz':>8s} {'frames':>7s}")
    for label, s in (("camera -> consumer (through switch)", out), ("camera -> consumer (baseline, direct)", phys)):
        print(f"{label:36s} {s['p50']:8.2f} {s['p99']:8.2f} {s['hz']:8.1f} {s['frames']:7d}")
    print(f"switch overhead at p50: {out['p50'] - phys['p50']:.2f} ms; goal p99 <= 10 ms: "
          f"{'met' if out['p99'] <= 10.0 else 'NOT met'}")
    split = {}  # capture -> publish in head_camera, capture -> arrival in camera_switch (their last 5 s)
    for name, values in stages.items():
        for key in ("color", "output"):
            if f"{key}.latency_p50_ms" in values:
                split[f"{name.split(':')[0].strip()}.{key}"] = {
                    "p50_ms": float(values[f"{key}.latency_p50_ms"]), "p99_ms": float(values[f"{key}.latency_p99_ms"])}
    for label, s in split.items():
        print(f"stage {label:30s} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f}")
    print(json.dumps({
        "latency_p50_ms": round(out["p50"], 3),
        "latency_p99_ms": round(out["p99"], 3),
        "delivered_hz": round(out["hz"], 2),
        "direct_latency_p50_ms": round(phys["p50"], 3),
        "direct_latency_p99_ms": round(phys["p99"], 3),
        "direct_delivered_hz": round(phys["hz"], 2),
        "seconds": args.seconds,
        "stage_split": split,
    }))


if __name__ == "__main__":
    main()
