"""Block-causal streaming and the skeleton control branch on diffusers' ``WanTransformer3DModel``.

The diffusers model runs unmodified, adapted through documented extension points:
a forward hook on ``patch_embedding`` adds the :class:`ControlBranch` tokens;
self-attention processors apply a block-causal mask (one pass) or attend
against a :class:`KVCache` (block by block, absolute RoPE positions);
cross-attention processors reuse the prompt keys/values of ``set_prompt``.

Latents are (B, C, frames, h, w) (C = 48 for Wan2.2 TI2V); timesteps are per
latent frame in [0, 1000] (0 = clean, the anchor at 0), expanded per token as
TI2V's expanded timesteps; the output is the velocity (noise - clean latent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from diffusers import ConfigMixin, ModelMixin, WanTransformer3DModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.attention_dispatch import dispatch_attention_fn

from .cache import KVCache

# ---- control branch -------------------------------------------------------------------------


class ControlBranch(ModelMixin, ConfigMixin):
    """RynnWorld's skeleton control: zero-initialised patch embedding of the condition latents, times ``scale``.

    Its output, flattened as the transformer flattens its patch embedding
    (``flatten(2).transpose(1, 2)``), is the (B, N, inner_dim) control tokens
    added to the video tokens. Weight and bias start at zero, so at
    initialisation the model is exactly the base model; ``scale`` (a learnable
    scalar) starts at ``scale_init``. Saved and loaded with ``save_pretrained`` /
    ``from_pretrained``.

    Args:
        latent_channels: channels of the condition latents (48 for Wan2.2's VAE).
        inner_dim: the transformer's token width (heads x head dim).
        patch_size: (t, h, w) patch of the transformer's ``patch_embedding``.
        scale_init: initial value of ``scale``.
    """

    @register_to_config
    def __init__(self, latent_channels: int = 48, inner_dim: int = 3072,
                 patch_size: Sequence[int] = (1, 2, 2), scale_init: float = 0.1) -> None:
        super().__init__()
        patch = tuple(int(p) for p in patch_size)
        self.conv = nn.Conv3d(latent_channels, inner_dim, kernel_size=patch, stride=patch)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)
        self.scale = nn.Parameter(torch.tensor(float(scale_init)))

    def forward(self, condition: torch.Tensor) -> torch.Tensor:
        """(B, latent_channels, f, h, w) condition latents -> (B, inner_dim, f/pt, h/ph, w/pw) control map."""
        return self.conv(condition) * self.scale


# ---- helpers ---------------------------------------------------------------------------------


def block_causal_mask(block_frames: Sequence[int], tokens_per_frame: int, sink_frames: int = 1,
                      window_frames: int | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """(N, N) bool mask, N = sum(block_frames) * tokens_per_frame; True where query token i may attend to key j.

    A token sees every token of its own block and of earlier blocks (the first
    block is normally the anchor frame alone). With ``window_frames``, of the
    frames before its block it sees only the first ``sink_frames`` and the
    ``window_frames`` most recent: exactly what a :class:`KVCache` with that
    sink and window holds when the block is generated one block at a time.
    """
    if not block_frames or min(block_frames) < 1:
        raise ValueError(f"block_frames must be a non-empty list of positive frame counts; got {list(block_frames)}")
    sizes = torch.tensor(list(block_frames), device=device)
    ends = torch.cumsum(sizes, 0)
    starts = ends - sizes
    frame_start = starts.repeat_interleave(sizes)  # (F,) first frame of each frame's block
    frame_end = ends.repeat_interleave(sizes)
    j = torch.arange(int(ends[-1]), device=device)[None, :]
    mask = j < frame_end[:, None]
    if window_frames is not None:
        before = j < frame_start[:, None]
        in_reach = (j < sink_frames) | (j >= frame_start[:, None] - window_frames)
        mask = mask & (~before | in_reach)
    return mask.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)


def rotary_for_frames(rope: nn.Module, frame_offset: int, frames: int, rows: int,
                      cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Wan's 3D rotary tables for latent frames [frame_offset, frame_offset + frames) of a (rows x cols) token grid.

    Built from the public buffers of the transformer's ``rope`` module
    (``WanRotaryPosEmbed``) exactly as its forward builds them, but starting at
    ``frame_offset``: with offset 0 the result equals ``rope(hidden_states)``.

    Args:
        rope: ``transformer.rope``.
        rows, cols: tokens per frame along h and w (latent size / patch).

    Returns:
        (cos, sin), each (1, frames * rows * cols, 1, head_dim).
    """
    if frame_offset < 0 or frame_offset + frames > rope.max_seq_len or max(rows, cols) > rope.max_seq_len:
        raise ValueError(
            f"RoPE covers positions 0..{rope.max_seq_len - 1}; got frames {frame_offset}..{frame_offset + frames - 1}"
            f" on a {rows}x{cols} grid"
        )
    split = [rope.t_dim, rope.h_dim, rope.w_dim]
    tables = []
    for freqs in (rope.freqs_cos, rope.freqs_sin):
        t, h, w = freqs.split(split, dim=1)
        t = t[frame_offset: frame_offset + frames].view(frames, 1, 1, -1).expand(frames, rows, cols, -1)
        h = h[:rows].view(1, rows, 1, -1).expand(frames, rows, cols, -1)
        w = w[:cols].view(1, 1, cols, -1).expand(frames, rows, cols, -1)
        tables.append(torch.cat([t, h, w], dim=-1).reshape(1, frames * rows * cols, 1, -1))
    return tables[0], tables[1]


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding on (B, S, heads, head_dim), the same arithmetic as diffusers' ``WanAttnProcessor``."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = cos[..., 0::2]
    sin = sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def _key_value(attn: nn.Module, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected keys (normed) and values of ``context`` for a cross-attention, each (B, L, heads, head_dim)."""
    if attn.fused_projections:
        key, value = attn.to_kv(context).chunk(2, dim=-1)
    else:
        key, value = attn.to_k(context), attn.to_v(context)
    key = attn.norm_k(key)
    return key.unflatten(2, (attn.heads, -1)), value.unflatten(2, (attn.heads, -1))


# ---- the per-call state the hook and the processors read ------------------------------------


@dataclass
class _Pass:
    """What one forward call of :class:`StreamingWanDiT` asks of the hook and the processors."""

    condition: torch.Tensor | None = None  # condition latents for the control branch
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None  # replaces the forward's position-0 rotary tables
    mask: torch.Tensor | None = None  # (1, 1, N, N) bool self-attention mask (full mode)
    cache: KVCache | None = None  # streaming mode: attend against (and maybe commit to) the cache
    cached_prompt: bool = False  # cross-attention uses the keys/values of set_prompt


class _State:
    """Shared between a :class:`StreamingWanDiT` and its processors: the pass in progress (None: plain diffusers)."""

    def __init__(self) -> None:
        self.current: _Pass | None = None


class BlockCausalSelfAttnProcessor:
    """Self-attention processor (``attn1``) of one layer: full, block-causal, or streaming against a KVCache.

    Same projections, qk norms and rotary application as diffusers'
    ``WanAttnProcessor``. With no pass in progress it computes exactly what
    ``WanAttnProcessor`` does; otherwise it uses the pass's rotary tables and
    either its mask (full mode, through ``dispatch_attention_fn``) or
    ``KVCache.attend`` for this layer (streaming mode).
    """

    _attention_backend = None  # set by diffusers' ``set_attention_backend``
    _parallel_config = None

    def __init__(self, state: _State, layer: int) -> None:
        self.state, self.layer = state, layer

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        step = self.state.current
        if attn.fused_projections:
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if step is not None and step.rotary is not None:
            rotary_emb = step.rotary
        if rotary_emb is not None:
            query = _apply_rotary(query, *rotary_emb)
            key = _apply_rotary(key, *rotary_emb)

        if step is not None and step.cache is not None:
            out = step.cache.attend(self.layer, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                    backend=self._attention_backend)
            out = out.transpose(1, 2)
        else:
            mask = attention_mask if step is None else step.mask
            out = dispatch_attention_fn(
                query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False, backend=self._attention_backend,
                parallel_config=self._parallel_config if step is None else None,
            )
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


class PromptCachedCrossAttnProcessor:
    """Cross-attention processor (``attn2``) of one layer, reusing the prompt's keys/values.

    :meth:`store` computes the keys/values of the (text-embedded) prompt once;
    a pass with ``cached_prompt`` uses them and ignores ``encoder_hidden_states``.
    Otherwise it computes exactly what diffusers' ``WanAttnProcessor`` does
    (text-to-video cross-attention; no image branch).
    """

    _attention_backend = None
    _parallel_config = None

    def __init__(self, state: _State) -> None:
        self.state = state
        self.key: torch.Tensor | None = None  # (1, L, heads, head_dim)
        self.value: torch.Tensor | None = None

    def store(self, attn: nn.Module, context: torch.Tensor) -> None:
        """Keys/values of ``context`` (1, L, inner_dim), the prompt after ``condition_embedder.text_embedder``."""
        self.key, self.value = _key_value(attn, context)

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        step = self.state.current
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        if step is not None and step.cached_prompt:
            batch = hidden_states.shape[0]
            key = self.key.expand(batch, -1, -1, -1)
            value = self.value.expand(batch, -1, -1, -1)
        else:
            key, value = _key_value(attn, encoder_hidden_states)
        out = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                                    backend=self._attention_backend, parallel_config=None)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


# ---- the streaming DiT ---------------------------------------------------------------------


class StreamingWanDiT(nn.Module):
    """A ``WanTransformer3DModel`` plus :class:`ControlBranch`, run block-causally in one pass or block by block.

    Wrapping installs the processors and the patch-embedding hook on
    ``transformer`` (its weights and forward are untouched). Called through
    this wrapper only: the prompt's cross-attention keys/values come from
    :meth:`set_prompt` (call it again after moving the model or changing its
    weights). Streaming (:meth:`forward_block`) is for inference (no grad).

    Args:
        transformer: a text-to-video Wan transformer (no image embedding, e.g. Wan2.2 TI2V).
        control: the control branch; a fresh zero-initialised one when None.
    """

    def __init__(self, transformer: WanTransformer3DModel, control: ControlBranch | None = None) -> None:
        super().__init__()
        cfg = transformer.config
        if cfg.added_kv_proj_dim is not None or cfg.image_dim is not None:
            raise ValueError("StreamingWanDiT supports text-to-video Wan transformers only (no image embedding); "
                             f"got added_kv_proj_dim={cfg.added_kv_proj_dim}, image_dim={cfg.image_dim}")
        if int(cfg.patch_size[0]) != 1:
            raise ValueError(f"per-frame timesteps and RoPE positions need a temporal patch of 1; got {cfg.patch_size}")
        inner_dim = cfg.num_attention_heads * cfg.attention_head_dim
        if control is None:
            control = ControlBranch(cfg.in_channels, inner_dim, tuple(cfg.patch_size))
        self.transformer, self.control = transformer, control
        self.patch_size = tuple(int(p) for p in cfg.patch_size)
        self._state = _State()
        self._self_attn = [BlockCausalSelfAttnProcessor(self._state, i) for i in range(len(transformer.blocks))]
        self._cross_attn = [PromptCachedCrossAttnProcessor(self._state) for _ in transformer.blocks]
        processors = {}
        for i in range(len(transformer.blocks)):
            processors[f"blocks.{i}.attn1.processor"] = self._self_attn[i]
            processors[f"blocks.{i}.attn2.processor"] = self._cross_attn[i]
        transformer.set_attn_processor(processors)
        self._hook = transformer.patch_embedding.register_forward_hook(self._add_control)
        self._prompt_dtype: torch.dtype | None = None

    def _add_control(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        step = self._state.current
        if step is None or step.condition is None:
            return output
        return output + self.control(step.condition).to(output.dtype)

    # ---- prompt and cache ----------------------------------------------------------------------
    @torch.no_grad()
    def set_prompt(self, prompt_embeds: torch.Tensor) -> None:
        """Compute every layer's cross-attention keys/values of the stream's prompt, once.

        Args:
            prompt_embeds: (1, L, text_dim) text-encoder output (UMT5 for Wan), on the model's device.
        """
        text_dim = self.transformer.config.text_dim
        if prompt_embeds.ndim != 3 or prompt_embeds.shape[0] != 1 or prompt_embeds.shape[2] != text_dim:
            raise ValueError(f"prompt_embeds must be (1, L, {text_dim}); got {tuple(prompt_embeds.shape)}")
        context = self.transformer.condition_embedder.text_embedder(prompt_embeds)
        for block, processor in zip(self.transformer.blocks, self._cross_attn):
            processor.store(block.attn2, context)
        self._prompt_dtype = prompt_embeds.dtype

    def new_cache(self, window_frames: int, block_frames: int, tokens_per_frame: int, batch: int = 1,
                  sink_frames: int = 1) -> KVCache:
        """A key/value cache for this model on its device and dtype (sink = the anchor frame by default).

        Args:
            window_frames: latent frames of the sliding window (>= block_frames).
            block_frames: latent frames of the largest block given to :meth:`forward_block`.
            tokens_per_frame: tokens of one latent frame, (h / patch_h) * (w / patch_w).
            batch: streams generated together.
            sink_frames: first committed frames never evicted.
        """
        cfg = self.transformer.config
        weight = self.transformer.patch_embedding.weight
        return KVCache(len(self.transformer.blocks), cfg.num_attention_heads, cfg.attention_head_dim,
                       tokens_per_frame, sink_frames, window_frames, block_frames, batch=batch,
                       device=weight.device, dtype=weight.dtype)

    @staticmethod
    def reset(cache: KVCache) -> None:
        """Forget every frame of ``cache`` (a new stream or a re-anchor)."""
        cache.reset()

    # ---- forward passes -----------------------------------------------------------------------
    def forward_block(self, latents: torch.Tensor, condition_latents: torch.Tensor, timesteps: torch.Tensor,
                      cache: KVCache, frame_offset: int, commit: bool) -> torch.Tensor:
        """Velocity of one block whose queries attend to [sink | window | this block] of ``cache``.

        A read pass (``commit=False``, the denoising steps) leaves the cache's
        sink and window as they were; a commit pass (normally the clean block at
        timestep 0) also writes the block's keys/values into them.

        Args:
            latents, condition_latents: (B, C, f, h, w), f <= the cache's block_frames (1 for the anchor).
            timesteps: (B, f) per latent frame in [0, 1000].
            cache: from :meth:`new_cache` with batch B and this grid's tokens per frame.
            frame_offset: absolute latent-frame position of the block's first frame (RoPE); normally
                ``cache.committed``.
            commit: write this block into the cache.

        Returns:
            (B, C, f, h, w) velocity.
        """
        self._check_inputs(latents, condition_latents, timesteps)
        self._require_prompt()
        b, _, f, h, w = latents.shape
        rows, cols = h // self.patch_size[1], w // self.patch_size[2]
        if rows * cols != cache.tokens_per_frame or cache.keys.shape[1] != b:
            raise ValueError(f"the cache holds batch {cache.keys.shape[1]} x {cache.tokens_per_frame} tokens per "
                             f"frame; these latents are batch {b} x {rows * cols}")
        rotary = rotary_for_frames(self.transformer.rope, frame_offset, f, rows, cols)
        step = _Pass(condition=condition_latents, rotary=rotary, cache=cache, cached_prompt=True)
        cache.begin(f, commit)
        try:
            out = self._run(latents, timesteps, step, None)
        finally:
            self._state.current = None
        cache.end()
        return out

    def forward_full(self, latents: torch.Tensor, condition_latents: torch.Tensor, timesteps: torch.Tensor,
                     block_frames: Sequence[int], *, window_frames: int | None = None, sink_frames: int = 1,
                     prompt_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Velocity of a whole stream in one pass under the block-causal mask (training; the reference).

        Frame i attends to its own block and earlier ones (with ``window_frames``
        only to the sink and window frames a :class:`KVCache` would hold, see
        :func:`block_causal_mask`). One block means full attention (no mask).
        With gradient checkpointing on and grad enabled, the mask stays
        installed after the call so the backward's recomputation sees it.

        Args:
            latents, condition_latents: (B, C, F, h, w), frame 0 normally the anchor.
            timesteps: (B, F) per latent frame in [0, 1000].
            block_frames: latent frames of each block, in order, summing to F (normally [1, k, k, ...]).
            window_frames, sink_frames: the cache's window and sink (None: every earlier frame is visible).
            prompt_embeds: (B, L, text_dim): cross-attend to these (gradients reach attn2) instead of the
                keys/values of :meth:`set_prompt`.

        Returns:
            (B, C, F, h, w) velocity.
        """
        self._check_inputs(latents, condition_latents, timesteps)
        frames = latents.shape[2]
        if sum(block_frames) != frames:
            raise ValueError(f"block_frames {list(block_frames)} must sum to the {frames} latent frames")
        if prompt_embeds is None:
            self._require_prompt()
        rows, cols = latents.shape[3] // self.patch_size[1], latents.shape[4] // self.patch_size[2]
        mask = None
        if len(block_frames) > 1:
            mask = block_causal_mask(block_frames, rows * cols, sink_frames, window_frames, latents.device)[None, None]
        step = _Pass(condition=condition_latents, mask=mask, cached_prompt=prompt_embeds is None)
        keep = torch.is_grad_enabled() and self.transformer.gradient_checkpointing
        try:
            return self._run(latents, timesteps, step, prompt_embeds)
        finally:
            if not keep:
                self._state.current = None

    def forward(self, latents: torch.Tensor, condition_latents: torch.Tensor, timesteps: torch.Tensor,
                block_frames: Sequence[int], **kwargs: Any) -> torch.Tensor:
        """Calling the module is :meth:`forward_full`."""
        return self.forward_full(latents, condition_latents, timesteps, block_frames, **kwargs)

    def _run(self, latents: torch.Tensor, timesteps: torch.Tensor, step: _Pass,
             prompt_embeds: torch.Tensor | None) -> torch.Tensor:
        b, _, f, h, w = latents.shape
        tokens_per_frame = (h // self.patch_size[1]) * (w // self.patch_size[2])
        token_timesteps = timesteps.repeat_interleave(tokens_per_frame, 1)  # (B, f * tokens_per_frame)
        if prompt_embeds is None:
            # The cross-attention ignores it (set_prompt's keys/values); one token keeps the text embedder cheap.
            prompt_embeds = torch.zeros(b, 1, self.transformer.config.text_dim, device=latents.device,
                                        dtype=self._prompt_dtype)
        self._state.current = step
        return self.transformer(hidden_states=latents, timestep=token_timesteps,
                                encoder_hidden_states=prompt_embeds, return_dict=False)[0]

    def _check_inputs(self, latents: torch.Tensor, condition_latents: torch.Tensor, timesteps: torch.Tensor) -> None:
        if latents.ndim != 5 or condition_latents.shape != latents.shape:
            raise ValueError(f"latents and condition_latents must be equal (B, C, f, h, w); got "
                             f"{tuple(latents.shape)} and {tuple(condition_latents.shape)}")
        _, ph, pw = self.patch_size
        if latents.shape[3] % ph or latents.shape[4] % pw:
            raise ValueError(f"latent h and w must be multiples of the patch {self.patch_size[1:]}; "
                             f"got {tuple(latents.shape[3:])}")
        if timesteps.shape != (latents.shape[0], latents.shape[2]):
            raise ValueError(f"timesteps must be (B, f) = {(latents.shape[0], latents.shape[2])}; "
                             f"got {tuple(timesteps.shape)}")

    def _require_prompt(self) -> None:
        if self._prompt_dtype is None:
            raise RuntimeError("no prompt: call set_prompt(prompt_embeds) before generating")
