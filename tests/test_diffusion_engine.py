"""Streaming engine on the tiny preset: causality, re-anchoring, stages, input rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rynn_teleop.world_model.diffusion import engine as engine_module
from rynn_teleop.world_model.diffusion.composite import CompositeSettings, static_video
from rynn_teleop.world_model.diffusion.engine import STAGES, STATIC_SETTLED_BLOCKS, StreamEngine
from rynn_teleop.world_model.diffusion.model import WanWorldModel as WorldModel
from rynn_teleop.world_model.diffusion.model import untrained_model
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.diffusion.sampler import FlowSampler
from rynn_teleop.world_model.diffusion.vae import rgb_to_pixels as rgb_to_tensor

# re-anchor every 9 frames: the anchor + 2 blocks of 4
SHORT = dataclasses.replace(TINY, chunk_frames=9)
H, W = TINY.height, TINY.width


def make_model(preset=TINY) -> WorldModel:
    """Seeded weights with a non-zero control branch (as after training), so conditions matter."""
    torch.set_num_threads(2)
    model = untrained_model(preset, seed=0)
    with torch.no_grad():
        model.dit.control.conv.weight.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(1))
    return model


@pytest.fixture(scope="module")
def model() -> WorldModel:
    return make_model()


@pytest.fixture(scope="module")
def short_model() -> WorldModel:
    return make_model(SHORT)


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (H, W, 3), dtype=np.uint8)


def block(seed: int) -> list[np.ndarray]:
    return [image(1000 * seed + i) for i in range(TINY.frames_per_block)]


def stream(model: WorldModel, blocks: list[int], seed: int = 0) -> list[list[np.ndarray]]:
    engine = StreamEngine(model, seed=seed)
    engine.reset(image(0))
    return [engine.generate_block(block(b)) for b in blocks]


def test_changing_future_conditions_leaves_earlier_frames_bit_identical(model):
    # API-level only (a block is returned before later conditions exist); the model's causality is
    # tested with whole sequences in test_diffusion_causality.py
    a = stream(model, [1, 2, 3, 4])
    b = stream(model, [1, 2, 7, 8])
    for early_a, early_b in zip(a[:2], b[:2]):
        assert all(np.array_equal(x, y) for x, y in zip(early_a, early_b))
    assert not all(np.array_equal(x, y) for x, y in zip(a[2], b[2]))  # the conditions do matter


def test_same_seed_same_stream_other_seed_other_stream(model):
    a, b, c = stream(model, [1, 2]), stream(model, [1, 2]), stream(model, [1, 2], seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
    assert not all(np.array_equal(x, y) for x, y in zip(a[1], c[1]))


def test_block_shapes_and_stage_timings(model):
    engine = StreamEngine(model)
    engine.reset(image(0))
    frames = engine.generate_block(block(1))
    assert len(frames) == engine.frames_per_block == 4 * TINY.block_frames
    assert all(f.shape == (H, W, 3) and f.dtype == np.uint8 for f in frames)
    assert engine.cache.committed == 1 + TINY.block_frames  # the anchor and the block
    assert set(engine.timer.mean_ms()) == set(STAGES) - {"composite"}  # reset is timed as "reanchor"


def test_input_rules(model):
    engine = StreamEngine(model)
    with pytest.raises(RuntimeError, match="reset"):
        engine.generate_block(block(1))
    engine.reset(image(0))
    with pytest.raises(ValueError, match="takes 4 condition frames"):
        engine.generate_block(block(1)[:3])
    with pytest.raises(ValueError, match=r"shape \(64, 96, 3\)"):
        engine.generate_block([np.zeros((W, H, 3), np.uint8)] * 4)


# ---- reference compositing ------------------------------------------------------------------------------


def test_compositing_where_nothing_counts_as_change_shows_the_anchor(model):
    engine = StreamEngine(model, composite=CompositeSettings(low=254.0, high=255.0, blur_px=1.5))
    engine.reset(image(0))
    for b in (1, 2):
        assert all(np.array_equal(frame, image(0)) for frame in engine.generate_block(block(b)))
    assert set(engine.timer.mean_ms()) == set(STAGES)


def test_compositing_where_everything_counts_as_change_shows_the_decoded_frames(model):
    plain = stream(model, [1, 2])
    engine = StreamEngine(model, composite=CompositeSettings(low=0.0, high=1e-3, blur_px=0.0))
    engine.reset(image(0))
    composited = [engine.generate_block(block(b)) for b in (1, 2)]
    for ours, theirs in zip(composited, plain):
        diff = np.abs(np.stack(ours).astype(int) - np.stack(theirs).astype(int))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99  # float rounding of the blend only


def test_the_reach_gate_keeps_the_anchor_beyond_the_skeletons_sweep(short_model):
    """Every change counts, but only within reach_px of where the skeleton has been since the anchor: black
    condition images leave the anchor; one skeleton pixel opens a disc around it that stays open (the sweep),
    and re-anchoring restarts the sweep from the newest condition image."""
    settings = CompositeSettings(low=0.0, high=1e-3, blur_px=0.0, reach_px=5.0)
    engine = StreamEngine(short_model, composite=settings)
    engine.reset(image(0))
    black = [np.zeros((H, W, 3), np.uint8)] * engine.frames_per_block
    assert all(np.array_equal(f, image(0)) for f in engine.generate_block(black))
    touched = [f.copy() for f in black]
    touched[1][20, 30] = (0, 200, 0)  # the skeleton at frame 2 of the block only
    frames = engine.generate_block(touched)
    assert np.array_equal(frames[0], image(0))
    for frame in frames[1:]:  # swept from frame 2 on
        changed = np.nonzero((frame != image(0)).any(axis=-1))
        assert len(changed[0]) > 0
        assert ((changed[0] - 20) ** 2 + (changed[1] - 30) ** 2).max() <= 25
    fresh = engine.generate_block(black)  # 9 frames reached: re-anchors first, on its own last frame (black cond.)
    assert all(np.array_equal(f, fresh[0]) for f in fresh) and np.array_equal(fresh[0], frames[-1])


def test_the_static_decode_streams_the_one_shot_static_video(short_model):
    """Block by block the engine's static decode is the one-shot decode of the anchor repeated; after
    re-anchoring it restarts from the new anchor (here the last generated frame)."""
    engine = StreamEngine(short_model, composite=CompositeSettings())
    engine.reset(image(0))
    n = engine.frames_per_block
    blocks = []
    for b in (1, 2):
        last = engine.generate_block(block(b))[-1]
        blocks.append(engine._static_block)
    reference = rgb_to_tensor([image(0)])
    expected = static_video(short_model.vae, reference, 1 + 2 * n)[:, :, 1:]
    assert torch.allclose(torch.cat(blocks, dim=2), expected, atol=1e-5)
    engine.generate_block(block(3))  # 9 frames reached: re-anchors on its own last frame first
    assert torch.equal(engine._reference, rgb_to_tensor([last]))
    again = static_video(short_model.vae, rgb_to_tensor([last]), 1 + n)[:, :, 1:]
    assert torch.allclose(engine._static_block, again, atol=1e-5)


UNREACHABLE = CompositeSettings(low=254.0, high=255.0, blur_px=1.5)  # no change reaches it: frames are the anchor


class Painter:
    """A stand-in renderer: the canvas with a bar of the action's first value [levels] painted on it; keeps
    each call's canvas."""

    def __init__(self) -> None:
        self.canvases: list[np.ndarray] = []

    def __call__(self, canvas: np.ndarray, action: np.ndarray) -> np.ndarray:
        self.canvases.append(canvas.copy())
        out = canvas.copy()
        out[10:20, 5:40] = int(action[0])
        return out


