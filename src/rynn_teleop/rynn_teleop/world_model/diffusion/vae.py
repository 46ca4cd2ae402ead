"""Causal 3D VAE in the style of Wan2.2's video VAE.

Structure (mirrors Wan2.2, sizes from the :class:`~.presets.Preset`):

* 2x2 pixel unshuffle (3 -> 12 channels), then one level per ``vae_dims``
  entry; each level but the last ends in a 2x spatial downsampling, the last
  two of those also downsample time 2x: 16x16 spatial, 4x temporal in all.
* Residual blocks of causal 3D convolutions (kernel 3 in time, padded on the
  past only) with channel-wise RMS norms (no statistics across frames), a
  middle block with per-frame spatial self-attention, and a head giving the
  posterior mean and log-variance (``encode`` returns the mean).
* The decoder mirrors it at its own widths (``vae_decoder_dims``, wider in
  Wan2.2) with ``vae_decoder_res_blocks`` blocks per level; its temporal upsampling turns each latent frame
  after the first into 4 frames.
* Per-channel latent normalisation buffers (``latent_mean``/``latent_std``,
  set by training) map to the DiT's latent space.

Frame counts: a stream starts with 1 + 4k frames (the first frame is encoded
alone, then 4 frames per latent frame) and continues with 4k frames per call;
1 + k latent frames decode to 1 + 4k frames. Every temporal operation is
causal and keeps the frames it needs from the previous call in a
:class:`StreamState`, so encoding or decoding block by block gives the
whole-clip result.

Images are (B, 3, T, H, W) tensors in [-1, 1]; :func:`rgb_to_tensor` and
:func:`tensor_to_rgb` convert from/to RGB uint8 (H, W, 3) numpy frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .presets import Preset

CAUSAL_PAST = 2  # past frames a kernel-3 temporal convolution needs


@dataclass
class StreamState:
    """What the causal layers remember between calls of one stream.

    Attributes:
        frames: frames consumed so far (video frames for the encoder, latent
            frames for the decoder).
        features: per layer, the trailing input frames its next call needs.
    """

    frames: int = 0
    features: dict[nn.Module, torch.Tensor] = field(default_factory=dict)

    def clear(self) -> None:
        self.frames = 0
        self.features.clear()


class CausalConv3d(nn.Conv3d):
    """3D convolution padded on the past only in time ("same" in space).

    The first call of a stream pads with zeros; later calls prepend the last
    ``kernel_t - 1`` input frames of the previous call.
    """

    def __init__(self, cin: int, cout: int, kernel: tuple[int, int, int] = (3, 3, 3)) -> None:
        super().__init__(cin, cout, kernel, padding=(0, kernel[1] // 2, kernel[2] // 2))
        self.past = kernel[0] - 1

    def forward(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:  # type: ignore[override]
        if self.past:
            previous = state.features.get(self)
            if previous is None:
                previous = x.new_zeros(*x.shape[:2], self.past, *x.shape[3:])
            x = torch.cat([previous, x], dim=2)
            state.features[self] = x[:, :, -self.past:].clone()
        return super().forward(x)


class RMSNorm(nn.Module):
    """RMS norm over the channel axis (dim 1), per frame and pixel: causal in time."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = channels**0.5
        self.gamma = nn.Parameter(torch.ones(channels, 1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma


class ResidualBlock(nn.Module):
    """norm -> SiLU -> causal conv, twice, plus a (1x1x1 projected) shortcut."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = RMSNorm(cin), CausalConv3d(cin, cout)
        self.norm2, self.conv2 = RMSNorm(cout), CausalConv3d(cout, cout)
        self.shortcut = nn.Conv3d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)), state)
        h = self.conv2(F.silu(self.norm2(h)), state)
        return self.shortcut(x) + h


class FrameAttention(nn.Module):
    """Single-head self-attention over the pixels of each frame (never across frames)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = RMSNorm(channels)
        self.qkv = nn.Conv3d(channels, 3 * channels, 1)
        self.proj = nn.Conv3d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        qkv = self.qkv(self.norm(x)).permute(0, 2, 3, 4, 1).reshape(b * t, h * w, 3, c)
        out = F.scaled_dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
        return x + self.proj(out.reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3))


class MiddleBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.res1 = ResidualBlock(channels, channels)
        self.attn = FrameAttention(channels)
        self.res2 = ResidualBlock(channels, channels)

    def forward(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        return self.res2(self.attn(self.res1(x, state)), state)


class TemporalDownsample(nn.Module):
    """Halves the frame count after the first frame: 1 + 2m frames -> 1 + m.

    The first frame of a stream passes through alone; output j >= 1 is a
    kernel-3, stride-2 convolution over input frames 2j-2, 2j-1, 2j (the last
    frame of the previous call is remembered).
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(channels, channels, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        previous = state.features.get(self)
        first = previous is None
        if first:
            previous, x = x[:, :, :1], x[:, :, 1:]
        state.features[self] = x[:, :, -1:].clone() if x.shape[2] else previous.clone()
        out = self.conv(torch.cat([previous, x], dim=2)) if x.shape[2] else x
        return torch.cat([previous, out], dim=2) if first else out


class TemporalUpsample(nn.Module):
    """Doubles the frame count after the first frame: 1 + m frames -> 1 + 2m.

    A causal convolution gives two frames' channels per input frame; the first
    frame of a stream passes through alone.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = CausalConv3d(channels, 2 * channels, (3, 1, 1))

    def forward(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        first = self.conv not in state.features  # the convolution remembers its past once started
        b, c, t, h, w = x.shape
        pairs = self.conv(x, state).view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)
        return torch.cat([x[:, :, :1], pairs[:, :, 2:]], dim=2) if first else pairs


class SpatialDownsample(nn.Module):
    """2x spatial downsampling per frame (stride-2 3x3 convolution)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(channels, channels, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class SpatialUpsample(nn.Module):
    """2x spatial upsampling per frame (nearest neighbour, then a 3x3 convolution)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(channels, channels, (1, 3, 3), padding=(0, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=(1, 2, 2), mode="nearest"))


class EncoderLevel(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, downsample: bool, temporal: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock(cin if i == 0 else cout, cout) for i in range(blocks))
        self.spatial = SpatialDownsample(cout) if downsample else None
        self.temporal = TemporalDownsample(cout) if temporal else None

    def forward(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, state)
        if self.spatial is not None:
            x = self.spatial(x)
        if self.temporal is not None:
            x = self.temporal(x, state)
        return x


class DecoderLevel(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, upsample: bool, temporal: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock(cin if i == 0 else cout, cout) for i in range(blocks))
        self.temporal = TemporalUpsample(cout) if temporal else None
        self.spatial = SpatialUpsample(cout) if upsample else None

    def forward(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, state)
        if self.temporal is not None:
            x = self.temporal(x, state)
        if self.spatial is not None:
            x = self.spatial(x)
        return x


def _level_plan(dims: Sequence[int]) -> list[tuple[int, int, bool, bool]]:
    """(in, out, spatial 2x, temporal 2x) per encoder level: 2x spatial on all but the last, time on the last two
    of those."""
    levels = len(dims)
    return [
        (dims[max(i - 1, 0)], dims[i], i < levels - 1, levels - 3 <= i < levels - 1)
        for i in range(levels)
    ]


class Encoder(nn.Module):
    """RGB video (B, 3, T, H, W) -> posterior mean and log-variance (B, 2z, T', H/16, W/16)."""

    def __init__(self, preset: Preset) -> None:
        super().__init__()
        dims = preset.vae_dims
        self.conv_in = CausalConv3d(12, dims[0])
        self.levels = nn.ModuleList(
            EncoderLevel(cin, cout, preset.vae_res_blocks, down, temporal)
            for cin, cout, down, temporal in _level_plan(dims)
        )
        self.middle = MiddleBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1])
        self.conv_out = CausalConv3d(dims[-1], 2 * preset.latent_channels)

    def forward(self, video: torch.Tensor, state: StreamState) -> torch.Tensor:
        x = self.conv_in(_pixel_unshuffle(video), state)
        for level in self.levels:
            x = level(x, state)
        x = self.middle(x, state)
        return self.conv_out(F.silu(self.norm_out(x)), state)


