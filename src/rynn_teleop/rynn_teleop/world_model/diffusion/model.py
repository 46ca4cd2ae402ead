"""The whole learned world model: diffusers' Wan2.2 VAE and DiT, our control branch and the fixed prompt."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from .dit import ControlBranch, StreamingWanDiT
from .presets import WanPreset
from .vae import StreamingVAE
from .weights import load_base, load_prompt, load_weights, save_prompt, save_weights

_LOG = logging.getLogger(__name__)

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


@dataclass
class WanWorldModel:
    """What one stream needs: the streaming VAE, the streaming DiT (transformer + control branch) and the
    prompt embedding (1, prompt_len, text_dim), all of one preset."""

    preset: WanPreset
    vae: StreamingVAE
    dit: StreamingWanDiT
    prompt_embeds: torch.Tensor

    def to(self, device: torch.device | str, dtype: torch.dtype, vae_dtype: torch.dtype | None = None
           ) -> WanWorldModel:
        """Move every part to ``device`` (in place; eval mode, no gradients); returns self.

        The DiT, control branch and prompt go to ``dtype``, except the DiT modules diffusers keeps in float32
        (``_keep_in_fp32_modules``: time embedding, norms, modulation tables), as ``from_pretrained`` leaves
        them; the VAE goes to ``vae_dtype`` (default ``dtype``).
        """
        for module, wanted in ((self.vae.vae, vae_dtype or dtype), (self.dit, dtype)):
            module.to(device)
            if next(module.parameters()).dtype != wanted:  # diffusers warns on every dtype cast
                module.to(dtype=wanted)
            module.eval().requires_grad_(False)
        keep = getattr(self.dit.transformer, "_keep_in_fp32_modules", None) or []
        if dtype != torch.float32 and keep:
            for name, module in self.dit.transformer.named_modules():
                if any(part in keep for part in name.split(".")):
                    module.to(dtype=torch.float32)
        self.prompt_embeds = self.prompt_embeds.to(device=device, dtype=dtype)
        return self


def control_branch(preset: WanPreset) -> ControlBranch:
    """A zero-initialised control branch for ``preset``'s DiT (the model then equals the base model)."""
    return ControlBranch(preset.latent_channels, preset.inner_dim, tuple(preset.patch))


def load_model(preset: WanPreset, base_dir: str | os.PathLike, weights_dir: str | os.PathLike | None,
               prompt_file: str | os.PathLike, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> WanWorldModel:
    """The world model from the base release ``base_dir``, the trainer's ``weights_dir`` and a prompt file.

    Without ``weights_dir`` (None or "") the control branch stays zero: the model is the base model, which
    ignores the actions (logged as a warning).

    Raises:
        ConfigurationError (``BaseModelError``, ``FineTunedWeightsError``, ``PromptEmbeddingError``): a folder
            or file that is missing or does not fit the preset; the message names it and the first differences.
    """
    base = load_base(base_dir, preset, device, dtype)
    control = control_branch(preset).to(device=device, dtype=dtype)
    if weights_dir:
        load_weights(weights_dir, base.transformer, control, preset)
    else:
        _LOG.warning("world model: no fine-tuned weights (weights_dir): the base model ignores the actions")
    prompt = load_prompt(prompt_file, preset, device, dtype)
    return WanWorldModel(preset, StreamingVAE(base.vae), StreamingWanDiT(base.transformer, control), prompt)


def untrained_model(preset: WanPreset, seed: int, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> WanWorldModel:
    """Seeded random weights of the real architecture, a random prompt and a non-zero control branch (so the
    actions change the frames): for tests and speed runs only; a node never uses it (it loads weights)."""
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        with torch.device(device):  # initialise in place: the paper model is 20 GB in float32
            vae = AutoencoderKLWan(**preset.vae_kwargs)
            transformer = WanTransformer3DModel(**preset.transformer_kwargs)
            control = control_branch(preset)
            torch.nn.init.normal_(control.conv.weight, std=0.02)
            prompt = torch.randn(preset.prompt_shape)
    model = WanWorldModel(preset, StreamingVAE(vae), StreamingWanDiT(transformer, control), prompt)
    return model.to(device, dtype)


def save_model(model: WanWorldModel, base_dir: str | os.PathLike, weights_dir: str | os.PathLike,
               prompt_file: str | os.PathLike, *, base_model_id: str = "untrained", training_step: int = 0) -> None:
    """Write ``model`` as :func:`load_model` reads it: its VAE and DiT in the base release's layout
    (``base_dir/vae``, ``base_dir/transformer``), its control branch as a weights folder (kind "control") and
    its prompt embedding. For tests, benchmarks and tools; the trainer writes weights folders the same way."""
    base = Path(base_dir)
    model.vae.vae.save_pretrained(base / "vae")
    model.dit.transformer.save_pretrained(base / "transformer")
    save_weights(weights_dir, transformer=model.dit.transformer, control=model.dit.control, kind="control",
                 preset=model.preset, base_model_id=base_model_id, training_step=training_step)
    save_prompt(model.prompt_embeds, prompt_file, prompt="(random)", tokens=model.prompt_embeds.shape[1])
