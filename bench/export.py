"""Export speed of ``episodes export --format lerobot``, against LeRobot's own dataset writer.

    .venv/bin/python bench/export.py [--episodes 2] [--seconds 15]  # about 45 s (first run: + the LeRobot environment)

Episodes: ``--episodes`` physical episodes of ``--seconds`` each, recorded here
without ROS (EpisodeRecorder): the consumer head camera at 640x480 rgb8, 30 Hz (the
synthetic tabletop, with a slid ball, plus sensor-like noise of 2 grey levels
so the encoders work as on a real camera), ``/arms/command`` and
``/hands/command`` at 100 Hz, ``/joint_states`` at 150 Hz. Built before any
timing.

Measured, wall clock, each as a multiple of real time (recorded seconds per
second of export):

* ``ours``: :func:`export_lerobot` with its defaults (episodes in a process
  pool, one per CPU; frames streamed from the bag into PyAV, libx264
  ``veryfast``, CRF 23, key frame every 2 frames);
* ``ours_svtav1``: the same with LeRobot's default codec (libsvtav1 preset 12,
  CRF 30, key frame every 2 frames), where PyAV has it;
* ``lerobot`` (the baseline): in the LeRobot environment
  (``scripts/lerobot_env.sh``), ``LeRobotDataset.create`` then ``add_frame``
  for every frame and ``save_episode`` per episode, with the settings of
  LeRobot's own recorder (4 image-writer threads, its default codec), the
  same frames, states and actions (handed over as raw arrays, so the baseline
  pays neither bag reading nor image decoding).

The last line is one JSON object: ``ours_x_realtime``, ``ours_svtav1_x_realtime``,
``lerobot_x_realtime`` (null with ``lerobot_error`` when the LeRobot environment
cannot be made), ``speedup`` (ours / lerobot; goal >= 5) and
``speedup_same_codec`` (ours_svtav1 / lerobot).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1: errors only (its configuration banner otherwise floods stderr)
WIDTH, HEIGHT, FPS = 640, 480, 30
REPO_ID = "bench/rynn"


def build_episodes(root: Path, n: int, seconds: float, raw: Path) -> list[Path]:
    """Record ``n`` episodes under ``root``; also writes every frame, state and action to ``raw`` (for the baseline)."""
    from rosbags.typesys import Stores, get_typestore

    from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES
    from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder
    from rynn_teleop.sources.camera.synthetic import SyntheticScene

    ts = get_typestore(Stores.ROS2_KILTED)
    js, img = "sensor_msgs/msg/JointState", "sensor_msgs/msg/Image"
    names = list(CANONICAL_JOINT_NAMES)

    def header(stamp: int):
        t = ts.types["builtin_interfaces/msg/Time"](sec=stamp // 10**9, nanosec=stamp % 10**9)
        return ts.types["std_msgs/msg/Header"](stamp=t, frame_id="")

    def joint_state(stamp: int, sel: slice, q: np.ndarray) -> bytes:
        m = ts.types[js](header=header(stamp), name=names[sel], position=q[sel],
                         velocity=np.zeros(0), effort=np.zeros(0))
        return bytes(ts.serialize_cdr(m, js))

    scene = SyntheticScene(WIDTH, HEIGHT, FPS, depth=False)
    rng = np.random.default_rng(0)
    noise = [rng.normal(0, 2.0, (HEIGHT, WIDTH, 3)).astype(np.int16) for _ in range(8)]
    paths = []
    frames_total = int(seconds * FPS) * n
    frames = np.lib.format.open_memmap(raw / "frames.npy", "w+", np.uint8, (frames_total, HEIGHT, WIDTH, 3))
    states = np.zeros((frames_total, 54), np.float32)
    actions = np.zeros((frames_total, 54), np.float32)
    lengths = []
    row = 0
    for e in range(n):
        t0 = (1_700_000_000 + 100 * e) * 10**9
        rates = {"/arms/command": 100.0, "/hands/command": 100.0, "/joint_states": 150.0,
                 "/head_camera/color/image_raw": 30.0}
        rec = EpisodeRecorder(root, rates, gap_rates={"/joint_states": 100.0, "/hands/command": 50.0},
                              queue_max_bytes=4 * 2**30)
        paths.append(rec.start(EpisodeMetadata(task="pick and place", camera_sources=["physical"]), now_ns=t0))

        def q(stamp: int, t0: int = t0) -> np.ndarray:
            return 0.4 * np.sin(1.3 * (stamp - t0) * 1e-9 + np.arange(54) * 0.1)

        msgs = []
        for k in range(int(seconds * 100)):
            s = t0 + k * 10_000_000 + 100_000
            msgs.append((s + 2_000_000, "/arms/command", js, joint_state(s, slice(0, 14), q(s))))
            hand = slice(14, 34) if k % 2 == 0 else slice(34, 54)
            msgs.append((s + 6_000_000, "/hands/command", js, joint_state(s + 5_000_000, hand, q(s + 5_000_000))))
            arm_state = joint_state(s + 2_000_000, slice(0, 14), q(s - 18_000_000))
            msgs.append((s + 3_000_000, "/joint_states", js, arm_state))
            if k % 2:
                hand_state = joint_state(s + 2_000_000, slice(14, 54), q(s - 28_000_000))
                msgs.append((s + 4_000_000, "/joint_states", js, hand_state))
        for t, topic, type_name, data in sorted(msgs, key=lambda m: m[0]):
            rec.submit(topic, type_name, data, t)
        n_frames = int(seconds * FPS)
        for i in range(n_frames):
            stamp = t0 + 40_000_000 + i * 10**9 // FPS
            rgb = np.clip(scene.render(i / FPS).color.astype(np.int16) + noise[i % len(noise)], 0, 255).astype(np.uint8)
            m = ts.types[img](header=header(stamp), height=HEIGHT, width=WIDTH, encoding="rgb8", is_bigendian=0,
                              step=WIDTH * 3, data=rgb.reshape(-1))
            data = bytes(ts.serialize_cdr(m, img))
            rec.submit("/head_camera/color/image_raw", img, data, stamp + 4_000_000)
            frames[row] = rgb
            newest_command = t0 + 100_000 + (stamp - t0 - 100_000) // 10_000_000 * 10_000_000
            states[row] = q(stamp - 20_000_000)
            actions[row] = q(newest_command)
            row += 1
        rec.stop(now_ns=t0 + int(seconds * 1e9) + 15_000_000)
        lengths.append(n_frames)
    frames.flush()
    np.save(raw / "states.npy", states)
    np.save(raw / "actions.npy", actions)
    (raw / "lengths.json").write_text(json.dumps(lengths))
    return paths


def lerobot_baseline(raw: Path, out: Path) -> dict:
    """Runs in the LeRobot environment: write the raw frames with LeRobotDataset.add_frame/save_episode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HOME", str(out.parent / "hf"))
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    frames = np.load(raw / "frames.npy", mmap_mode="r")
    states = np.load(raw / "states.npy")
    actions = np.load(raw / "actions.npy")
    lengths = json.loads((raw / "lengths.json").read_text())
    names = [f"j{i}" for i in range(54)]
    features = {
        "observation.images.consumer": {"dtype": "video", "shape": (HEIGHT, WIDTH, 3),
                                        "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (54,), "names": names},
        "action": {"dtype": "float32", "shape": (54,), "names": names},
    }
    started = time.perf_counter()
    ds = LeRobotDataset.create(REPO_ID, fps=FPS, features=features, root=out, use_videos=True, image_writer_threads=4)
    row = 0
    for n in lengths:
        for _ in range(n):
            ds.add_frame({"observation.images.consumer": np.asarray(frames[row]), "observation.state": states[row],
                          "action": actions[row], "task": "pick and place"})
            row += 1
        ds.save_episode()
    ds.finalize()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "frames": row, "lerobot_version": getattr(lerobot, "__version__", "?"),
            "codec": ds.vcodec if hasattr(ds, "vcodec") else "libsvtav1"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=2, help="episodes (default 2)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each episode [s] (default 15)")
    parser.add_argument("--workers", type=int, default=None, help="export processes (default: one per CPU)")
    # internal: the LeRobot baseline, run in .venv-lerobot
    parser.add_argument("--baseline", nargs=2, metavar=("RAW", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        print(json.dumps(lerobot_baseline(Path(args.baseline[0]), Path(args.baseline[1]))))
        return

    from rynn_teleop.recording.export import export_lerobot
    from rynn_teleop.recording.lerobot import VideoOptions, encoder_available

    tmp = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        raw = tmp / "raw"
        raw.mkdir()
        t = time.perf_counter()
        episodes = build_episodes(tmp / "episodes", args.episodes, args.seconds, raw)
        print(f"built {len(episodes)} episodes of {args.seconds:g} s at {WIDTH}x{HEIGHT} {FPS} Hz in "
              f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
        real_s = args.episodes * int(args.seconds * FPS) / FPS

        report = export_lerobot(episodes, tmp / "ours", REPO_ID, fps=FPS, workers=args.workers)
        if report.skipped:
            raise SystemExit(f"bench episodes failed their check: {report.skipped}")
        ours = report.recorded_seconds / report.seconds
        print(f"ours (libx264): {report.seconds:.2f} s for {report.recorded_seconds:.1f} s -> {ours:.1f}x real time",
              file=sys.stderr)
        ours_av1 = None
        if encoder_available("libsvtav1"):
            r2 = export_lerobot(episodes, tmp / "ours_av1", REPO_ID, fps=FPS, workers=args.workers,
                                video=VideoOptions(codec="libsvtav1", crf=30, gop=2, preset="12"))
            ours_av1 = r2.recorded_seconds / r2.seconds
            print(f"ours (libsvtav1): {r2.seconds:.2f} s -> {ours_av1:.1f}x real time", file=sys.stderr)

        result = {"episodes": args.episodes, "seconds_each": args.seconds, "resolution": f"{WIDTH}x{HEIGHT}",
                  "fps": FPS, "cpus": len(os.sched_getaffinity(0)), "ours_x_realtime": round(ours, 2),
                  "ours_svtav1_x_realtime": None if ours_av1 is None else round(ours_av1, 2),
                  "lerobot_x_realtime": None, "speedup": None, "speedup_same_codec": None}
        env = subprocess.run([str(ROOT / "scripts/lerobot_env.sh")], capture_output=True, text=True)
        if env.returncode != 0:
            result["lerobot_error"] = (env.stderr.strip().splitlines() or ["lerobot_env.sh failed"])[-1]
        else:
            python = env.stdout.strip().splitlines()[-1]
            proc = subprocess.run([python, __file__, "--baseline", str(raw), str(tmp / "lerobot")],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                result["lerobot_error"] = proc.stderr.strip()[-2000:]
            else:
                base = json.loads(proc.stdout.strip().splitlines()[-1])
                lr = real_s / base["seconds"]
                print(f"LeRobot add_frame/save_episode ({base['lerobot_version']}, {base['codec']}): "
                      f"{base['seconds']:.2f} s -> {lr:.2f}x real time", file=sys.stderr)
                result.update(lerobot_x_realtime=round(lr, 2), lerobot_version=base["lerobot_version"],
                              speedup=round(ours / lr, 2),
                              speedup_same_codec=None if ours_av1 is None else round(ours_av1 / lr, 2))
        print(json.dumps(result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