def test_the_render_reference_shows_the_painted_frames_where_the_model_changes_nothing(short_model):
    """Nothing counts as change: each frame is the painter's drawing of its own action over the anchor; after
    re-anchoring (9 frames) the painter draws over the new anchor (the last generated frame)."""
    painter = Painter()
    engine = StreamEngine(short_model, composite=dataclasses.replace(UNREACHABLE, reference="render"),
                          painter=painter)
    engine.reset(image(0))
    n = engine.frames_per_block
    frames = []
    for b in (1, 2):
        actions = [np.full(54, 10.0 * (n * b + i)) for i in range(n)]
        out = engine.generate_block(block(b), actions)
        for frame, action in zip(out, actions):
            assert np.array_equal(frame, painter(image(0), action))
        frames += out
    assert all(np.array_equal(c, image(0)) for c in painter.canvases)
    painter.canvases.clear()
    engine.generate_block(block(3), [np.full(54, 7.0)] * n)  # re-anchors on its own last frame first
    assert painter.canvases and all(np.array_equal(c, frames[-1]) for c in painter.canvases)


def test_the_render_references_static_decode_streams_the_one_shot_decode_of_the_painted_video(short_model):
    """Block by block the static decode of the painted frames is the one-shot decode of the anchor followed by
    them (what evaluate and tune-composite compute offline)."""
    painter = Painter()
    engine = StreamEngine(short_model, composite=CompositeSettings(reference="render"), painter=painter)
    engine.reset(image(0))
    n = engine.frames_per_block
    statics, painted = [], []
    real = engine._static_of

    def keep(reference):
        painted.append(reference)
        statics.append(real(reference))
        return statics[-1]

    engine._static_of = keep
    for b in (1, 2):
        engine.generate_block(block(b), [np.full(54, 30.0 * (b + i)) for i in range(n)])
    video = torch.cat([rgb_to_tensor([image(0)]), *painted], dim=2)
    expected = short_model.vae.decode(short_model.vae.encode(video))[:, :, 1:]
    assert torch.allclose(torch.cat(statics, dim=2), expected, atol=1e-5)
    assert not torch.allclose(statics[0][:, :, :1], statics[1][:, :, :1], atol=1e-3)  # it follows the painting


