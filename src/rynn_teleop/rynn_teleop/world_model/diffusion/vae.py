"""Streaming encode/decode on diffusers' Wan2.2 VAE (``AutoencoderKLWan``).

:class:`StreamingVAE` runs the VAE's own encoder and decoder modules in the chunks that
``AutoencoderKLWan.encode``/``decode`` use (encode: the first frame alone, then 4 frames per latent frame;
decode: one latent frame per step), but keeps the causal-convolution caches in a :class:`VAEStream` owned by
the caller, so a video can be encoded or decoded call by call and gives the one-shot result.

Shapes: pixels (B, 3, T, H, W) in [-1, 1] with H, W multiples of s; latents (B, z, t, H/s, W/s) with s the
VAE's spatial compression (16 for Wan2.2's layout; 8 with one 2x level fewer, the stand-in ``small8`` preset's)
and z the config's ``z_dim`` (48 for Wan2.2), normalised per channel with the config's ``latents_mean`` and
``latents_std`` as diffusers' Wan pipelines do.
A stream starts with 1 + 4k frames (-> 1 + k latent frames) and continues with 4k frames (-> k).
:func:`rgb_to_pixels`/:func:`pixels_to_rgb` convert from/to RGB uint8 (H, W, 3) frames.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, patchify, unpatchify

from .presets import json_like

SPATIAL_COMPRESSION = 16  # [pixels per latent cell] along rows and columns (patch 2, then three 2x levels)
#: the spatial compressions a StreamingVAE takes [pixels per latent cell]: Wan2.2's, and one 2x level fewer
SPATIAL_COMPRESSIONS = (8, SPATIAL_COMPRESSION)
TEMPORAL_COMPRESSION = 4  # [frames per latent frame] after the first frame
LATENT_CHANNELS = 48  # z_dim of the Wan2.2 VAE

Role = Literal["encode", "decode"]

@dataclass(eq=False)
class VAEStream:
    """The causal-convolution caches of ONE encoder or decoder stream, kept between calls.

    Made by :meth:`StreamingVAE.new_stream`; the first ``encode`` or ``decode`` call binds it to that role.

    Attributes:
        role: ``"encode"`` or ``"decode"`` once used, None before.
        feat_cache: diffusers' cache list, one slot per ``WanCausalConv3d`` of the encoder or decoder.
        frames: input frames consumed so far (pixel frames when encoding, latent frames when decoding).
        signature: (batch, rows, columns) of the inputs, fixed by the first call.
    """

    role: Role | None = None
    feat_cache: list[Any] = field(default_factory=list)
    frames: int = 0
    signature: tuple[int, int, int] | None = None

    @property
    def started(self) -> bool:
        """True once the stream has consumed input; its next call continues it."""
        return self.frames > 0

    def reset(self) -> None:
        """Forget everything: the next call starts a new stream (in either role)."""
        self.role, self.feat_cache, self.frames, self.signature = None, [], 0, None


class StreamingVAE:
    """Streaming Wan2.2 VAE over a diffusers ``AutoencoderKLWan`` (see the module docstring).

    The wrapper has no weights of its own; ``vae`` stays the caller's module (device, dtype, ``save_pretrained``).
    Encoding and decoding run without autograd (the VAE is frozen here) and without diffusers' spatial tiling.

    Raises:
        ValueError: ``vae`` does not compress 16x16 or 8x8 (:data:`SPATIAL_COMPRESSIONS`) in space, 4x in time,
            or uses the Wan2.1 layout (``patch_size`` None).
    """

    def __init__(self, vae: AutoencoderKLWan) -> None:
        config = vae.config
        spatial = (config.patch_size or 1) * 2 ** (len(config.dim_mult) - 1)
        temporal = 2 ** sum(bool(flag) for flag in config.temperal_downsample)
        if config.patch_size is None or spatial not in SPATIAL_COMPRESSIONS or temporal != TEMPORAL_COMPRESSION:
            raise ValueError(
                f"StreamingVAE needs a Wan2.2-layout VAE (patch_size set, "
                f"{' or '.join(f'{s}x' for s in SPATIAL_COMPRESSIONS)} spatial, "
                f"{TEMPORAL_COMPRESSION}x temporal compression); got patch_size={config.patch_size}, "
                f"{spatial}x spatial, {temporal}x temporal"
            )
        self.vae = vae
        self.spatial_compression: int = spatial  # [pixels per latent cell], each axis
        self.latent_channels: int = config.z_dim
        self.patch_size: int = config.patch_size
        self._conv_counts: dict[Role, int] = {
            "encode": sum(isinstance(m, WanCausalConv3d) for m in vae.encoder.modules()),
            "decode": sum(isinstance(m, WanCausalConv3d) for m in vae.decoder.modules()),
        }
        shape = (1, config.z_dim, 1, 1, 1)
        self._mean = torch.tensor(config.latents_mean, dtype=torch.float32).view(shape)
        self._std = torch.tensor(config.latents_std, dtype=torch.float32).view(shape)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> StreamingVAE:
        """A randomly initialised VAE built by ``AutoencoderKLWan.from_config(config)``.

        ``config`` is JSON-like; tuples (of read-only presets) are passed on as the lists diffusers expects.
        """
        return cls(AutoencoderKLWan.from_config(json_like(config)))

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> StreamingVAE:
        """``AutoencoderKLWan.from_pretrained(path, **kwargs)`` (e.g. ``subfolder="vae"``, ``torch_dtype``)."""
        return cls(AutoencoderKLWan.from_pretrained(path, **kwargs))

    @property
    def device(self) -> torch.device:
        """The VAE's device; inputs are moved there."""
        return self.vae.device

    @property
    def dtype(self) -> torch.dtype:
        """The VAE's parameter dtype; inputs are cast to it and outputs come in it."""
        return self.vae.dtype

    def new_stream(self) -> VAEStream:
        """An empty stream; pass it to every ``encode`` (or every ``decode``) call of one video."""
        return VAEStream()

    # latent normalisation ---------------------------------------------------------------------------------

    def normalise(self, mean: torch.Tensor) -> torch.Tensor:
        """Posterior mean (B, z, t, h, w) -> normalised latents ``(mean - latents_mean) / latents_std``."""
        return (mean - self._mean.to(mean.device, mean.dtype)) / self._std.to(mean.device, mean.dtype)

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`normalise`: ``latents * latents_std + latents_mean``."""
        return latents * self._std.to(latents.device, latents.dtype) + self._mean.to(latents.device, latents.dtype)

    # streaming --------------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor, stream: VAEStream | None = None) -> torch.Tensor:
        """Normalised posterior mean of ``pixels`` (no sampling).

        Args:
            pixels: (B, 3, T, H, W) in [-1, 1], H and W multiples of s (``spatial_compression``); cast to the
                VAE's device and dtype.
                T = 1 + 4k (k >= 0) on a new stream, T = 4k (k >= 1) on a continuing one.
            stream: an encoder stream, updated in place; None encodes a one-shot clip.

        Returns:
            (B, z, 1 + k or k, H/s, W/s) latents in the VAE's dtype (z = ``z_dim``, 48 for Wan2.2).

        Raises:
            ValueError: the shape or frame count breaks the rules above, or ``stream`` belongs to the
                decoder, to another batch or image size, or to another VAE.
        """
        if pixels.ndim != 5 or pixels.shape[1] != 3:
            raise ValueError(f"encode takes pixels of shape (B, 3, T, H, W); got {tuple(pixels.shape)}")
        batch, _, frames, rows, cols = pixels.shape
        _check_image_size(rows, cols, self.spatial_compression)
        stream = VAEStream() if stream is None else stream
        step = TEMPORAL_COMPRESSION
        if not stream.started:
            ok, rule = frames >= 1 and (frames - 1) % step == 0, f"1 + {step}k frames to start a stream"
        else:
            ok, rule = frames >= step and frames % step == 0, f"{step}k frames (k >= 1) to continue one"
        if not ok:
            raise ValueError(
                f"the Wan VAE encodes {rule} (the first frame alone, then {step} frames per latent frame); "
                f"got {frames}"
            )
        self._bind(stream, "encode", (batch, rows, cols))
        x = patchify(pixels.to(self.device, self.dtype).contiguous(), patch_size=self.patch_size)
        first = 0 if stream.started else 1  # a new stream encodes its first frame alone
        pieces = [x[:, :, :first]] if first else []
        pieces += [x[:, :, start:start + step] for start in range(first, frames, step)]
        outs = [self.vae.encoder(piece, feat_cache=stream.feat_cache, feat_idx=[0]) for piece in pieces]
        stream.frames += frames
        moments = self.vae.quant_conv(torch.cat(outs, dim=2))
        mean = moments[:, : self.latent_channels]
        return self.normalise(mean)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, stream: VAEStream | None = None) -> torch.Tensor:
        """Video of normalised ``latents``.

        Args:
            latents: (B, z, n, h, w), z = ``z_dim``, n >= 1; cast to the VAE's device and dtype.
            stream: a decoder stream, updated in place; None decodes a one-shot clip.

        Returns:
            (B, 3, T, s h, s w) in [-1, 1] (clamped), T = 1 + 4(n - 1) on a new stream, 4n on a continuing one.

        Raises:
            ValueError: the shape breaks the rules above, or ``stream`` belongs to the encoder, to another
                batch or latent size, or to another VAE.
        """
        if latents.ndim != 5 or latents.shape[1] != self.latent_channels or latents.shape[2] < 1:
            raise ValueError(
                f"decode takes latents of shape (B, {self.latent_channels}, n >= 1, h, w); got {tuple(latents.shape)}"
            )
        batch, _, count, rows, cols = latents.shape
        stream = VAEStream() if stream is None else stream
        self._bind(stream, "decode", (batch, rows, cols))
        x = self.vae.post_quant_conv(self.denormalise(latents.to(self.device, self.dtype)))
        outs = []
        for i in range(count):
            first = not stream.started and i == 0
            outs.append(self.vae.decoder(x[:, :, i:i + 1], feat_cache=stream.feat_cache, feat_idx=[0],
                                         first_chunk=first))
        stream.frames += count
        video = unpatchify(torch.cat(outs, dim=2), patch_size=self.patch_size)
        return video.clamp(-1.0, 1.0)

    def _bind(self, stream: VAEStream, role: Role, signature: tuple[int, int, int]) -> None:
        """Give a fresh stream its role and caches; check a used one matches ``role`` and ``signature``."""
        if stream.role is None:
            stream.role, stream.signature = role, signature
            stream.feat_cache = [None] * self._conv_counts[role]
            return
        if stream.role != role:
            raise ValueError(f"this VAEStream is a {stream.role!r} stream; it cannot be used to {role}")
        if len(stream.feat_cache) != self._conv_counts[role]:
            raise ValueError("this VAEStream was made for another VAE (its cache has another number of slots)")
        if stream.signature != signature:
            raise ValueError(
                f"a stream keeps its (batch, rows, columns) {stream.signature}; got {signature}"
            )


def _check_image_size(rows: int, cols: int, multiple: int = SPATIAL_COMPRESSION) -> None:
    if rows <= 0 or cols <= 0 or rows % multiple or cols % multiple:
        raise ValueError(
            f"image rows and columns must be positive multiples of {multiple} "
            f"(the VAE's spatial compression); got {rows} x {cols}"
        )


def rgb_to_pixels(frames: Sequence[np.ndarray] | np.ndarray, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """RGB uint8 frames, each (H, W, 3), as one (1, 3, T, H, W) video in [-1, 1] (``v / 127.5 - 1``).

    Raises:
        ValueError: no frames, a frame is not (H, W, 3) uint8, the frames differ in size, or H, W are not
            multiples of 16.
    """
    if len(frames) == 0:
        raise ValueError("rgb_to_pixels needs at least one frame")
    stacked = frames if isinstance(frames, np.ndarray) else np.stack([np.asarray(f) for f in frames])
    if stacked.ndim != 4 or stacked.shape[-1] != 3 or stacked.dtype != np.uint8:
        raise ValueError(f"expected RGB uint8 frames of shape (H, W, 3); got {stacked.dtype} {stacked.shape[1:]}")
    _check_image_size(stacked.shape[1], stacked.shape[2])
    pixels = torch.from_numpy(np.ascontiguousarray(stacked)).to(device).permute(3, 0, 1, 2).unsqueeze(0)
    return (pixels.to(dtype) / 127.5 - 1.0).contiguous()


def pixels_to_rgb(pixels: torch.Tensor) -> list[np.ndarray]:
    """A (1, 3, T, H, W) video in [-1, 1] (clamped) as T RGB uint8 (H, W, 3) frames (``round((v + 1) * 127.5)``).

    Raises:
        ValueError: the shape is not (1, 3, T, H, W) or H, W are not multiples of 16.
    """
    if pixels.ndim != 5 or pixels.shape[0] != 1 or pixels.shape[1] != 3:
        raise ValueError(f"pixels_to_rgb takes a (1, 3, T, H, W) video; got {tuple(pixels.shape)}")
    _check_image_size(pixels.shape[3], pixels.shape[4])
    values = ((pixels.detach().float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    array = values[0].permute(1, 2, 3, 0).cpu().numpy()
    return [np.ascontiguousarray(frame) for frame in array]
