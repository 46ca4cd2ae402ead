"""Causal 3D VAE on the tiny preset: frame-count rules, causality, block-wise = whole-clip streaming."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.diffusion.vae import (
    CausalVAE,
    StreamState,
    rgb_to_tensor,
    tensor_to_rgb,
)

H, W, Z = TINY.height, TINY.width, TINY.latent_channels
h, w = TINY.latent_grid


@pytest.fixture(scope="module")
def vae() -> CausalVAE:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    return CausalVAE(TINY).eval().requires_grad_(False)


def video(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(1, 3, frames, H, W, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("k", [0, 1, 3])
def test_one_plus_4k_frames_give_one_plus_k_latent_frames(vae, k):
    latents = vae.encode(video(1 + 4 * k))
    assert latents.shape == (1, Z, 1 + k, h, w)
    assert vae.decode(latents).shape == (1, 3, 1 + 4 * k, H, W)


@pytest.mark.parametrize("frames", [2, 3, 4, 8])
def test_other_frame_counts_are_refused(vae, frames):
    with pytest.raises(ValueError, match=r"1 \+ 4k frames to start a stream"):
        vae.encode(video(frames))


def test_continuing_a_stream_takes_4k_frames(vae):
    state = StreamState()
    vae.encode(video(1), state)
    with pytest.raises(ValueError, match=r"4k frames \(k >= 1\) to continue"):
        vae.encode(video(5), state)
    assert vae.encode(video(8), state).shape[2] == 2


def test_wrong_image_size_is_refused(vae):
    with pytest.raises(ValueError, match="do not match"):
        vae.encode(torch.zeros(1, 3, 1, W, H))


def test_block_wise_encode_equals_whole_clip(vae):
    clip = video(1 + 4 * 3)
    whole = vae.encode(clip)
    state = StreamState()
    parts = [vae.encode(clip[:, :, :1], state)]
    parts += [vae.encode(clip[:, :, 1 + 4 * i: 5 + 4 * i], state) for i in range(3)]
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=1e-5, atol=1e-5)  # float32: summation order differs
    # uneven blocks (1 + 8 frames, then 4) give the same as well
    state = StreamState()
    parts = [vae.encode(clip[:, :, :9], state), vae.encode(clip[:, :, 9:], state)]
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=1e-5, atol=1e-5)  # float32: summation order differs


def test_block_wise_decode_equals_whole_clip(vae):
    latents = torch.randn(1, Z, 4, h, w, generator=torch.Generator().manual_seed(1))
    whole = vae.decode(latents)
    state = StreamState()
    parts = [vae.decode(latents[:, :, i: i + 1], state) for i in range(4)]
    assert [p.shape[2] for p in parts] == [1, 4, 4, 4]
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=1e-5, atol=1e-5)  # float32: summation order differs


def test_encoder_and_decoder_are_causal(vae):
    clip = video(1 + 4 * 3)
    changed = clip.clone()
    changed[:, :, 5:] = -clip[:, :, 5:]  # frames of latent frames 2 and 3
    a, b = vae.encode(clip), vae.encode(changed)
    assert torch.equal(a[:, :, :2], b[:, :, :2])
    assert not torch.equal(a[:, :, 2:], b[:, :, 2:])
    latents = torch.randn(1, Z, 4, h, w, generator=torch.Generator().manual_seed(2))
    later = latents.clone()
    later[:, :, 3] += 1.0
    assert torch.equal(vae.decode(latents)[:, :, :9], vae.decode(later)[:, :, :9])


def test_rgb_round_trip():
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(3)]
    tensor = rgb_to_tensor(frames)
    assert tensor.shape == (1, 3, 3, H, W) and tensor.min() >= -1 and tensor.max() <= 1
    assert all(np.array_equal(a, b) for a, b in zip(tensor_to_rgb(tensor), frames))
    assert tensor_to_rgb(torch.full((1, 3, 1, 2, 2), 5.0))[0].tolist() == [[[255] * 3] * 2] * 2  # clamped
    with pytest.raises(ValueError, match="uint8"):
        rgb_to_tensor([np.zeros((H, W, 3), dtype=np.float32)])
