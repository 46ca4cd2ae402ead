"""World model speed: render backend FPS, tiny diffusion FPS on CPU, paper preset on a GPU.

    .venv/bin/python bench/world_model.py                          # render + tiny (CPU), about a minute
    .venv/bin/python bench/world_model.py --preset paper --device cuda   # GPU check: paper dims, random weights

Render: the ``render`` backend at 640x480 on one core (OpenCV and torch
limited to one thread) over a moving teleoperation-like trajectory, with the
skeleton conditioning image timed separately; the named baseline measured in
the same run is "repeat the first frame" (a copy of the reference: the floor
any backend pays), and the ratio to the issue's goal (60 FPS) is printed.
Diffusion: the streaming engine on diffusers' Wan2.2 classes (``tiny`` preset on CPU) from a reset: time to
first frame, steady-state FPS, the per-stage split (condition encoding, 4
denoising passes, commit pass, VAE decoding) and FPS as the stream grows (flat:
the key/value cache has a fixed size). Speed does not depend on trained
weights, so the engine is timed with seeded random weights; this is labelled
in the output, never used to make images. ``--preset paper --device cuda``
times the paper's dimensions at 832x480 next to the paper's 40 FPS (one
H100).

``--composite`` times the same stream again with reference compositing (``diffusion.composite: true``, its
default thresholds; ``--composite-reach-px R`` with the reach gate; ``--composite-reference render`` over the
render backend's frames, the robot painted at a swinging home posture) and adds ``composite_fps`` and
``composite_cost_ratio`` (plain FPS / composited FPS, both
from this run). With random weights the VAE's drawing of the unchanged anchor may never settle, so every block
pays the extra encode and decode: the upper bound of the cost.

The last line is one JSON object with ``render_fps``, ``tiny_fps``,
``tiny_first_frame_ms``, ``stage_split`` (then extras).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rynn_teleop.world_model.diffusion.composite import REFERENCES  # torch-free
from rynn_teleop.world_model.diffusion.presets import PRESETS  # torch-free

PAPER_FPS = 40.0  # RynnWorld-Teleop, 832x480, one H100 (shared/docs/world-model.md)
RENDER_GOAL_FPS = 60.0


def trajectory(robot, n: int) -> np.ndarray:
    """(n, 54) joint vectors: arms near home (hands in view) with moving wrists and elbows, hands opening and
    closing."""
    from rynn_teleop.core.arm_teleop import DEFAULT_HOME
    from rynn_teleop.core.robot_model import arm_joint_names, hand_joint_names

    lim = robot.limits
    qs = np.tile(robot.neutral(), (n, 1))
    t = np.arange(n) / 30.0
    for side in ("left", "right"):
        arm = robot.indices(arm_joint_names(side))
        qs[:, arm] = DEFAULT_HOME[:7] if side == "left" else DEFAULT_HOME[7:]
        qs[:, arm[0]] += -0.3 if side == "left" else 0.3  # shoulders raised: hands and wrists in the camera's view
        qs[:, arm[3]] += 0.25 * np.sin(1.5 * t)
        qs[:, arm[6]] += 0.4 * np.sin(2.0 * t)
        hand = robot.indices(hand_joint_names(side))
        mid, span = 0.5 * (lim.lower[hand] + lim.upper[hand]), 0.5 * (lim.upper[hand] - lim.lower[hand])
        qs[:, hand] = mid + 0.7 * span * np.sin(2.5 * t[:, None] + np.arange(len(hand)))
    return qs


def bench_render(frames: int) -> dict:
    import cv2

    from rynn_teleop.core.camera import default_intrinsics
    from rynn_teleop.core.robot_model import RobotModel
    from rynn_teleop.sources.camera import make_camera_source
    from rynn_teleop.world_model.conditioning import Conditioner, SkeletonStyle
    from rynn_teleop.world_model.render import RenderGenerator

    cv2.setNumThreads(1)
    robot = RobotModel.default()
    intr = default_intrinsics(640, 480)
    scene = make_camera_source("synthetic", width=640, height=480, fps=30.0, seed=0, depth=False)
    scene.start(0.0)
    reference = scene.read(0.0)[0].color
    scene.close()
    gen = RenderGenerator(robot, intr)
    gen.reset(reference)
    cond = Conditioner(robot, intr, SkeletonStyle())
    qs = trajectory(robot, frames)
    for q in qs[:20]:  # warm-up
        gen.step(q)
        cond.condition_image(q)
    render_t, cond_t, copy_t = [], [], []
    for q in qs:
        t0 = time.perf_counter()
        gen.step(q)
        t1 = time.perf_counter()
        cond.condition_image(q)
        t2 = time.perf_counter()
        reference.copy()
        t3 = time.perf_counter()
        render_t.append(t1 - t0)
        cond_t.append(t2 - t1)
        copy_t.append(t3 - t2)
    render_t, cond_t, copy_t = (np.array(v) * 1e3 for v in (render_t, cond_t, copy_t))
    return {
        "render_fps": 1e3 / render_t.mean(),
        "render_p50_ms": float(np.percentile(render_t, 50)),
        "render_p99_ms": float(np.percentile(render_t, 99)),
        "render_stages_ms": gen.timings(),
        "condition_ms": float(cond_t.mean()),
        "render_with_condition_fps": 1e3 / (render_t + cond_t).mean(),
        "baseline_repeat_first_frame_fps": 1e3 / copy_t.mean(),
        "frames": len(qs),
    }


def bench_diffusion(preset: str, device: str, dtype: str, frames: int, attention: str | None,
                    compile_blocks: bool, fp8: bool, composite: bool = False, reach_px: float = 0.0,
                    reference: str = "anchor") -> dict:
    from rynn_teleop.world_model.diffusion.bench_support import measure_stream
    from rynn_teleop.world_model.diffusion.composite import CompositeSettings

    return measure_stream(preset, device=device, dtype=dtype, frames=frames, random_weights=True,
                          attention_backend=attention, compile_blocks=compile_blocks, fp8=fp8,
                          composite=CompositeSettings(reach_px=reach_px, reference=reference) if composite else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=300, help="render frames to time")
    parser.add_argument("--preset", default="tiny", choices=tuple(PRESETS), help="diffusion preset")
    parser.add_argument("--composite", action="store_true", help="also time the stream with reference compositing")
    parser.add_argument("--composite-reach-px", type=float, default=0.0, help="with --composite: the reach gate's "
                        "radius (composite_reach_px; 0: no gate)")
    parser.add_argument("--composite-reference", default="anchor", choices=REFERENCES,
                        help="with --composite: composite over the anchor or the render backend's frames "
                        "(composite_reference)")
    parser.add_argument("--device", default="cpu", help="torch device for the diffusion engine")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (GPU default)")
    parser.add_argument("--diffusion-frames", type=int, default=None, help="generated frames to time")
    parser.add_argument("--attention", default=None, help="diffusers attention backend of the DiT (default SDPA; "
                        "e.g. flash, _flash_3 where installed)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the DiT's repeated blocks")
    parser.add_argument("--fp8", action="store_true", help="FP8 weights and activations of the DiT's linear layers "
                        "(torchao from requirements/gpu.txt; GPUs of compute capability 8.9 or higher)")
    args = parser.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device here (torch {torch.__version__}); "
                         "the paper preset is timed on a GPU machine")
    if args.fp8:
        from rynn_teleop.world_model.diffusion.fp8 import fp8_unavailable

        if reason := fp8_unavailable(args.device):
            raise SystemExit(f"--fp8: {reason}")
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    out: dict = {}
    if args.preset == "tiny":
        r = bench_render(args.frames)
        print(f"render 640x480, one core: {r['render_fps']:.1f} FPS (p50 {r['render_p50_ms']:.2f} ms, p99 "
              f"{r['render_p99_ms']:.2f} ms); goal {RENDER_GOAL_FPS:.0f} FPS: "
              f"{'met' if r['render_fps'] >= RENDER_GOAL_FPS else 'NOT met'} "
              f"(x{r['render_fps'] / RENDER_GOAL_FPS:.2f})")
        print(f"  skeleton condition image {r['condition_ms']:.2f} ms; render + condition "
              f"{r['render_with_condition_fps']:.1f} FPS; baseline 'repeat the first frame' "
              f"{r['baseline_repeat_first_frame_fps']:.0f} FPS (render costs "
              f"x{r['baseline_repeat_first_frame_fps'] / r['render_fps']:.1f} of it)")
        out.update(r)
    frames = args.diffusion_frames or 161
    d = bench_diffusion(args.preset, args.device, dtype, frames, args.attention, args.compile, args.fp8)
    fp8 = ", FP8 linears" if args.fp8 else ""
    label = f"{args.preset} diffusion on {args.device} ({dtype}{fp8}, seeded random weights: speed only)"
    print(f"{label}: {d['fps']:.1f} FPS at {d['width']}x{d['height']}, first frame {d['first_frame_ms']:.1f} ms, "
          f"peak memory {d['peak_memory_mb']:.0f} MB")
    print("  stage split: " + ", ".join(f"{k} {100 * v:.0f} %" for k, v in d["stage_split"].items()))
    print("  FPS as the stream grows: " + ", ".join(f"{v:.1f}" for v in d["fps_by_stream_length"]))
    if args.composite:
        c = bench_diffusion(args.preset, args.device, dtype, frames, args.attention, args.compile, args.fp8, True,
                            args.composite_reach_px, args.composite_reference)
        print(f"  with reference compositing: {c['fps']:.1f} FPS (x{d['fps'] / c['fps']:.2f} the time per frame); "
              f"composite stage {c['stage_ms'].get('composite', 0.0):.1f} ms per block")
        out.update({"composite_fps": c["fps"], "composite_cost_ratio": d["fps"] / c["fps"],
                    "composite_stage_ms": c["stage_ms"].get("composite"),
                    "composite_reach_px": args.composite_reach_px,
                    "composite_reference": args.composite_reference})
    if args.preset == "paper":
        print(f"  paper: {PAPER_FPS:.0f} FPS at 832x480 on one H100; ratio x{d['fps'] / PAPER_FPS:.2f}")
        out.update({"render_fps": None, "paper_fps": d["fps"], "paper_ratio_vs_published": d["fps"] / PAPER_FPS})
    out.update({
        "tiny_fps": d["fps"] if args.preset == "tiny" else None,
        "tiny_first_frame_ms": d["first_frame_ms"] if args.preset == "tiny" else None,
        "stage_split": {k: round(v, 3) for k, v in d["stage_split"].items()},
        "diffusion": {k: v for k, v in d.items() if k != "stage_split"},
    })
    head = {k: out.pop(k, None) for k in ("render_fps", "tiny_fps", "tiny_first_frame_ms", "stage_split")}
    print(json.dumps({**{k: (round(v, 3) if isinstance(v, float) else v) for k, v in head.items()}, **out},
                     default=float))


if __name__ == "__main__":
    main()
