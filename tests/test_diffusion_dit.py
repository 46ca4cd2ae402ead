"""Streaming on diffusers' WanTransformer3DModel: zero-init control, block-causal mask, cache = one-pass attention."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusion_configs import PAPER_TRANSFORMER_CONFIG, tiny_transformer_config

from rynn_teleop.world_model.diffusion.cache import KVCache
from rynn_teleop.world_model.diffusion.dit import ControlBranch, StreamingWanDiT, block_causal_mask, rotary_for_frames

C, H, W = 48, 4, 6  # latent channels and grid: 2 x 3 = 6 tokens per frame
TOKENS = (H // 2) * (W // 2)
BLOCK = 2
BLOCKS = [1, BLOCK, BLOCK, BLOCK]  # the anchor, then three blocks
FRAMES = sum(BLOCKS)
TEXT_DIM = tiny_transformer_config()["text_dim"]


def make_base(seed: int = 0) -> WanTransformer3DModel:
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    return WanTransformer3DModel(**tiny_transformer_config()).eval().requires_grad_(False)


def make_dit(seed: int = 0, trained_control: bool = True) -> StreamingWanDiT:
    dit = StreamingWanDiT(make_base(seed)).eval().requires_grad_(False)
    if trained_control:  # a trained control branch is not zero
        torch.nn.init.normal_(dit.control.conv.weight, std=0.2)
        torch.nn.init.normal_(dit.control.conv.bias, std=0.2)
    dit.set_prompt(prompt())
    return dit


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def latents(frames: int = FRAMES, seed: int = 1) -> torch.Tensor:
    return randn(1, C, frames, H, W, seed=seed)


def prompt() -> torch.Tensor:
    return randn(1, 5, TEXT_DIM, seed=99)


def starts(blocks: list[int]) -> list[int]:
    return [sum(blocks[:i]) for i in range(len(blocks))]


def stream(dit: StreamingWanDiT, cache: KVCache, clean: torch.Tensor, noisy: torch.Tensor, cond: torch.Tensor,
           read_t: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Anchor commit, then per block a read pass on ``noisy`` at ``read_t`` and a commit pass on ``clean`` at 0."""
    commits, reads = [], []
    for start, size in zip(starts(BLOCKS), BLOCKS):
        frames = slice(start, start + size)
        if start > 0:
            reads.append(dit.forward_block(noisy[:, :, frames], cond[:, :, frames], read_t[:, frames], cache,
                                           frame_offset=start, commit=False))
        else:
            reads.append(None)
        commits.append(dit.forward_block(clean[:, :, frames], cond[:, :, frames], torch.zeros(1, size), cache,
                                         frame_offset=start, commit=True))
    return commits, reads


# ---- configs ---------------------------------------------------------------------------------


def test_paper_config_is_the_published_5b_transformer():
    cfg = PAPER_TRANSFORMER_CONFIG
    assert cfg["num_attention_heads"] * cfg["attention_head_dim"] == 3072
    assert (cfg["num_layers"], cfg["ffn_dim"], cfg["in_channels"], cfg["out_channels"]) == (30, 14336, 48, 48)
    assert set(cfg) <= set(WanTransformer3DModel.extract_init_dict(cfg)[0])  # every key is a constructor argument
    with torch.device("meta"):
        model = WanTransformer3DModel(**cfg)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(5.0e9, rel=0.05)


def test_tiny_config_builds_a_ti2v_shaped_model():
    cfg = make_base().config
    assert (cfg.in_channels, cfg.out_channels, tuple(cfg.patch_size)) == (48, 48, (1, 2, 2))
    assert cfg.attention_head_dim % 6 == 0


# ---- zero-init identity ----------------------------------------------------------------------


def test_fresh_control_branch_is_the_base_model_bit_for_bit():
    base = make_base()
    reference = copy.deepcopy(base)
    dit = StreamingWanDiT(base).eval()
    dit.set_prompt(prompt())
    assert torch.count_nonzero(dit.control.conv.weight) == 0 and torch.count_nonzero(dit.control.conv.bias) == 0
    assert dit.control.scale.item() == pytest.approx(0.1)
    x, t = latents(), randn(1, FRAMES, seed=3).abs() * 1000
    t[:, 0] = 0  # the anchor frame is clean
    with torch.no_grad():
        expected = reference(x, t.repeat_interleave(TOKENS, 1), prompt(), return_dict=False)[0]
        for seed in (4, 5):  # any condition
            assert torch.equal(dit.forward_full(x, latents(seed=seed), t, [FRAMES]), expected)
        # the processors and the hook change nothing when the transformer is called directly
        assert torch.equal(base(x, t.repeat_interleave(TOKENS, 1), prompt(), return_dict=False)[0], expected)
        # cross-attending to per-call prompt embeddings is the same computation as the cached prompt
        assert torch.equal(dit.forward_full(x, latents(seed=4), t, [FRAMES], prompt_embeds=prompt()), expected)


