"""The learned world model in PyTorch (the ``diffusion`` backend).

Modules, each mirroring one piece of the paper's system (see
``docs/world-model.md``):

* ``presets``: model sizes ``tiny`` and ``paper`` (torch-free);
* ``vae``: the causal 3D VAE (1 + 4k frames <-> 1 + k latent frames, streaming);
* ``transformer``: the block-causal DiT with the zero-initialised control branch;
* ``cache``: the fixed-size sink + sliding-window key/value cache;
* ``sampler``: the 4-step shifted flow-matching sampler;
* ``engine``: streaming generation (denoise, commit pass, re-anchoring, stage timing);
* ``model``, ``checkpoint``: the whole model and its safetensors weights;
* ``backend``: :class:`DiffusionGenerator`, the world-model backend;
* ``bench_support``: :func:`measure_stream` for ``bench/world_model.py``.

This package is the only place that imports torch. The names below are
loaded on first use, so ``import rynn_teleop.world_model.diffusion.presets``
does not import torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "PRESETS": "presets", "Preset": "presets", "get_preset": "presets",
    "DiffusionGenerator": "backend",
    "StreamEngine": "engine",
    "WorldModel": "model", "untrained_model": "model",
    "load_model": "checkpoint", "load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint",
    "CheckpointMissingError": "checkpoint", "CheckpointMismatchError": "checkpoint",
    "measure_stream": "bench_support",
}

__all__ = [
    "PRESETS", "CheckpointMismatchError", "CheckpointMissingError", "DiffusionGenerator", "Preset",
    "StreamEngine", "WorldModel", "get_preset", "load_checkpoint", "load_model",
    "measure_stream", "save_checkpoint", "untrained_model",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
