"""Block-causal diffusion transformer (DiT) over latent-frame tokens, with the control branch.

Mirrors Wan2.2 TI2V-5B's DiT as used by RynnWorld-Teleop:

* patch embedding: a Conv3D with kernel = stride = patch (1, 2, 2) from the
  VAE latents to ``dim``-wide tokens, one latent frame's tokens after another;
* control branch: the condition (skeleton) video, encoded by the same VAE, is
  patch-embedded by a second Conv3D whose weight and bias start at zero,
  multiplied by a learnable scalar (start 0.1) and added to the video tokens,
  so that at initialisation the model is exactly the base model;
* timestep conditioning as in Wan: a sinusoidal embedding and an MLP, one
  shared projection to six modulation vectors (shift/scale/gate for attention
  and FFN), plus a learned per-block offset (AdaLN); timesteps are per latent
  frame, so a block at noise level t can attend to clean frames at level 0;
* self-attention with RMS-normalised queries/keys and a 3D rotary embedding
  (frame, row, column; Wan's split of the head dimension), then a GELU FFN;
* no text cross-attention: the only conditions are the anchor frame (in the
  cache) and the skeleton video (the control branch). Wan2.2 TI2V-5B's 5.0 B
  parameters include about 1.15 B of text cross-attention and text embedding,
  so the ``paper`` preset has about 3.9 B.

Attention is block-causal over latent frames: the anchor (frame 0) is a block
of its own, then blocks of ``block_frames``; a block sees itself, the sink
frames and the ``window_frames`` frames before it. :meth:`DiT.forward` runs a
whole sequence under that mask (training, tests); :meth:`DiT.forward_block`
runs one block against the :class:`~.cache.KVCache` (streaming), writing its
keys/values in the commit pass. The model predicts the flow velocity
(noise - clean latent), as Wan does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .cache import KVCache
from .presets import Preset

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sinusoidal_embedding(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """Wan's sinusoidal timestep embedding: (...,) timesteps in [0, 1000] -> (..., dim) float32, [cos | sin]."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, device=timesteps.device, dtype=torch.float64) / half)
    angles = timesteps.to(torch.float64)[..., None] * freqs
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).float()


