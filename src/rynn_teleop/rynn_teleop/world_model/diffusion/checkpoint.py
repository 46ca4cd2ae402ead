"""Weights of the world model in a safetensors file.

A checkpoint holds every tensor of :class:`~.model.WorldModel`'s state dict
(VAE, DiT, control branch, latent normalisation) and metadata naming its
preset and the preset's shape-deciding dimensions. Loading refuses a missing
file, a file of another preset or shape, and never leaves random weights in
place: either every tensor is loaded or an error is raised.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from rynn_teleop.errors import ConfigurationError

from .model import WorldModel, resolve_dtype
from .presets import Preset

FORMAT = "rynn_teleop.diffusion"
VERSION = "1"
MAX_LISTED = 10  # differences listed in a mismatch error


class CheckpointMissingError(ConfigurationError):
    """No checkpoint was given, or the file does not exist."""


class CheckpointMismatchError(ConfigurationError):
    """The file is not a checkpoint of this preset (other preset, keys or shapes).

    Attributes:
        differences: every difference found, one line each.
    """

    def __init__(self, path: Path, differences: list[str]) -> None:
        self.differences = differences
        listed = "\n  ".join(differences[:MAX_LISTED])
        more = f"\n  ... and {len(differences) - MAX_LISTED} more" if len(differences) > MAX_LISTED else ""
        super().__init__(f"checkpoint {path} does not match the model:\n  {listed}{more}")


def require_checkpoint(path: str | os.PathLike | None) -> Path:
    """``path`` as an existing file.

    Raises:
        CheckpointMissingError: None or "", or no such file.
    """
    if not path or not Path(path).is_file():
        where = "no checkpoint was given" if not path else f"there is no file at {path}"
        raise CheckpointMissingError(
            f"the diffusion world model needs a trained checkpoint (a .safetensors file written by "
            f"save_checkpoint), but {where}; it never runs on random weights. "
            "The 'render' backend needs no checkpoint."
        )
    return Path(path)


def save_checkpoint(model: nn.Module, path: str | os.PathLike, preset: Preset) -> None:
    """Write every tensor of ``model`` and the preset metadata to ``path`` (safetensors)."""
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    metadata = {"format": FORMAT, "version": VERSION, "preset": preset.name,
                "dims": json.dumps(preset.shape_fields, sort_keys=True)}
    save_file(tensors, str(path), metadata=metadata)


def load_checkpoint(model: nn.Module, path: str | os.PathLike | None, preset: Preset) -> None:
    """Load the checkpoint at ``path`` into ``model`` (a model built from ``preset``), in place.

    Tensors are converted to the model's device and dtype. Nothing is loaded
    unless the whole file matches.

    Raises:
        CheckpointMissingError: no path, or no such file.
        CheckpointMismatchError: not a safetensors file, another format, format version or preset,
            other dimensions, missing/unexpected keys or other shapes (the first
            differences are listed).
    """
    file = check_checkpoint(model, path, preset)
    with safe_open(str(file), framework="pt") as reader, torch.no_grad():
        for name, target in model.state_dict().items():
            target.copy_(reader.get_tensor(name))


def check_checkpoint(model: nn.Module, path: str | os.PathLike | None, preset: Preset) -> Path:
    """``path`` if it holds a checkpoint matching ``model`` and ``preset`` (reads the header only;
    ``model`` may be on the meta device).

    Raises:
        CheckpointMissingError, CheckpointMismatchError: as :func:`load_checkpoint`.
    """
    file = require_checkpoint(path)
    try:
        with safe_open(str(file), framework="pt") as reader:
            differences = _differences(reader.metadata() or {}, reader, model.state_dict(), preset)
    except SafetensorError as error:
        raise CheckpointMismatchError(file, [f"not a readable safetensors file ({error})"]) from error
    if differences:
        raise CheckpointMismatchError(file, differences)
    return file


def load_model(preset: Preset, path: str | os.PathLike | None, device: torch.device | str = "cpu",
               dtype: torch.dtype | str = torch.float32) -> WorldModel:
    """The model of ``preset`` with the checkpoint's weights, on ``device`` in ``dtype``, in eval mode.

    The model is laid out on the meta device and allocated directly in
    ``dtype`` (no float32 copy, no random initialisation): every tensor then
    comes from the file.

    Raises:
        CheckpointMissingError, CheckpointMismatchError: as :func:`load_checkpoint`.
    """
    with torch.device("meta"):
        model = WorldModel(preset)
    file = check_checkpoint(model, path, preset)  # before allocating anything
    model = model.to(resolve_dtype(dtype)).to_empty(device=device)
    load_checkpoint(model, file, preset)
    return model.eval().requires_grad_(False)


def _differences(metadata: dict[str, str], reader: Any, state: dict[str, torch.Tensor],
                 preset: Preset) -> list[str]:
    found: list[str] = []
    if metadata.get("format") != FORMAT:
        found.append(f"format {metadata.get('format')!r}, expected {FORMAT!r}")
    if metadata.get("version") != VERSION:
        found.append(f"checkpoint format version {metadata.get('version')!r}, expected {VERSION!r} "
                     "(written by another version of rynn_teleop; convert or re-export it)")
    if metadata.get("preset") != preset.name:
        found.append(f"preset {metadata.get('preset')!r}, expected {preset.name!r}")
    if "dims" in metadata:
        dims = json.loads(metadata["dims"])
        found += [f"preset field {key} = {dims.get(key)!r}, expected {value!r}"
                  for key, value in preset.shape_fields.items() if dims.get(key) != value]
    else:
        found.append("no preset dimensions in the metadata")
    keys = set(reader.keys())
    found += [f"missing tensor {name}" for name in state if name not in keys]
    found += [f"unexpected tensor {name}" for name in sorted(keys - state.keys())]
    for name in sorted(keys & state.keys()):
        shape = tuple(reader.get_slice(name).get_shape())
        if shape != tuple(state[name].shape):
            found.append(f"tensor {name} has shape {shape}, expected {tuple(state[name].shape)}")
    return found
