"""Model sizes of the diffusion world model (torch-free).

A :class:`Preset` fixes every dimension of the VAE, the DiT, the key/value
cache and the sampler. ``paper`` mirrors Wan2.2 TI2V-5B as used by
RynnWorld-Teleop (832x480, 48 latent channels, 16x16 spatial and 4x
temporal compression, VAE encoder 160/320/640/640 with 2 residual blocks per
level and the wider decoder 256/512/1024/1024 with 3, DiT dim 3072 / 30 layers / 24 heads / FFN 14336, patch
(1, 2, 2)); ``tiny`` has the same structure at a size that runs the tests on
a CPU in seconds.

Token arithmetic of ``paper``: 480x832 px / 16 = 30x52 latents per latent
frame, the (1, 2, 2) patch makes that 15x26 = 390 tokens; 81 frames = 1 + 4*20
frames = 21 latent frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rynn_teleop.errors import ConfigurationError


@dataclass(frozen=True)
class Preset:
    """Every dimension of one model size (see the module docstring).

    Frame counts: video frames [frames] unless named ``latent``; a latent
    frame covers 4 video frames (the first latent frame of a stream: 1).
    """

    name: str
    width: int  # image width [px]
    height: int  # image height [px]
    latent_channels: int  # VAE latent channels (Wan2.2: 48)
    vae_dims: tuple[int, ...]  # VAE channels per resolution level (encoder order)
    vae_res_blocks: int  # residual blocks per VAE encoder level
    vae_decoder_dims: tuple[int, ...]  # VAE decoder channels per level, in encoder order (Wan2.2: wider)
    vae_decoder_res_blocks: int  # residual blocks per VAE decoder level (Wan2.2: encoder's + 1)
    dim: int  # DiT hidden size
    layers: int  # DiT blocks
    heads: int  # attention heads
    ffn: int  # FFN hidden size
    block_frames: int  # latent frames generated per block
    sink_frames: int  # latent frames kept for ever in the cache (the anchor first)
    window_frames: int  # latent frames in the sliding window of the cache
    shift: float  # flow schedule shift (sigma = shift*t / (1 + (shift-1)*t))
    temporal_compression: int = 4  # video frames per latent frame
    spatial_compression: int = 16  # pixels per latent, each axis
    patch: tuple[int, int, int] = (1, 2, 2)  # DiT patch (latent frames, rows, columns)
    chunk_frames: int = 81  # video frames between re-anchorings, anchor included
    timesteps: tuple[int, ...] = (1000, 750, 500, 250)  # sampler steps, of 1000
    control_scale_init: float = 0.1  # initial learnable scale of the control branch
    freq_dim: int = 256  # sinusoidal timestep embedding size

    def __post_init__(self) -> None:
        checks = {
            "temporal_compression must be 4 (two causal temporal downsamplings)": self.temporal_compression == 4,
            "spatial_compression must be 2 ** len(vae_dims) (pixel unshuffle 2, then one 2x step per level)":
                self.spatial_compression == 2 ** len(self.vae_dims),
            "vae_decoder_dims must have one entry per level of vae_dims":
                len(self.vae_decoder_dims) == len(self.vae_dims),
            "vae_res_blocks and vae_decoder_res_blocks must be at least 1":
                self.vae_res_blocks >= 1 and self.vae_decoder_res_blocks >= 1,
            "patch must be (1, p, p): one latent frame per token":
                self.patch[0] == 1 and self.patch[1] == self.patch[2],
            "width and height must be multiples of spatial_compression * patch":
                self.width % self.pixels_per_token == 0 and self.height % self.pixels_per_token == 0,
            "dim must be a multiple of heads": self.dim % self.heads == 0,
            "head_dim (dim / heads) must be even and at least 6 (3D rotary embedding)":
                self.head_dim % 2 == 0 and self.head_dim >= 6,
            "chunk_frames - 1 must be a multiple of 4 * block_frames (whole blocks per chunk)":
                self.chunk_frames > 1
                and (self.chunk_frames - 1) % (self.temporal_compression * self.block_frames) == 0,
            "window_frames must hold at least one block": self.window_frames >= self.block_frames,
            "sink_frames must be at least 1 (the anchor)": self.sink_frames >= 1,
            "timesteps must decrease within (0, 1000]":
                all(0 < t <= 1000 for t in self.timesteps)
                and list(self.timesteps) == sorted(self.timesteps, reverse=True),
            "shift must be positive": self.shift > 0,
        }
        failed = [rule for rule, ok in checks.items() if not ok]
        if failed:
            raise ConfigurationError(f"preset {self.name!r} is inconsistent: " + "; ".join(failed))

    @property
    def pixels_per_token(self) -> int:
        """Pixels per token side [px] (VAE compression times patch)."""
        return self.spatial_compression * self.patch[1]

    @property
    def latent_grid(self) -> tuple[int, int]:
        """Latents per latent frame (rows, columns)."""
        return self.height // self.spatial_compression, self.width // self.spatial_compression

    @property
    def token_grid(self) -> tuple[int, int]:
        """Tokens per latent frame (rows, columns) after the patch."""
        rows, cols = self.latent_grid
        return rows // self.patch[1], cols // self.patch[2]

    @property
    def tokens_per_frame(self) -> int:
        """Tokens per latent frame."""
        return math.prod(self.token_grid)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def frames_per_block(self) -> int:
        """Video frames generated per block [frames]."""
        return self.temporal_compression * self.block_frames

    @property
    def chunk_latent_frames(self) -> int:
        """Latent frames of one chunk, the anchor included (81 frames -> 21)."""
        return latent_frames(self.chunk_frames, self.temporal_compression)

    @property
    def cache_frames(self) -> int:
        """Latent frames the key/value cache holds (sink + window)."""
        return self.sink_frames + self.window_frames

    @property
    def shape_fields(self) -> dict[str, object]:
        """The fields that decide the weights' shapes (compared against a checkpoint)."""
        names = ("width", "height", "latent_channels", "vae_dims", "vae_res_blocks", "vae_decoder_dims",
                 "vae_decoder_res_blocks", "dim", "layers", "heads", "ffn", "temporal_compression",
                 "spatial_compression", "patch", "freq_dim")
        return {n: list(v) if isinstance(v := getattr(self, n), tuple) else v for n in names}


