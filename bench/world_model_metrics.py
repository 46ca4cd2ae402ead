"""SSIM cost of the world-model evaluation: metrics.ssim (OpenCV's separable Gaussian filter, float64) vs
torchmetrics' structural_similarity_index_measure (float64, the baseline, measured in the same run), on the same
frames, with the largest difference of their values.

Frames: random RGB at the ``small`` preset's size (160 x 96) by default, a ground truth and a noisy copy (as
generated frames differ from recorded ones); both functions score the same pairs.

    .venv/bin/python bench/world_model_metrics.py [--frames 80] [--width 160] [--height 96] [--threads 0]

``--threads``: torch's intra-op threads for the baseline (0: torch's default). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from rynn_teleop.world_model.training import metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=80, help="frame pairs scored (an 81-frame clip's 80)")
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 256, (args.frames, args.height, args.width, 3), dtype=np.uint8)
    pred = np.clip(truth.astype(int) + rng.integers(-30, 31, truth.shape), 0, 255).astype(np.uint8)
    metrics.ssim(pred[:1], truth[:1])  # imports and first calls outside the timing
    metrics.ssim_torchmetrics(pred[:1], truth[:1])

    t0 = time.perf_counter()
    base_values = metrics.ssim_torchmetrics(pred, truth)
    base = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours_values = metrics.ssim(pred, truth)
    ours = time.perf_counter() - t0
    print(f"torchmetrics: {1e3 * base / args.frames:.1f} ms/frame, metrics.ssim: {1e3 * ours / args.frames:.2f} "
          f"ms/frame ({args.width}x{args.height}, {args.frames} frames, torch threads {torch.get_num_threads()})")
    print(json.dumps({"frames": args.frames, "width": args.width, "height": args.height,
                      "torch_threads": torch.get_num_threads(),
                      "baseline": "torchmetrics structural_similarity_index_measure (float64, valid area)",
                      "baseline_ms_per_frame": round(1e3 * base / args.frames, 3),
                      "ours_ms_per_frame": round(1e3 * ours / args.frames, 3),
                      "ratio_ours_over_baseline": round(ours / base, 4),
                      "max_abs_difference": float(np.abs(ours_values - base_values).max())}))


if __name__ == "__main__":
    main()
