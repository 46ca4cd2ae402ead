"""Stand-in VAE capacity: how well a VAE fitted on the CPU reconstructs held-out twin frames (the ceiling of any
world model generating in its latents), against repeating the clip's first frame, on the same frames.

    .venv/bin/python bench/world_model_vae.py DATASET [--steps 1500] [--base-dim 4] [--decoder-dim 8] [--spatial 16]

DATASET: a dataset of the ``small`` (or ``tiny``) preset built from twin episodes with ``--objects --split-by
layout`` (``bench/world_model_training.py --twin --out DIR`` leaves one in ``DIR/dataset``). The VAE is the preset's
``AutoencoderKLWan`` with the widths given (``--spatial 8``: one level fewer, ``dim_mult`` [1, 2, 2]), fitted by
:func:`~rynn_teleop.world_model.training.tiny_base.fit_tiny_base` (its ``vae_overrides``), then every held-out clip
(up to its first 41 frames) is encoded and decoded whole. Scores, over frames 1..: whole-frame PSNR, and PSNR inside
the projected box of each object in view (moving or not). The baseline is frame 0 repeated. One JSON line: both,
their differences, the settings and the seconds.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch


def scores(frames_fn, dataset, box_visible, box_psnr, psnr, read_clip_objects) -> tuple[float, float]:
    """Mean whole-frame and box PSNR [dB] of ``frames_fn(clip, T)`` (T - 1 frames) over the held-out clips."""
    whole, boxes = [], []
    for i, file in enumerate(dataset.files):
        clip, objects = dataset[i], read_clip_objects(dataset.root / file)
        t_max = min(41, clip.length)
        pred = frames_fn(clip, t_max)
        for t in range(1, t_max):
            whole.append(float(np.asarray(psnr(pred[t - 1], clip.frames[t])).mean()))
            for k in np.nonzero(box_visible(objects.boxes[t:t + 1])[0])[0]:
                value = box_psnr(pred[t - 1], clip.frames[t], objects.boxes[t, k])
                if np.isfinite(value):
                    boxes.append(value)
    return float(np.mean(whole)), float(np.mean(boxes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--steps", type=int, default=1500, help="VAE fitting steps")
    parser.add_argument("--base-dim", type=int, default=4, help="encoder base width")
    parser.add_argument("--decoder-dim", type=int, default=8, help="decoder base width")
    parser.add_argument("--spatial", type=int, choices=(8, 16), default=16, help="spatial compression [px/latent]")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import tempfile
    from pathlib import Path

    from diffusers import AutoencoderKLWan

    from rynn_teleop.world_model.diffusion.vae import pixels_to_rgb, rgb_to_pixels
    from rynn_teleop.world_model.training.clips import ClipDataset
    from rynn_teleop.world_model.training.metrics import box_psnr, psnr
    from rynn_teleop.world_model.training.objects import box_visible, read_clip_objects
    from rynn_teleop.world_model.training.tiny_base import fit_tiny_base

    held_out = ClipDataset(args.dataset, "val")
    overrides = {"base_dim": args.base_dim, "decoder_base_dim": args.decoder_dim}
    if args.spatial == 8:
        overrides.update(dim_mult=[1, 2, 2], temperal_downsample=[True, True], scale_factor_spatial=8)
    with tempfile.TemporaryDirectory(prefix="wm_vae_") as tmp:
        fitted = fit_tiny_base(args.dataset, Path(tmp) / "base", Path(tmp) / "prompt.safetensors",
                               seconds=float("inf"), max_steps=args.steps, seed=args.seed, vae_overrides=overrides,
                               log=None)
        vae = AutoencoderKLWan.from_pretrained(str(Path(tmp) / "base"), subfolder="vae").eval()

    def round_trip(clip, t_max):
        with torch.no_grad():
            video = vae(rgb_to_pixels(clip.frames[:t_max]), sample_posterior=False).sample
        return pixels_to_rgb(video)[1:]

    def repeat_first(clip, t_max):
        return [clip.frames[0]] * (t_max - 1)

    common = (held_out, box_visible, box_psnr, psnr, read_clip_objects)
    vae_whole, vae_box = scores(round_trip, *common)
    base_whole, base_box = scores(repeat_first, *common)
    print(json.dumps({
        "vae_psnr": round(vae_whole, 3), "vae_box_psnr": round(vae_box, 3),
        "baseline_psnr": round(base_whole, 3), "baseline_box_psnr": round(base_box, 3),
        "vae_minus_baseline_psnr": round(vae_whole - base_whole, 3),
        "vae_minus_baseline_box_psnr": round(vae_box - base_box, 3),
        "train_window_psnr": round(fitted["train_psnr"], 3), "steps": fitted["steps"],
        "fit_seconds": fitted["seconds"],
        "base_dim": args.base_dim, "decoder_dim": args.decoder_dim, "spatial": args.spatial,
        "parameters": sum(p.numel() for p in vae.parameters()), "preset": held_out.info.preset,
        "held_out_clips": len(held_out), "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