def test_the_render_reference_needs_a_painter_and_the_actions(short_model):
    settings = dataclasses.replace(UNREACHABLE, reference="render")
    with pytest.raises(ValueError, match="needs a painter"):
        StreamEngine(short_model, composite=settings)
    engine = StreamEngine(short_model, composite=settings, painter=Painter())
    engine.reset(image(0))
    with pytest.raises(ValueError, match="needs the block's 4 actions; got none"):
        engine.generate_block(block(1))
    with pytest.raises(ValueError, match="needs the block's 4 actions; got 3"):
        engine.generate_block(block(1), [np.zeros(54)] * 3)


def test_compositing_re_anchors_on_the_observed_real_frame(short_model):
    engine = StreamEngine(short_model, composite=UNREACHABLE)
    engine.reset(image(0))
    engine.observe(image(60))
    for b in (1, 2):
        assert all(np.array_equal(f, image(0)) for f in engine.generate_block(block(b)))
    assert all(np.array_equal(f, image(60)) for f in engine.generate_block(block(3)))  # re-anchored first


def test_compositing_with_a_bfloat16_dit_keeps_the_anchor_exact(model):
    engine = StreamEngine(model, dtype="bfloat16", composite=UNREACHABLE)
    engine.reset(image(0))  # bfloat16 pixels are off by up to half a level; the reference is rounded back
    assert all(np.array_equal(f, image(0)) for f in engine.generate_block(block(1)))


def test_a_block_whose_compositing_fails_is_followed_by_a_re_anchor(model, monkeypatch):
    engine = StreamEngine(model, composite=UNREACHABLE)
    engine.reset(image(0))
    engine.generate_block(block(1))
    real = engine_module.composite

    def fail(*args, **kwargs):
        raise RuntimeError("compositing failed")

    monkeypatch.setattr(engine_module, "composite", fail)
    with pytest.raises(RuntimeError, match="compositing failed"):
        engine.generate_block(block(2))
    monkeypatch.setattr(engine_module, "composite", real)
    # re-anchors on its last frame (the anchor): the static streams restart in step with the generated ones
    assert all(np.array_equal(f, image(0)) for f in engine.generate_block(block(3)))
    assert engine.frames_since_anchor == engine.frames_per_block


def test_a_settled_static_decode_is_reused_until_the_next_anchoring(model, monkeypatch):
    engine = StreamEngine(model, composite=CompositeSettings())
    vae = engine.model.vae
    real_decode, static_calls = vae.decode, []

    def decode(latents, stream=None):
        out = real_decode(latents, stream)
        if stream is engine._static_decoder:  # a static decode that never changes: quiet from its second block
            static_calls.append(out.shape[2])
            return torch.zeros_like(out)
        return out

    monkeypatch.setattr(vae, "decode", decode)
    engine.reset(image(0))
    for b in range(1, STATIC_SETTLED_BLOCKS + 4):
        engine.generate_block(block(b))
    assert engine.static_settled
    # the anchor's frame, the first block, then the quiet blocks until settled; none after
    assert static_calls == [1] + [engine.frames_per_block] * (1 + STATIC_SETTLED_BLOCKS)
    engine.reanchor(image(9))
    assert not engine.static_settled
    engine.generate_block(block(9))
    assert static_calls[-2:] == [1, engine.frames_per_block]  # restarted from the new anchor


def sink_keys(engine: StreamEngine) -> torch.Tensor:
    tokens = engine.cache.tokens_per_frame * engine.cache.sink_frames
    return engine.cache.keys[:, :, :, :tokens].clone()


