"""Diffusion test configs: the public release's config files as dicts and small seeded variants."""

from __future__ import annotations

from typing import Any

import torch

from rynn_teleop.world_model.diffusion.presets import PAPER, TINY, json_like
from rynn_teleop.world_model.diffusion.vae import LATENT_CHANNELS, SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION

#: ``vae/config.json`` of the public ``Wan-AI/Wan2.2-TI2V-5B-Diffusers`` release (without ``_diffusers_version``).
#: ``clip_output`` is in that file but is not an ``AutoencoderKLWan`` argument: diffusers warns and ignores it.
PAPER_VAE_CONFIG: dict[str, Any] = {"_class_name": "AutoencoderKLWan", **json_like(PAPER.vae_config),
                                     "clip_output": False}


def tiny_vae_config(seed: int = 0) -> dict[str, Any]:
    """A small Wan2.2-structured VAE config for ``AutoencoderKLWan(**cfg)`` (tests, the ``tiny`` preset).

    Same structure as :data:`PAPER_VAE_CONFIG` (patch 2, 48 latent channels, residual blocks, multipliers
    (1, 2, 4, 4), a decoder twice as wide as the encoder, 16x16 spatial and 4x temporal compression) at
    ``base_dim`` 4 and one residual block per encoder level; ``latents_mean``/``latents_std`` are 48 values
    drawn from ``seed`` (std in [0.5, 1.5)).
    """
    generator = torch.Generator().manual_seed(seed)
    mean = (0.2 * torch.randn(LATENT_CHANNELS, generator=generator)).tolist()
    std = (0.5 + torch.rand(LATENT_CHANNELS, generator=generator)).tolist()
    return {
        "base_dim": 4,
        "decoder_base_dim": 8,
        "z_dim": LATENT_CHANNELS,
        "dim_mult": [1, 2, 4, 4],
        "num_res_blocks": 1,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "dropout": 0.0,
        "latents_mean": [round(v, 4) for v in mean],
        "latents_std": [round(v, 4) for v in std],
        "is_residual": True,
        "in_channels": 12,
        "out_channels": 12,
        "patch_size": 2,
        "scale_factor_temporal": TEMPORAL_COMPRESSION,
        "scale_factor_spatial": SPATIAL_COMPRESSION,
    }


#: ``transformer/config.json`` of the public Wan2.2-TI2V-5B-Diffusers release: the TI2V-5B entry of
#: huggingface/diffusers ``scripts/convert_wan_to_diffusers.py`` (``get_transformer_config``) plus the
#: constructor defaults its ``save_pretrained`` writes (image_dim, pos_embed_seq_len, rope_max_seq_len).
PAPER_TRANSFORMER_CONFIG: dict[str, Any] = json_like(PAPER.transformer_config)


def tiny_transformer_config() -> dict[str, Any]:
    """A ``WanTransformer3DModel(**cfg)`` config for CPU tests (the ``tiny`` preset's): TI2V's channels and patch,
    2 layers, 4 heads of 48 (RoPE splits 48 into (t, h, w) = (16, 16, 16))."""
    return json_like(TINY.transformer_config)
