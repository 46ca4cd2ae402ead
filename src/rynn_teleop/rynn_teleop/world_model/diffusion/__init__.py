"""The learned world model (the ``diffusion`` backend) on diffusers' Wan2.2 classes.

Modules:

* ``presets``: model sizes ``tiny`` and ``paper`` (torch-free);
* ``vae``: :class:`StreamingVAE`, diffusers' ``AutoencoderKLWan`` with per-stream causal caches;
* ``dit``: :class:`StreamingWanDiT`, diffusers' ``WanTransformer3DModel`` with the zero-initialised control
  branch and block-causal attention processors over the key/value cache;
* ``cache``: the fixed-size sink + sliding-window key/value cache;
* ``sampler``: the 4-step shifted flow-matching sampler;
* ``weights``: the base release, the trainer's weights folder and the prompt embedding (load, save, check);
* ``model``: :class:`WanWorldModel`, the parts of one stream; ``engine``: streaming generation;
* ``backend``: :class:`DiffusionGenerator`, the world-model backend; ``bench_support``: :func:`measure_stream`;
* ``fp8``: FP8 linear layers of the DiT through torchao (GPU only).

This package is the only place that imports torch. The names below are loaded on first use, so
``import rynn_teleop.world_model.diffusion.presets`` does not import torch. Importing the package registers
the ``diffusion`` world_model backend (``backend`` imports torch only when one is built).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from . import backend as _backend  # noqa: F401 - registers the diffusion backend; torch-free until one is built

_EXPORTS = {
    "PRESETS": "presets", "WanPreset": "presets", "get_preset": "presets",
    "DiffusionGenerator": "backend",
    "StreamEngine": "engine",
    "WanWorldModel": "model", "load_model": "model", "untrained_model": "model",
    "StreamingVAE": "vae", "StreamingWanDiT": "dit", "ControlBranch": "dit",
    "load_base": "weights", "load_weights": "weights", "save_weights": "weights", "encode_prompt": "weights",
    "load_prompt": "weights",
    "measure_stream": "bench_support",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
