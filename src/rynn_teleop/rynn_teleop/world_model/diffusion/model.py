"""The whole learned world model: the causal VAE and the block-causal DiT of one preset."""

from __future__ import annotations

import torch
from torch import nn

from .presets import Preset
from .transformer import DiT
from .vae import CausalVAE


class WorldModel(nn.Module):
    """VAE (``vae``) and DiT with its control branch (``dit``); weights come from a checkpoint
    (:func:`~.checkpoint.load_checkpoint`). Construction alone gives untrained weights."""

    def __init__(self, preset: Preset) -> None:
        super().__init__()
        self.preset = preset
        self.vae = CausalVAE(preset)
        self.dit = DiT(preset)


def untrained_model(preset: Preset, seed: int, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> WorldModel:
    """A seeded, untrained model in eval mode: for tests (checkpoint round trips) and speed runs only.

    Random weights produce noise, not a world model; the generator backend
    never uses this (it loads a checkpoint).
    """
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        with torch.device(device):  # initialise in place: the paper model is 16 GB in float32
            model = WorldModel(preset)
    return model.to(dtype).eval().requires_grad_(False)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from itself or its name ("float32", "bfloat16", "float16").

    Raises:
        ValueError: another name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}") from None
