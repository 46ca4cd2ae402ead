"""Model sizes of the diffusion world model on diffusers' Wan2.2 classes (torch-free).

A :class:`WanPreset` holds the constructor arguments of diffusers' ``AutoencoderKLWan`` and
``WanTransformer3DModel`` (every argument, so a ``config.json`` can be compared field by field), the
streaming dimensions (block, sink and window of the key/value cache, chunk between re-anchorings), the
sampler's steps and the prompt embedding's shape. ``paper`` is Wan2.2 TI2V-5B as released in
``Wan2.2-TI2V-5B-Diffusers`` at 832x480; ``tiny`` has the same structure at a size that runs the tests on
a CPU in seconds; ``small`` is ``tiny``'s networks at 160x96, where the twin's objects are 10 px across;
``small8`` is ``small`` with an 8x (not 16x) VAE, whose latents can show such an object move.

Token arithmetic of ``paper``: 480x832 px / 16 = 30x52 latents per latent frame, the (1, 2, 2) patch makes
that 15x26 = 390 tokens; 81 frames = 1 + 4*20 frames = 21 latent frames.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from rynn_teleop.errors import ConfigurationError

#: every constructor argument of diffusers' ``AutoencoderKLWan`` (diffusers 0.42)
VAE_CONFIG_KEYS = frozenset({
    "base_dim", "decoder_base_dim", "z_dim", "dim_mult", "num_res_blocks", "attn_scales", "temperal_downsample",
    "dropout", "latents_mean", "latents_std", "is_residual", "in_channels", "out_channels", "patch_size",
    "scale_factor_temporal", "scale_factor_spatial",
})
#: every constructor argument of diffusers' ``WanTransformer3DModel`` (diffusers 0.42)
TRANSFORMER_CONFIG_KEYS = frozenset({
    "patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
    "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps", "image_dim", "added_kv_proj_dim",
    "rope_max_seq_len", "pos_embed_seq_len",
})


class WanPresetError(ConfigurationError):
    """A :class:`WanPreset` is inconsistent.

    Attributes:
        field: the name of the preset field the message is about.
    """

    def __init__(self, preset: str, field_name: str, message: str) -> None:
        super().__init__(f"preset {preset!r}: {field_name}: {message}")
        self.field = field_name


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


def _frozen(value: Any) -> Any:
    """``value`` with lists as tuples and dicts as read-only mappings (JSON-like values only)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def json_like(value: Any) -> Any:
    """``value`` with tuples as lists and mappings as dicts: the form ``config.json`` files hold."""
    if isinstance(value, Mapping):
        return {k: json_like(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_like(v) for v in value]
    return value


@dataclass(frozen=True)
class WanPreset:
    """Every dimension of one model size (see the module docstring).

    Frame counts: video frames [frames] unless named ``latent``; a latent frame covers
    ``temporal_compression`` (4) video frames, the first latent frame of a stream 1.
    ``vae_config`` and ``transformer_config`` are stored read-only (lists as tuples); use
    :attr:`vae_kwargs` / :attr:`transformer_kwargs` to build the diffusers models.

    Raises:
        WanPresetError: on construction, naming the first inconsistent field.
    """

    name: str
    width: int  # image width [px]
    height: int  # image height [px]
    latent_channels: int  # VAE latent channels (Wan2.2: 48) = the DiT's in/out channels
    vae_config: Mapping[str, Any] = field(hash=False)  # AutoencoderKLWan arguments, all of them
    transformer_config: Mapping[str, Any] = field(hash=False)  # WanTransformer3DModel arguments, all of them
    block_frames: int  # latent frames generated per block
    sink_frames: int  # latent frames kept for ever in the cache (the anchor first)
    window_frames: int  # latent frames in the sliding window of the cache
    shift: float  # flow schedule shift (sigma = shift*t / (1 + (shift-1)*t))
    prompt_len: int  # prompt embedding length [tokens] (UMT5 in Wan: 512)
    text_dim: int  # prompt embedding width (UMT5-XXL: 4096)
    chunk_frames: int = 81  # video frames between re-anchorings, anchor included (1 + 4k)
    timesteps: tuple[int, ...] = (1000, 750, 500, 250)  # sampler steps, of 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "vae_config", _frozen(self.vae_config))
        object.__setattr__(self, "transformer_config", _frozen(self.transformer_config))
        object.__setattr__(self, "timesteps", tuple(self.timesteps))
        for field_name, message in self._problems():
            raise WanPresetError(self.name, field_name, message)

    def _problems(self):
        """(field, message) of each inconsistency, in the order they are checked."""
        vae, dit = self.vae_config, self.transformer_config
        for name, config, keys in (("vae_config", vae, VAE_CONFIG_KEYS),
                                   ("transformer_config", dit, TRANSFORMER_CONFIG_KEYS)):
            missing, unknown = sorted(keys - set(config)), sorted(set(config) - keys)
            if missing or unknown:
                yield name, f"must hold every constructor argument; missing {missing}, unknown {unknown}"
                return
        if vae["z_dim"] != self.latent_channels:
            yield "latent_channels", f"{self.latent_channels} differs from vae_config z_dim {vae['z_dim']}"
        if (dit["in_channels"], dit["out_channels"]) != (self.latent_channels, self.latent_channels):
            yield "latent_channels", (f"{self.latent_channels} differs from transformer_config in/out channels "
                                      f"{dit['in_channels']}/{dit['out_channels']}")
        if not len(vae["latents_mean"]) == len(vae["latents_std"]) == vae["z_dim"]:
            yield "vae_config", "latents_mean and latents_std need one value per latent channel (z_dim)"
        if vae["scale_factor_temporal"] != 4 or list(vae["temperal_downsample"]).count(True) != 2:
            yield "vae_config", "temporal compression must be 4 (two causal temporal downsamplings)"
        vae_patch = vae["patch_size"] or 1
        if vae["scale_factor_spatial"] != vae_patch * 2 ** (len(vae["dim_mult"]) - 1):
            yield "vae_config", "scale_factor_spatial must be patch_size * 2 ** (len(dim_mult) - 1)"
        patch = tuple(dit["patch_size"])
        if len(patch) != 3 or patch[0] != 1 or patch[1] != patch[2]:
            yield "transformer_config", f"patch_size must be (1, p, p), one latent frame per token; got {patch}"
            return
        head_dim = dit["attention_head_dim"]
        if head_dim < 6 or head_dim % 2:
            yield "transformer_config", f"attention_head_dim must be even and at least 6 (3D rotary); got {head_dim}"
        if dit["text_dim"] != self.text_dim:
            yield "text_dim", f"{self.text_dim} differs from transformer_config text_dim {dit['text_dim']}"
        for name in ("width", "height"):
            size = getattr(self, name)
            if size <= 0 or size % self.pixels_per_token:
                yield name, (f"must be a positive multiple of {self.pixels_per_token} px (VAE "
                             f"{self.spatial_compression} x patch {patch[1]}); got {size}")
        if self.block_frames < 1:
            yield "block_frames", f"must be at least 1; got {self.block_frames}"
        if self.sink_frames < 1:
            yield "sink_frames", f"must be at least 1 (the anchor); got {self.sink_frames}"
        if self.window_frames < self.block_frames:
            yield "window_frames", f"must hold at least one block ({self.block_frames}); got {self.window_frames}"
        step = self.temporal_compression * max(self.block_frames, 1)
        if self.chunk_frames <= 1 or (self.chunk_frames - 1) % step:
            yield "chunk_frames", (f"must be 1 + {step}k with k >= 1 (the anchor, then whole blocks of "
                                   f"{step} frames); got {self.chunk_frames}")
        steps = list(self.timesteps)
        if not steps or steps[0] != 1000 or steps != sorted(set(steps), reverse=True) or steps[-1] <= 0:
            yield "timesteps", f"must start at 1000 and strictly decrease above 0; got {self.timesteps}"
        if self.shift <= 0:
            yield "shift", f"must be positive; got {self.shift}"
        if self.prompt_len < 1:
            yield "prompt_len", f"must be at least 1; got {self.prompt_len}"
        sized = all(v > 0 and v % self.pixels_per_token == 0 for v in (self.width, self.height))
        if sized and self.chunk_frames > 1:
            rope, grid = dit["rope_max_seq_len"], self.token_grid
            if self.chunk_latent_frames > rope or max(grid) > rope:
                yield "chunk_frames", (f"a chunk of {self.chunk_latent_frames} latent frames on a {grid[0]}x{grid[1]} "
                                       f"token grid exceeds the rotary table of rope_max_seq_len {rope} positions")

    @property
    def vae_kwargs(self) -> dict[str, Any]:
        """``AutoencoderKLWan(**vae_kwargs)`` builds this preset's VAE (a fresh dict, lists as lists)."""
        return json_like(self.vae_config)

    @property
    def transformer_kwargs(self) -> dict[str, Any]:
        """``WanTransformer3DModel(**transformer_kwargs)`` builds this preset's DiT (a fresh dict)."""
        return json_like(self.transformer_config)

    @property
    def temporal_compression(self) -> int:
        """Video frames per latent frame (after the first)."""
        return int(self.vae_config["scale_factor_temporal"])

    @property
    def spatial_compression(self) -> int:
        """Pixels per latent, each axis."""
        return int(self.vae_config["scale_factor_spatial"])

    @property
    def patch(self) -> tuple[int, int, int]:
        """DiT patch (latent frames, rows, columns)."""
        return tuple(self.transformer_config["patch_size"])

    @property
    def pixels_per_token(self) -> int:
        """Pixels per token side [px] (VAE compression times patch)."""
        return self.spatial_compression * self.patch[1]

    @property
    def inner_dim(self) -> int:
        """DiT hidden size (heads x head dim)."""
        return int(self.transformer_config["num_attention_heads"] * self.transformer_config["attention_head_dim"])

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
    def frames_per_block(self) -> int:
        """Video frames generated per block [frames]."""
        return self.temporal_compression * self.block_frames

    @property
    def chunk_latent_frames(self) -> int:
        """Latent frames of one chunk, the anchor included (81 frames -> 21)."""
        return latent_frames(self.chunk_frames, self.temporal_compression)

    @property
    def prompt_shape(self) -> tuple[int, int, int]:
        """Shape of the prompt embedding the DiT takes: (1, prompt_len, text_dim)."""
        return 1, self.prompt_len, self.text_dim


#: Wan2.2 TI2V-5B's VAE, as ``vae/config.json`` of ``Wan2.2-TI2V-5B-Diffusers``: encoder 160/320/640/640 with 2
#: residual blocks per level, the wider decoder 256/512/1024/1024, 2x2 pixel patch (12 channels), 16x16 and 4x
#: compression to 48 channels
PAPER_VAE_CONFIG: Mapping[str, Any] = _frozen({
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "latents_mean": [
        -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
        -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
        -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
        -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
        -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
        0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
    ],
    "latents_std": [
        0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
        0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
        0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
        0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
        0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
        0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
    ],
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_temporal": 4,
    "scale_factor_spatial": 16,
})

#: Wan2.2 TI2V-5B's DiT, as ``transformer/config.json`` of ``Wan2.2-TI2V-5B-Diffusers``: dim 3072 = 24 heads x
#: 128, 30 layers, FFN 14336, patch (1, 2, 2), UMT5-XXL text (4096)
PAPER_TRANSFORMER_CONFIG: Mapping[str, Any] = _frozen({
    "patch_size": [1, 2, 2],
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "in_channels": 48,
    "out_channels": 48,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 14336,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-06,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
    "pos_embed_seq_len": None,
})

#: the paper's VAE structure (residual, 2x2 pixel patch, 16x16 and 4x compression, 48 latent channels) at base
#: dim 4 and one residual block per level; the latent statistics are arbitrary fixed values
TINY_VAE_CONFIG: Mapping[str, Any] = _frozen({
    **PAPER_VAE_CONFIG,
    "base_dim": 4,
    "decoder_base_dim": 8,  # wider than the encoder, as in Wan2.2
    "num_res_blocks": 1,
    "latents_mean": [round(0.02 * (i % 11) - 0.1, 4) for i in range(48)],
    "latents_std": [round(0.5 + 0.05 * (i % 7), 4) for i in range(48)],
})

#: the paper's DiT structure (48 channels, patch (1, 2, 2)) with 2 layers of 4 heads x 48 (RoPE's t/h/w split
#: 16/16/16). The width, 192, is the patch's 2 x 2 x 48 latent values: a narrower DiT's output layer could only
#: predict velocities in a subspace of each token's values, and its samples could never lose the rest of the noise.
TINY_TRANSFORMER_CONFIG: Mapping[str, Any] = _frozen({
    **PAPER_TRANSFORMER_CONFIG,
    "num_attention_heads": 4,
    "attention_head_dim": 48,
    "num_layers": 2,
    "ffn_dim": 384,
    "freq_dim": 16,
    "text_dim": 16,
    "rope_max_seq_len": 64,
})

TINY = WanPreset(
    name="tiny",
    width=96,  # not square, so that row/column mix-ups fail the tests
    height=64,
    latent_channels=48,
    vae_config=TINY_VAE_CONFIG,
    transformer_config=TINY_TRANSFORMER_CONFIG,
    block_frames=1,
    sink_frames=1,
    window_frames=2,
    shift=5.0,
    prompt_len=16,
    text_dim=16,
)

#: ``tiny``'s networks at 160x96 (5x3 tokens per latent frame instead of 3x2): the twin's task objects are 10 px
#: across or more where ``tiny`` draws the red cube 7 px (pick_place, layouts 0-7: the cube's box is 7.1 px at
#: 96x64, 11.8 px here; the ball 11 -> 18 px; bimanual_lift's bar 11 -> 18 px), at about 2.5 x tiny's compute,
#: so that training and distilling it on a 2-core CPU fits in the interaction bench's budget
SMALL = replace(TINY, name="small", width=160, height=96)

#: ``small`` with a VAE of 8x spatial compression (one 2x level fewer: ``dim_mult`` (1, 2, 2), both levels
#: downsampling in time): 20x12 latents of 48 channels per latent frame, 10x6 = 60 tokens (4x ``small``'s, the
#: same DiT). At 16x one latent covers 16x16 px and the stand-in VAE does not draw a moved 10-15 px object; at 8x
#: its round trip follows the object (docs/benchmarks/components.md, "World model on twin episodes")
SMALL8 = replace(SMALL, name="small8", vae_config={
    **TINY_VAE_CONFIG, "dim_mult": [1, 2, 2], "temperal_downsample": [True, True], "scale_factor_spatial": 8})

PAPER = WanPreset(
    name="paper",
    width=832,
    height=480,
    latent_channels=48,
    vae_config=PAPER_VAE_CONFIG,
    transformer_config=PAPER_TRANSFORMER_CONFIG,
    block_frames=1,  # 4 video frames per block: 100 ms of latency at 40 frames/s
    sink_frames=1,  # the anchor frame
    window_frames=8,  # 32 video frames of recent context
    shift=5.0,  # Wan2.2 TI2V sample_shift
    prompt_len=512,  # WanPipeline's max_sequence_length for UMT5
    text_dim=4096,  # UMT5-XXL d_model
)

PRESETS: dict[str, WanPreset] = {p.name: p for p in (TINY, SMALL, SMALL8, PAPER)}
#: presets with no published release: their base (VAE fitted to a dataset, a seeded DiT, a random prompt) is made
#: here by ``rynn-teleop world-model tiny-base`` (:mod:`rynn_teleop.world_model.training.tiny_base`)
STAND_IN_PRESETS: tuple[str, ...] = (TINY.name, SMALL.name, SMALL8.name)


def get_preset(name: str) -> WanPreset:
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