def test_one_block_mask_is_full_attention():
    assert block_causal_mask([FRAMES], TOKENS).all()
    mask = block_causal_mask(BLOCKS, TOKENS)
    frame_mask = mask[::TOKENS, ::TOKENS].int().tolist()
    assert frame_mask == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1],
    ]
    # with a window of 2 the last block no longer sees frames 1 and 2, but always the anchor (the sink)
    windowed = block_causal_mask(BLOCKS, TOKENS, sink_frames=1, window_frames=2)[::TOKENS, ::TOKENS]
    assert windowed[5].int().tolist() == [1, 0, 0, 1, 1, 1, 1]


def test_control_branch_is_wired_and_trainable(tmp_path):
    dit = make_dit(trained_control=False)
    x, cond, t = latents(), latents(seed=2), torch.zeros(1, FRAMES)
    dit.control.requires_grad_(True)
    out = dit.forward_full(x, cond, t, BLOCKS)
    out.square().mean().backward()
    assert torch.count_nonzero(dit.control.conv.weight.grad) > 0  # the zero-initialised weights still learn
    with torch.no_grad():
        torch.nn.init.normal_(dit.control.conv.weight, std=0.2)
        assert not torch.equal(dit.forward_full(x, cond, t, BLOCKS), out)
    dit.control.save_pretrained(tmp_path)
    loaded = ControlBranch.from_pretrained(tmp_path)
    assert torch.equal(loaded.conv.weight, dit.control.conv.weight) and loaded.scale.item() == pytest.approx(0.1)


def test_rotary_tables_continue_at_the_frame_offset():
    rope = make_base().rope
    rows, cols = H // 2, W // 2
    whole = rope(torch.zeros(1, C, 5, H, W))
    assert all(torch.equal(a, b) for a, b in zip(rotary_for_frames(rope, 0, 5, rows, cols), whole))
    offset = rotary_for_frames(rope, 3, 2, rows, cols)
    assert all(torch.equal(a, b[:, 3 * TOKENS:]) for a, b in zip(offset, whole))
    with pytest.raises(ValueError, match="RoPE covers"):
        rotary_for_frames(rope, rope.max_seq_len - 1, 2, rows, cols)


# ---- streaming = one pass ----------------------------------------------------------------------


def test_streaming_equals_the_block_causal_pass():
    dit = make_dit()
    clean, noisy, cond = latents(seed=1), latents(seed=2), latents(seed=3)
    read_t = randn(1, FRAMES, seed=4).abs() * 1000
    cache = dit.new_cache(window_frames=FRAMES, block_frames=BLOCK, tokens_per_frame=TOKENS)
    with torch.no_grad():
        commits, reads = stream(dit, cache, clean, noisy, cond, read_t)
        full = dit.forward_full(clean, cond, torch.zeros(1, FRAMES), BLOCKS)
        torch.testing.assert_close(torch.cat(commits, dim=2), full, rtol=1e-5, atol=1e-5)
        # each read pass: the committed past at t=0 and this block, noisy, at its own timestep
        for i, (start, size) in enumerate(zip(starts(BLOCKS), BLOCKS)):
            if reads[i] is None:
                continue
            end = start + size
            x = torch.cat([clean[:, :, :start], noisy[:, :, start:end]], dim=2)
            t = torch.cat([torch.zeros(1, start), read_t[:, start:end]], dim=1)
            expected = dit.forward_full(x, cond[:, :, :end], t, BLOCKS[: i + 1])[:, :, start:]
            torch.testing.assert_close(reads[i], expected, rtol=1e-5, atol=1e-5)
    assert cache.frames_held() == list(range(FRAMES))


def test_eviction_keeps_the_sink_and_the_latest_frames():
    dit = make_dit()
    window = 3
    clean, cond = latents(seed=1), latents(seed=3)
    cache = dit.new_cache(window_frames=window, block_frames=BLOCK, tokens_per_frame=TOKENS)
    commits, sink = [], None
    with torch.no_grad():
        for start, size in zip(starts(BLOCKS), BLOCKS):
            frames = slice(start, start + size)
            commits.append(dit.forward_block(clean[:, :, frames], cond[:, :, frames], torch.zeros(1, size), cache,
                                             frame_offset=start, commit=True))
            held = cache.frames_held()
            assert held[0] == 0 and held[1:] == list(range(max(1, cache.committed - window), cache.committed))
            anchor_keys = cache.keys[:, :, :, cache.slot_of(0) * TOKENS: (cache.slot_of(0) + 1) * TOKENS]
            if sink is None:
                sink = anchor_keys.clone()
            assert torch.equal(anchor_keys, sink)  # the anchor is never evicted nor overwritten
        assert cache.committed == FRAMES and cache.full
        # the evicting stream equals the one-pass form with the same sink and window
        full = dit.forward_full(clean, cond, torch.zeros(1, FRAMES), BLOCKS, sink_frames=1, window_frames=window)
        torch.testing.assert_close(torch.cat(commits, dim=2), full, rtol=1e-5, atol=1e-5)
        # and differs from unbounded attention, so the window did cut something
        assert not torch.allclose(full, dit.forward_full(clean, cond, torch.zeros(1, FRAMES), BLOCKS), atol=1e-4)


