"""A stand-in "base release" for the ``tiny`` preset: a VAE fitted to the dataset's frames, a seeded DiT.

The paper starts from Wan2.2 TI2V-5B, whose VAE is pretrained and frozen. No pretrained VAE of the ``tiny``
size exists, and a random one cannot reconstruct a frame, so a tiny run first fits one:
:func:`fit_tiny_base` trains ``AutoencoderKLWan`` of the tiny preset's config (unchanged, so the folder
passes :func:`~rynn_teleop.world_model.diffusion.weights.load_base`'s checks) as a deterministic
autoencoder on the dataset's training frames, and writes a folder in the release's layout (``vae/``,
``transformer/`` with a seeded random DiT, as a stand-in for the pretrained one) plus a seeded random
prompt embedding. Only the stand-in presets (``tiny``, ``small``): the ``paper`` preset uses the published release.

Loss per step: L1 + MSE between a random 5-frame window (1 + 4: one latent frame of motion) of a training
clip and its reconstruction through the posterior mean, each pixel weighted by 1 + ``change_weight`` x the clip's
change map there (the training loss's ramp, :data:`~.config.CHANGE_RAMP`, of the window's difference from the
clip's first frame; the weighted means divided by the mean weight), plus ``ssim_weight`` times 1 - SSIM (the mean
over the window's frames, with the evaluation's Gaussian window), plus ``stats_weight``
times how far the normalised latents (the config's fixed ``latents_mean``/``latents_std``) are from zero mean and
unit variance per channel, so that the DiT's flow-matching noise has the latents' scale.

``change_weight`` (and ``object_weight``, the same for the boxes of the objects that move: a twin dataset's
:mod:`~.objects`) serves reference compositing (:mod:`~rynn_teleop.world_model.diffusion.composite`): a
composited model shows the anchor frame wherever nothing changed, so the VAE's capacity is spent where the robot
and the objects move (docs: benchmarks, world model on twin episodes).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from rynn_teleop.errors import ConfigurationError

from ..diffusion.presets import STAND_IN_PRESETS, get_preset
from ..diffusion.vae import rgb_to_pixels
from ..diffusion.weights import save_prompt
from .clips import ClipDataset

WINDOW = 5  # frames per training sample: the first frame, then one latent frame of 4
OBJECT_MARGIN_PX = 2  # the moved objects' boxes are grown by this much for ``object_weight`` [px]


def _windows(dataset: ClipDataset, rng: np.random.Generator, batch: int, changes: bool = True,
             objects: dict[int, np.ndarray | None] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(batch, 3, WINDOW, H, W) pixels in [-1, 1]: random windows of random training clips; each window's
    change map (batch, 1, WINDOW, H, W) in [0, 1] against its clip's first frame (:data:`~.config.CHANGE_RAMP`;
    None when not ``changes``); and, when ``objects`` is given (a cache: clip index -> that clip's
    :meth:`~.objects.ClipObjects.mover_mask`, filled on first use; None for a clip without objects), each window's
    moved-object mask (batch, 1, WINDOW, H, W) in {0, 1} (0 where its clip has no objects)."""
    from ..diffusion.composite import change_weight
    from .config import CHANGE_RAMP
    from .objects import read_clip_objects

    out, maps, boxes = [], [], []
    for _ in range(batch):
        index = int(rng.integers(len(dataset)))
        clip = dataset[index]
        start = int(rng.integers(clip.length - WINDOW + 1))
        window = rgb_to_pixels(list(clip.frames[start:start + WINDOW]))
        out.append(window)
        if changes:
            maps.append(change_weight(window, rgb_to_pixels([clip.frames[0]]).expand_as(window), CHANGE_RAMP))
        if objects is not None:
            if index not in objects:
                clip_objects = read_clip_objects(dataset.root / dataset.files[index])
                objects[index] = None if clip_objects is None else clip_objects.mover_mask(
                    clip.frames.shape[1], clip.frames.shape[2], OBJECT_MARGIN_PX)
            mask = objects[index]
            boxes.append(torch.zeros_like(window[:, :1]) if mask is None
                         else torch.from_numpy(mask[start:start + WINDOW]).to(window.dtype)[None, None])
    return (torch.cat(out), torch.cat(maps) if changes else None,
            torch.cat(boxes) if objects is not None else None)


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a - b) ** 2).mean()) / 4.0  # [-1, 1] -> [0, 1]
    return float("inf") if mse == 0 else 10.0 * np.log10(1.0 / mse)


