"""DiffusionGenerator (the world-model backend interface) and the stream benchmark, on the tiny preset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.backend import DiffusionGenerator
from rynn_teleop.world_model.diffusion.bench_support import measure_stream
from rynn_teleop.world_model.diffusion.composite import CompositeSettings
from rynn_teleop.world_model.diffusion.model import save_model, untrained_model
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.diffusion.weights import BaseModelError, FineTunedWeightsError, PromptEmbeddingError
from rynn_teleop.world_model.generator import Generator, as_rgb

ACTION = np.zeros(54)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, str]:
    """Seeded random weights written as a tiny base release, a weights folder and a prompt file: the loading
    path of the real release."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("release")
    paths = {"base_dir": str(root / "base"), "weights_dir": str(root / "weights"),
             "prompt_file": str(root / "prompt.safetensors")}
    save_model(untrained_model(TINY, seed=0), **paths)
    return paths


def make(weights: dict[str, str], **kwargs) -> DiffusionGenerator:
    return DiffusionGenerator("tiny", **weights, **kwargs)


def frame(seed: int, size: tuple[int, int] = (120, 160)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def test_no_weights_no_generator(weights, tmp_path):
    with pytest.raises(ConfigurationError, match="base_dir is required"):
        DiffusionGenerator("tiny", None, None, weights["prompt_file"])
    with pytest.raises(ConfigurationError, match="prompt_file is required"):
        DiffusionGenerator("tiny", weights["base_dir"], None, "")
    with pytest.raises(BaseModelError, match=str(tmp_path)):
        DiffusionGenerator("tiny", str(tmp_path), None, weights["prompt_file"])
    with pytest.raises(FineTunedWeightsError):
        DiffusionGenerator("tiny", weights["base_dir"], str(tmp_path), weights["prompt_file"])
    with pytest.raises(PromptEmbeddingError):
        DiffusionGenerator("tiny", weights["base_dir"], None, str(tmp_path / "none.safetensors"))
    with pytest.raises(BaseModelError, match="expected"):  # a tiny release is not the paper model
        DiffusionGenerator("paper", weights["base_dir"], None, weights["prompt_file"])


def test_compositing_settings(weights):
    with pytest.raises(ConfigurationError, match="composite_low < composite_high"):
        make(weights, composite=True, composite_low=30.0, composite_high=20.0)
    with pytest.raises(ConfigurationError, match="composite_low < composite_high"):  # checked even when off
        make(weights, composite_low=30.0, composite_high=20.0)
    generator = make(weights, composite=True, composite_low=254.0, composite_high=255.0)
    assert generator.engine.composite.low == 254.0
    generator.reset(frame(0))
    out = [f for t in range(generator.engine.frames_per_block) for f in generator.step(np.zeros(54), frame(10 + t))]
    assert len(out) == generator.engine.frames_per_block and "composite" in generator.timings()
    anchor = as_rgb(frame(0), generator.width, generator.height)  # nothing reaches the thresholds: the anchor
    assert all(np.array_equal(f, anchor) for f in out)
    assert make(weights).engine.composite is None  # off by default


def test_the_render_reference_composites_over_the_robot_painted_at_each_action(weights):
    """composite_reference render: where nothing reaches the thresholds each frame is the render backend's
    drawing of that step's action over the anchor, at the output size."""
    from rynn_teleop.world_model.render import RenderGenerator

    with pytest.raises(ConfigurationError, match="composite_reference must be one of anchor, render"):
        make(weights, composite=True, composite_reference="robot")
    generator = make(weights, composite=True, composite_low=254.0, composite_high=255.0,
                     composite_reference="render")
    render = RenderGenerator(width=TINY.width, height=TINY.height)
    anchor = as_rgb(frame(0), TINY.width, TINY.height)
    render.reset(anchor)
    generator.reset(frame(0))
    from rynn_teleop.sim.rollout import home_posture

    home = home_posture()  # the arms in the head camera's view
    actions = [home + np.r_[np.full(14, 0.15 * t), np.zeros(40)] for t in range(generator.engine.frames_per_block)]
    out = [f for t, q in enumerate(actions) for f in generator.step(q, frame(10 + t))]
    assert len(out) == len(actions)
    for f, q in zip(out, actions):
        expected = as_rgb(render.step(q)[0], generator.width, generator.height)
        assert np.array_equal(f, expected)
    assert not np.array_equal(out[0], anchor) and not np.array_equal(out[0], out[-1])  # drawn, and moved
    # an action the renderer cannot paint is refused at once, and nothing is buffered
    for bad in (np.zeros(53), np.full(54, np.nan)):
        with pytest.raises(ValueError, match=r"render: expected a finite \(54,\) joint vector"):
            generator.step(bad, frame(20))
    assert generator.pending == 0


def test_threads_sets_torchs_pool_of_the_process_and_zero_leaves_it(weights):
    before = torch.get_num_threads()
    try:
        make(weights, threads=1)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        make(weights)  # 0: torch's default is left as it is
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert any(p.name == "threads" and p.min == 0 for p in DiffusionGenerator.SETTINGS)


def test_the_loaded_model_generates_what_the_saved_one_does(weights):
    from rynn_teleop.world_model.diffusion.engine import StreamEngine

    reference = StreamEngine(untrained_model(TINY, seed=0), seed=5)
    loaded = make(weights, seed=5)
    start = frame(0, (TINY.height, TINY.width))
    reference.reset(start)
    loaded.reset(start)
    conditions = [frame(10 + i, (TINY.height, TINY.width)) for i in range(4)]
    expected = reference.generate_block(conditions)
    got = [f for c in conditions for f in loaded.step(ACTION, c)]
    assert len(got) == 4 and all(np.array_equal(a, b) for a, b in zip(expected, got))


def test_blocks_are_buffered_and_returned_oldest_first(weights):
    gen = make(weights, width=160, height=120)
    assert isinstance(gen, Generator)
    gen.reset(frame(0))
    returned = []
    for i in range(7):
        out = gen.step(ACTION, frame(10 + i))  # any size: resized to the preset's
        returned.append(len(out))
        assert gen.pending == (i + 1) % 4
        assert all(f.shape == (120, 160, 3) and f.dtype == np.uint8 for f in out)
    assert returned == [0, 0, 0, 4, 0, 0, 0]
    assert set(gen.timings()) >= {"encode_condition", "denoise", "commit", "decode"}
    gen.reset(frame(1))
    assert gen.pending == 0
    gen.close()


def test_chunk_frames_sets_the_reanchoring_period(weights):
    gen = make(weights, chunk_frames=9)
    assert gen.uses_real_frames and gen.engine.preset.chunk_frames == 9
    gen.reset(frame(0))
    for i in range(12):
        gen.step(ACTION, frame(10 + i))
    assert gen.engine.frames_since_anchor == 4  # re-anchored before the third block
    with pytest.raises(ConfigurationError, match="whole blocks"):
        make(weights, chunk_frames=10)


def test_reanchor_keeps_pending_actions(weights):
    gen = make(weights)
    gen.reset(frame(0))
    gen.step(ACTION, frame(1))
    gen.observe(frame(2))
    gen.reanchor(frame(3))
    assert gen.pending == 1 and gen.engine.frames_since_anchor == 0
    assert [len(gen.step(ACTION, frame(4 + i))) for i in range(3)] == [0, 0, 4]
    assert gen.width == TINY.width and gen.height == TINY.height


def test_condition_and_reset_are_required(weights):
    gen = make(weights)
    with pytest.raises(RuntimeError, match="reset"):
        gen.step(ACTION, frame(1))
    gen.reset(frame(0))
    with pytest.raises(ValueError, match="condition"):
        gen.step(ACTION)


def test_measure_stream_needs_weights_or_an_explicit_random_request(weights):
    with pytest.raises(ValueError, match="random_weights"):
        measure_stream("tiny", frames=8)
    with pytest.raises(ValueError, match="random_weights"):
        measure_stream("tiny", frames=8, random_weights=True, **weights)
    result = measure_stream("tiny", frames=33, random_weights=True, segments=2)
    assert result["weights"] == "random" and result["frames"] == 32
    assert (result["width"], result["height"]) == (TINY.width, TINY.height)
    assert result["fps"] > 0 and result["first_frame_ms"] > 0 and result["peak_memory_mb"] > 0
    assert sum(result["stage_split"].values()) == pytest.approx(1.0)
    assert {"encode_condition", "denoise", "commit", "decode"} <= set(result["stage_split"])
    assert result["stream_length_frames"] == [17, 33] and len(result["fps_by_stream_length"]) == 2
    assert measure_stream("tiny", frames=9, **weights)["weights"] == "loaded"
    painted = measure_stream("tiny", frames=17, random_weights=True, segments=2,
                             composite=CompositeSettings(reference="render"))
    assert painted["stage_ms"]["composite"] > 0  # the robot painted and blended in every block