def latent_frames(frames: int, temporal_compression: int = 4) -> int:
    """Latent frames of a clip that starts a stream: 1 + 4k frames -> 1 + k.

    Raises:
        ValueError: ``frames`` is not 1 + 4k.
    """
    if frames < 1 or (frames - 1) % temporal_compression:
        raise ValueError(
            f"a stream starts with 1 + {temporal_compression}k frames (the first frame alone, then "
            f"{temporal_compression} frames per latent frame); got {frames}"
        )
    return 1 + (frames - 1) // temporal_compression


TINY = Preset(
    name="tiny",
    width=96,  # not square, so that row/column mix-ups fail the tests
    height=64,
    latent_channels=8,
    vae_dims=(8, 16, 32, 32),
    vae_res_blocks=1,
    vae_decoder_dims=(16, 16, 32, 32),  # wider than the encoder and one more block, as in Wan2.2
    vae_decoder_res_blocks=2,
    dim=64,
    layers=2,
    heads=4,
    ffn=128,
    block_frames=1,
    sink_frames=1,
    window_frames=2,
    shift=5.0,
)

PAPER = Preset(
    name="paper",
    width=832,
    height=480,
    latent_channels=48,
    vae_dims=(160, 320, 640, 640),  # Wan2.2 VAE: dim 160, multipliers (1, 2, 4, 4)
    vae_res_blocks=2,
    vae_decoder_dims=(256, 512, 1024, 1024),  # Wan2.2 VAE decoder: dec_dim 256, multipliers (1, 2, 4, 4)
    vae_decoder_res_blocks=3,  # Wan2.2: num_res_blocks + 1 per decoder level
    dim=3072,
    layers=30,
    heads=24,
    ffn=14336,
    block_frames=1,  # 4 video frames per block: 100 ms of latency at 40 frames/s
    sink_frames=1,  # the anchor frame
    window_frames=8,  # 32 video frames of recent context
    shift=5.0,  # Wan2.2 TI2V sample_shift
)

PRESETS: dict[str, Preset] = {p.name: p for p in (TINY, PAPER)}


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ConfigurationError: no such preset (the message names the choices).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown diffusion preset {name!r}; choose one of: {', '.join(PRESETS)}"
        ) from None
