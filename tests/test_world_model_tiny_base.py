"""The tiny stand-in base release: a VAE fitted to a dataset's frames, written in the release's layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.model import load_model
from rynn_teleop.world_model.diffusion.presets import SMALL, TINY, get_preset
from rynn_teleop.world_model.training.clips import Clip, DatasetInfo, write_clip
from rynn_teleop.world_model.training.tiny_base import fit_tiny_base


def square_clip(seed: int, frames: int = 9, size: tuple[int, int] = (TINY.width, TINY.height)) -> Clip:
    w, h = size
    video = np.full((frames, h, w, 3), 40, np.uint8)
    for t in range(frames):
        x = (seed * 7 + 5 * t) % (w - 16)
        video[t, 20:36, x:x + 16] = (220, 80, 30)
    return Clip(video, video.copy(), np.zeros((frames, 54), np.float32), np.arange(frames, dtype=np.int64),
                f"ep{seed}", 0)


def make_dataset(root, preset: str = "tiny"):
    size = (TINY.width, TINY.height) if preset == "paper" else (get_preset(preset).width, get_preset(preset).height)
    info = DatasetInfo(preset=preset, width=size[0], height=size[1], fps=30.0, clip_frames=9,
                       joint_names=[f"j{i}" for i in range(54)])
    for i in range(2):
        name = f"clips/train/{i:06d}.safetensors"
        write_clip(root / name, square_clip(i, size=size))
        info.episodes.append({"path": f"ep{i}", "name": f"ep{i}", "split": "train", "frames": 9, "clips": [name]})
    info.write(root)
    return root


def test_the_fitted_base_loads_as_a_release_and_reconstructs_better_than_at_start(tmp_path):
    torch.set_num_threads(2)
    data = make_dataset(tmp_path / "data")
    fitted = fit_tiny_base(data, tmp_path / "b2", tmp_path / "p2.safetensors", seconds=1e9, max_steps=25, batch=1,
                           log=None)
    assert fitted["steps"] == 25 and fitted["train_psnr"] > fitted["first_psnr"]
    model = load_model(TINY, tmp_path / "b2", None, tmp_path / "p2.safetensors")
    assert model.prompt_embeds.shape == TINY.prompt_shape


def test_the_small_preset_gets_a_base_of_its_own_size(tmp_path):
    torch.set_num_threads(2)
    data = make_dataset(tmp_path / "data", preset="small")
    fitted = fit_tiny_base(data, tmp_path / "b", tmp_path / "p.safetensors", seconds=1e9, max_steps=2, batch=1,
                           log=None)
    assert fitted["steps"] == 2
    model = load_model(SMALL, tmp_path / "b", None, tmp_path / "p.safetensors")  # the preset's checks pass
    assert model.prompt_embeds.shape == SMALL.prompt_shape
    assert (SMALL.width, SMALL.height) == (160, 96) and SMALL.token_grid == (3, 5)  # rows, columns


def test_the_small8_preset_gets_an_8x_base_that_loads_as_its_own(tmp_path):
    from rynn_teleop.world_model.diffusion.presets import SMALL8

    torch.set_num_threads(2)
    data = make_dataset(tmp_path / "data", preset="small8")
    fit_tiny_base(data, tmp_path / "b", tmp_path / "p.safetensors", seconds=1e9, max_steps=1, batch=1, log=None)
    model = load_model(SMALL8, tmp_path / "b", None, tmp_path / "p.safetensors")  # the preset's checks pass
    assert model.vae.spatial_compression == 8 and model.vae.latent_channels == 48
    with pytest.raises(ConfigurationError, match="dim_mult"):  # and not as small's (16x)
        load_model(SMALL, tmp_path / "b", None, tmp_path / "p.safetensors")


def test_a_used_folder_or_a_dataset_of_another_preset_is_refused(tmp_path):
    data = make_dataset(tmp_path / "data")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(ConfigurationError, match="not empty"):
        fit_tiny_base(data, tmp_path / "used", tmp_path / "p.safetensors", max_steps=1, log=None)
    other = make_dataset(tmp_path / "paper", preset="paper")
    with pytest.raises(ConfigurationError, match="'paper' dataset"):
        fit_tiny_base(other, tmp_path / "b", tmp_path / "p.safetensors", max_steps=1, log=None)


def test_vae_overrides_change_the_fitted_vae_and_the_base_no_longer_loads_as_the_preset(tmp_path):
    """bench/world_model_vae.py's capacity experiments: a wider VAE with 8x spatial compression is fitted and
    written; load_base then refuses it as the preset's, naming the differing config field."""
    import json

    from diffusers import AutoencoderKLWan

    from rynn_teleop.world_model.diffusion.weights import BaseModelError, load_base

    torch.set_num_threads(2)
    data = make_dataset(tmp_path / "data")
    overrides = {"base_dim": 8, "dim_mult": [1, 2, 2], "temperal_downsample": [True, True], "scale_factor_spatial": 8}
    fit_tiny_base(data, tmp_path / "b", tmp_path / "p.safetensors", seconds=1e9, max_steps=1, batch=1,
                  vae_overrides=overrides, log=None)
    config = json.loads((tmp_path / "b" / "vae" / "config.json").read_text())
    assert {k: config[k] for k in overrides} == overrides
    vae = AutoencoderKLWan.from_pretrained(str(tmp_path / "b"), subfolder="vae")
    x = torch.zeros(1, 3, 1, TINY.height, TINY.width)
    assert vae.encode(x).latent_dist.mode().shape[-2:] == (TINY.height // 8, TINY.width // 8)
    with pytest.raises(BaseModelError, match="base_dim"):
        load_base(tmp_path / "b", TINY)


def test_an_ssim_weight_adds_its_term_to_the_fit_and_is_recorded(tmp_path):
    """The same seed, windows and steps with and without ssim_weight give different VAEs; tiny_base.json says
    which; the term is the evaluation's SSIM (1 for identical videos, lower for a changed one); a negative weight
    is refused with its name."""
    import json

    from rynn_teleop.world_model.training.tiny_base import _ssim

    torch.set_num_threads(2)
    data = make_dataset(tmp_path / "data")
    for name, weight in (("plain", 0.0), ("ssim", 1.0)):
        fit_tiny_base(data, tmp_path / name, tmp_path / f"{name}.safetensors", seconds=1e9, max_steps=2, batch=1,
                      ssim_weight=weight, log=None)
        assert json.loads((tmp_path / name / "tiny_base.json").read_text())["ssim_weight"] == weight
    from safetensors.torch import load_file

    plain, ssim = (load_file(next((tmp_path / n / "vae").glob("*.safetensors"))) for n in ("plain", "ssim"))
    assert any(not torch.equal(plain[k], ssim[k]) for k in plain)
    video = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    assert float(_ssim(video, video)) == pytest.approx(1.0)
    assert float(_ssim(video, video.flip(-1))) < 0.5
    with pytest.raises(ConfigurationError, match="ssim_weight"):
        fit_tiny_base(data, tmp_path / "neg", tmp_path / "neg.safetensors", max_steps=1, ssim_weight=-1.0, log=None)


def test_a_change_weight_weights_the_fit_where_the_clip_moves_and_is_recorded(tmp_path):
    """Each window's change map is 0 where it equals its clip's first frame and 1 where the moving square differs
    from it by far more than the ramp's top; fits with and without the weight differ; tiny_base.json says which; a
    negative weight is refused with its name."""
    import json

    from rynn_teleop.world_model.training.clips import ClipDataset
    from rynn_teleop.world_model.training.tiny_base import WINDOW, _windows

    torch.set_num_threads(2)
    data = make_dataset(tmp_path / "data")
    dataset = ClipDataset(data, "train")
    x, change, movers = _windows(dataset, np.random.default_rng(3), 4)
    assert movers is None
    assert x.shape == (4, 3, WINDOW, TINY.height, TINY.width)
    assert change.shape == (4, 1, WINDOW, TINY.height, TINY.width)
    picks = np.random.default_rng(3)
    for n in range(4):
        clip = dataset[int(picks.integers(len(dataset)))]
        start = int(picks.integers(clip.length - WINDOW + 1))
        for t in range(WINDOW):
            differs = (clip.frames[start + t] != clip.frames[0]).any(axis=-1)
            near = torch.nn.functional.max_pool2d(  # within 6 px (4 sigma of the blur) of a change
                torch.from_numpy(differs).float()[None, None], 13, 1, 6)[0, 0].bool()
            assert float(change[n, 0, t][~near].abs().sum()) == 0.0
            if differs.any():  # inside the square's 16 x 16 box, away from its edge: the full weight
                assert float(change[n, 0, t].max()) == pytest.approx(1.0)
    for name, weight in (("plain", 0.0), ("change", 4.0)):
        fit_tiny_base(data, tmp_path / name, tmp_path / f"{name}.safetensors", seconds=1e9, max_steps=2, batch=1,
                      change_weight=weight, log=None)
        assert json.loads((tmp_path / name / "tiny_base.json").read_text())["change_weight"] == weight
    from safetensors.torch import load_file

    plain, weighted = (load_file(next((tmp_path / n / "vae").glob("*.safetensors"))) for n in ("plain", "change"))
    assert any(not torch.equal(plain[k], weighted[k]) for k in plain)
    with pytest.raises(ConfigurationError, match="change_weight"):
        fit_tiny_base(data, tmp_path / "neg", tmp_path / "neg.safetensors", max_steps=1, change_weight=-1.0, log=None)


def test_an_object_weight_weights_the_fit_inside_the_moving_objects_boxes_and_is_recorded(tmp_path):
    """With objects in the clip files, each window's mover mask is its clip's moving box grown by the margin (and
    zero for a clip without objects); a fit with the weight differs from one without; tiny_base.json says which; a
    negative weight is refused with its name."""
    import json

    from rynn_teleop.world_model.training import objects as ob
    from rynn_teleop.world_model.training.clips import ClipDataset
    from rynn_teleop.world_model.training.tiny_base import OBJECT_MARGIN_PX, WINDOW, _windows

    torch.set_num_threads(2)
    data = make_dataset(tmp_path / "data")
    dataset = ClipDataset(data, "train")
    frames = dataset[0].length
    boxes = np.zeros((frames, 1, 4), np.int32)
    for t in range(frames):  # clip 0's square (square_clip(0)): its box as the object's
        boxes[t, 0] = (5 * t % (TINY.width - 16), 20, 5 * t % (TINY.width - 16) + 16, 36)
    flags = np.zeros((frames, 1), bool)
    ob.add_to_clip_file(data / dataset.files[0], ob.ClipObjects(
        (ob.SceneObject("square", "box", (0.05, 0.05, 0.05), False),), "test/seed=0", np.zeros((frames, 1, 7)),
        boxes, flags, flags, flags, np.array([0])))
    cache: dict = {}
    x, change, movers = _windows(dataset, np.random.default_rng(5), 6, changes=False, objects=cache)
    assert change is None and movers.shape == (6, 1, WINDOW, TINY.height, TINY.width)
    assert set(cache) == {0, 1} and cache[1] is None  # both clips drawn, clip 1 without objects
    picks = np.random.default_rng(5)
    for n in range(6):
        index = int(picks.integers(len(dataset)))
        start = int(picks.integers(frames - WINDOW + 1))
        if index == 1:
            assert float(movers[n].sum()) == 0.0
            continue
        for t in range(WINDOW):
            u0, v0, u1, v1 = boxes[start + t, 0]
            expected = torch.zeros(TINY.height, TINY.width)
            m = OBJECT_MARGIN_PX
            expected[v0 - m:v1 + m, max(u0 - m, 0):u1 + m] = 1
            assert torch.equal(movers[n, 0, t], expected)
    for name, weight in (("plain", 0.0), ("objects", 8.0)):
        fit_tiny_base(data, tmp_path / name, tmp_path / f"{name}.safetensors", seconds=1e9, max_steps=2, batch=2,
                      object_weight=weight, seed=1, log=None)
        assert json.loads((tmp_path / name / "tiny_base.json").read_text())["object_weight"] == weight
    from safetensors.torch import load_file

    plain, weighted = (load_file(next((tmp_path / n / "vae").glob("*.safetensors"))) for n in ("plain", "objects"))
    assert any(not torch.equal(plain[k], weighted[k]) for k in plain)
    with pytest.raises(ConfigurationError, match="object_weight"):
        fit_tiny_base(data, tmp_path / "neg", tmp_path / "neg.safetensors", max_steps=1, object_weight=-1.0, log=None)
