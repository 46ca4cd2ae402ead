"""StreamingVAE on a tiny diffusers AutoencoderKLWan: streaming == one-shot == diffusers, stream isolation, rules."""

from __future__ import annotations

import inspect
from types import MappingProxyType

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan
from diffusion_configs import PAPER_VAE_CONFIG, tiny_vae_config

from rynn_teleop.world_model.diffusion.vae import StreamingVAE, VAEStream, pixels_to_rgb, rgb_to_pixels

H, W = 32, 48  # not square, so that row/column mix-ups fail the tests
Z = 48
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def svae() -> StreamingVAE:
    torch.manual_seed(0)
    return StreamingVAE(AutoencoderKLWan(**tiny_vae_config()).eval().requires_grad_(False))


def video(frames: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.rand(batch, 3, frames, H, W, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def latents(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, Z, frames, H // 16, W // 16, generator=torch.Generator().manual_seed(seed))


def config_stats(vae: AutoencoderKLWan) -> tuple[torch.Tensor, torch.Tensor]:
    mean = torch.tensor(vae.config.latents_mean).view(1, Z, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, Z, 1, 1, 1)
    return mean, std


@pytest.mark.parametrize("k", [0, 1, 3])
def test_encode_equals_diffusers_normalised_posterior_mean(svae, k):
    clip = video(1 + 4 * k)
    ours = svae.encode(clip)
    assert ours.shape == (1, Z, 1 + k, H // 16, W // 16)
    mean, std = config_stats(svae.vae)
    with torch.no_grad():
        reference = (svae.vae.encode(clip).latent_dist.mean - mean) / std
    torch.testing.assert_close(ours, reference, **TOL)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_decode_equals_diffusers_after_denormalising(svae, n):
    z = latents(n)
    ours = svae.decode(z)
    assert ours.shape == (1, 3, 1 + 4 * (n - 1), H, W)
    assert ours.min() >= -1.0 and ours.max() <= 1.0
    mean, std = config_stats(svae.vae)
    with torch.no_grad():
        reference = svae.vae.decode(z * std + mean).sample
    torch.testing.assert_close(ours, reference, **TOL)


def test_streaming_encode_equals_one_shot(svae):
    clip = video(1 + 4 * 4)
    whole = svae.encode(clip)
    stream = svae.new_stream()
    parts = [svae.encode(clip[:, :, :5], stream), svae.encode(clip[:, :, 5:9], stream),
             svae.encode(clip[:, :, 9:], stream)]  # 1 + 4, then 4, then 8 frames
    assert [p.shape[2] for p in parts] == [2, 1, 2]
    assert stream.frames == 17 and stream.role == "encode"
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, **TOL)


def test_streaming_encode_can_start_with_one_frame(svae):
    clip = video(1 + 4 * 2, seed=3)
    stream = svae.new_stream()
    parts = [svae.encode(clip[:, :, :1], stream)] + [svae.encode(clip[:, :, t:t + 4], stream) for t in (1, 5)]
    torch.testing.assert_close(torch.cat(parts, dim=2), svae.encode(clip), **TOL)


def test_streaming_decode_equals_one_shot(svae):
    z = latents(5)
    whole = svae.decode(z)
    stream = svae.new_stream()
    frames = [svae.decode(z[:, :, i:i + 1], stream) for i in range(5)]
    assert [f.shape[2] for f in frames] == [1, 4, 4, 4, 4]
    torch.testing.assert_close(torch.cat(frames, dim=2), whole, **TOL)
    uneven = svae.new_stream()
    chunks = [svae.decode(z[:, :, a:b], uneven) for a, b in ((0, 2), (2, 3), (3, 5))]
    torch.testing.assert_close(torch.cat(chunks, dim=2), whole, **TOL)


def test_two_streams_do_not_share_state(svae):
    clip_a, clip_b = video(9, seed=1), video(9, seed=2)
    alone_a, alone_b = svae.encode(clip_a), svae.encode(clip_b)
    sa, sb = svae.new_stream(), svae.new_stream()
    out_a, out_b = [], []
    for a, b in ((0, 1), (1, 5), (5, 9)):
        out_a.append(svae.encode(clip_a[:, :, a:b], sa))
        out_b.append(svae.encode(clip_b[:, :, a:b], sb))
    torch.testing.assert_close(torch.cat(out_a, dim=2), alone_a, **TOL)
    torch.testing.assert_close(torch.cat(out_b, dim=2), alone_b, **TOL)

    z_a, z_b = latents(3, seed=1), latents(3, seed=2)
    da, db = svae.new_stream(), svae.new_stream()
    dec_a, dec_b = [], []
    for i in range(3):
        dec_a.append(svae.decode(z_a[:, :, i:i + 1], da))
        dec_b.append(svae.decode(z_b[:, :, i:i + 1], db))
    torch.testing.assert_close(torch.cat(dec_a, dim=2), svae.decode(z_a), **TOL)
    torch.testing.assert_close(torch.cat(dec_b, dim=2), svae.decode(z_b), **TOL)


def test_batches_stream_like_single_videos(svae):
    clip = video(5, seed=4, batch=2)
    both = svae.encode(clip)
    torch.testing.assert_close(both[1:], svae.encode(clip[1:]), **TOL)


@pytest.mark.parametrize("frames", [0, 2, 3, 4, 8])
def test_a_new_stream_needs_1_plus_4k_frames(svae, frames):
    stream = svae.new_stream()
    with pytest.raises(ValueError, match=r"1 \+ 4k frames to start a stream"):
        svae.encode(video(frames), stream)
    assert stream.role is None and not stream.started  # a refused call leaves the stream untouched
    with pytest.raises(ValueError, match=r"1 \+ 4k frames to start a stream"):
        svae.encode(video(frames))


@pytest.mark.parametrize("frames", [1, 3, 5])
def test_a_continuing_stream_needs_4k_frames(svae, frames):
    stream = svae.new_stream()
    svae.encode(video(1), stream)
    with pytest.raises(ValueError, match=r"4k frames \(k >= 1\) to continue"):
        svae.encode(video(frames), stream)
    assert svae.encode(video(8), stream).shape[2] == 2


@pytest.mark.parametrize("rows, cols", [(24, 48), (32, 40), (8, 8)])
def test_image_sides_must_be_multiples_of_16(svae, rows, cols):
    with pytest.raises(ValueError, match="multiples of 16"):
        svae.encode(torch.zeros(1, 3, 1, rows, cols))
    with pytest.raises(ValueError, match="multiples of 16"):
        rgb_to_pixels([np.zeros((rows, cols, 3), np.uint8)])
    with pytest.raises(ValueError, match="multiples of 16"):
        pixels_to_rgb(torch.zeros(1, 3, 1, rows, cols))


def test_shape_errors(svae):
    with pytest.raises(ValueError, match=r"\(B, 3, T, H, W\)"):
        svae.encode(torch.zeros(1, 4, 1, H, W))
    with pytest.raises(ValueError, match=r"\(B, 48, n >= 1, h, w\)"):
        svae.decode(torch.zeros(1, 16, 1, 2, 3))
    with pytest.raises(ValueError, match=r"\(B, 48, n >= 1, h, w\)"):
        svae.decode(torch.zeros(1, Z, 0, 2, 3))
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        rgb_to_pixels([np.zeros((H, W, 3), np.float32)])
    with pytest.raises(ValueError, match=r"\(1, 3, T, H, W\)"):
        pixels_to_rgb(torch.zeros(2, 3, 1, H, W))


def test_a_stream_keeps_its_role_and_sizes(svae):
    stream = svae.new_stream()
    svae.encode(video(1), stream)
    with pytest.raises(ValueError, match="'encode' stream"):
        svae.decode(latents(1), stream)
    with pytest.raises(ValueError, match=r"keeps its \(batch, rows, columns\)"):
        svae.encode(video(4, batch=2), stream)
    stream.reset()
    assert stream.role is None and stream.frames == 0
    assert svae.decode(latents(1), stream).shape == (1, 3, 1, H, W)
    other = StreamingVAE(AutoencoderKLWan(**{**tiny_vae_config(), "num_res_blocks": 2}))
    with pytest.raises(ValueError, match="another VAE"):
        other.decode(latents(1), stream)


def test_normalise_denormalise_round_trip(svae):
    mu = torch.randn(2, Z, 3, 2, 3, generator=torch.Generator().manual_seed(5))
    mean, std = config_stats(svae.vae)
    torch.testing.assert_close(svae.normalise(mu), (mu - mean) / std)
    torch.testing.assert_close(svae.denormalise(svae.normalise(mu)), mu)
    torch.testing.assert_close(svae.normalise(svae.denormalise(mu)), mu)


def test_rgb_pixel_round_trip():
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(3)]
    pixels = rgb_to_pixels(frames)
    assert pixels.shape == (1, 3, 3, H, W) and pixels.dtype == torch.float32
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0
    assert pixels[0, :, 1, 2, 5].tolist() == pytest.approx((frames[1][2, 5] / 127.5 - 1.0).tolist())
    back = pixels_to_rgb(pixels)
    assert len(back) == 3 and all(b.dtype == np.uint8 and b.shape == (H, W, 3) for b in back)
    assert all(np.array_equal(a, b) for a, b in zip(frames, back, strict=True))
    assert np.array_equal(pixels_to_rgb(torch.full((1, 3, 1, H, W), 3.0))[0], np.full((H, W, 3), 255, np.uint8))


def test_tiny_config_is_seeded_wan22_structure():
    cfg = tiny_vae_config()
    assert cfg == tiny_vae_config() and cfg != tiny_vae_config(seed=1)
    assert len(cfg["latents_mean"]) == len(cfg["latents_std"]) == Z and min(cfg["latents_std"]) > 0
    for key in ("z_dim", "patch_size", "is_residual", "in_channels", "out_channels", "dim_mult",
                "temperal_downsample", "scale_factor_spatial", "scale_factor_temporal"):
        assert cfg[key] == PAPER_VAE_CONFIG[key], key


def test_paper_config_builds_the_wan22_vae():
    accepted = set(inspect.signature(AutoencoderKLWan.__init__).parameters) - {"self"}
    assert set(PAPER_VAE_CONFIG) - accepted == {"_class_name", "clip_output"}
    assert len(PAPER_VAE_CONFIG["latents_mean"]) == len(PAPER_VAE_CONFIG["latents_std"]) == Z
    with torch.device("meta"):  # shapes only: no memory for the ~0.7 B parameters
        paper = StreamingVAE.from_config(PAPER_VAE_CONFIG)
    assert paper.latent_channels == Z and paper.patch_size == 2
    assert paper.vae.encoder.conv_in.in_channels == 12 and paper.vae.decoder.conv_out.out_channels == 12
    assert paper.vae.encoder.conv_in.out_channels == 160 and paper.vae.decoder.conv_in.out_channels == 1024


@pytest.fixture(scope="module")
def svae8() -> StreamingVAE:
    """One 2x level fewer (``dim_mult`` (1, 2, 2)): 8x8 spatial compression, still 4x in time."""
    torch.manual_seed(0)
    config = {**tiny_vae_config(), "dim_mult": [1, 2, 2], "temperal_downsample": [True, True],
              "scale_factor_spatial": 8}
    return StreamingVAE(AutoencoderKLWan(**config).eval().requires_grad_(False))


def test_an_8x_vae_streams_like_its_one_shot_and_like_diffusers(svae8):
    assert svae8.spatial_compression == 8 and svae8.latent_channels == Z
    clip = video(1 + 4 * 3, seed=7)
    whole = svae8.encode(clip)
    assert whole.shape == (1, Z, 4, H // 8, W // 8)
    mean, std = config_stats(svae8.vae)
    with torch.no_grad():
        reference = (svae8.vae.encode(clip).latent_dist.mean - mean) / std
    torch.testing.assert_close(whole, reference, **TOL)
    stream = svae8.new_stream()
    parts = [svae8.encode(clip[:, :, :5], stream), svae8.encode(clip[:, :, 5:], stream)]
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, **TOL)
    decoded = svae8.decode(whole)
    assert decoded.shape == (1, 3, 13, H, W)
    stream = svae8.new_stream()
    frames = [svae8.decode(whole[:, :, i:i + 1], stream) for i in range(4)]
    torch.testing.assert_close(torch.cat(frames, dim=2), decoded, **TOL)
    with pytest.raises(ValueError, match="multiples of 8"):
        svae8.encode(torch.zeros(1, 3, 1, H + 4, W))
    svae8.encode(torch.zeros(1, 3, 1, H + 8, W))  # 40 rows: a multiple of 8, not of 16


def test_a_vae_of_another_spatial_compression_is_refused():
    config = {**tiny_vae_config(), "dim_mult": [1, 2, 4, 4, 4], "temperal_downsample": [False, False, True, True],
              "scale_factor_spatial": 32}
    with pytest.raises(ValueError, match=r"8x or 16x spatial.*got patch_size=2, 32x spatial, 4x temporal"):
        StreamingVAE(AutoencoderKLWan(**config))


def test_a_wan21_layout_vae_is_refused():
    wan21 = AutoencoderKLWan(base_dim=4, z_dim=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    with pytest.raises(ValueError, match="Wan2.2-layout VAE"):
        StreamingVAE(wan21)


def test_from_pretrained_loads_a_saved_vae(svae, tmp_path):
    svae.vae.save_pretrained(tmp_path / "vae")
    loaded = StreamingVAE.from_pretrained(str(tmp_path), subfolder="vae")
    clip = video(5, seed=6)
    torch.testing.assert_close(loaded.encode(clip), svae.encode(clip), rtol=0, atol=0)
    assert isinstance(svae.new_stream(), VAEStream)


def test_from_config_takes_read_only_json_like_configs():
    frozen = MappingProxyType({key: tuple(v) if isinstance(v, list) else v for key, v in tiny_vae_config().items()})
    torch.manual_seed(0)
    built = StreamingVAE.from_config(frozen)
    assert list(built.vae.config.dim_mult) == [1, 2, 4, 4] and built.latent_channels == Z
