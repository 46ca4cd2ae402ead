"""Stand-in VAE capacity: how well a VAE fitted on the CPU reconstructs held-out twin frames (the ceiling of any
world model generating in its latents), against repeating the clip's first frame, on the same frames.

    .venv/bin/python bench/world_model_vae.py DATASET [--steps 1500] [--base-dim 4] [--decoder-dim 8] [--spatial 16]
        [--ssim-weight 0] [--as-eval [--max-clips N]]

DATASET: a dataset of the ``small`` (or ``tiny``) preset built from twin episodes with ``--objects --split-by
layout`` (``bench/world_model_training.py --twin --out DIR`` leaves one in ``DIR/dataset``). The VAE is the preset's
``AutoencoderKLWan`` with the widths given (``--spatial 8``: the ``small8`` preset's levels, one fewer), fitted by
:func:`~rynn_teleop.world_model.training.tiny_base.fit_tiny_base` (its ``vae_overrides``), then every held-out clip
(up to its first 41 frames) is encoded and decoded whole. Scores, over frames 1..: whole-frame PSNR, and PSNR inside
the projected box of each object in view (moving or not). The baseline is frame 0 repeated. One JSON line: both,
their differences, the settings and the seconds. ``--ssim-weight W`` adds W x (1 - SSIM) to the fitting loss
(:func:`~rynn_teleop.world_model.training.tiny_base.fit_tiny_base`'s ``ssim_weight``).

``--as-eval`` scores the round trip as ``rynn-teleop world-model eval --composite`` scores its ``reconstruction``
(the ceiling of every model served composited): every frame of every held-out clip, composited over frame 0 at the
backend's default thresholds, with ``evaluate.score``; beside it the ``render`` backend and repeat-first on the same
frames. Keys ``<model>_<metric>`` for ``vae``, ``render``, ``baseline`` and ``psnr``, ``ssim``,
``object_psnr_after``, ``object_psnr_moving``, and each goal's margin of the VAE over the better baseline
(``vae_margin_*``).
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


def as_eval(vae, held_out, max_clips: int | None = None) -> dict[str, float | int | None]:
    """The ``--as-eval`` scores (see the module docstring) of ``vae`` (an ``AutoencoderKLWan``) on ``held_out``'s
    clips (the first ``max_clips``; None: all)."""
    from rynn_teleop.core.robot_model import RobotModel
    from rynn_teleop.world_model.conditioning import Conditioner
    from rynn_teleop.world_model.diffusion.composite import CompositeSettings
    from rynn_teleop.world_model.diffusion.presets import get_preset
    from rynn_teleop.world_model.diffusion.vae import StreamingVAE
    from rynn_teleop.world_model.render import RenderGenerator
    from rynn_teleop.world_model.training import evaluate as ev
    from rynn_teleop.world_model.training.clips import read_clip
    from rynn_teleop.world_model.training.objects import read_clip_objects

    info = held_out.info
    robot = RobotModel.default()
    columns = ev._joint_order(info, robot)
    intrinsics, _ = ev.dataset_intrinsics(info)
    camera_frame = str(info.condition.get("camera_frame", ev.DEFAULT_CAMERA_FRAME))
    conditioner = Conditioner(robot, intrinsics, camera_frame=camera_frame)
    render = RenderGenerator(robot, intrinsics, width=info.width, height=info.height, camera_frame=camera_frame)
    margin = max(ev.HAND_MARGIN_MIN_PX, round(ev.HAND_MARGIN_FRACTION * info.width))
    streaming, composite = StreamingVAE(vae), CompositeSettings()
    scores = {"vae": [], "render": [], "baseline": []}
    for file in held_out.files[:max_clips]:
        clip = read_clip(held_out.root / file)
        objects = read_clip_objects(held_out.root / file)
        if objects is None:
            raise SystemExit(f"{file}: no objects; --as-eval needs a twin dataset (--objects)")
        actions = clip.actions[:, columns].astype(np.float64)
        with torch.no_grad():
            predictions = {"vae": ev.vae_round_trip(streaming, clip, composite),
                           "render": ev.stream(render, clip, actions), "baseline": ev.repeat_first(clip)}
        for model, pred in predictions.items():
            scores[model].append(ev.score(pred, clip.frames[1:], ev.hand_masks(conditioner, actions[1:], margin),
                                          None, objects=objects.slice(1, clip.length),
                                          resting_at_anchor=~objects.moved[0]))
    metrics = ("psnr", "ssim", "object_psnr_after", "object_psnr_moving")
    block = get_preset(info.preset).frames_per_block
    means = {m: ev.summarise(rows, block) for m, rows in scores.items()}
    out = {f"{m}_{k}": None if means[m][k] is None else round(means[m][k], 4) for m in scores for k in metrics}
    for k in metrics:  # the goal's form: the VAE over the better of the two baselines
        values = [means[m][k] for m in scores]
        out[f"vae_margin_{k}"] = None if None in values else round(values[0] - max(values[1:]), 4)
    out["held_out_frames"] = int(sum(len(s.psnr) for s in scores["baseline"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--steps", type=int, default=1500, help="VAE fitting steps")
    parser.add_argument("--base-dim", type=int, default=4, help="encoder base width")
    parser.add_argument("--decoder-dim", type=int, default=8, help="decoder base width")
    parser.add_argument("--spatial", type=int, choices=(8, 16), default=16, help="spatial compression [px/latent]")
    parser.add_argument("--ssim-weight", type=float, default=0.0, help="weight of 1 - SSIM in the fitting loss")
    parser.add_argument("--as-eval", action="store_true", help="score as world-model eval --composite scores its "
                        "reconstruction, beside render and repeat-first (see the module docstring)")
    parser.add_argument("--max-clips", type=int, default=None, help="with --as-eval: score the first N held-out "
                        "clips only (a quick check; the numbers need all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import tempfile
    from pathlib import Path

    from diffusers import AutoencoderKLWan

    from rynn_teleop.world_model.diffusion.presets import SMALL8, json_like
    from rynn_teleop.world_model.diffusion.vae import pixels_to_rgb, rgb_to_pixels
    from rynn_teleop.world_model.training.clips import ClipDataset
    from rynn_teleop.world_model.training.metrics import box_psnr, psnr
    from rynn_teleop.world_model.training.objects import box_visible, read_clip_objects
    from rynn_teleop.world_model.training.tiny_base import fit_tiny_base

    held_out = ClipDataset(args.dataset, "val")
    overrides = {"base_dim": args.base_dim, "decoder_base_dim": args.decoder_dim}
    if args.spatial == 8:  # the small8 preset's levels
        overrides.update({k: json_like(SMALL8.vae_config[k])
                          for k in ("dim_mult", "temperal_downsample", "scale_factor_spatial")})
    with tempfile.TemporaryDirectory(prefix="wm_vae_") as tmp:
        fitted = fit_tiny_base(args.dataset, Path(tmp) / "base", Path(tmp) / "prompt.safetensors",
                               seconds=float("inf"), max_steps=args.steps, seed=args.seed, vae_overrides=overrides,
                               ssim_weight=args.ssim_weight, log=None)
        vae = AutoencoderKLWan.from_pretrained(str(Path(tmp) / "base"), subfolder="vae").eval()
    settings = {"train_window_psnr": round(fitted["train_psnr"], 3), "steps": fitted["steps"],
                "fit_seconds": fitted["seconds"], "base_dim": args.base_dim, "decoder_dim": args.decoder_dim,
                "spatial": args.spatial, "ssim_weight": args.ssim_weight,
                "parameters": sum(p.numel() for p in vae.parameters()), "preset": held_out.info.preset,
                "held_out_clips": len(held_out), "threads": torch.get_num_threads()}
    if args.as_eval:
        print(json.dumps({**as_eval(vae, held_out, args.max_clips), **settings, "max_clips": args.max_clips}))
        return 0

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
        "vae_minus_baseline_box_psnr": round(vae_box - base_box, 3), **settings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