def test_read_pass_leaves_the_cache_unchanged():
    dit = make_dit()
    clean, cond = latents(seed=1), latents(seed=3)
    cache = dit.new_cache(window_frames=3, block_frames=BLOCK, tokens_per_frame=TOKENS)
    held_slots = slice(0, cache.scratch_slot * TOKENS)  # sink and window; the scratch block is the pass's own
    with torch.no_grad():
        dit.forward_block(clean[:, :, :1], cond[:, :, :1], torch.zeros(1, 1), cache, frame_offset=0, commit=True)
        before = (cache.keys[..., held_slots, :].clone(), cache.values[..., held_slots, :].clone(),
                  cache.valid[held_slots].clone(), cache.committed, cache.frames_held())
        dit.forward_block(clean[:, :, 1:3], cond[:, :, 1:3], torch.full((1, 2), 700.0), cache, frame_offset=1,
                          commit=False)
    assert torch.equal(cache.keys[..., held_slots, :], before[0])
    assert torch.equal(cache.values[..., held_slots, :], before[1])
    assert torch.equal(cache.valid[held_slots], before[2])
    assert (cache.committed, cache.frames_held()) == before[3:]


# ---- causality ------------------------------------------------------------------------------


@pytest.mark.parametrize("changed", ["latents", "condition"])
def test_later_blocks_do_not_change_earlier_outputs(changed):
    dit = make_dit()
    clean, cond = latents(seed=1), latents(seed=3)
    read_t = torch.full((1, FRAMES), 500.0)
    last = starts(BLOCKS)[-1]
    other_clean, other_cond = clean.clone(), cond.clone()
    target = other_clean if changed == "latents" else other_cond
    target[:, :, last:] = latents(seed=7)[:, :, last:]
    with torch.no_grad():
        a = dit.forward_full(clean, cond, read_t, BLOCKS)
        b = dit.forward_full(other_clean, other_cond, read_t, BLOCKS)
        assert torch.equal(a[:, :, :last], b[:, :, :last])
        assert not torch.equal(a[:, :, last:], b[:, :, last:])
        outputs = []
        for x, c in ((clean, cond), (other_clean, other_cond)):
            cache = dit.new_cache(window_frames=FRAMES, block_frames=BLOCK, tokens_per_frame=TOKENS)
            commits, reads = stream(dit, cache, x, x, c, read_t)
            outputs.append(torch.cat(commits[:-1] + reads[1:-1], dim=2))
        assert torch.equal(outputs[0], outputs[1])


# ---- the prompt ------------------------------------------------------------------------------


def test_prompt_keys_and_values_are_computed_once():
    dit = make_dit()
    calls = []
    handle = dit.transformer.blocks[0].attn2.to_k.register_forward_hook(lambda *_: calls.append(1))
    dit.set_prompt(prompt())
    assert len(calls) == 1
    cache = dit.new_cache(window_frames=FRAMES, block_frames=BLOCK, tokens_per_frame=TOKENS)
    with torch.no_grad():
        stream(dit, cache, latents(seed=1), latents(seed=2), latents(seed=3), torch.full((1, FRAMES), 500.0))
    handle.remove()
    assert len(calls) == 1


def test_streaming_needs_a_prompt_and_a_matching_cache():
    dit = StreamingWanDiT(make_base())
    cache = dit.new_cache(window_frames=FRAMES, block_frames=BLOCK, tokens_per_frame=TOKENS)
    x = latents(1)
    with pytest.raises(RuntimeError, match="set_prompt"):
        dit.forward_block(x, x, torch.zeros(1, 1), cache, frame_offset=0, commit=True)
    dit.set_prompt(prompt())
    wrong = dit.new_cache(window_frames=FRAMES, block_frames=BLOCK, tokens_per_frame=TOKENS + 1)
    with pytest.raises(ValueError, match="tokens per frame"):
        dit.forward_block(x, x, torch.zeros(1, 1), wrong, frame_offset=0, commit=True)
    with pytest.raises(ValueError, match="sum to"):
        dit.forward_full(latents(), latents(), torch.zeros(1, FRAMES), [1, 2])


# ---- training ------------------------------------------------------------------------------


def test_gradient_checkpointing_sees_the_mask():
    grads = []
    for checkpointing in (False, True):
        dit = make_dit()
        dit.transformer.requires_grad_(True).train()
        if checkpointing:
            dit.transformer.enable_gradient_checkpointing()
        out = dit.forward_full(latents(seed=1), latents(seed=3), torch.full((1, FRAMES), 300.0), BLOCKS,
                               prompt_embeds=prompt())
        out.square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in dit.transformer.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)