def test_reanchoring_resets_the_cache_on_the_newest_real_frame(short_model):
    engine = StreamEngine(short_model)
    engine.reset(image(0))
    engine.generate_block(block(1))
    engine.generate_block(block(2))
    assert engine.cache.committed == 3 and engine.frames_since_anchor == 8
    engine.observe(image(50))
    engine.observe(image(51))  # the newest one counts
    engine.generate_block(block(3))  # 9 frames reached: re-anchors first
    assert engine.frames_since_anchor == 4
    assert engine.cache.committed == 2 and engine.cache.frames_held() == [0, 1]
    # the sink is what a fresh stream anchored on that frame (and the newest condition) holds
    fresh = StreamEngine(short_model)
    fresh.reset(image(51), condition=block(2)[-1])
    assert torch.equal(sink_keys(engine), sink_keys(fresh))
    assert "reanchor" in engine.timer.mean_ms()


def test_reanchoring_without_a_real_frame_uses_the_last_generated_frame(short_model):
    engine = StreamEngine(short_model)
    engine.reset(image(0))
    engine.generate_block(block(1))
    last = engine.generate_block(block(2))[-1]
    engine.generate_block(block(3))
    fresh = StreamEngine(short_model)
    fresh.reset(last, condition=block(2)[-1])
    assert torch.equal(sink_keys(engine), sink_keys(fresh))


def test_observed_frame_is_used_once(short_model):
    engine = StreamEngine(short_model)
    engine.reset(image(0))
    engine.observe(image(60))
    for b in range(1, 4):
        engine.generate_block(block(b))  # re-anchors on image 60 before block 3
    on_real = StreamEngine(short_model)
    on_real.reset(image(60), condition=block(2)[-1])
    assert torch.equal(sink_keys(engine), sink_keys(on_real))
    last = engine.generate_block(block(4))[-1]
    engine.generate_block(block(5))  # re-anchors again: no newer real frame, so on its own last frame
    on_own = StreamEngine(short_model)
    on_own.reset(last, condition=block(4)[-1])
    assert torch.equal(sink_keys(engine), sink_keys(on_own))


def test_reanchor_now(model):
    engine = StreamEngine(model)
    engine.reset(image(0))
    engine.generate_block(block(1))
    engine.reanchor(image(70))
    assert engine.cache.committed == 1 and engine.frames_since_anchor == 0
    fresh = StreamEngine(model)
    fresh.reset(image(70), condition=block(1)[-1])
    assert torch.equal(sink_keys(engine), sink_keys(fresh))


