"""Choosing compositing settings on training clips: the criterion on hand-made scores, and a run on a tiny model."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from test_world_model_eval import _dataset, model_dirs, robot  # noqa: F401 - fixtures

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.composite import CompositeSettings
from rynn_teleop.world_model.training import tune_composite as tc

A, B = CompositeSettings(9.0, 30.0, 3.0), CompositeSettings(14.0, 45.0, 7.0)
C = CompositeSettings(30.0, 80.0, 10.0, 8.0)


def test_the_highest_ssim_among_the_candidates_keeping_the_object_margin_is_chosen():
    render = tc.Scores(20.0, 0.90, 12.0)
    candidates = [(A, tc.Scores(21.0, 0.88, 14.0)), (B, tc.Scores(21.0, 0.89, 13.0)),
                  (C, tc.Scores(22.0, 0.95, 12.5))]  # C: the best SSIM, but only 0.5 dB over render in the boxes
    chosen, why = tc.choose(candidates, render)
    assert chosen == B and "highest SSIM of the 2 candidates" in why
    assert tc.choose(candidates, render, object_margin_db=1.5)[0] == A  # only A keeps 1.5 dB
    chosen, why = tc.choose(candidates, render, object_margin_db=5.0)  # none keeps it: the best boxes
    assert chosen == A and "no candidate keeps" in why
    no_objects = [(s, tc.Scores(sc.psnr, sc.ssim, None)) for s, sc in candidates]
    assert tc.choose(no_objects, tc.Scores(20.0, 0.9, None))[0] == C
    with pytest.raises(ValueError, match="no candidates"):
        tc.choose([], render)


def test_candidates_keeping_the_margin_on_the_moving_frames_too_come_first():
    """Where the clips have frames after a first move inside the clip, the highest SSIM among the candidates
    keeping the margin there as well as after the first move; when none does, the rule without it."""
    render = tc.Scores(20.0, 0.90, 12.0, 11.0)
    candidates = [(A, tc.Scores(21.0, 0.88, 14.0, 12.5)), (B, tc.Scores(21.0, 0.89, 13.0, 11.5)),
                  (C, tc.Scores(22.0, 0.95, 12.5, 14.0))]  # C: the best SSIM, but only 0.5 dB over render after
    chosen, why = tc.choose(candidates, render)
    assert chosen == A and "object_psnr_after and object_psnr_moving" in why and "of the 1 candidates" in why
    chosen, why = tc.choose(candidates, render._replace(object_psnr_moving=13.0))  # none keeps both: B, as before
    assert chosen == B and "highest SSIM of the 2 candidates whose object_psnr_after is" in why
    assert tc.choose(candidates, render._replace(object_psnr_moving=None))[0] == B  # no moving frames


def test_the_default_grid_holds_the_backend_defaults_and_gated_candidates():
    assert CompositeSettings() in tc.GRID and len(set(tc.GRID)) == len(tc.GRID) == 45
    assert {s.reach_px for s in tc.GRID} == {0.0, 10.0, 20.0}
    assert min(s.low for s in tc.GRID) == 3.0  # the low thresholds an 8x VAE's moved object needs


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory, robot):  # noqa: F811 - the fixture
    root = tmp_path_factory.mktemp("tune_dataset")
    _dataset(root, robot, splits=("train", "train", "val"), objects=True)
    return root


def test_tuning_a_tiny_model_writes_the_choice_and_every_candidates_scores(
        tmp_path, train_dataset, model_dirs):  # noqa: F811 - the fixture
    """On the training clips only; the candidates' composited frames are scored as the evaluation scores
    them (an unreachable ramp gives frame 0, scored as the repeat-first baseline); the chosen settings come back
    as the diffusion backend's parameters; the CLI prints them."""
    unreachable = CompositeSettings(254.0, 255.0, 0.0)
    grid = (unreachable, CompositeSettings(0.0, 1e-3, 0.0), CompositeSettings(0.0, 1e-3, 0.0, 4.0))
    result = tc.tune_composite(train_dataset, tmp_path / "tune", base_dir=model_dirs["base_dir"],
                               weights_dir=model_dirs["weights_dir"], prompt_file=model_dirs["prompt_file"],
                               every=1, grid=grid, log=None)
    saved = json.loads((tmp_path / "tune" / tc.TUNE_FILE).read_text())
    assert saved == json.loads(json.dumps(result))
    assert result["clips"] == ["clips/train/000000.safetensors", "clips/train/000001.safetensors"]
    assert result["frames"] == 2 * (9 - 1) and result["inputs"]["split"] == "train"
    assert [c["low"] for c in result["candidates"]] == [254.0, 0.0, 0.0]
    assert result["candidates"][0]["psnr"] == result["baseline"]["psnr"]
    assert result["candidates"][0]["object_psnr_after"] == result["baseline"]["object_psnr_after"] is not None
    assert result["candidates"][0]["object_psnr_moving"] == result["baseline"]["object_psnr_moving"] is not None
    assert result["render"]["object_psnr_after"] is not None
    chosen = CompositeSettings(**result["chosen"])
    assert chosen in grid and result["backend_settings"] == chosen.backend_settings()
    assert result["criterion"]
    with pytest.raises(ConfigurationError, match="every"):
        tc.tune_composite(train_dataset, tmp_path / "bad", base_dir=model_dirs["base_dir"],
                          weights_dir=model_dirs["weights_dir"], prompt_file=model_dirs["prompt_file"], every=0,
                          log=None)