class RotaryEmbedding3D(nn.Module):
    """Rotary position embedding over (latent frame, token row, token column).

    The head dimension d is split as in Wan: d - 4*(d//6) channels for the
    frame axis, 2*(d//6) each for rows and columns. Tables cover frame
    positions 0 .. ``max_frames`` - 1 (one chunk: the anchor is position 0).
    They are float32 on every device whatever the model's dtype, made once
    per device (not buffers: nothing to load, nothing cast to bfloat16).
    """

    def __init__(self, head_dim: int, max_frames: int, rows: int, cols: int) -> None:
        super().__init__()
        self.head_dim, self.max_frames, self.rows, self.cols = head_dim, max_frames, rows, cols
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _angles(self) -> torch.Tensor:
        """(max_frames, tokens per frame, head_dim / 2) rotation angles [rad], float64 on the CPU."""
        third = self.head_dim // 6
        splits = (self.head_dim - 4 * third, 2 * third, 2 * third)
        axes = (torch.arange(self.max_frames), torch.arange(self.rows), torch.arange(self.cols))
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(self.max_frames, -1, 3).double()
        return torch.cat([
            grid[..., axis, None] / torch.pow(10000.0, torch.arange(0, n, 2).double() / n)
            for axis, n in enumerate(splits)
        ], dim=-1)

    def tables(self, start: int, frames: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (frames * tokens per frame, head_dim / 2) float32, for frames start .. start + frames - 1.

        Raises:
            ValueError: positions beyond the chunk the tables cover.
        """
        if start < 0 or start + frames > self.max_frames:
            raise ValueError(
                f"latent frame positions {start}..{start + frames - 1} are outside 0..{self.max_frames - 1} "
                "(one chunk; re-anchor before going further)"
            )
        if device not in self._tables:
            angles = self._angles()
            self._tables[device] = (torch.cos(angles).float().to(device), torch.sin(angles).float().to(device))
        cos, sin = self._tables[device]
        return cos[start: start + frames].flatten(0, 1), sin[start: start + frames].flatten(0, 1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive channel pairs of x (B, heads, L, head_dim) by the angles of (L, head_dim / 2)."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    return rotated.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (B, F*S, D) * (1 + scale) + shift with per-frame (B, F, D) modulation."""
    b, length, d = x.shape
    frames = shift.shape[1]
    x = x.view(b, frames, length // frames, d)
    return (x * (1 + scale[:, :, None]) + shift[:, :, None]).view(b, length, d)


def gate(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """x (B, F*S, D) times a per-frame gate (B, F, D)."""
    b, length, d = x.shape
    frames = g.shape[1]
    return (x.view(b, frames, length // frames, d) * g[:, :, None]).view(b, length, d)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        b, length, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, length, self.heads, d // self.heads).transpose(1, 2)

        q = apply_rotary(heads(self.norm_q(self.q(x))), cos, sin)
        k = apply_rotary(heads(self.norm_k(self.k(x))), cos, sin)
        out = attend(q, k, heads(self.v(x)))
        return self.o(out.transpose(1, 2).reshape(b, length, d))


class DiTBlock(nn.Module):
    """AdaLN-modulated self-attention and FFN (Wan's block without cross-attention)."""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, dim))
        self.modulation = nn.Parameter(torch.randn(1, 1, 6, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x (B, F*S, D); e (B, F, 6, D) the shared timestep projection per frame."""
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + e).unbind(2)
        x = x + gate(self.attn(modulate(self.norm1(x), shift1, scale1), cos, sin, attend), gate1)
        return x + gate(self.ffn(modulate(self.norm2(x), shift2, scale2)), gate2)


class Head(nn.Module):
    """Final AdaLN-modulated projection from tokens to patches of velocity."""

    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.proj = nn.Linear(dim, out)
        self.modulation = nn.Parameter(torch.randn(1, 1, 2, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """x (B, F*S, D); e (B, F, D) the timestep embedding per frame."""
        shift, scale = (self.modulation + e[:, :, None]).unbind(2)
        return self.proj(modulate(self.norm(x), shift, scale))


class DiT(nn.Module):
    """The block-causal DiT with its control branch (see the module docstring).

    Latents are (B, z, F, h, w) with (h, w) = the preset's latent grid; the
    condition latents have the same shape (the VAE encoding of the skeleton
    video, frame-aligned with the video).
    """

    def __init__(self, preset: Preset) -> None:
        super().__init__()
        self.preset = preset
        z, d, patch = preset.latent_channels, preset.dim, preset.patch
        self.patch_embed = nn.Conv3d(z, d, patch, stride=patch)
        self.control_embed = nn.Conv3d(z, d, patch, stride=patch)
        nn.init.zeros_(self.control_embed.weight)
        nn.init.zeros_(self.control_embed.bias)
        self.control_scale = nn.Parameter(torch.tensor(float(preset.control_scale_init)))
        self.time_embedding = nn.Sequential(nn.Linear(preset.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.blocks = nn.ModuleList(DiTBlock(d, preset.heads, preset.ffn) for _ in range(preset.layers))
        self.head = Head(d, z * math.prod(patch))
        self.rope = RotaryEmbedding3D(preset.head_dim, preset.chunk_latent_frames, *preset.token_grid)

    # ---- shared pieces -------------------------------------------------------
    def embed(self, latents: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        """Video tokens plus the scaled control tokens: (B, z, F, h, w) x 2 -> (B, F*S, D)."""
        tokens = self.patch_embed(latents) + self.control_scale * self.control_embed(condition)
        return tokens.flatten(2).transpose(1, 2)

    def timestep_embeddings(self, timesteps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-frame timesteps (B, F) in [0, 1000] -> embedding (B, F, D) and block modulation (B, F, 6, D)."""
        dtype = self.time_embedding[0].weight.dtype
        e = self.time_embedding(sinusoidal_embedding(timesteps, self.preset.freq_dim).to(dtype))
        return e, self.time_projection(e).unflatten(-1, (6, self.preset.dim))

    def unpatchify(self, tokens: torch.Tensor, frames: int) -> torch.Tensor:
        """(B, F*S, ph*pw*z) -> (B, z, F, h, w); channels ordered (patch row, patch column, latent) as in Wan."""
        b = tokens.shape[0]
        rows, cols = self.preset.token_grid
        _, ph, pw = self.preset.patch
        z = self.preset.latent_channels
        x = tokens.view(b, frames, rows, cols, ph, pw, z).permute(0, 6, 1, 2, 4, 3, 5)
        return x.reshape(b, z, frames, rows * ph, cols * pw)

    def _run(self, latents: torch.Tensor, condition: torch.Tensor, timesteps: torch.Tensor, start: int,
             attend: Attend) -> torch.Tensor:
        frames = latents.shape[2]
        x = self.embed(latents, condition)
        e, e6 = self.timestep_embeddings(timesteps)
        cos, sin = self.rope.tables(start, frames, latents.device)
        for layer, block in enumerate(self.blocks):
            x = block(x, e6, cos, sin, lambda q, k, v, layer=layer: attend(layer, q, k, v))
        return self.unpatchify(self.head(x, e), frames)

    # ---- whole sequence --------------------------------------------------------
    def forward(self, latents: torch.Tensor, condition: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """Velocity for a whole stream (anchor at frame 0) under the block-causal sink/window mask.

        Args:
            latents: (B, z, F, h, w), frame 0 the anchor.
            condition: (B, z, F, h, w) condition latents.
            timesteps: (B, F) per-frame timesteps in [0, 1000] (0 = clean).

        Returns:
            (B, z, F, h, w) predicted velocity (noise - clean latent).
        """
        p = self.preset
        mask = block_causal_mask(latents.shape[2], p.block_frames, p.sink_frames, p.window_frames)
        token_mask = mask.repeat_interleave(p.tokens_per_frame, 0).repeat_interleave(p.tokens_per_frame, 1)
        token_mask = token_mask.to(latents.device)

        def attend(_: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=token_mask)

        return self._run(latents, condition, timesteps, 0, attend)

    # ---- one block against the cache ----------------------------------------------
    def forward_block(self, latents: torch.Tensor, condition: torch.Tensor, timesteps: torch.Tensor,
                      cache: KVCache, commit: bool) -> torch.Tensor:
        """Velocity for one block attending to the cache; the commit pass writes the block into it.

        The block's frame positions continue after the frames committed so far
        (``cache.committed``).

        Args:
            latents, condition: (B, z, k, h, w), k <= block_frames (1 for the anchor).
            timesteps: (B, k) timesteps in [0, 1000].
            cache: the stream's cache.
            commit: write this block's keys/values (run it on the clean block at timestep 0).

        Returns:
            (B, z, k, h, w) predicted velocity.
        """
        cache.begin(latents.shape[2], commit)
        out = self._run(latents, condition, timesteps, cache.committed, cache.attend)
        cache.end()
        return out

    def make_cache(self, batch: int = 1) -> KVCache:
        """A cache sized for this model and preset, on the model's device and dtype."""
        p = self.preset
        weight = self.patch_embed.weight
        return KVCache(p.layers, p.heads, p.head_dim, p.tokens_per_frame, p.sink_frames, p.window_frames,
                       p.block_frames, batch=batch, device=weight.device, dtype=weight.dtype)


def block_index(frame: int, block_frames: int) -> int:
    """Block of latent frame ``frame``: the anchor (frame 0) is block 0, then blocks of ``block_frames``."""
    return 0 if frame == 0 else 1 + (frame - 1) // block_frames


def block_causal_mask(frames: int, block_frames: int, sink_frames: int, window_frames: int) -> torch.Tensor:
    """(frames, frames) bool mask, True where frame i may attend to frame j.

    Frame i sees j if j's block is not after i's block and j is a sink frame,
    within the ``window_frames`` frames before i's block, or in i's block:
    exactly what the cache holds when i's block is generated.
    """
    blocks = torch.tensor([block_index(f, block_frames) for f in range(frames)])
    starts = torch.tensor([0 if b == 0 else 1 + (b - 1) * block_frames for b in blocks.tolist()])
    j = torch.arange(frames)[None, :]
    not_future = blocks[None, :] <= blocks[:, None]
    in_reach = (j < sink_frames) | (j >= starts[:, None] - window_frames)
    return not_future & in_reach
