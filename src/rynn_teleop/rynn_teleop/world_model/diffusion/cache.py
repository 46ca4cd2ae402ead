"""Fixed-size key/value cache of the streaming DiT: attention sink + sliding window.

Mirrors the paper's cache: the keys/values of past latent frames, written by
the commit pass (the clean block at noise level 0), live in buffers allocated
once. The first ``sink_frames`` committed frames (the anchor first) are never
evicted; later frames go to a ring buffer holding the ``window_frames`` most
recent ones. A scratch region of ``block_frames`` slots holds the keys/values
of the block being denoised, so one attention call sees [sink | window |
current block] with static shapes.

Layout of ``keys``/``values``: (layers, batch, heads, slots * tokens_per_frame,
head_dim), slots = sink + window + block, in that order. All bookkeeping
(which frame is in which slot, how many are valid) is host-side Python ints;
the device-side ``valid`` mask is written by slice assignment, never read
back, so the cache costs no device->host synchronisation.

Keys are stored after the rotary embedding (at their frame's position), so
the order of frames in the ring does not matter to attention.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn


class KVCache:
    """Sink + sliding-window key/value cache over latent frames (see the module docstring).

    Args:
        layers, heads, head_dim: the DiT's attention shape.
        tokens_per_frame: tokens of one latent frame.
        sink_frames: latent frames never evicted (the first committed ones).
        window_frames: latent frames of the sliding window (>= block_frames).
        block_frames: latent frames of the largest block denoised at once.
        batch: streams generated together.
    """

    def __init__(self, layers: int, heads: int, head_dim: int, tokens_per_frame: int, sink_frames: int,
                 window_frames: int, block_frames: int, batch: int = 1, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        if sink_frames < 1 or window_frames < block_frames or block_frames < 1:
            raise ValueError(
                f"need sink_frames >= 1 and window_frames >= block_frames >= 1; got sink {sink_frames}, "
                f"window {window_frames}, block {block_frames}"
            )
        self.layers, self.tokens_per_frame = layers, tokens_per_frame
        self.sink_frames, self.window_frames, self.block_frames = sink_frames, window_frames, block_frames
        slots = sink_frames + window_frames + block_frames
        shape = (layers, batch, heads, slots * tokens_per_frame, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.valid = torch.zeros(slots * tokens_per_frame, device=device, dtype=torch.bool)
        self._mask = self.valid.view(1, 1, 1, -1)
        self.committed = 0  # latent frames committed since the last reset
        self._block = 0  # latent frames of the block now in the scratch slots
        self._targets: list[int] = []  # slots the block's frames go to when committing

    # ---- host-side bookkeeping -------------------------------------------------
    @property
    def scratch_slot(self) -> int:
        """First slot of the current block's scratch region."""
        return self.sink_frames + self.window_frames

    def slot_of(self, frame: int) -> int:
        """Slot that committed frame ``frame`` (0 = the first since reset) is (or was) stored in."""
        if frame < self.sink_frames:
            return frame
        return self.sink_frames + (frame - self.sink_frames) % self.window_frames

    def frames_held(self) -> list[int]:
        """Committed frame indices the cache holds now: the sink, then the window oldest first."""
        sink = list(range(min(self.committed, self.sink_frames)))
        window = list(range(max(self.sink_frames, self.committed - self.window_frames), self.committed))
        return sink + window

    @property
    def full(self) -> bool:
        """Every sink and window slot holds a frame (steady state)."""
        return self.committed >= self.sink_frames + self.window_frames

    def reset(self) -> None:
        """Forget every frame (buffers keep their storage; stale contents are masked out)."""
        self.committed = 0
        self._block = 0
        self.valid.fill_(False)

    # ---- the attention side ----------------------------------------------------
    def begin(self, frames: int, commit: bool) -> None:
        """Prepare for a forward pass over a block of ``frames`` latent frames.

        With ``commit`` the block's keys/values are also written to the sink or
        window slots of the next committed frames (after each layer's attention,
        so the block still sees the frame it evicts).
        """
        if not 1 <= frames <= self.block_frames:
            raise ValueError(f"a block has 1..{self.block_frames} latent frames; got {frames}")
        if frames != self._block:
            t = self.tokens_per_frame
            start = self.scratch_slot * t
            self.valid[start: start + frames * t] = True
            self.valid[start + frames * t:] = False
            self._block = frames
        self._targets = [self.slot_of(self.committed + i) for i in range(frames)] if commit else []

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               backend: Any = None) -> torch.Tensor:
        """Attention of the block's queries over [sink | window | block] for one layer.

        Args:
            q, k, v: (batch, heads, block tokens, head_dim), rotary embedding applied.
            backend: a diffusers attention backend (``set_attention_backend``), used where every key is valid
                (steady state: the cache full and a whole block); None, and every masked pass (the first
                blocks after an anchor, partial blocks), use PyTorch's SDPA.

        Returns:
            (batch, heads, block tokens, head_dim).
        """
        t = self.tokens_per_frame
        start = self.scratch_slot * t
        n = k.shape[2]
        self.keys[layer, :, :, start: start + n] = k
        self.values[layer, :, :, start: start + n] = v
        # Steady state (cache full, whole block): every key is valid, so no mask (allows flash kernels).
        if self.full and self._block == self.block_frames:
            if backend is None:
                out = F.scaled_dot_product_attention(q, self.keys[layer], self.values[layer])
            else:  # diffusers' dispatcher takes (batch, tokens, heads, head_dim) views: no copies
                out = dispatch_attention_fn(q.transpose(1, 2), self.keys[layer].transpose(1, 2),
                                            self.values[layer].transpose(1, 2), backend=backend).transpose(1, 2)
        else:
            out = F.scaled_dot_product_attention(q, self.keys[layer], self.values[layer], attn_mask=self._mask)
        for i, slot in enumerate(self._targets):
            self.keys[layer, :, :, slot * t: (slot + 1) * t] = k[:, :, i * t: (i + 1) * t]
            self.values[layer, :, :, slot * t: (slot + 1) * t] = v[:, :, i * t: (i + 1) * t]
        return out

    def end(self) -> None:
        """Finish the forward pass; a committing one now counts its frames as held."""
        t = self.tokens_per_frame
        for slot in self._targets:
            self.valid[slot * t: (slot + 1) * t] = True
        self.committed += len(self._targets)
        self._targets = []