def test_generated_latents_equal_the_whole_sequence_model(model):
    """Every block the engine generates is the whole-sequence DiT's 4-step sample of that block behind
    clean (t = 0) earlier frames, with the same noise: checks the commit pass (clean keys/values of
    every generated block written at t = 0) and, past window + 2 blocks, the cache's eviction."""
    blocks = TINY.window_frames + 3
    engine = StreamEngine(model, seed=3)
    generated, conditions = [], []
    denoise = engine._denoise

    def spy(condition):
        latents = denoise(condition)
        conditions.append(condition.clone())
        generated.append(latents.clone())
        return latents

    engine._denoise = spy
    engine.reset(image(0))
    for b in range(1, blocks + 1):
        engine.generate_block(block(b))
    assert engine.cache.committed == 1 + blocks and len(engine.cache.frames_held()) < 1 + blocks  # evicted

    with torch.no_grad():
        clean = [model.vae.encode(rgb_to_tensor([image(0)]))]
        cond = [model.vae.encode(torch.full((1, 3, 1, H, W), -1.0))]  # the black anchor condition
        sampler = FlowSampler(TINY.timesteps, TINY.shift)
        noise = torch.Generator().manual_seed(3)
        for i in range(blocks):
            context = torch.cat(clean, 2)
            condition = torch.cat(cond + [conditions[i]], 2)
            n = context.shape[2]

            def velocity(x, timestep, context=context, condition=condition, n=n):
                timesteps = torch.cat([torch.zeros(1, n), torch.full((1, x.shape[2]), timestep)], 1)
                frames = [1] + [TINY.block_frames] * ((n - 1) // TINY.block_frames + 1)
                return model.dit.forward_full(torch.cat([context, x], 2), condition, timesteps, frames,
                                              window_frames=TINY.window_frames,
                                              sink_frames=TINY.sink_frames)[:, :, n:]

            reference = sampler.sample(velocity, conditions[i].shape, noise, "cpu", torch.float32)
            torch.testing.assert_close(generated[i], reference, rtol=1e-5, atol=1e-5, msg=f"block {i + 1}")
            clean.append(reference)
            cond.append(conditions[i])


def test_a_failed_block_leaves_the_reanchoring_condition_alone(model):
    engine = StreamEngine(model)
    engine.reset(image(0), condition=image(5))
    before = engine._last_condition.clone()

    def fail(_):
        raise RuntimeError("out of memory")

    engine._denoise = fail
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.generate_block(block(1))
    assert torch.equal(engine._last_condition, before)


@pytest.mark.parametrize("stage", ["commit", "decode"])
def test_a_block_that_fails_part_way_is_followed_by_a_re_anchor(model, stage):
    """A failure after the condition encoder (or the cache) moved on leaves them inconsistent: the next block
    starts from a re-anchor on the last good frame, so the streams are those of a fresh anchor."""
    engine = StreamEngine(model)
    engine.reset(image(0), condition=image(5))
    original = engine.model.dit.forward_block if stage == "commit" else engine.model.vae.decode

    def fail(*args, **kwargs):
        if stage == "decode" or kwargs.get("commit"):
            raise RuntimeError("out of memory")
        return original(*args, **kwargs)

    target = engine.model.dit if stage == "commit" else engine.model.vae
    setattr(target, "forward_block" if stage == "commit" else "decode", fail)
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            engine.generate_block(block(1))
        assert engine._condition_stream.frames == 1 + TINY.frames_per_block  # moved on with the failed block
    finally:
        delattr(target, "forward_block" if stage == "commit" else "decode")
    frames = engine.generate_block(block(2))
    assert len(frames) == TINY.frames_per_block
    assert engine._condition_stream.frames == 1 + TINY.frames_per_block  # re-anchored, then one block
    assert engine.cache.committed == 1 + TINY.block_frames


def test_the_attention_backend_reaches_the_streaming_self_attention(model, monkeypatch):
    from rynn_teleop.world_model.diffusion import cache as cache_module

    seen = []
    real = cache_module.dispatch_attention_fn

    def spy(*args, backend=None, **kwargs):
        seen.append(backend)
        return real(*args, backend=backend, **kwargs)

    monkeypatch.setattr(cache_module, "dispatch_attention_fn", spy)
    expected = stream(model, [1, 2, 3, 4])
    assert not seen  # no backend set: PyTorch's SDPA directly
    model.dit.transformer.set_attention_backend("native")
    try:
        frames = stream(model, [1, 2, 3, 4])
    finally:
        for processor in model.dit.transformer.attn_processors.values():
            processor._attention_backend = None
    assert seen and all(str(b.value if hasattr(b, "value") else b) == "native" for b in seen)
    assert all(np.array_equal(a, b) for x, y in zip(expected, frames) for a, b in zip(x, y))


def test_a_chunk_beyond_the_rotary_table_is_refused():
    from rynn_teleop.world_model.diffusion.presets import WanPresetError

    longest = TINY.transformer_config["rope_max_seq_len"]
    with pytest.raises(WanPresetError, match="rope_max_seq_len"):
        dataclasses.replace(TINY, chunk_frames=1 + 4 * longest)


def test_the_small8_preset_streams_its_frame_size_through_an_8x_vae():
    """``small8``: 8x VAE latents (20x12 per latent frame, 10x6 tokens); the engine streams 160x96 frames and a
    block does not depend on later conditions."""
    from rynn_teleop.world_model.diffusion.presets import SMALL8

    assert SMALL8.latent_grid == (12, 20) and SMALL8.token_grid == (6, 10)
    model = make_model(SMALL8)
    assert model.vae.spatial_compression == 8
    rng = np.random.default_rng(3)

    def frames(n: int) -> list[np.ndarray]:
        return [rng.integers(0, 256, (SMALL8.height, SMALL8.width, 3), dtype=np.uint8) for _ in range(n)]

    anchor, first, second, other = frames(1)[0], frames(4), frames(4), frames(4)
    outputs = []
    for later in (second, other):
        engine = StreamEngine(model, seed=0)
        engine.reset(anchor)
        outputs.append([engine.generate_block(first), engine.generate_block(later)])
    assert all(f.shape == (SMALL8.height, SMALL8.width, 3) for f in outputs[0][0])
    assert all(np.array_equal(x, y) for x, y in zip(outputs[0][0], outputs[1][0]))
    assert not all(np.array_equal(x, y) for x, y in zip(outputs[0][1], outputs[1][1]))
