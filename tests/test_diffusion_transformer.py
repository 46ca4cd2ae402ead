"""Block-causal DiT on the tiny preset: control-branch zero init, mask, cached = full-sequence attention."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from rynn_teleop.world_model.diffusion.presets import TINY, Preset
from rynn_teleop.world_model.diffusion.transformer import DiT, block_causal_mask

Z = TINY.latent_channels
GRID = TINY.latent_grid
# blocks of 2 latent frames and a window of 3: blocks straddle the ring's wrap-around
WIDE = dataclasses.replace(TINY, block_frames=2, sink_frames=1, window_frames=3)


def make_dit(preset: Preset, seed: int = 0, control: bool = True) -> DiT:
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    dit = DiT(preset).eval().requires_grad_(False)
    if control:  # a trained control branch is not zero
        torch.nn.init.normal_(dit.control_embed.weight, std=0.2)
    return dit


def latents(frames: int, seed: int) -> torch.Tensor:
    return torch.randn(1, Z, frames, *GRID, generator=torch.Generator().manual_seed(seed))


def test_control_branch_starts_as_identity():
    dit = make_dit(TINY, control=False)
    assert torch.count_nonzero(dit.control_embed.weight) == 0 and torch.count_nonzero(dit.control_embed.bias) == 0
    assert dit.control_scale.item() == pytest.approx(0.1)
    x, t = latents(3, 0), torch.tensor([[0.0, 500.0, 500.0]])
    out_a = dit(x, latents(3, 1), t)
    out_b = dit(x, latents(3, 2), t)
    assert torch.equal(out_a, out_b)  # bit-identical: the condition has no effect at initialisation
    assert torch.equal(out_a, dit(x, torch.zeros_like(x), t))
    trained = make_dit(TINY, control=True)
    assert not torch.equal(trained(x, latents(3, 1), t), trained(x, latents(3, 2), t))


def test_block_causal_mask():
    mask = block_causal_mask(8, block_frames=2, sink_frames=1, window_frames=3)
    # blocks: [0] [1 2] [3 4] [5 6] [7]
    assert mask[0].tolist() == [True] + [False] * 7
    assert mask[1].tolist() == mask[2].tolist() == [True, True, True, False, False, False, False, False]
    assert mask[5].tolist() == [True, False, True, True, True, True, True, False]  # sink, window 2..4, own block
    assert mask[7].tolist() == [True, False, False, False, True, True, True, True]
    assert mask.diagonal().all()


@pytest.mark.parametrize("preset, frames", [(TINY, 3), (TINY, 8), (WIDE, 9)], ids=["within-capacity", "evicting",
                                                                                   "two-frame-blocks"])
def test_cached_generation_equals_full_pass(preset, frames):
    """Commit passes block by block give the full pass's output; a noisy block read against the
    cache gives the full pass's output for that block behind clean context."""
    dit = make_dit(preset)
    x, c = latents(frames, 3), latents(frames, 4)
    full = dit(x, c, torch.zeros(1, frames))
    cache = dit.make_cache()
    bounds = [0, 1] + list(range(1 + preset.block_frames, frames, preset.block_frames)) + [frames]
    noisy_level = 600.0
    for lo, hi in itertools.pairwise(bounds):
        n = hi - lo
        if lo > 0:  # denoising read: noisy block behind clean context, cache unchanged
            noisy = latents(n, 100 + lo)
            reference = dit(torch.cat([x[:, :, :lo], noisy], 2), c[:, :, :hi],
                            torch.cat([torch.zeros(1, lo), torch.full((1, n), noisy_level)], 1))[:, :, lo:]
            read = dit.forward_block(noisy, c[:, :, lo:hi], torch.full((1, n), noisy_level), cache, commit=False)
            torch.testing.assert_close(read, reference, rtol=1e-4, atol=1e-5)
        step = dit.forward_block(x[:, :, lo:hi], c[:, :, lo:hi], torch.zeros(1, n), cache, commit=True)
        torch.testing.assert_close(step, full[:, :, lo:hi], rtol=1e-4, atol=1e-5)
    assert cache.committed == frames


def test_positions_beyond_a_chunk_are_refused():
    short = dataclasses.replace(TINY, chunk_frames=9)  # 3 latent frames per chunk
    dit = make_dit(short)
    with pytest.raises(ValueError, match="re-anchor"):
        dit(latents(4, 0), latents(4, 1), torch.zeros(1, 4))