def test_tuning_over_the_render_reference_gives_every_candidate_that_reference(
        tmp_path, train_dataset, model_dirs):  # noqa: F811 - the fixture
    """reference render: every candidate is composited over the render backend's frames (an unreachable ramp
    scores exactly as render) and the choice carries the reference to the backend."""
    grid = (CompositeSettings(254.0, 255.0, 0.0), CompositeSettings(0.0, 1e-3, 0.0))
    result = tc.tune_composite(train_dataset, tmp_path / "tune", base_dir=model_dirs["base_dir"],
                               weights_dir=model_dirs["weights_dir"], prompt_file=model_dirs["prompt_file"],
                               every=1, grid=grid, reference="render", log=None)
    assert [c["reference"] for c in result["candidates"]] == ["render", "render"]
    unreachable = result["candidates"][0]
    assert (unreachable["psnr"], unreachable["ssim"]) == (result["render"]["psnr"], result["render"]["ssim"])
    assert unreachable["psnr"] != result["baseline"]["psnr"]
    assert result["backend_settings"]["composite_reference"] == "render" and result["inputs"]["reference"] == "render"
    with pytest.raises(ConfigurationError, match="composite_reference"):
        tc.tune_composite(train_dataset, tmp_path / "bad", base_dir=model_dirs["base_dir"],
                          weights_dir=model_dirs["weights_dir"], prompt_file=model_dirs["prompt_file"],
                          grid=grid, reference="camera", log=None)


def test_the_cli_prints_the_backend_parameters(tmp_path, train_dataset, model_dirs, capsys,  # noqa: F811
                                               monkeypatch):
    monkeypatch.setattr(tc, "GRID", (CompositeSettings(), CompositeSettings(reach_px=8.0)))
    parser = argparse.ArgumentParser()
    tc.add_arguments(parser)
    args = parser.parse_args([str(train_dataset), "--out", str(tmp_path / "t"), "--base-dir",
                              str(model_dirs["base_dir"]), "--weights-dir", str(model_dirs["weights_dir"]),
                              "--prompt-file", str(model_dirs["prompt_file"]), "--every", "2"])
    assert tc.run_cli(args) == 0
    out = capsys.readouterr().out
    assert '"composite": true' in out and "composite_reach_px" in out and tc.TUNE_FILE in out
    assert len(json.loads((tmp_path / "t" / tc.TUNE_FILE).read_text())["candidates"]) == 2
    assert np.isfinite(json.loads((tmp_path / "t" / tc.TUNE_FILE).read_text())["render"]["psnr"])
