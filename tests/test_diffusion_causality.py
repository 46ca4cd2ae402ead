"""Causality of the whole-sequence model: nothing a frame's output depends on lies after its block.

The engine cannot show this (it returns a block before later conditions
exist), so these tests perturb everything from some block start onward and
require the outputs of all earlier frames to stay bit-identical: in the DiT
(latents, conditions and timesteps, under the block-causal mask) and in the
VAE encoder that turns condition frames into condition latents.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rynn_teleop.world_model.diffusion.presets import TINY, Preset
from rynn_teleop.world_model.diffusion.transformer import DiT
from rynn_teleop.world_model.diffusion.vae import CausalVAE

Z, GRID = TINY.latent_channels, TINY.latent_grid
WIDE = dataclasses.replace(TINY, block_frames=2, window_frames=3)
FRAMES = 9  # latent frames: the anchor and 8 more (blocks of 1, or 4 blocks of 2)


def block_starts(preset: Preset, frames: int) -> list[int]:
    return list(range(1, frames, preset.block_frames))


@pytest.mark.parametrize("preset", [TINY, WIDE], ids=["block-1", "block-2"])
def test_dit_outputs_before_a_block_ignore_everything_from_that_block_on(preset):
    torch.set_num_threads(2)
    torch.manual_seed(0)
    dit = DiT(preset).eval().requires_grad_(False)
    torch.nn.init.normal_(dit.control_embed.weight, std=0.2)  # trained control branch: conditions matter
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, Z, FRAMES, *GRID, generator=g)
    c = torch.randn(1, Z, FRAMES, *GRID, generator=g)
    t = torch.rand(1, FRAMES, generator=g) * 1000
    out = dit(x, c, t)
    for start in block_starts(preset, FRAMES):
        x2, c2, t2 = x.clone(), c.clone(), t.clone()
        x2[:, :, start:] += torch.randn(x2[:, :, start:].shape, generator=g)
        c2[:, :, start:] -= torch.randn(c2[:, :, start:].shape, generator=g)
        t2[:, start:] = torch.rand(t2[:, start:].shape, generator=g) * 1000
        changed = dit(x2, c2, t2)
        assert torch.equal(changed[:, :, :start], out[:, :, :start]), f"frames before {start} saw later frames"
        assert not torch.equal(changed[:, :, start:], out[:, :, start:])  # the perturbation is real


@pytest.mark.parametrize("preset", [TINY, WIDE], ids=["block-1", "block-2"])
def test_condition_latents_before_a_block_ignore_later_condition_frames(preset):
    """vae.encode of the condition clip (anchor + 4 frames per latent frame): changing condition
    frames from a block's first frame on leaves every earlier condition latent frame bit-identical."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    vae = CausalVAE(preset).eval().requires_grad_(False)
    latent_frames = 5
    g = torch.Generator().manual_seed(2)
    clip = torch.rand(1, 3, 1 + 4 * (latent_frames - 1), preset.height, preset.width, generator=g) * 2 - 1
    with torch.no_grad():
        out = vae.encode(clip)
        for start in block_starts(preset, latent_frames):
            first_video_frame = 1 + 4 * (start - 1)
            changed_clip = clip.clone()
            changed_clip[:, :, first_video_frame:] = torch.rand(changed_clip[:, :, first_video_frame:].shape,
                                                                generator=g) * 2 - 1
            changed = vae.encode(changed_clip)
            assert torch.equal(changed[:, :, :start], out[:, :, :start]), \
                f"condition latents before {start} saw later condition frames"
            assert not torch.equal(changed[:, :, start:], out[:, :, start:])