class Decoder(nn.Module):
    """Latents (B, z, T', h, w) -> RGB video (B, 3, T, 16h, 16w)."""

    def __init__(self, preset: Preset) -> None:
        super().__init__()
        dims = preset.vae_decoder_dims
        self.conv_in = CausalConv3d(preset.latent_channels, dims[-1])
        self.middle = MiddleBlock(dims[-1])
        plan = _level_plan(dims)
        # mirror of the encoder: level j's blocks at its resolution, then the upsampling that undoes level j-1's
        self.levels = nn.ModuleList(
            DecoderLevel(dims[j], dims[max(j - 1, 0)], preset.vae_decoder_res_blocks,
                         *(plan[j - 1][2:] if j else (False, False)))
            for j in reversed(range(len(dims)))
        )
        self.norm_out = RMSNorm(dims[0])
        self.conv_out = CausalConv3d(dims[0], 12)

    def forward(self, latents: torch.Tensor, state: StreamState) -> torch.Tensor:
        x = self.middle(self.conv_in(latents, state), state)
        for level in self.levels:
            x = level(x, state)
        return _pixel_shuffle(self.conv_out(F.silu(self.norm_out(x)), state))


class CausalVAE(nn.Module):
    """The causal video VAE (see the module docstring)."""

    def __init__(self, preset: Preset) -> None:
        super().__init__()
        self.preset = preset
        self.encoder = Encoder(preset)
        self.decoder = Decoder(preset)
        shape = (1, preset.latent_channels, 1, 1, 1)
        self.register_buffer("latent_mean", torch.zeros(shape))
        self.register_buffer("latent_std", torch.ones(shape))

    def encode(self, video: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """Normalised posterior mean of ``video``.

        Args:
            video: (B, 3, T, H, W) in [-1, 1]; T = 1 + 4k at the start of a
                stream (``state`` None or fresh), 4k when continuing one.
            state: the stream's state, updated in place; None encodes a whole clip.

        Returns:
            (B, z, 1 + k or k, H/16, W/16) latents.

        Raises:
            ValueError: the frame count breaks the rule above, or H, W differ from the preset's.
        """
        state = StreamState() if state is None else state
        self._check_frames(video.shape[2], state)
        self._check_size(video.shape[-2:], (self.preset.height, self.preset.width), "video")
        posterior = self.encoder(video, state)
        state.frames += video.shape[2]
        mean = posterior[:, : self.preset.latent_channels]
        return (mean - self.latent_mean) / self.latent_std

    def decode(self, latents: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """Video of normalised ``latents`` (B, z, T', h, w): 1 + k latent frames -> 1 + 4k frames
        at the start of a stream, k -> 4k when continuing one. Values about [-1, 1] (not clamped).

        Raises:
            ValueError: no latent frames, or h, w differ from the preset's latent grid.
        """
        state = StreamState() if state is None else state
        if latents.shape[2] < 1:
            raise ValueError("the causal VAE decodes at least one latent frame per call")
        self._check_size(latents.shape[-2:], self.preset.latent_grid, "latents")
        video = self.decoder(latents * self.latent_std + self.latent_mean, state)
        state.frames += latents.shape[2]
        return video

    def _check_frames(self, count: int, state: StreamState) -> None:
        step = self.preset.temporal_compression
        if state.frames == 0:
            ok, rule = count >= 1 and (count - 1) % step == 0, f"1 + {step}k frames to start a stream"
        else:
            ok, rule = count >= step and count % step == 0, f"{step}k frames (k >= 1) to continue one"
        if not ok:
            raise ValueError(
                f"the causal VAE encodes {rule} (the first frame alone, then {step} frames per latent frame); "
                f"got {count}"
            )

    @staticmethod
    def _check_size(got: Sequence[int], expected: tuple[int, int], what: str) -> None:
        if tuple(got) != expected:
            raise ValueError(f"{what} of (rows, columns) {tuple(got)} do not match the preset's {expected}")


def _pixel_unshuffle(video: torch.Tensor) -> torch.Tensor:
    """(B, 3, T, H, W) -> (B, 12, T, H/2, W/2), 2x2 pixel blocks into channels."""
    b, c, t, h, w = video.shape
    x = video.view(b, c, t, h // 2, 2, w // 2, 2).permute(0, 1, 4, 6, 2, 3, 5)
    return x.reshape(b, 4 * c, t, h // 2, w // 2)


def _pixel_shuffle(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_pixel_unshuffle`."""
    b, c4, t, h, w = x.shape
    x = x.view(b, c4 // 4, 2, 2, t, h, w).permute(0, 1, 4, 5, 2, 6, 3)
    return x.reshape(b, c4 // 4, t, 2 * h, 2 * w)


def rgb_to_tensor(frames: Sequence[np.ndarray] | np.ndarray, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """RGB uint8 frames, each (H, W, 3), as one (1, 3, T, H, W) video in [-1, 1].

    Raises:
        ValueError: a frame is not (H, W, 3) uint8, or the frames differ in size.
    """
    stacked = frames if isinstance(frames, np.ndarray) else np.stack([np.asarray(f) for f in frames])
    if stacked.ndim == 3:
        stacked = stacked[None]
    if stacked.ndim != 4 or stacked.shape[-1] != 3 or stacked.dtype != np.uint8:
        raise ValueError(f"expected RGB uint8 frames of shape (H, W, 3), got {stacked.dtype} {stacked.shape[1:]}")
    pixels = torch.from_numpy(np.ascontiguousarray(stacked)).to(device).permute(3, 0, 1, 2).unsqueeze(0)
    return pixels_to_tensor(pixels, dtype)


def pixels_to_tensor(pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 (1, 3, T, H, W) pixels -> video in [-1, 1]."""
    return (pixels.to(dtype) / 127.5 - 1.0).contiguous()


def tensor_to_pixels(video: torch.Tensor) -> torch.Tensor:
    """A video in [-1, 1] (clamped) -> uint8 pixels of the same shape, on the same device."""
    return ((video.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)


def pixels_to_rgb(pixels: torch.Tensor) -> list[np.ndarray]:
    """uint8 (1, 3, T, H, W) pixels -> T RGB uint8 (H, W, 3) numpy frames."""
    array = pixels[0].permute(1, 2, 3, 0).cpu().numpy()
    return [np.ascontiguousarray(frame) for frame in array]


def tensor_to_rgb(video: torch.Tensor) -> list[np.ndarray]:
    """A (1, 3, T, H, W) video in [-1, 1] (clamped) as T RGB uint8 (H, W, 3) frames."""
    return pixels_to_rgb(tensor_to_pixels(video))
