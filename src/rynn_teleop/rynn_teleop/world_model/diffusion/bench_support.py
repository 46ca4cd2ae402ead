"""Stream-speed measurement of the diffusion engine (for ``bench/``).

Speed does not depend on the weights' values, so the ``paper`` preset can be
timed with random weights on a GPU, but only when the caller asks for it
(``random_weights=True``); otherwise the weights are loaded, as everywhere.
The inputs are synthetic: a gradient reference frame and condition frames
with a moving disc (what is drawn does not change the work done).
"""

from __future__ import annotations

import itertools
import os
import resource
import time
from typing import Any

import numpy as np
import torch

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.generator import StageTimer

from .composite import CompositeSettings
from .engine import StreamEngine
from .fp8 import fp8_unavailable, quantize_fp8
from .model import load_model, resolve_dtype, untrained_model
from .presets import WanPreset, get_preset

WARMUP_BLOCKS = 2  # blocks run (then discarded) before timing: kernel selection, allocator warm-up


def measure_stream(preset: str | WanPreset, device: str = "cpu", dtype: str | torch.dtype = "float32",
                   frames: int = 161, base_dir: str | os.PathLike | None = None,
                   weights_dir: str | os.PathLike | None = None, prompt_file: str | os.PathLike | None = None,
                   random_weights: bool = False, seed: int = 0, segments: int = 4,
                   attention_backend: str | None = None, compile_blocks: bool = False,
                   fp8: bool = False, composite: CompositeSettings | None = None) -> dict[str, Any]:
    """Time one stream of ``frames`` frames (the reference frame and whole blocks), after a short warm-up.

    Args:
        preset: preset or its name.
        frames: stream length, reference included; rounded up to 1 + whole blocks (161 = two chunks of the
            paper's 81 frames: the first blocks after an anchor, the steady state and one re-anchor).
        base_dir, weights_dir, prompt_file: the weights (:func:`~.model.load_model`; base_dir and prompt_file
            required unless ``random_weights``).
        random_weights: time seeded random weights of the real architecture (speed only; never frames to look at).
        segments: stretches the stream is cut into for ``fps_by_stream_length``.
        attention_backend: a diffusers attention backend for the DiT ("native", "flash", ...; None: SDPA).
        compile_blocks: ``torch.compile`` the DiT's repeated blocks (diffusers' ``compile_repeated_blocks``).
        fp8: FP8 weights and activations in the DiT's block linear layers (:func:`~.fp8.quantize_fp8`).
        composite: reference compositing (:mod:`.composite`; its stage is timed as ``composite``); None: off.
            With the ``render`` reference the default robot is painted (the render backend) at the home posture
            swinging its arms.

    Returns:
        ``preset``, ``device``, ``dtype``, ``weights`` ("loaded" or "random"), ``width``,
        ``height`` [px], ``frames`` (generated frames timed), ``fps`` (generated frames per
        second after the first block [1/s]), ``first_frame_ms`` (reset(reference) until the first
        block's frames are back [ms]), ``stage_ms`` (mean time per stage call [ms]),
        ``stage_split`` (each stage's share of the summed stage time), ``peak_memory_mb`` (CUDA:
        peak allocated by torch; CPU: the process's peak resident set [MiB]),
        ``fps_by_stream_length`` (frames per second over each of ``segments`` stretches: flat
        with a fixed-size cache) and ``stream_length_frames`` (stream length at the end of
        each stretch [frames]).

    Raises:
        ConfigurationError: weights that cannot be loaded (see :func:`~.model.load_model`); ``fp8`` where the
            device or the install cannot run it.
        ValueError: both weights and ``random_weights``, or neither.
    """
    config = get_preset(preset) if isinstance(preset, str) else preset
    resolved = resolve_dtype(dtype)
    if random_weights == bool(base_dir):
        raise ValueError("give either base_dir (with prompt_file, optionally weights_dir) or random_weights=True")
    if fp8 and (reason := fp8_unavailable(device)):
        raise ConfigurationError(reason)
    model = (untrained_model(config, seed, device, resolved) if random_weights
             else load_model(config, base_dir, weights_dir, prompt_file, device, resolved))
    if attention_backend:
        model.dit.transformer.set_attention_backend(attention_backend)
    if fp8:
        quantize_fp8(model.dit.transformer)
    if compile_blocks:
        model.dit.transformer.compile_repeated_blocks(fullgraph=False)
    per_block = config.frames_per_block
    blocks = max(segments, 2, -(-(frames - 1) // per_block))
    timer = StageTimer(window=blocks + WARMUP_BLOCKS + 8)
    painter, actions = None, [None] * 8
    if composite is not None and composite.reference == "render":
        from rynn_teleop.sim.rollout import home_posture
        from rynn_teleop.world_model.render import RenderGenerator

        renderer = RenderGenerator(width=config.width, height=config.height)

        def painter(anchor: np.ndarray, q: np.ndarray) -> np.ndarray:
            return renderer.render(q, anchor)

        home = home_posture()
        actions = [[home + np.r_[np.full(14, 0.3 * np.sin(0.2 * (b * per_block + f))), np.zeros(len(home) - 14)]
                    for f in range(per_block)] for b in range(8)]
    engine = StreamEngine(model, device=device, dtype=resolved, seed=seed, timer=timer, composite=composite,
                          painter=painter)
    reference, conditions = _inputs(config)

    engine.reset(reference)
    for b in range(WARMUP_BLOCKS):
        engine.generate_block(conditions[b % len(conditions)], actions[b % len(actions)])
    timer.clear()
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)

    start = time.perf_counter()
    engine.reset(reference)
    ends = []
    for b in range(blocks):
        engine.generate_block(conditions[b % len(conditions)], actions[b % len(actions)])
        ends.append(time.perf_counter())
    bounds = np.linspace(0, blocks, segments + 1).round().astype(int).tolist()
    times = [start, *ends]
    stretches = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]
    return {
        "preset": config.name, "device": str(engine.device), "dtype": str(resolved).removeprefix("torch."),
        "weights": "random" if random_weights else "loaded", "attention_backend": attention_backend or "sdpa",
        "compiled": compile_blocks, "fp8": fp8, "width": config.width, "height": config.height,
        "frames": blocks * per_block,
        "fps": (blocks - 1) * per_block / (ends[-1] - ends[0]),
        "first_frame_ms": 1e3 * (ends[0] - start),
        "stage_ms": timer.mean_ms(), "stage_split": timer.split(),
        "peak_memory_mb": _peak_memory_mb(engine.device),
        "fps_by_stream_length": [(hi - lo) * per_block / (times[hi] - times[lo]) for lo, hi in stretches],
        "stream_length_frames": [1 + hi * per_block for _, hi in stretches],
    }


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _inputs(config: WanPreset, count: int = 8) -> tuple[np.ndarray, list[list[np.ndarray]]]:
    """A gradient reference frame and ``count`` blocks of condition frames with a moving disc."""
    h, w = config.height, config.width
    rows, cols = np.mgrid[0:h, 0:w]
    reference = np.stack([255 * cols / w, 255 * rows / h, np.full((h, w), 96.0)], axis=-1).astype(np.uint8)
    blocks = []
    for b in range(count):
        block = []
        for f in range(config.frames_per_block):
            phase = 2 * np.pi * (b * config.frames_per_block + f) / (count * config.frames_per_block)
            cy, cx = h / 2 + h / 4 * np.sin(phase), w / 2 + w / 4 * np.cos(phase)
            disc = (rows - cy) ** 2 + (cols - cx) ** 2 < (min(h, w) / 8) ** 2
            block.append(np.repeat((255 * disc).astype(np.uint8)[..., None], 3, axis=-1))
        blocks.append(block)
    return reference, blocks
