"""DiffusionGenerator (the world-model backend interface) and the stream benchmark, on the tiny preset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.backend import DiffusionGenerator
from rynn_teleop.world_model.diffusion.bench_support import measure_stream
from rynn_teleop.world_model.diffusion.checkpoint import (
    CheckpointMissingError,
    save_checkpoint,
)
from rynn_teleop.world_model.diffusion.model import untrained_model
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.generator import Generator

ACTION = np.zeros(54)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """Seeded untrained weights, only to exercise the loading path."""
    torch.set_num_threads(2)
    path = str(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")
    save_checkpoint(untrained_model(TINY, seed=0), path, TINY)
    return path


def frame(seed: int, size: tuple[int, int] = (120, 160)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def test_no_checkpoint_no_generator():
    with pytest.raises(CheckpointMissingError, match="'render' backend needs no checkpoint"):
        DiffusionGenerator("tiny", None)


def test_blocks_are_buffered_and_returned_oldest_first(checkpoint):
    gen = DiffusionGenerator("tiny", checkpoint, width=160, height=120)
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


def test_chunk_frames_sets_the_reanchoring_period(checkpoint):
    gen = DiffusionGenerator("tiny", checkpoint, chunk_frames=9)
    assert gen.uses_real_frames and gen.engine.preset.chunk_frames == 9
    gen.reset(frame(0))
    for i in range(12):
        gen.step(ACTION, frame(10 + i))
    assert gen.engine.frames_since_anchor == 4  # re-anchored before the third block
    with pytest.raises(ConfigurationError, match="whole blocks"):
        DiffusionGenerator("tiny", checkpoint, chunk_frames=10)


def test_reanchor_keeps_pending_actions(checkpoint):
    gen = DiffusionGenerator("tiny", checkpoint)
    gen.reset(frame(0))
    gen.step(ACTION, frame(1))
    gen.observe(frame(2))
    gen.reanchor(frame(3))
    assert gen.pending == 1 and gen.engine.frames_since_anchor == 0
    assert [len(gen.step(ACTION, frame(4 + i))) for i in range(3)] == [0, 0, 4]
    assert gen.width == TINY.width and gen.height == TINY.height


def test_condition_and_reset_are_required(checkpoint):
    gen = DiffusionGenerator("tiny", checkpoint)
    with pytest.raises(RuntimeError, match="reset"):
        gen.step(ACTION, frame(1))
    gen.reset(frame(0))
    with pytest.raises(ValueError, match="condition"):
        gen.step(ACTION)


def test_measure_stream_needs_a_checkpoint_or_an_explicit_random_request(checkpoint):
    with pytest.raises(CheckpointMissingError):
        measure_stream("tiny", frames=8)
    with pytest.raises(ValueError, match="not both"):
        measure_stream("tiny", frames=8, checkpoint=checkpoint, random_weights=True)
    result = measure_stream("tiny", frames=33, random_weights=True, segments=2)
    assert result["weights"] == "random" and result["frames"] == 32
    assert (result["width"], result["height"]) == (TINY.width, TINY.height)
    assert result["fps"] > 0 and result["first_frame_ms"] > 0 and result["peak_memory_mb"] > 0
    assert sum(result["stage_split"].values()) == pytest.approx(1.0)
    assert {"encode_condition", "denoise", "commit", "decode"} <= set(result["stage_split"])
    assert result["stream_length_frames"] == [17, 33] and len(result["fps_by_stream_length"]) == 2
    assert measure_stream("tiny", frames=9, checkpoint=checkpoint)["weights"] == "checkpoint"
