"""The change-weighted loss of the world model's training (``change_loss_weight``): the change map on the latent
grid from hand-made clips with known answers, the weighting of the teacher's and the student's errors, and
runs of both stages that store and use the map."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from test_world_model_distill import config as distill_config
from test_world_model_train import config as train_config
from test_world_model_train import make_dataset, make_release

from rynn_teleop.world_model.diffusion.composite import LEVEL, CompositeSettings
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.training.common import latent_change
from rynn_teleop.world_model.training.config import DistillConfig, RunConfigError, TrainConfig
from rynn_teleop.world_model.training.distill import distill, student_loss, student_sigmas
from rynn_teleop.world_model.training.train import teacher_loss, train, weighted_mse

H, W = TINY.height, TINY.width
LH, LW = TINY.latent_grid
CELL = H // LH  # [px] side of one latent cell
RAMP = CompositeSettings(low=9.0, high=30.0, blur_px=0.0)  # no smoothing: known answers cell by cell


def grey_clip(frames: int = 9) -> torch.Tensor:
    """(1, 3, frames, H, W) mid-grey in [-1, 1]."""
    return torch.zeros(1, 3, frames, H, W)


# ---- the change map ---------------------------------------------------------------------------------------


def test_a_box_that_appears_marks_its_cells_in_the_latent_frames_that_hold_it():
    clip = grey_clip()
    # a white box over latent cell (1, 2) in video frame 6 only: latent frame 2 holds video frames 5..8
    clip[:, :, 6, CELL:2 * CELL, 2 * CELL:3 * CELL] = 1.0
    change = latent_change(clip, TINY, RAMP)
    assert change.shape == (1, 1, 3, LH, LW)
    expected = torch.zeros_like(change)
    expected[0, 0, 2, 1, 2] = 1.0
    torch.testing.assert_close(change, expected)


def test_a_change_on_the_ramp_weighs_in_between_and_one_pixel_marks_its_cell():
    clip = grey_clip()
    clip[:, :, 1:, :, :] += 19.5 * LEVEL  # the whole scene 19.5 levels brighter: halfway up the 9..30 ramp
    clip[:, :, 3, 0, 0] += 100 * LEVEL  # one pixel of one video frame far brighter: its cell is fully changed
    change = latent_change(clip, TINY, RAMP)
    assert torch.all(change[:, :, 0] == 0)  # the anchor never changes from itself
    assert change[0, 0, 1, 0, 0] == pytest.approx(1.0)
    rest = change[0, 0, 1:].flatten()[1:]
    torch.testing.assert_close(rest, torch.full_like(rest, 0.5))
    dimmer = grey_clip() + 8 * LEVEL * (torch.arange(9) > 0).view(1, 1, 9, 1, 1)
    assert torch.all(latent_change(dimmer, TINY, RAMP) == 0)  # below the ramp's low end: unchanged


def test_frames_that_do_not_map_onto_the_grid_are_refused():
    with pytest.raises(ValueError, match="latent frames"):
        latent_change(torch.zeros(1, 3, 8, H, W), TINY, RAMP)
    with pytest.raises(ValueError, match="latent frames"):
        latent_change(torch.zeros(1, 3, 9, H, W + CELL), TINY, RAMP)  # another frame size


# ---- the weighting ------------------------------------------------------------------------------------------


def test_weighted_mse_moves_the_emphasis_to_changed_cells_and_keeps_the_scale():
    error = torch.zeros(1, 2, 1, 1, 2)
    error[..., 0] = 1.0  # an error of 1 in the unchanged cell, 0 in the changed one
    change = torch.tensor([0.0, 1.0]).view(1, 1, 1, 1, 2)
    assert weighted_mse(error, None, 3.0) == pytest.approx(0.5)
    assert weighted_mse(error, change, 0.0) == pytest.approx(0.5)
    assert weighted_mse(error, change, 3.0) == pytest.approx(1 / 5)  # weights 1 and 4, normalised: 1 * 1 / 5
    assert weighted_mse(error.flip(-1), change, 3.0) == pytest.approx(4 / 5)
    uniform = torch.ones_like(change)
    assert weighted_mse(error, uniform, 3.0) == pytest.approx(0.5)  # everything changed: the plain mean
    keep_first = torch.tensor([1.0, 0.0]).view(1, 1, 1, 1, 2)  # a mask: only the unchanged cell carries a loss
    assert weighted_mse(error, change, 3.0, keep_first) == pytest.approx(1.0)
    assert weighted_mse(error, None, 0.0, keep_first.flip(-1)) == pytest.approx(0.0)
    assert weighted_mse(error, change, 3.0, torch.zeros_like(keep_first)) == pytest.approx(0.0)  # none kept


class Zero(torch.nn.Module):
    """Predicts velocity 0 whatever the input: the error is the target itself."""

    def forward(self, latents, *args, **kwargs):
        return torch.zeros_like(latents)


def test_teacher_loss_weights_the_frames_after_the_anchor_by_their_change():
    c, f = TINY.latent_channels, 3
    clean = torch.randn(1, c, f, LH, LW, generator=torch.Generator().manual_seed(0))
    change = torch.zeros(1, 1, f, LH, LW)
    change[:, :, 2, 0, :] = 1.0  # the top row of cells of the last latent frame changed
    prompt = torch.zeros(1, 1, 8)

    def loss(change_map, weight):
        torch.manual_seed(5)  # the noise is the loss's first draw
        return float(teacher_loss(Zero(), clean, torch.zeros_like(clean), prompt, TINY.shift, 0.0, change_map, weight))

    torch.manual_seed(5)
    target = (torch.randn_like(clean) - clean)[:, :, 1:]  # velocity target of the frames that carry the loss
    assert loss(None, 0.0) == pytest.approx(float(target.square().mean()), rel=1e-6)
    expected = weighted_mse(target.square(), change[:, :, 1:], 4.0)
    assert loss(change, 4.0) == pytest.approx(float(expected), rel=1e-6)
    assert loss(change, 4.0) != pytest.approx(loss(None, 0.0), rel=1e-3)


def test_student_loss_weights_cells_of_noisy_frames_only():
    torch.manual_seed(0)
    b, c, f = 1, TINY.latent_channels, 1 + TINY.block_frames

    sigmas = student_sigmas(TINY)
    states = torch.randn(b, len(sigmas), c, f, LH, LW)
    clean = torch.randn(b, c, f, LH, LW)
    condition, prompt = torch.zeros_like(clean), torch.zeros(1, 1, 8)

    def loss(change, weight):
        torch.manual_seed(1)  # the same levels and frontier each time
        return float(student_loss(Zero(), states, clean, condition, prompt, TINY, sigmas, "noisy", change, weight))

    plain = loss(None, 0.0)
    assert loss(torch.ones(b, 1, f, LH, LW), 5.0) == pytest.approx(plain, rel=1e-6)  # uniform: unchanged
    changed = torch.zeros(b, 1, f, LH, LW)
    changed[..., 0, 0] = 1.0
    torch.manual_seed(1)
    from rynn_teleop.world_model.training.distill import student_inputs

    inputs = student_inputs(states, clean, sigmas, TINY, "noisy")
    error = (inputs.latents - clean).square()
    noisy = inputs.noisy.float()[:, None, :, None, None]
    weight = noisy * (1 + 5.0 * changed)
    expected = float((error * weight).sum() / (weight.expand_as(error)).sum())
    assert loss(changed, 5.0) == pytest.approx(expected, rel=1e-5)
    assert expected != pytest.approx(plain, rel=1e-3)


# ---- the runs ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return make_release(tmp_path_factory.mktemp("change_release"))


def test_both_stages_train_with_the_change_weight_and_the_pairs_hold_the_map(release, tmp_path):
    data = make_dataset(tmp_path / "data", train_clips=1)
    teacher = tmp_path / "teacher"
    result = train(train_config(release, data, teacher, steps=2, change_loss_weight=4.0))
    plain = train(train_config(release, data, tmp_path / "plain_teacher", steps=2))
    assert len(result.losses) == 2 and all(loss == loss for loss in result.losses)  # finite, not NaN
    assert result.losses[0] != pytest.approx(plain.losses[0], rel=1e-4)  # the same draws, weighted otherwise
    setup = {"data": data, "base": release[0], "prompt": release[1], "teacher": teacher}
    student = tmp_path / "student"
    weighted = distill(distill_config(setup, student, steps=2, change_loss_weight=4.0))
    pair = load_file(str(student / "ode_pairs" / "000000_000.safetensors"))
    assert pair["change"].shape == (1, *pair["clean"].shape[1:2], LH, LW)
    assert 0.0 <= float(pair["change"].min()) and float(pair["change"].max()) == 1.0  # the square moves
    assert torch.all(pair["change"][:, 0] == 0)
    stamp = (student / "ode_pairs" / "000000_000.safetensors").stat().st_mtime_ns
    unweighted = distill(distill_config(setup, student, steps=2, resume="no"))  # plain: the pairs are made again
    assert weighted.losses[0] != pytest.approx(unweighted.losses[0], rel=1e-4)  # same pairs and draws
    again = load_file(str(student / "ode_pairs" / "000000_000.safetensors"))
    assert "change" not in again
    assert (student / "ode_pairs" / "000000_000.safetensors").stat().st_mtime_ns != stamp


def test_the_change_weight_is_checked():
    required = {"dataset": "d", "base_dir": "b", "prompt_file": "p", "output": "o"}
    assert TrainConfig(**required).change_settings is None
    assert TrainConfig(**required, change_loss_weight=2.0).change_settings == CompositeSettings(9.0, 30.0, 1.5)
    with pytest.raises(RunConfigError, match="change_loss_weight.*out of range"):
        TrainConfig(**required, change_loss_weight=-1.0)
    with pytest.raises(RunConfigError, match="parameter 'change_loss_weight'.*only stage ode"):
        DistillConfig(**required, teacher="t", stage="dmd", change_loss_weight=1.0)


def test_the_encoder_computes_each_clips_map_once_and_for_new_clips_of_a_batch_only():
    from rynn_teleop.world_model.training.common import ClipBatch, LatentEncoder

    frames = grey_clip().repeat(2, 1, 1, 1, 1)
    frames[0, :, 5:, :CELL, :CELL] = 1.0  # clip 0: the top-left cell changes from latent frame 2 on
    frames[1, :, 1:, CELL:2 * CELL, :CELL] = -1.0  # clip 1: the cell below it, from latent frame 1 on
    latents = torch.zeros(2, TINY.latent_channels, 3, LH, LW)

    def batch(rows):
        return ClipBatch(torch.tensor(rows), 9, frames[rows], None, latents[rows], latents[rows])

    encoder = LatentEncoder(None, TINY, change=RAMP)  # stored latents: the VAE is not used
    first = encoder(batch([0]), "cpu").change
    torch.testing.assert_close(first, latent_change(frames[:1], TINY, RAMP))
    both = encoder(batch([0, 1]), "cpu").change  # clip 0 known, clip 1 new (second row): the rows keep their clips
    torch.testing.assert_close(both, latent_change(frames, TINY, RAMP))
    assert both[1, 0, 1, 1, 0] == 1.0 and both[0, 0, 1, 0, 0] == 0.0 and both[0, 0, 2, 0, 0] == 1.0
    # a known clip's map is not recomputed: the frames of a later batch are not read for it
    again = encoder(ClipBatch(torch.tensor([0]), 9, torch.zeros_like(frames[:1]), None, latents[:1], latents[:1]),
                    "cpu").change
    torch.testing.assert_close(again, first)


def test_stored_latents_are_read_with_the_frames_but_not_the_condition_frames(tmp_path):
    import json

    import numpy as np

    from rynn_teleop.world_model.training.clips import Clip, read_clip, write_clip
    from rynn_teleop.world_model.training.common import IndexedClips

    data = make_dataset(tmp_path / "data", frames=5)
    info = json.loads((data / "dataset.json").read_text())
    for episode in info["episodes"]:
        for rel in episode["clips"]:
            clip = read_clip(data / rel)
            latents = np.zeros((TINY.latent_channels, 2, LH, LW), np.float32)
            write_clip(data / rel, Clip(clip.frames, clip.conditions, clip.actions, clip.stamps_ns, clip.episode,
                                        clip.start, latents, latents.copy()))
    (data / "dataset.json").write_text(json.dumps({**info, "has_latents": True}))
    plain = IndexedClips(data, "train", TINY, pixels=False)[0]
    assert plain.frames is None and plain.latents is not None
    item = IndexedClips(data, "train", TINY, pixels=False, frames=True)[0]
    assert item.frames is not None and item.conditions is None and item.latents is not None
    np.testing.assert_array_equal(item.frames, read_clip(data / info["episodes"][0]["clips"][0]).frames)


def test_the_map_without_frames_is_refused_with_the_reason():
    from rynn_teleop.world_model.training.clips import DatasetError
    from rynn_teleop.world_model.training.common import ClipBatch, LatentEncoder

    latents = torch.zeros(1, TINY.latent_channels, 3, LH, LW)
    batch = ClipBatch(torch.tensor([0]), 9, None, None, latents, latents)
    encoder = LatentEncoder(None, TINY, source="DATA", change=RAMP)  # stored latents: the VAE is not used
    with pytest.raises(DatasetError, match="DATA: the change map needs the clips' frames"):
        encoder(batch, "cpu")
    assert LatentEncoder(None, TINY, source="DATA")(batch, "cpu").change is None
