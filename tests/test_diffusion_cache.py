"""Key/value cache: allocated once, sink never evicted, window = the last W committed frames, reset clears."""

from __future__ import annotations

import pytest
import torch

from rynn_teleop.world_model.diffusion.cache import KVCache

LAYERS, HEADS, HEAD_DIM, TOKENS = 2, 2, 4, 3
SINK, WINDOW, BLOCK = 2, 3, 2


def make_cache() -> KVCache:
    return KVCache(LAYERS, HEADS, HEAD_DIM, TOKENS, SINK, WINDOW, BLOCK)


def frame_kv(frame: int, frames: int = 1) -> torch.Tensor:
    """Keys whose every value names the committed frame they belong to."""
    values = torch.arange(frame, frame + frames, dtype=torch.float32).repeat_interleave(TOKENS)
    return values.view(1, 1, -1, 1).expand(1, HEADS, -1, HEAD_DIM).contiguous()


def commit(cache: KVCache, frames: int) -> None:
    kv = frame_kv(cache.committed, frames)
    cache.begin(frames, commit=True)
    for layer in range(LAYERS):
        cache.attend(layer, kv, kv, kv)
    cache.end()


def slot_frame(cache: KVCache, slot: int) -> float:
    values = cache.keys[:, :, :, slot * TOKENS: (slot + 1) * TOKENS]
    assert torch.all(values == values.flatten()[0])
    return float(values.flatten()[0])


def test_eviction_invariants_over_many_blocks():
    cache = make_cache()
    storage = (cache.keys.data_ptr(), cache.values.data_ptr(), cache.valid.data_ptr())
    shape = cache.keys.shape
    commit(cache, 1)  # the anchor
    for _ in range(20):
        commit(cache, BLOCK)
        held = cache.frames_held()
        # capacity never grows: the same storage and shape throughout
        assert (cache.keys.data_ptr(), cache.values.data_ptr(), cache.valid.data_ptr()) == storage
        assert cache.keys.shape == shape
        # the sink holds frames 0 and 1 for ever; the window the last W committed frames, in order
        assert held[:SINK] == [0, 1]
        assert held[SINK:] == list(range(max(SINK, cache.committed - WINDOW), cache.committed))
        for frame in held:
            assert slot_frame(cache, cache.slot_of(frame)) == frame
        # exactly the held frames (and the scratch block) are valid
        valid_slots = cache.valid.view(-1, TOKENS).all(dim=1).tolist()
        held_slots = {cache.slot_of(f) for f in held}
        assert valid_slots[: SINK + WINDOW] == [s in held_slots for s in range(SINK + WINDOW)]
    assert cache.committed == 41 and cache.full


def test_block_sees_the_frame_it_evicts():
    cache = make_cache()
    for _ in range(SINK + WINDOW):
        commit(cache, 1)
    oldest = cache.frames_held()[SINK]
    q = torch.zeros(1, HEADS, BLOCK * TOKENS, HEAD_DIM)  # uniform attention: the mean of the visible values
    kv = frame_kv(cache.committed, BLOCK)
    cache.begin(BLOCK, commit=True)
    out = cache.attend(0, q, kv, kv)
    visible = cache.frames_held() + list(range(cache.committed, cache.committed + BLOCK))
    assert oldest in visible
    torch.testing.assert_close(out, torch.full_like(out, sum(visible) / len(visible)))


def test_denoising_passes_do_not_write():
    cache = make_cache()
    commit(cache, 1)
    before = cache.keys.clone(), cache.valid.clone(), cache.committed
    cache.begin(BLOCK, commit=False)
    kv = frame_kv(7, BLOCK)
    cache.attend(0, kv, kv, kv)
    cache.end()
    scratch = slice(cache.scratch_slot * TOKENS, None)
    assert torch.equal(cache.keys[..., : scratch.start, :], before[0][..., : scratch.start, :])
    assert cache.committed == before[2]
    assert torch.equal(cache.valid[: scratch.start], before[1][: scratch.start])


def test_masked_attention_ignores_empty_slots():
    cache = make_cache()
    commit(cache, 1)
    q = torch.zeros(1, HEADS, TOKENS, HEAD_DIM)
    kv = frame_kv(5)
    cache.begin(1, commit=False)
    out = cache.attend(0, q, kv, kv)
    torch.testing.assert_close(out, torch.full_like(out, (0 + 5) / 2))  # the anchor and the block only


def test_reset_clears():
    cache = make_cache()
    for _ in range(6):
        commit(cache, 1)
    cache.reset()
    assert cache.committed == 0 and cache.frames_held() == [] and not cache.valid.any()
    commit(cache, 1)
    assert cache.frames_held() == [0]


def test_block_size_is_checked():
    cache = make_cache()
    with pytest.raises(ValueError, match="1..2"):
        cache.begin(BLOCK + 1, commit=False)
    with pytest.raises(ValueError, match="window_frames >= block_frames"):
        KVCache(LAYERS, HEADS, HEAD_DIM, TOKENS, 1, 1, 2)