def _ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean SSIM (differentiable; the evaluation's window and constants, :mod:`.metrics`) of the frames of two
    (B, 3, T, H, W) videos in [-1, 1]."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    from .metrics import SSIM_K1, SSIM_K2, SSIM_KERNEL, SSIM_SIGMA

    return structural_similarity_index_measure(  # frames as (B * T, 3, H, W)
        a.transpose(1, 2).flatten(0, 1), b.transpose(1, 2).flatten(0, 1), gaussian_kernel=True, sigma=SSIM_SIGMA,
        kernel_size=SSIM_KERNEL, k1=SSIM_K1, k2=SSIM_K2, data_range=2.0)


def fit_tiny_base(dataset_dir: str | os.PathLike, base_dir: str | os.PathLike, prompt_file: str | os.PathLike, *,
                  seconds: float = 120.0, max_steps: int | None = None, batch: int = 2, lr: float = 2e-3,
                  stats_weight: float = 0.1, ssim_weight: float = 0.0, change_weight: float = 0.0,
                  object_weight: float = 0.0, seed: int = 0,
                  vae_overrides: Mapping[str, Any] | None = None,
                  log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Fit the tiny VAE to ``dataset_dir``'s training frames and write a tiny base release.

    Args:
        dataset_dir: a dataset of a stand-in preset (``tiny``, ``small``: :data:`STAND_IN_PRESETS`;
            ``rynn-teleop world-model dataset --preset tiny``); the base is that preset's.
        base_dir: output folder (``vae/``, ``transformer/``); must not exist or be empty.
        prompt_file: output prompt embedding (.safetensors).
        seconds: training time budget [s] (wall clock); ``max_steps`` stops earlier if given.
        batch: windows per step.
        lr: AdamW learning rate.
        stats_weight: weight of the latent-statistics term.
        ssim_weight: weight of the 1 - SSIM term (>= 0; 0: L1 + MSE alone, the default).
        change_weight: extra weight of the pixels where the clip changes (>= 0; 0: uniform, the default).
        object_weight: extra weight of the pixels inside the boxes of the objects that move in the clip's episode
            (grown by :data:`OBJECT_MARGIN_PX`; clips without objects add nothing), added to ``change_weight``'s
            (>= 0; 0: none, the default).
        seed: seeds the VAE's initialisation, the windows, the DiT and the prompt.
        vae_overrides: ``AutoencoderKLWan`` arguments replacing the preset's (widths, levels), for capacity
            experiments (``bench/world_model_vae.py``); such a base no longer loads as the preset's
            (:func:`~rynn_teleop.world_model.diffusion.weights.load_base` checks the VAE config).
        log: progress lines (None: silent).

    Returns:
        ``steps``, ``seconds``, ``first_psnr`` and ``train_psnr`` (reconstruction PSNR [dB] of the first 3
        and the last 20 steps' windows),
        ``latent_mean``/``latent_std`` (of the normalised latents over those windows), ``base_dir``,
        ``prompt_file``.

    Raises:
        DatasetError: no dataset or no training clips there.
        ConfigurationError: a dataset of another preset, clips shorter than 5 frames, a non-empty
            ``base_dir``, or a negative ``ssim_weight``, ``change_weight`` or ``object_weight``.
    """
    if not ssim_weight >= 0.0:
        raise ConfigurationError(f"tiny base: ssim_weight must be >= 0; got {ssim_weight}")
    if not change_weight >= 0.0:
        raise ConfigurationError(f"tiny base: change_weight must be >= 0; got {change_weight}")
    if not object_weight >= 0.0:
        raise ConfigurationError(f"tiny base: object_weight must be >= 0; got {object_weight}")
    dataset = ClipDataset(dataset_dir, "train")
    if dataset.info.preset not in STAND_IN_PRESETS:
        raise ConfigurationError(f"{dataset_dir}: a {dataset.info.preset!r} dataset; a tiny base is fitted to a "
                                 f"dataset of {' or '.join(repr(p) for p in STAND_IN_PRESETS)} (the paper preset "
                                 "uses the published Wan2.2 release)")
    preset = get_preset(dataset.info.preset)
    base = Path(base_dir)
    if base.exists() and any(base.iterdir()):
        raise ConfigurationError(f"{base}: not empty; the tiny base is written into a new folder")
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    vae_kwargs = {**preset.vae_kwargs, **(vae_overrides or {})}
    vae = AutoencoderKLWan(**vae_kwargs).train()
    mean = torch.tensor(vae_kwargs["latents_mean"]).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae_kwargs["latents_std"]).view(1, -1, 1, 1, 1)
    optimiser = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    start = time.monotonic()
    step, recent, first = 0, [], []
    mover_masks: dict[int, np.ndarray | None] | None = {} if object_weight else None
    while time.monotonic() - start < seconds and (max_steps is None or step < max_steps):
        x, change, movers = _windows(dataset, rng, batch, changes=bool(change_weight), objects=mover_masks)
        posterior = vae.encode(x).latent_dist.mode()
        reconstruction = vae.decode(posterior).sample
        latents = (posterior - mean) / std
        per_channel = latents.transpose(0, 1).flatten(1)
        stats = per_channel.mean(1).pow(2).mean() + (per_channel.std(1) - 1.0).pow(2).mean()
        error = reconstruction - x
        weight = torch.ones_like(error[:, :1])  # 1 + the weights that are on, per pixel
        if change_weight:
            weight = weight + change_weight * change
        if object_weight:
            weight = weight + object_weight * movers
        loss = ((weight * error.abs()).mean() + (weight * error.pow(2)).mean()) / weight.mean()
        loss = loss + stats_weight * stats
        if ssim_weight:
            loss = loss + ssim_weight * (1.0 - _ssim(reconstruction, x))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        step += 1
        latents = latents.detach()
        recent = [*recent[-19:], (_psnr(reconstruction.detach(), x), float(latents.mean()), float(latents.std()))]
        if step <= 3:
            first.append(recent[-1][0])
        if log and step % 50 == 0:
            log(f"tiny base: step {step}, {time.monotonic() - start:.0f} s, reconstruction "
                f"{np.mean([r[0] for r in recent]):.1f} dB, latents mean {recent[-1][1]:+.2f} std {recent[-1][2]:.2f}")
    vae.eval().requires_grad_(False)
    vae.save_pretrained(base / "vae")
    transformer = WanTransformer3DModel(**preset.transformer_kwargs)
    transformer.save_pretrained(base / "transformer")
    generator = torch.Generator().manual_seed(seed)
    save_prompt(torch.randn(preset.prompt_shape, generator=generator), prompt_file,
                prompt=f"({preset.name}: random)", tokens=preset.prompt_len)
    result = {"steps": step, "seconds": round(time.monotonic() - start, 1),
              "first_psnr": float(np.mean(first)) if first else None,
              "train_psnr": float(np.mean([r[0] for r in recent])) if recent else None,
              "latent_mean": recent[-1][1] if recent else None, "latent_std": recent[-1][2] if recent else None,
              "ssim_weight": ssim_weight, "change_weight": change_weight, "object_weight": object_weight,
              "base_dir": str(base), "prompt_file": str(prompt_file)}
    (base / "tiny_base.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rynn-teleop world-model tiny-base DATASET --out BASE_DIR --prompt-file FILE [--seconds S] [--max-steps N]
    [--change-weight W] [--object-weight W]``."""
    parser.add_argument("dataset", help="a dataset folder of a stand-in preset (rynn-teleop world-model dataset "
                        "--preset tiny or small)")
    parser.add_argument("--out", required=True, help="the base folder to write (vae/, transformer/)")
    parser.add_argument("--prompt-file", required=True, help="the prompt embedding to write (.safetensors)")
    parser.add_argument("--seconds", type=float, default=120.0, help="VAE training time [s]")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (default: the time "
                        "budget alone)")
    parser.add_argument("--change-weight", type=float, default=0.0, help="extra loss weight where a clip changes "
                        "(for a model served with reference compositing; 0: uniform)")
    parser.add_argument("--object-weight", type=float, default=0.0, help="extra loss weight inside the boxes of "
                        "the objects that move (twin datasets; added to --change-weight's; 0: none)")
    parser.add_argument("--seed", type=int, default=0)


def run_cli(args: argparse.Namespace) -> int:
    """Fit and write the tiny base; prints the result as JSON."""
    result = fit_tiny_base(args.dataset, args.out, args.prompt_file, seconds=args.seconds, max_steps=args.max_steps,
                           change_weight=args.change_weight, object_weight=args.object_weight, seed=args.seed)
    print(json.dumps(result))
    return 0
