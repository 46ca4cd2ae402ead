"""Reference compositing on hand-made videos with known answers."""

from __future__ import annotations

import pytest
import torch

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.composite import LEVEL, CompositeSettings, change_weight, composite

T, H, W = 4, 32, 48


def video(value: float, frames: int = T) -> torch.Tensor:
    return torch.full((1, 3, frames, H, W), value)


def test_unchanged_pixels_are_the_reference_exactly():
    static = video(0.1)
    decoded = static + 5 * LEVEL  # the model drew the unchanged scene 5 levels off: below the default low (14)
    reference = torch.linspace(-1, 1, H * W).reshape(1, 1, 1, H, W).expand(1, 3, 1, H, W)
    out = composite(decoded, static, reference, CompositeSettings())
    assert torch.equal(out, reference.expand_as(out))


def test_a_changed_region_is_the_generated_one_and_the_rest_the_reference():
    settings = CompositeSettings(low=9.0, high=30.0, blur_px=1.5)
    static, reference = video(0.0), video(-0.5, 1)
    decoded = static.clone()
    decoded[:, :, :, 8:24, 16:40] = 0.8  # 102 levels of change in a 16 x 24 box
    out = composite(decoded, static, reference, settings)
    inner = out[:, :, :, 12:20, 20:36]  # 4 px (> 3 sigma) inside the box: weight 1
    assert torch.allclose(inner, torch.full_like(inner, 0.8))
    assert torch.equal(out[:, :, :, :3], reference.expand(-1, -1, T, -1, -1)[:, :, :, :3])  # 5 px outside: weight 0
    weight = change_weight(decoded, static, settings)
    assert weight.shape == (1, 1, T, H, W) and 0 < float(weight[0, 0, 0, 6, 28]) < 1  # blends 2 px outside


def test_the_ramp_between_low_and_high_is_linear():
    settings = CompositeSettings(low=10.0, high=30.0, blur_px=0.0)
    static = video(0.0)
    for levels, expected in ((5.0, 0.0), (10.0, 0.0), (20.0, 0.5), (30.0, 1.0), (60.0, 1.0)):
        weight = change_weight(static + levels * LEVEL, static, settings)
        assert torch.allclose(weight, torch.full_like(weight, expected), atol=1e-4), levels


def test_a_whole_changed_scene_is_the_generated_one():
    decoded, static, reference = video(0.6), video(-0.6), video(0.0, 1)
    assert torch.allclose(composite(decoded, static, reference, CompositeSettings()), decoded)


@pytest.mark.parametrize("low, high, blur, key", [
    (30.0, 30.0, 1.5, "composite_low"), (40.0, 30.0, 1.5, "composite_high"), (-1.0, 30.0, 1.5, "composite_low"),
    (9.0, 30.0, 25.0, "blur_px")])
def test_bad_settings_are_refused_naming_the_keys(low, high, blur, key):
    with pytest.raises(ConfigurationError, match=key):
        CompositeSettings(low, high, blur)


def test_shapes_must_match():
    with pytest.raises(ValueError, match="differ in shape"):
        change_weight(video(0.0), video(0.0, T + 1), CompositeSettings())
    with pytest.raises(ValueError, match="not one frame"):
        composite(video(0.0), video(0.0), video(0.0, 2), CompositeSettings())
