"""Reference compositing on hand-made videos with known answers."""

from __future__ import annotations

import pytest
import torch

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.composite import (
    LEVEL,
    CompositeSettings,
    change_weight,
    composite,
    reach,
    skeleton_mask,
    sweep,
)

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


@pytest.mark.parametrize("reach_px", [-1.0, 250.0])
def test_a_reach_out_of_range_is_refused_naming_the_key(reach_px):
    with pytest.raises(ConfigurationError, match="composite_reach_px"):
        CompositeSettings(reach_px=reach_px)


# ---- the reach gate -------------------------------------------------------------------------------------


def test_the_skeleton_is_every_condition_pixel_that_is_not_black():
    conditions = torch.full((1, 3, 2, H, W), -1.0)
    conditions[0, 1, 0, 5, 7] = -1.0 + LEVEL  # one level in one channel
    conditions[0, :, 1, 9, 3] = 0.2
    mask = skeleton_mask(conditions)
    assert mask.shape == (1, 1, 2, H, W) and mask.dtype == torch.bool
    assert mask.sum() == 2 and mask[0, 0, 0, 5, 7] and mask[0, 0, 1, 9, 3]


def test_the_sweep_is_the_union_so_far_continuing_the_previous_one():
    skeleton = torch.zeros((1, 1, 3, H, W), dtype=torch.bool)
    skeleton[0, 0, 0, 1, 1] = skeleton[0, 0, 2, 2, 2] = True
    previous = torch.zeros((1, 1, 1, H, W), dtype=torch.bool)
    previous[0, 0, 0, 0, 0] = True
    swept = sweep(skeleton, previous)
    assert swept.shape == skeleton.shape
    assert [int(swept[0, 0, t].sum()) for t in range(3)] == [2, 2, 3]
    assert swept[0, 0, 2, 0, 0] and swept[0, 0, 1, 1, 1]  # nothing is forgotten
    assert [int(sweep(skeleton)[0, 0, t].sum()) for t in range(3)] == [1, 1, 2]


def test_reach_is_a_disc_of_the_radius_around_the_sweep():
    swept = torch.zeros((1, 1, 1, H, W), dtype=torch.bool)
    swept[0, 0, 0, 16, 24] = True
    grown = reach(swept, 3.0)[0, 0, 0]
    # lattice points with du^2 + dv^2 <= 9: 29
    assert int(grown.sum()) == 29 and grown[16, 27] == 1 and grown[19, 24] == 1 and grown[18, 27] == 0
    assert int(reach(swept, 0.5).sum()) == 1


def test_the_cpu_dilation_equals_the_convolution_used_on_other_devices():
    from rynn_teleop.world_model.diffusion.composite import _disk, _reach_convolved

    swept = torch.rand((2, 1, 3, H, W)) > 0.97
    swept[0, 0, 0, 0, 0] = swept[1, 0, 2, H - 1, W - 1] = True  # at the borders too
    for radius in (0.5, 3.0, 7.5):
        convolved = _reach_convolved(swept.reshape(6, H, W), _disk(radius)).reshape(2, 1, 3, H, W)
        assert torch.equal(reach(swept, radius), convolved)


def test_a_change_out_of_reach_of_the_sweep_is_the_reference():
    settings = CompositeSettings(low=0.0, high=1e-3, blur_px=0.0, reach_px=4.0)  # every change counts ...
    static, reference = video(0.0), video(-0.5, 1)
    decoded = video(0.8)  # ... and the whole frame changed
    swept = torch.zeros((1, 1, T, H, W), dtype=torch.bool)
    swept[:, :, 2:, 10, 10] = True  # the robot appears at frame 2
    out = composite(decoded, static, reference, settings, swept)
    assert torch.equal(out[:, :, :2], reference.expand(-1, -1, 2, -1, -1))  # no robot yet: all the reference
    assert torch.allclose(out[:, :, 2:, 10, 6:15], torch.full((1, 3, 2, 9), 0.8))  # within 4 px: the model's
    assert torch.equal(out[:, :, 2:, 10, 15], reference[:, :, 0, 10, 15, None].expand(-1, -1, 2))  # 5 px: not
    # without a sweep (or with reach_px 0) the gate is off
    assert torch.allclose(composite(decoded, static, reference, settings), decoded)
    off = CompositeSettings(low=0.0, high=1e-3, blur_px=0.0)
    assert torch.allclose(composite(decoded, static, reference, off, swept), decoded)
    with pytest.raises(ValueError, match="swept"):
        change_weight(decoded, static, settings, swept[:, :, :1])


def test_shapes_must_match():
    with pytest.raises(ValueError, match="differ in shape"):
        change_weight(video(0.0), video(0.0, T + 1), CompositeSettings())
    with pytest.raises(ValueError, match="neither one frame nor every frame"):
        composite(video(0.0), video(0.0), video(0.0, 2), CompositeSettings())


def test_a_reference_per_frame_gives_each_frame_its_own_unchanged_pixels():
    # the render reference: frame t's unchanged pixels are reference frame t's, its changed ones the model's
    static = video(0.0)
    reference = torch.stack([torch.full((1, 3, H, W), 0.1 * t) for t in range(T)], dim=2)
    decoded = static.clone()
    decoded[:, :, 2, 8:24, 16:40] = 0.8  # frame 2 changed in a box, the others as the static decode
    out = composite(decoded, static, reference, CompositeSettings(low=9.0, high=30.0, blur_px=0.0))
    for t in range(T):
        if t != 2:
            assert torch.equal(out[:, :, t], reference[:, :, t])
    assert torch.allclose(out[:, :, 2, 8:24, 16:40], torch.full((1, 3, 16, 24), 0.8))
    assert torch.allclose(out[:, :, 2, :8], reference[:, :, 2, :8])


def test_an_unknown_reference_is_refused_naming_the_key():
    with pytest.raises(ConfigurationError, match="composite_reference must be one of anchor, render; got 'camera'"):
        CompositeSettings(reference="camera")
    assert CompositeSettings(reference="render").backend_settings()["composite_reference"] == "render"
