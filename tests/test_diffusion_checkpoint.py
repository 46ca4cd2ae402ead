"""safetensors checkpoints: round trip, and clear errors for a missing or mismatched file.

The checkpoints here are written from seeded untrained weights to test the
loader; they are not models.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.checkpoint import (
    CheckpointMismatchError,
    CheckpointMissingError,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from rynn_teleop.world_model.diffusion.model import WorldModel, untrained_model
from rynn_teleop.world_model.diffusion.presets import TINY


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[str, WorldModel]:
    torch.set_num_threads(2)
    model = untrained_model(TINY, seed=3)
    path = str(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")
    save_checkpoint(model, path, TINY)
    return path, model


def test_round_trip(saved):
    path, model = saved
    loaded = load_model(TINY, path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    x = torch.randn(1, TINY.latent_channels, 2, *TINY.latent_grid)
    t = torch.tensor([[0.0, 250.0]])
    assert torch.equal(model.dit(x, x, t), loaded.dit(x, x, t))


def test_load_converts_dtype(saved):
    loaded = load_model(TINY, saved[0], dtype="bfloat16")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("path", [None, "", "/nonexistent/world_model.safetensors"])
def test_missing_checkpoint_is_a_clear_error(path):
    with pytest.raises(CheckpointMissingError,
                       match="needs a trained checkpoint.*'render' backend needs no checkpoint"):
        load_model(TINY, path)
    assert issubclass(CheckpointMissingError, ConfigurationError)


def test_other_dimensions_are_listed(saved):
    wider = dataclasses.replace(TINY, dim=96, heads=4, ffn=192)
    with pytest.raises(CheckpointMismatchError) as error:
        load_checkpoint(WorldModel(wider), saved[0], wider)
    message = str(error.value)
    assert "preset field dim = 64, expected 96" in message
    assert "has shape (64," in message and "expected (96," in message
    assert "more" in message  # many differences: the first are listed
    assert issubclass(CheckpointMismatchError, ConfigurationError)


def test_other_preset_name_and_keys_are_listed(saved, tmp_path):
    tensors = load_file(saved[0])
    tensors.pop("dit.control_scale")
    tensors["dit.extra"] = torch.zeros(1)
    path = tmp_path / "edited.safetensors"
    save_file(tensors, str(path), metadata={"format": "rynn_teleop.diffusion", "preset": "paper"})
    model = untrained_model(TINY, seed=4)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(CheckpointMismatchError) as error:
        load_checkpoint(model, path, TINY)
    message = str(error.value)
    for line in ("preset 'paper', expected 'tiny'", "missing tensor dit.control_scale", "unexpected tensor dit.extra"):
        assert line in message
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing half-loaded


def test_not_a_safetensors_file(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(CheckpointMismatchError, match="not a readable safetensors file"):
        load_model(TINY, path)
